//! A loaded [`Trace`] as bytes and back: what `pickle` (and so `multiprocessing`) uses in the binding.
//!
//! The layout is this crate's own, little-endian, versioned by [`SNAPSHOT_VERSION`]: every column as
//! a length and its values, the interners as their strings in id order. Reading it back checks every
//! length and every index into the string tables, the sources, the steps and the events, so a
//! truncated or altered snapshot is an error and never a panic later. Loading parses nothing and
//! aligns nothing: it is a copy (about 1 GB/s), where loading the JSON again is a parse and an
//! alignment.

use hashbrown::HashMap;

use crate::model::{ArgValue, CounterSample, Flow, Interner, Layer, SourceInfo, Step, Trace, MAX_TIME_NS};
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"TELLERTR";
/// Bumped whenever the layout changes; an older or newer snapshot is refused with both numbers.
pub const SNAPSHOT_VERSION: u32 = 2; // 2: the track sort indices and process labels
const WHAT: &str = "<trace snapshot>";

fn bad(msg: impl Into<String>) -> Error {
    Error::format(WHAT, None, None, msg)
}

// -- writing ---------------------------------------------------------------------------------------

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn opt_str(&mut self, s: &Option<String>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }
    fn interner(&mut self, s: &Interner) {
        self.len(s.len());
        for t in s.iter() {
            self.str(t);
        }
    }
}

macro_rules! put_col {
    ($w:expr, $v:expr) => {{
        $w.len($v.len());
        for x in $v.iter() {
            $w.0.extend_from_slice(&x.to_le_bytes());
        }
    }};
}

/// The trace as bytes ([`from_bytes`] reads them back).
pub fn to_bytes(t: &Trace) -> Vec<u8> {
    let n = t.len();
    // the columns are most of it: about 100 bytes per event with the args
    let mut w = W(Vec::with_capacity(64 + n * 100 + t.args.len() * 13));
    w.0.extend_from_slice(MAGIC);
    w.u32(SNAPSHOT_VERSION);
    w.interner(&t.strings);
    put_col!(w, t.layer);
    put_col!(w, t.name);
    put_col!(w, t.cat);
    put_col!(w, t.ts);
    put_col!(w, t.dur);
    put_col!(w, t.pid);
    put_col!(w, t.tid);
    put_col!(w, t.device);
    put_col!(w, t.corr);
    put_col!(w, t.ext);
    put_col!(w, t.flags);
    put_col!(w, t.source);
    put_col!(w, t.args_off);
    w.len(t.args.len());
    for (k, v) in &t.args {
        w.u32(*k);
        let (tag, bits) = match *v {
            ArgValue::Int(x) => (0u8, x as u64),
            ArgValue::Float(x) => (1, x.to_bits()),
            ArgValue::Bool(x) => (2, x as u64),
            ArgValue::Str(x) => (3, x as u64),
            ArgValue::Json(x) => (4, x as u64),
            ArgValue::Null => (5, 0),
        };
        w.u8(tag);
        w.u64(bits);
    }
    put_col!(w, t.link);
    put_col!(w, t.parent);
    put_col!(w, t.step);
    put_col!(w, t.symbol);
    w.interner(&t.symbols);
    w.len(t.steps.len());
    for s in &t.steps {
        w.i64(s.event);
        w.u32(s.name);
        w.i64(s.start);
        w.i64(s.end);
        w.i64(s.pid);
        w.i64(s.tid);
        w.0.extend_from_slice(&s.source.to_le_bytes());
    }
    w.len(t.flows.len());
    for f in &t.flows {
        w.u64(f.id);
        w.u8(f.phase);
        w.u32(f.cat);
        w.u32(f.name);
        w.i64(f.ts);
        w.i64(f.pid);
        w.i64(f.tid);
        w.u8(f.binding_enclosing as u8);
        w.0.extend_from_slice(&f.source.to_le_bytes());
    }
    w.len(t.counters.len());
    for c in &t.counters {
        w.u32(c.name);
        w.u32(c.series);
        w.i64(c.pid);
        w.i64(c.ts);
        w.u64(c.value.to_bits());
    }
    w.len(t.process_names.len());
    for &(pid, name) in &t.process_names {
        w.i64(pid);
        w.u32(name);
    }
    w.len(t.thread_names.len());
    for &(pid, tid, name) in &t.thread_names {
        w.i64(pid);
        w.i64(tid);
        w.u32(name);
    }
    w.len(t.process_sort.len());
    for &(pid, idx) in &t.process_sort {
        w.i64(pid);
        w.i64(idx);
    }
    w.len(t.thread_sort.len());
    for &(pid, tid, idx) in &t.thread_sort {
        w.i64(pid);
        w.i64(tid);
        w.i64(idx);
    }
    w.len(t.process_labels.len());
    for &(pid, l) in &t.process_labels {
        w.i64(pid);
        w.u32(l);
    }
    // sorted: the same trace always gives the same bytes
    let mut labels: Vec<(i64, u32)> = t.id_labels.iter().map(|(&k, &v)| (k, v)).collect();
    labels.sort_unstable();
    w.len(labels.len());
    for (k, v) in labels {
        w.i64(k);
        w.u32(v);
    }
    w.len(t.sources.len());
    for s in &t.sources {
        w.str(&s.path);
        w.u32(s.process);
        w.str(&s.kind);
        w.i64(s.base_ns);
        match s.pid {
            None => w.u8(0),
            Some(p) => {
                w.u8(1);
                w.i64(p);
            }
        }
        w.opt_str(&s.host);
        w.opt_str(&s.producer);
        w.u64(s.events);
        w.len(s.metadata.len());
        for (k, v) in &s.metadata {
            w.str(k);
            w.str(v);
        }
    }
    w.len(t.warnings.len());
    for s in &t.warnings {
        w.str(s);
    }
    w.0
}

