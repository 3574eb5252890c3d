//! The columnar event model: one struct of arrays for every event of every input, names interned once.
//!
//! Decision: struct-of-arrays rather than `Vec<Event>` so Python gets zero-copy numpy views of each
//! column, the hot loops (alignment, summaries, tokenization) touch only the columns they need, and
//! a 10M-event trace costs ~90 bytes/event instead of a heap object per event.

use hashbrown::HashMap;
use std::hash::BuildHasher;

/// The largest |time| or duration a reader accepts, in ns (about 127 years from the epoch): every
/// end (ts + dur) fits in an i64, and differences of two ends saturate.
pub const MAX_TIME_NS: i64 = 4_000_000_000_000_000_000;

/// Event layers. The numeric codes are part of the raw format (`docs/trace-format.md`).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    Other = 0,
    Annotation = 1,
    HostOp = 2,
    Python = 3,
    Runtime = 4,
    Driver = 5,
    Kernel = 6,
    Memcpy = 7,
    Memset = 8,
    Sync = 9,
    Marker = 10,
    GpuAnnotation = 11,
}

pub const NUM_LAYERS: usize = 12;
pub const LAYER_NAMES: [&str; NUM_LAYERS] = [
    "other",
    "annotation",
    "host_op",
    "python",
    "runtime",
    "driver",
    "kernel",
    "memcpy",
    "memset",
    "sync",
    "marker",
    "gpu_annotation",
];
/// Kineto-style category written for each layer when an event has no original category.
pub const LAYER_DEFAULT_CATS: [&str; NUM_LAYERS] = [
    "other",
    "user_annotation",
    "cpu_op",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_sync",
    "marker",
    "gpu_user_annotation",
];

impl Layer {
    pub fn from_u8(v: u8) -> Option<Layer> {
        use Layer::*;
        Some(match v {
            0 => Other,
            1 => Annotation,
            2 => HostOp,
            3 => Python,
            4 => Runtime,
            5 => Driver,
            6 => Kernel,
            7 => Memcpy,
            8 => Memset,
            9 => Sync,
            10 => Marker,
            11 => GpuAnnotation,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        LAYER_NAMES[self as usize]
    }
    pub fn from_name(s: &str) -> Option<Layer> {
        LAYER_NAMES
            .iter()
            .position(|n| *n == s)
            .and_then(|i| Layer::from_u8(i as u8))
    }
    /// GPU activities: what `gpu_events` counts and what gets linked to a launching API call.
    pub fn is_gpu_activity(self) -> bool {
        matches!(self, Layer::Kernel | Layer::Memcpy | Layer::Memset)
    }
    /// Events that live on a GPU track (device, stream) rather than a CPU thread.
    pub fn on_gpu(self) -> bool {
        matches!(
            self,
            Layer::Kernel | Layer::Memcpy | Layer::Memset | Layer::GpuAnnotation
        )
    }
    pub fn is_api(self) -> bool {
        matches!(self, Layer::Runtime | Layer::Driver)
    }
}

/// Map a Chrome/Kineto category to a layer. Old (2020) and new category names are both known.
/// Returns `None` for categories teller does not know (they become `Layer::Other` with a warning).
pub fn layer_from_category(cat: &str) -> Option<Layer> {
    Some(match cat {
        "cpu_op" | "Operator" | "operator" => Layer::HostOp,
        "cpu_instant_event" => Layer::Marker,
        "user_annotation" | "annotation" | "nvtx" | "NVTX" => Layer::Annotation,
        "gpu_user_annotation" => Layer::GpuAnnotation,
        "python_function" | "python" => Layer::Python,
        "cuda_runtime" | "Runtime" | "runtime" | "hip_runtime" => Layer::Runtime,
        "cuda_driver" | "Driver" | "driver" | "hip_driver" => Layer::Driver,
        "kernel" | "Kernel" => Layer::Kernel,
        "gpu_memcpy" | "Memcpy" | "memcpy" => Layer::Memcpy,
        "gpu_memset" | "Memset" | "memset" => Layer::Memset,
        "cuda_sync" | "sync" | "Sync" => Layer::Sync,
        "marker" | "Mark" | "mark" => Layer::Marker,
        "overhead" | "Trace" | "trace" | "other" | "cuda_profiler_range" | "python_oneshot" => Layer::Other,
        _ => return None,
    })
}

/// Event flags.
pub mod flags {
    /// An instant (phase `i`), not an interval.
    pub const INSTANT: u8 = 1;
    /// A range that was never closed (B without E, raw BEGIN without END); closed at the trace end.
    pub const UNFINISHED: u8 = 2;
    /// An instant of process scope (Chrome `"s": "p"`): drawn across its process, not one thread.
    pub const SCOPE_PROCESS: u8 = 4;
    /// An instant of global scope (Chrome `"s": "g"`): drawn across the whole trace.
    pub const SCOPE_GLOBAL: u8 = 8;
}

/// A string interner: every distinct name, category and string argument is stored once.
///
/// The texts live back to back in one buffer and the table holds only ids, so a new string costs no
/// allocation of its own (amortized buffer growth). Two allocations per new string (a `Box<str>` for
/// the map and its clone for the id list) were a quarter of the load time of small traces, with
/// malloc, free and rehashing together larger than the JSON scanner.
#[derive(Debug, Default, Clone)]
pub struct Interner {
    table: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
    buf: String,
    /// end offset in `buf` of string i (its start is the previous end)
    ends: Vec<usize>,
}

impl Interner {
    pub fn new() -> Self {
        let mut s = Interner::default();
        s.intern(""); // id 0 is always the empty string
        s
    }
    /// An interner sized for about `strings` strings of `bytes` bytes in all.
    pub fn with_capacity(strings: usize, bytes: usize) -> Self {
        let mut s = Interner {
            table: hashbrown::HashTable::with_capacity(strings),
            hasher: Default::default(),
            buf: String::with_capacity(bytes),
            ends: Vec::with_capacity(strings),
        };
        s.intern("");
        s
    }
    #[inline]
    fn text<'a>(buf: &'a str, ends: &[usize], id: u32) -> &'a str {
        let i = id as usize;
        let start = if i == 0 { 0 } else { ends[i - 1] };
        &buf[start..ends[i]]
    }
    #[inline]
    pub fn intern(&mut self, s: &str) -> u32 {
        let hash = self.hasher.hash_one(s);
        let Interner {
            table,
            hasher,
            buf,
            ends,
        } = self;
        if let Some(&id) = table.find(hash, |&id| Self::text(buf, ends, id) == s) {
            return id;
        }
        let id = ends.len() as u32;
        buf.push_str(s);
        ends.push(buf.len());
        table.insert_unique(hash, id, |&id| hasher.hash_one(Self::text(buf, ends, id)));
        id
    }
    #[inline]
    pub fn get(&self, id: u32) -> &str {
        Self::text(&self.buf, &self.ends, id)
    }
    pub fn lookup(&self, s: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(s);
        self.table.find(hash, |&id| self.get(id) == s).copied()
    }
    pub fn len(&self) -> usize {
        self.ends.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
    /// The strings in id order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.ends.len() as u32).map(move |id| self.get(id))
    }
    /// Forgets the strings interned after the first `len` (a parse that is retried from an earlier
    /// point must give the ids a single pass gives).
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.ends.len());
        while self.ends.len() > len {
            let id = (self.ends.len() - 1) as u32;
            let hash = self.hasher.hash_one(self.get(id));
            if let Ok(e) = self.table.find_entry(hash, |&x| x == id) {
                e.remove();
            }
            self.ends.pop();
        }
        let end = if len == 0 { 0 } else { self.ends[len - 1] };
        self.buf.truncate(end);
    }
}

/// A value of an event argument. Arrays and objects are kept as their JSON text (interned).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(u32),
    /// JSON text of an array or object (or a number that does not fit i64), interned.
    Json(u32),
    Null,
}