// -- reading ---------------------------------------------------------------------------------------

struct R<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> R<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.b.len() - self.pos < n {
            return Err(Error::format(
                WHAT,
                Some(self.pos as u64),
                None,
                format!(
                    "truncated in {what}: {n} more bytes needed, {} left",
                    self.b.len() - self.pos
                ),
            ));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn i64(&mut self, what: &str) -> Result<i64> {
        Ok(self.u64(what)? as i64)
    }
    /// A count of items of at least `item` bytes each: more than the bytes left is an error here,
    /// before anything is allocated for them.
    fn len(&mut self, item: usize, what: &str) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = (self.b.len() - self.pos) as u64;
        if n.checked_mul(item.max(1) as u64).is_none_or(|need| need > left) {
            return Err(Error::format(
                WHAT,
                Some(at as u64),
                None,
                format!("truncated or damaged in {what}: a count of {n} is more than the {left} bytes left"),
            ));
        }
        Ok(n as usize)
    }
    fn str(&mut self, what: &str) -> Result<String> {
        let n = self.len(1, what)?;
        let at = self.pos;
        let s = self.take(n, what)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(Error::format(WHAT, Some(at as u64), None, format!("{what}: not UTF-8"))),
        }
    }
    fn opt_str(&mut self, what: &str) -> Result<Option<String>> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.str(what)?)),
            x => Err(bad(format!("{what}: option tag {x}"))),
        }
    }
    fn interner(&mut self, what: &str) -> Result<Interner> {
        let n = self.len(8, what)?;
        let mut s = Interner::with_capacity(n, 0);
        for i in 0..n {
            let t = self.str(what)?;
            if i == 0 {
                if !t.is_empty() {
                    return Err(bad(format!("{what}: string 0 is {t:?}, not the empty string")));
                }
                continue;
            }
            if s.intern(&t) as usize != i {
                return Err(bad(format!("{what}: string {i} ({t:?}) appears twice")));
            }
        }
        if n == 0 {
            return Err(bad(format!("{what}: no strings (the empty string 0 is always there)")));
        }
        Ok(s)
    }
}

macro_rules! get_col {
    ($r:expr, $t:ty, $what:expr) => {{
        const SZ: usize = std::mem::size_of::<$t>();
        let n = $r.len(SZ, $what)?;
        let bytes = $r.take(n * SZ, $what)?;
        bytes
            .chunks_exact(SZ)
            .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<$t>>()
    }};
}