/// A flow event (`s`, `t`, `f`) as read. Kineto's `ac2g` flows duplicate the correlation ids; in a
/// trace merged from several processes (teller's trace.json) they name the launching process of each
/// GPU activity (`align`). Other flow kinds (`fwdbwd`) are kept so that they survive a round trip.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    pub id: u64,
    pub phase: u8,
    pub cat: u32,
    pub name: u32,
    pub ts: i64,
    pub pid: i64,
    pub tid: i64,
    pub binding_enclosing: bool,
    pub source: u16,
}

/// A counter sample (`C` phase or raw COUNTER record): one row per series value.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterSample {
    pub name: u32,
    pub series: u32,
    pub pid: i64,
    pub ts: i64,
    pub value: f64,
}

/// One input file as read, and what it said about itself.
#[derive(Debug, Clone, Default)]
pub struct SourceInfo {
    pub path: String,
    /// The process this source belongs to (an index shared by the raw files of one process: same
    /// host, pid and start time, as the loader scopes correlation ids), one per Chrome file.
    pub process: u32,
    /// "chrome" or "raw"
    pub kind: String,
    /// Offset added to this source's timestamps to reach the common time base (realtime ns).
    pub base_ns: i64,
    pub pid: Option<i64>,
    pub host: Option<String>,
    pub producer: Option<String>,
    pub events: u64,
    /// Top-level keys of a Chrome trace other than traceEvents, as JSON text (deviceProperties, ...),
    /// and the raw HEADER meta of a raw file, as JSON text.
    pub metadata: Vec<(String, String)>,
}

/// A step (segment): the unit of tokenization and of per-iteration comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The event that defines the step, or -1 for a synthetic step (fallback).
    pub event: i64,
    pub name: u32,
    pub start: i64,
    pub end: i64,
    pub pid: i64,
    pub tid: i64,
    pub source: u16,
}

/// The whole columnar trace. Columns are indexed by event number; all have the same length.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub strings: Interner,
    pub layer: Vec<u8>,
    pub name: Vec<u32>,
    pub cat: Vec<u32>,
    /// Start, integer nanoseconds on the common time base (realtime ns once aligned).
    pub ts: Vec<i64>,
    pub dur: Vec<i64>,
    pub pid: Vec<i64>,
    /// Thread id for CPU events; stream for GPU events.
    pub tid: Vec<i64>,
    /// GPU device for GPU events, -1 for CPU events.
    pub device: Vec<i32>,
    /// Correlation id (runtime/driver call <-> GPU activity), 0 when none.
    pub corr: Vec<u64>,
    /// External id (framework op <-> runtime call, NVTX range <-> GPU work), 0 when none.
    pub ext: Vec<u64>,
    pub flags: Vec<u8>,
    /// Index into `sources`.
    pub source: Vec<u16>,
    /// Event i's args are `args[args_off[i]..args_off[i+1]]`.
    pub args_off: Vec<u32>,
    pub args: Vec<(u32, ArgValue)>,

    // Derived by `align::finish` (empty before).
    /// For GPU activities: index of the runtime/driver event that launched it, else -1.
    pub link: Vec<i64>,
    /// Call-chain parent (CPU nesting; a GPU activity's parent is its launch), -1 for roots.
    pub parent: Vec<i64>,
    /// Step index (into `steps`), -1 when outside every step.
    pub step: Vec<i32>,
    /// Normalized symbol id (into `symbols`), see `normalize`.
    pub symbol: Vec<u32>,
    pub symbols: Interner,
    pub steps: Vec<Step>,

    pub flows: Vec<Flow>,
    pub counters: Vec<CounterSample>,
    /// (pid, name) of processes, (pid, tid, name) of threads, from metadata events / raw headers.
    pub process_names: Vec<(i64, u32)>,
    pub thread_names: Vec<(i64, i64, u32)>,
    /// (pid, sort_index) and (pid, tid, sort_index) from `process_sort_index` / `thread_sort_index`
    /// metadata: the order of the tracks in a viewer, written back as read.
    pub process_sort: Vec<(i64, i64)>,
    pub thread_sort: Vec<(i64, i64, i64)>,
    /// (pid, labels) from `process_labels` metadata (Kineto's "CPU", "GPU 0"), written back as read.
    pub process_labels: Vec<(i64, u32)>,
    /// Synthetic ids given to non-numeric pid/tid strings ("Spans", "PyTorch Profiler") -> the string.
    pub id_labels: HashMap<i64, u32>,
    pub sources: Vec<SourceInfo>,
    pub warnings: Vec<String>,
}

/// Synthetic ids for non-numeric pids/tids live above this bound (no real pid/tid/stream gets there).
pub const LABEL_ID_BASE: i64 = 1 << 52;

impl Trace {
    pub fn new() -> Self {
        Trace {
            strings: Interner::new(),
            symbols: Interner::new(),
            args_off: vec![0],
            ..Default::default()
        }
    }
    #[inline]
    pub fn len(&self) -> usize {
        self.ts.len()
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }
    #[inline]
    pub fn end(&self, i: usize) -> i64 {
        // (readers bound every time by MAX_TIME_NS: no overflow; saturating all the same)
        self.ts[i].saturating_add(self.dur[i])
    }
    #[inline]
    pub fn layer_of(&self, i: usize) -> Layer {
        Layer::from_u8(self.layer[i]).unwrap_or(Layer::Other)
    }
    pub fn args_of(&self, i: usize) -> &[(u32, ArgValue)] {
        &self.args[self.args_off[i] as usize..self.args_off[i + 1] as usize]
    }
    pub fn name_of(&self, i: usize) -> &str {
        self.strings.get(self.name[i])
    }
    /// Label id for a non-numeric pid/tid string.
    pub fn label_id(&mut self, s: &str) -> i64 {
        let sym = self.strings.intern(s);
        let id = LABEL_ID_BASE + sym as i64;
        self.id_labels.insert(id, sym);
        id
    }