fn check_ids(what: &str, ids: impl IntoIterator<Item = u32>, bound: usize) -> Result<()> {
    for (i, id) in ids.into_iter().enumerate() {
        if id as usize >= bound {
            return Err(bad(format!("{what} [{i}] is {id}, past the {bound} strings")));
        }
    }
    Ok(())
}

fn check_refs(what: &str, v: &[i64], bound: usize) -> Result<()> {
    for (i, &x) in v.iter().enumerate() {
        if x < -1 || x >= bound as i64 {
            return Err(bad(format!("{what} [{i}] is {x}, outside -1..{bound}")));
        }
    }
    Ok(())
}

/// A trace from the bytes of [`to_bytes`]. Every length and index is checked: what comes back is a
/// trace every other function here can use, or an error saying where the bytes are wrong.
pub fn from_bytes(b: &[u8]) -> Result<Trace> {
    let mut r = R { b, pos: 0 };
    if b.len() < 12 || &b[..8] != MAGIC {
        return Err(bad("not a teller trace snapshot (no TELLERTR header)"));
    }
    r.pos = 8;
    let version = r.u32("the version")?;
    if version != SNAPSHOT_VERSION {
        return Err(bad(format!(
            "snapshot version {version}; this teller reads version {SNAPSHOT_VERSION} (made by another teller version: load the trace from its files again)"
        )));
    }
    let strings = r.interner("strings")?;
    let layer = get_col!(r, u8, "layer");
    let name = get_col!(r, u32, "name");
    let cat = get_col!(r, u32, "cat");
    let ts = get_col!(r, i64, "ts");
    let dur = get_col!(r, i64, "dur");
    let pid = get_col!(r, i64, "pid");
    let tid = get_col!(r, i64, "tid");
    let device = get_col!(r, i32, "device");
    let corr = get_col!(r, u64, "corr");
    let ext = get_col!(r, u64, "ext");
    let flags = get_col!(r, u8, "flags");
    let source = get_col!(r, u16, "source");
    let args_off = get_col!(r, u32, "args_off");
    let na = r.len(13, "args")?;
    let mut args = Vec::with_capacity(na);
    for _ in 0..na {
        let k = r.u32("args")?;
        let tag = r.u8("args")?;
        let bits = r.u64("args")?;
        let v = match tag {
            0 => ArgValue::Int(bits as i64),
            1 => ArgValue::Float(f64::from_bits(bits)),
            2 => ArgValue::Bool(bits != 0),
            3 | 4 if bits > u32::MAX as u64 => return Err(bad(format!("args: string id {bits}"))),
            3 => ArgValue::Str(bits as u32),
            4 => ArgValue::Json(bits as u32),
            5 => ArgValue::Null,
            x => return Err(bad(format!("args: value tag {x}"))),
        };
        args.push((k, v));
    }
    let link = get_col!(r, i64, "link");
    let parent = get_col!(r, i64, "parent");
    let step = get_col!(r, i32, "step");
    let symbol = get_col!(r, u32, "symbol");
    let symbols = r.interner("symbols")?;
    let ns = r.len(46, "steps")?;
    let mut steps = Vec::with_capacity(ns);
    for _ in 0..ns {
        steps.push(Step {
            event: r.i64("steps")?,
            name: r.u32("steps")?,
            start: r.i64("steps")?,
            end: r.i64("steps")?,
            pid: r.i64("steps")?,
            tid: r.i64("steps")?,
            source: r.u16("steps")?,
        });
    }
    let nf = r.len(44, "flows")?;
    let mut flows = Vec::with_capacity(nf);
    for _ in 0..nf {
        flows.push(Flow {
            id: r.u64("flows")?,
            phase: r.u8("flows")?,
            cat: r.u32("flows")?,
            name: r.u32("flows")?,
            ts: r.i64("flows")?,
            pid: r.i64("flows")?,
            tid: r.i64("flows")?,
            binding_enclosing: r.u8("flows")? != 0,
            source: r.u16("flows")?,
        });
    }
    let nc = r.len(32, "counters")?;
    let mut counters = Vec::with_capacity(nc);
    for _ in 0..nc {
        counters.push(CounterSample {
            name: r.u32("counters")?,
            series: r.u32("counters")?,
            pid: r.i64("counters")?,
            ts: r.i64("counters")?,
            value: f64::from_bits(r.u64("counters")?),
        });
    }
    let np = r.len(12, "process names")?;
    let mut process_names = Vec::with_capacity(np);
    for _ in 0..np {
        process_names.push((r.i64("process names")?, r.u32("process names")?));
    }
    let nt = r.len(20, "thread names")?;
    let mut thread_names = Vec::with_capacity(nt);
    for _ in 0..nt {
        thread_names.push((r.i64("thread names")?, r.i64("thread names")?, r.u32("thread names")?));
    }
    let nps = r.len(16, "process sort indices")?;
    let mut process_sort = Vec::with_capacity(nps);
    for _ in 0..nps {
        process_sort.push((r.i64("process sort indices")?, r.i64("process sort indices")?));
    }
    let nts = r.len(24, "thread sort indices")?;
    let mut thread_sort = Vec::with_capacity(nts);
    for _ in 0..nts {
        let what = "thread sort indices";
        thread_sort.push((r.i64(what)?, r.i64(what)?, r.i64(what)?));
    }
    let npl = r.len(12, "process labels")?;
    let mut process_labels = Vec::with_capacity(npl);
    for _ in 0..npl {
        process_labels.push((r.i64("process labels")?, r.u32("process labels")?));
    }
    let nl = r.len(12, "id labels")?;
    let mut id_labels = HashMap::with_capacity(nl);
    for _ in 0..nl {
        let k = r.i64("id labels")?;
        id_labels.insert(k, r.u32("id labels")?);
    }
    let nsrc = r.len(40, "sources")?;
    let mut sources = Vec::with_capacity(nsrc);
    for _ in 0..nsrc {
        let path = r.str("sources")?;
        let process = r.u32("sources")?;
        let kind = r.str("sources")?;
        let base_ns = r.i64("sources")?;
        let pid = match r.u8("sources")? {
            0 => None,
            1 => Some(r.i64("sources")?),
            x => return Err(bad(format!("sources: option tag {x}"))),
        };
        let host = r.opt_str("sources")?;
        let producer = r.opt_str("sources")?;
        let events = r.u64("sources")?;
        let nm = r.len(16, "sources")?;
        let mut metadata = Vec::with_capacity(nm);
        for _ in 0..nm {
            metadata.push((r.str("sources")?, r.str("sources")?));
        }
        sources.push(SourceInfo {
            path,
            process,
            kind,
            base_ns,
            pid,
            host,
            producer,
            events,
            metadata,
        });
    }
    let nw = r.len(8, "warnings")?;
    let mut warnings = Vec::with_capacity(nw);
    for _ in 0..nw {
        warnings.push(r.str("warnings")?);
    }
    if r.pos != b.len() {
        return Err(Error::format(
            WHAT,
            Some(r.pos as u64),
            None,
            format!("{} bytes after the end of the trace", b.len() - r.pos),
        ));
    }

    // -- every length and index, so that nothing downstream can index out of bounds --
    let n = layer.len();
    let cols: [(&str, usize); 11] = [
        ("name", name.len()),
        ("cat", cat.len()),
        ("ts", ts.len()),
        ("dur", dur.len()),
        ("pid", pid.len()),
        ("tid", tid.len()),
        ("device", device.len()),
        ("corr", corr.len()),
        ("ext", ext.len()),
        ("flags", flags.len()),
        ("source", source.len()),
    ];
    for (what, len) in cols {
        if len != n {
            return Err(bad(format!("column {what} has {len} values for {n} events")));
        }
    }
    // the derived columns: `load` always aligns, so a trace has them all
    for (what, len) in [
        ("link", link.len()),
        ("parent", parent.len()),
        ("step", step.len()),
        ("symbol", symbol.len()),
    ] {
        if len != n {
            return Err(bad(format!("column {what} has {len} values for {n} events")));
        }
    }
    // times as the readers bound them (each within MAX_TIME_NS, plus a source's base offset, itself
    // within it), so that what later code adds or subtracts stays as far from overflow as for a
    // trace just loaded
    let tmax = 2 * MAX_TIME_NS;
    let times = ts
        .iter()
        .chain(&dur)
        // (a step's end is its event's saturating end: a start within the bound is what counts)
        .chain(steps.iter().map(|s| &s.start))
        .chain(flows.iter().map(|f| &f.ts))
        .chain(counters.iter().map(|c| &c.ts));
    if let Some(v) = times.into_iter().find(|v| v.unsigned_abs() > tmax as u64) {
        return Err(bad(format!(
            "a time or duration of {v} ns, beyond the {tmax} ns a loaded trace can hold"
        )));
    }
    if let Some(i) = layer.iter().position(|&l| Layer::from_u8(l).is_none()) {
        return Err(bad(format!("layer [{i}] is {}, not a layer code", layer[i])));
    }
    let ns_ = strings.len();
    check_ids("name", name.iter().copied(), ns_)?;
    check_ids("cat", cat.iter().copied(), ns_)?;
    if let Some(i) = source.iter().position(|&s| s as usize >= sources.len()) {
        return Err(bad(format!(
            "source [{i}] is {}, past the {} sources",
            source[i],
            sources.len()
        )));
    }
    if args_off.len() != n + 1
        || args_off[0] != 0
        || args_off.windows(2).any(|w| w[0] > w[1])
        || *args_off.last().unwrap() as usize != args.len()
    {
        return Err(bad(format!(
            "args_off ({} offsets) does not split the {} args among {n} events",
            args_off.len(),
            args.len()
        )));
    }
    check_ids("arg key", args.iter().map(|a| a.0), ns_)?;
    check_ids(
        "arg string",
        args.iter().filter_map(|a| match a.1 {
            ArgValue::Str(x) | ArgValue::Json(x) => Some(x),
            _ => None,
        }),
        ns_,
    )?;
    check_refs("link", &link, n)?;
    check_refs("parent", &parent, n)?;
    if let Some(i) = step.iter().position(|&s| s < -1 || s >= steps.len() as i32) {
        return Err(bad(format!("step [{i}] is {}, outside -1..{}", step[i], steps.len())));
    }
    check_ids("symbol", symbol.iter().copied(), symbols.len())?;
    for (i, s) in steps.iter().enumerate() {
        if s.event < -1 || s.event >= n as i64 || s.name as usize >= ns_ || s.source as usize >= sources.len() {
            return Err(bad(format!("step {i} refers past the events, strings or sources")));
        }
    }
    for (i, f) in flows.iter().enumerate() {
        if f.source as usize >= sources.len() || !matches!(f.phase, b's' | b't' | b'f') {
            return Err(bad(format!(
                "flow {i}: source {} of {} sources, phase {:?} (s, t or f)",
                f.source,
                sources.len(),
                f.phase as char
            )));
        }
    }
    check_ids("flow name", flows.iter().flat_map(|f| [f.name, f.cat]), ns_)?;
    check_ids("counter name", counters.iter().flat_map(|c| [c.name, c.series]), ns_)?;
    check_ids("process name", process_names.iter().map(|p| p.1), ns_)?;
    check_ids("thread name", thread_names.iter().map(|p| p.2), ns_)?;
    check_ids("id label", id_labels.values().copied(), ns_)?;
    check_ids("process label", process_labels.iter().map(|p| p.1), ns_)?;

    Ok(Trace {
        strings,
        layer,
        name,
        cat,
        ts,
        dur,
        pid,
        tid,
        device,
        corr,
        ext,
        flags,
        source,
        args_off,
        args,
        link,
        parent,
        step,
        symbol,
        symbols,
        steps,
        flows,
        counters,
        process_names,
        thread_names,
        process_sort,
        thread_sort,
        process_labels,
        id_labels,
        sources,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_fixture(name: &str) -> Trace {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/traces");
        let p = dir.join(name);
        crate::load(&[p.to_string_lossy().into_owned()], &Default::default()).unwrap()
    }

    fn sample() -> Trace {
        load_fixture("mi300x_sglang_decode_hipgraph.kineto.json.gz")
    }

    /// A small trace for the tests that read thousands of damaged copies (a debug build).
    fn small() -> Trace {
        let t = load_fixture("mi250_rocm62_tiny.kineto.json.gz");
        assert!(!t.steps.is_empty() && !t.args.is_empty());
        t
    }

    fn same(a: &Trace, b: &Trace) {
        assert_eq!(
            a.strings.iter().collect::<Vec<_>>(),
            b.strings.iter().collect::<Vec<_>>()
        );
        assert_eq!(
            a.symbols.iter().collect::<Vec<_>>(),
            b.symbols.iter().collect::<Vec<_>>()
        );
        assert_eq!(a.layer, b.layer);
        assert_eq!(
            (&a.name, &a.cat, &a.ts, &a.dur, &a.pid, &a.tid),
            (&b.name, &b.cat, &b.ts, &b.dur, &b.pid, &b.tid)
        );
        assert_eq!(
            (&a.device, &a.corr, &a.ext, &a.flags, &a.source),
            (&b.device, &b.corr, &b.ext, &b.flags, &b.source)
        );
        assert_eq!((&a.args_off, &a.args), (&b.args_off, &b.args));
        assert_eq!(
            (&a.link, &a.parent, &a.step, &a.symbol),
            (&b.link, &b.parent, &b.step, &b.symbol)
        );
        assert_eq!((&a.steps, &a.flows, &a.counters), (&b.steps, &b.flows, &b.counters));
        assert_eq!(
            (&a.process_names, &a.thread_names, &a.id_labels),
            (&b.process_names, &b.thread_names, &b.id_labels)
        );
        assert_eq!(
            (&a.process_sort, &a.thread_sort, &a.process_labels),
            (&b.process_sort, &b.thread_sort, &b.process_labels)
        );
        assert_eq!(a.warnings, b.warnings);
        assert_eq!(format!("{:?}", a.sources), format!("{:?}", b.sources));
    }

    #[test]
    fn round_trip_keeps_everything_and_the_bytes() {
        let t = sample();
        assert!(t.len() > 1000 && !t.steps.is_empty() && !t.flows.is_empty());
        let b = to_bytes(&t);
        let u = from_bytes(&b).unwrap();
        same(&t, &u);
        assert_eq!(to_bytes(&u), b, "a trace read back writes the same bytes");
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let b = to_bytes(&small());
        // every prefix in the header and the first columns, then a stride through the rest
        let cuts: Vec<usize> = (0..2000).chain((2000..b.len()).step_by(29)).collect();
        for cut in cuts {
            let e = from_bytes(&b[..cut]).unwrap_err();
            assert!(matches!(e, Error::Format { .. }), "{cut}: {e}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(from_bytes(&extra).unwrap_err().to_string().contains("after the end"));
    }

    #[test]
    fn flipped_bytes_never_panic() {
        let b = to_bytes(&small());
        let mut x = 0x2545F4914F6CDD1Du64;
        for _ in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut c = b.clone();
            let i = (x as usize) % c.len();
            c[i] ^= (x >> 32) as u8 | 1;
            // an error, or a trace whose every index is in range (its values are not checked)
            if let Ok(t) = from_bytes(&c) {
                assert_eq!(t.name.len(), t.len());
            }
        }
    }

    #[test]
    fn refuses_what_a_loaded_trace_never_holds() {
        type Edit = fn(&mut Trace);
        let cases: [(Edit, &str); 7] = [
            (|t| t.link.clear(), "column link has 0 values"),
            (|t| t.symbol.pop().map(|_| ()).unwrap(), "column symbol has"),
            (|t| t.flows[0].phase = b'x', "phase 'x'"),
            (|t| t.flows[0].source = 9, "flow 0: source 9 of 1 sources"),
            (|t| t.steps[0].source = 1, "step 0 refers past"),
            (|t| t.ts[0] = i64::MAX, "a time or duration of 9223372036854775807"),
            (|t| t.dur[3] = -2 * MAX_TIME_NS - 1, "beyond the"),
        ];
        for (edit, said) in cases {
            let mut t = sample();
            edit(&mut t);
            let e = from_bytes(&to_bytes(&t)).unwrap_err().to_string();
            assert!(e.contains(said), "{said}: {e}");
        }
    }

    #[test]
    fn refuses_other_versions_and_other_bytes() {
        let mut b = to_bytes(&sample());
        b[8] = 1; // (the version before the track sort indices and labels)
        assert!(from_bytes(&b).unwrap_err().to_string().contains("snapshot version 1"));
        assert!(from_bytes(b"{\"traceEvents\": []}")
            .unwrap_err()
            .to_string()
            .contains("TELLERTR"));
    }
}