    /// Append one event; args must have been pushed to `self.args` already (this closes the args run).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn push_event(
        &mut self,
        layer: Layer,
        name: u32,
        cat: u32,
        ts: i64,
        dur: i64,
        pid: i64,
        tid: i64,
        device: i32,
        corr: u64,
        ext: u64,
        flags: u8,
        source: u16,
    ) {
        self.layer.push(layer as u8);
        self.name.push(name);
        self.cat.push(cat);
        self.ts.push(ts);
        self.dur.push(dur);
        self.pid.push(pid);
        self.tid.push(tid);
        self.device.push(device);
        self.corr.push(corr);
        self.ext.push(ext);
        self.flags.push(flags);
        self.source.push(source);
        self.args_off.push(self.args.len() as u32);
    }

    /// Re-intern `other`'s strings into `self` and append all of its events, flows and metadata,
    /// shifting source indices. Used to merge per-file traces.
    pub fn append(&mut self, other: Trace) {
        let remap: Vec<u32> = other.strings.iter().map(|s| self.strings.intern(s)).collect();
        let src_shift = self.sources.len() as u16;
        let n0 = self.len();
        let a0 = self.args.len() as u32;
        let r = |id: u32| remap[id as usize];
        self.layer.extend_from_slice(&other.layer);
        self.name.extend(other.name.iter().map(|&x| r(x)));
        self.cat.extend(other.cat.iter().map(|&x| r(x)));
        self.ts.extend_from_slice(&other.ts);
        self.dur.extend_from_slice(&other.dur);
        let map_id = |id: i64, this: &mut HashMap<i64, u32>| -> i64 {
            if id >= LABEL_ID_BASE {
                if let Some(&sym) = other.id_labels.get(&id) {
                    let ns = r(sym);
                    let nid = LABEL_ID_BASE + ns as i64;
                    this.insert(nid, ns);
                    return nid;
                }
            }
            id
        };
        for &p in &other.pid {
            let v = map_id(p, &mut self.id_labels);
            self.pid.push(v);
        }
        for &t in &other.tid {
            let v = map_id(t, &mut self.id_labels);
            self.tid.push(v);
        }
        self.device.extend_from_slice(&other.device);
        self.corr.extend_from_slice(&other.corr);
        self.ext.extend_from_slice(&other.ext);
        self.flags.extend_from_slice(&other.flags);
        self.source.extend(other.source.iter().map(|&s| s + src_shift));
        self.args_off.extend(other.args_off[1..].iter().map(|&o| o + a0));
        self.args.extend(other.args.iter().map(|&(k, v)| {
            let v = match v {
                ArgValue::Str(s) => ArgValue::Str(r(s)),
                ArgValue::Json(s) => ArgValue::Json(r(s)),
                v => v,
            };
            (r(k), v)
        }));
        for f in other.flows {
            let pid = map_id(f.pid, &mut self.id_labels);
            let tid = map_id(f.tid, &mut self.id_labels);
            self.flows.push(Flow {
                cat: r(f.cat),
                name: r(f.name),
                source: f.source + src_shift,
                pid,
                tid,
                ..f
            });
        }
        for c in other.counters {
            let pid = map_id(c.pid, &mut self.id_labels);
            self.counters.push(CounterSample {
                name: r(c.name),
                series: r(c.series),
                pid,
                ..c
            });
        }
        for (p, n) in other.process_names {
            let p = map_id(p, &mut self.id_labels);
            self.process_names.push((p, r(n)));
        }
        for (p, t, n) in other.thread_names {
            let p = map_id(p, &mut self.id_labels);
            let t = map_id(t, &mut self.id_labels);
            self.thread_names.push((p, t, r(n)));
        }
        for (p, l) in other.process_labels {
            self.process_labels.push((map_id(p, &mut self.id_labels), r(l)));
        }
        for (p, i) in other.process_sort {
            self.process_sort.push((map_id(p, &mut self.id_labels), i));
        }
        for (p, t, i) in other.thread_sort {
            let p = map_id(p, &mut self.id_labels);
            self.thread_sort.push((p, map_id(t, &mut self.id_labels), i));
        }
        self.sources.extend(other.sources);
        self.warnings.extend(other.warnings);
        debug_assert_eq!(self.len(), n0 + other.ts.len());
    }
}

#[cfg(test)]
mod tests {
    use super::Interner;

    #[test]
    fn interner_ids_texts_and_truncate() {
        let mut s = Interner::new();
        assert_eq!(s.get(0), "");
        assert_eq!(s.intern(""), 0);
        // enough strings to rehash the table several times; some share prefixes, one is multi-byte
        let words: Vec<String> = (0..5000).map(|i| format!("k{i}_{}", "é".repeat(i % 3))).collect();
        let ids: Vec<u32> = words.iter().map(|w| s.intern(w)).collect();
        assert_eq!(ids, (1..=5000).collect::<Vec<u32>>());
        for (w, &id) in words.iter().zip(&ids) {
            assert_eq!(s.get(id), w);
            assert_eq!(s.intern(w), id);
            assert_eq!(s.lookup(w), Some(id));
        }
        assert_eq!(s.lookup("absent"), None);
        assert_eq!(s.len(), 5001);
        assert_eq!(s.iter().nth(3), Some(words[2].as_str()));
        // truncating forgets the later strings; interning them again gives the same ids
        s.truncate(1001);
        assert_eq!(s.len(), 1001);
        assert_eq!(s.lookup(&words[1000]), None);
        assert_eq!(s.lookup(&words[999]), Some(1000));
        for (w, &id) in words.iter().zip(&ids).skip(1000) {
            assert_eq!(s.intern(w), id);
        }
        assert_eq!(
            s.iter().collect::<Vec<_>>()[1..],
            words.iter().map(|w| w.as_str()).collect::<Vec<_>>()[..]
        );
        s.truncate(0);
        assert!(s.is_empty());
        assert_eq!(s.intern("x"), 0);
    }
}
