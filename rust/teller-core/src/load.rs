//! Loading: expand inputs (files, run directories), read every file in parallel, merge processes,
//! align.

use crate::align::{finish, AlignOptions};
use crate::chrome::{read_chrome, read_chrome_feed};
use crate::error::{Error, Result};
use crate::inflate::{self, Stop};
use crate::model::{Trace, LABEL_ID_BASE};
use crate::raw::{looks_like_raw, read_raw, ProcessKey};
use hashbrown::HashMap;
use rayon::prelude::*;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub align: AlignOptions,
}

/// Input file kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chrome,
    Raw,
}

fn is_trace_file(p: &Path) -> bool {
    let s = p
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    // the JSON files teller itself writes next to traces (run and sample directories) are not traces
    let metadata = matches!(
        s.as_str(),
        "run.json" | "summary.json" | "annotation.json" | "manifest.json"
    );
    !metadata && (s.ends_with(".tmsgpack") || s.ends_with(".json") || s.ends_with(".json.gz"))
}

/// Expands one input into the files to read. A directory is a teller run directory (raw files in
/// `raw/` or at its top) or a directory of Chrome traces; raw files win over JSON (a run directory's
/// `trace.json` is our own output of those raw files).
pub fn expand_input(input: &str) -> Result<Vec<PathBuf>> {
    let p = Path::new(input);
    let md = std::fs::metadata(p).map_err(|e| Error::io(input, &e))?;
    if !md.is_dir() {
        // a file, or a pipe or device to read to its end (`/dev/stdin`, `<(zcat t.json.gz)`)
        return Ok(vec![p.to_path_buf()]);
    }
    let mut raw = Vec::new();
    let mut json = Vec::new();
    let mut scan = |d: &Path| -> Result<()> {
        let rd = match std::fs::read_dir(d) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(&d.display().to_string(), &e)),
        };
        for e in rd {
            let e = e.map_err(|e| Error::io(&d.display().to_string(), &e))?;
            let path = e.path();
            if path.is_file() && is_trace_file(&path) && path.to_str().is_none() {
                // (read lossily it would be another name, "not found"): said as it is
                return Err(Error::Io {
                    path: path.to_string_lossy().into_owned(),
                    msg: "file name is not valid UTF-8: teller reads UTF-8 paths (rename the file)".into(),
                    errno: None,
                });
            }
            if path.is_file() && is_trace_file(&path) {
                if path.to_string_lossy().ends_with(".tmsgpack") {
                    raw.push(path);
                } else {
                    json.push(path);
                }
            }
        }
        Ok(())
    };
    scan(p)?;
    scan(&p.join("raw"))?;
    let mut files = if !raw.is_empty() { raw } else { json };
    files.sort();
    if files.is_empty() {
        let msg = if p.join("run.json").is_file() {
            // a `teller collect` run whose program made no NVTX/CUDA call the shim saw
            "run directory holds no trace files: no raw files in raw/ (the program made no NVTX or \
             CUDA calls, or the collector shim was not loaded; see run.json and stderr.log)"
        } else {
            "directory holds no trace files (*.tmsgpack, *.json, *.json.gz, also looked in raw/)"
        };
        return Err(Error::Empty {
            path: input.to_string(),
            msg: msg.into(),
        });
    }
    Ok(files)
}

/// Reads a file, transparently gunzipping it.
pub fn read_bytes(path: &str) -> Result<Vec<u8>> {
    let data = read_input(path)?;
    inflate_all(path, data)
}

/// At most this many first bytes decide whether a stream is read on (`looks_like_raw` reads 64).
const HEAD_BYTES: usize = 64;
/// A stream of nothing but whitespace is given up on after this many bytes.
const BLANK_BYTES: usize = 1 << 20;

/// Reads a whole input. A regular file is read at once. Anything else (a pipe, `/dev/stdin`, a
/// character device) has no size to stop at, so it is read on only once its first bytes open
/// something teller reads: JSON, gzip or a raw stream, decided as soon as enough has arrived (the
/// first byte past any whitespace for JSON). `/dev/zero` or `/dev/urandom` fail at their first bytes
/// with the message a file holding them gets, where reading on ran until memory was gone.
pub fn read_input(path: &str) -> Result<Vec<u8>> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    let regular = f.metadata().map(|m| m.is_file()).unwrap_or(false);
    let mut data = Vec::new();
    if regular {
        // (the size is a capacity hint only: a file that grows meanwhile is still read whole)
        let n = f.metadata().map(|m| m.len() as usize).unwrap_or(0);
        let _ = data.try_reserve_exact(n);
        f.read_to_end(&mut data).map_err(|e| Error::io(path, &e))?;
        return Ok(data);
    }
    let mut buf = [0u8; 4096];
    loop {
        // (what has arrived decides: a short head that stays open is not waited on for more)
        let n = match f.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path, &e)),
        };
        if n == 0 {
            return Ok(data);
        }
        data.extend_from_slice(&buf[..n]);
        match opens_an_input(&data) {
            Some(true) => break,
            // (the head alone goes on: parsing it says what is wrong, at which byte, as for a file;
            // another compression is refused by name from its magic)
            Some(false) => return Ok(data),
            None if data.len() >= BLANK_BYTES => return Ok(data),
            None => {}
        }
    }
    f.read_to_end(&mut data).map_err(|e| Error::io(path, &e))?;
    Ok(data)
}

/// Whether a stream's first bytes open something teller reads: JSON (after a BOM and whitespace,
/// `{` or `[`), gzip, or a raw stream; None while too few have arrived to tell.
fn opens_an_input(head: &[u8]) -> Option<bool> {
    const BOM: &[u8] = b"\xef\xbb\xbf";
    match head.first()? {
        0x1f => return head.get(1).map(|&b| b == 0x8b),
        0x90..=0x9f | 0xdc => {
            return if looks_like_raw(head) {
                Some(true)
            } else if head.len() < HEAD_BYTES {
                None
            } else {
                Some(false)
            }
        }
        _ => {}
    }
    if head.len() < BOM.len() && BOM.starts_with(head) {
        return None;
    }
    let text = head.strip_prefix(BOM).unwrap_or(head);
    text.iter()
        .find(|b| !b.is_ascii_whitespace())
        .map(|&b| b == b'{' || b == b'[')
}

fn inflate_all(path: &str, data: Vec<u8>) -> Result<Vec<u8>> {
    if data.len() >= 2 && data[0] == 0x1f && data[1] == 0x8b {
        // ISIZE (last 4 bytes) is the uncompressed size mod 2^32: a good capacity hint.
        let hint = inflate::trailer_size(&data).unwrap_or(0);
        // (a hint that cannot be had is only a hint: the buffer then grows as it fills)
        let mut out = Vec::new();
        let _ = out.try_reserve_exact(hint.min(1 << 32).max(data.len() * 4));
        let mut dec = inflate::Members::new(&data[..]);
        if let Err(e) = dec.read_to_end(&mut out) {
            return Err(inflate::gzip_error(path, &e.to_string(), out.len()));
        }
        if out.is_empty() {
            return Err(Error::Empty {
                path: path.into(),
                msg: "empty: its gzip data decompress to nothing".into(),
            });
        }
        return Ok(out);
    }
    if let Some((name, cmd)) = inflate::other_compression(&data) {
        return Err(Error::format(
            path,
            None,
            None,
            format!("{name}-compressed, which teller does not read: decompress it first ({cmd}), or gzip it"),
        ));
    }
    Ok(data)
}

/// Below this inflated size a second thread costs more than the inflating it would hide.
pub const PIPELINE_MIN_BYTES: usize = 256 << 10;

/// Whether a gzipped Chrome trace is parsed while a second thread inflates it (`inflate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipeline {
    /// Inflate everything, then parse.
    Off,
    /// From `PIPELINE_MIN_BYTES` inflated (the gzip trailer's size), handing over up to
    /// `inflate::CHUNK` bytes at a time.
    Auto,
    /// At any size, handing over at most `chunk` bytes at a time (tests cut events anywhere).
    Always { chunk: usize },
}

/// Reads one file of either kind.
pub fn read_file(path: &str, source: u16) -> Result<(Trace, Kind, Option<ProcessKey>)> {
    read_file_with(path, source, Pipeline::Auto)
}

/// `read_file`, pipelined or not (both ways give the same trace, warnings and errors).
pub fn read_file_with(path: &str, source: u16, pipeline: Pipeline) -> Result<(Trace, Kind, Option<ProcessKey>)> {
    let data = read_input(path)?;
    let (chunk, min) = match pipeline {
        Pipeline::Off => (0, usize::MAX),
        Pipeline::Auto => (inflate::CHUNK, PIPELINE_MIN_BYTES),
        Pipeline::Always { chunk } => (chunk, 0),
    };
    let announced = inflate::announced_size(&data).filter(|&n| n >= min);
    if let (Some(n), false) = (announced, path.ends_with(".tmsgpack")) {
        let r = inflate::with_feed(path, &data, n, chunk, |feed| {
            // the first bytes tell a raw stream from JSON
            if looks_like_raw(feed.head(64)) {
                feed.cancel();
                return Ok(None);
            }
            read_chrome_feed(feed, source).map(Some)
        });
        match r {
            Ok(Some(t)) => return Ok((t, Kind::Chrome, None)),
            Err(Stop::Err(e)) => return Err(e),
            // a raw stream, or a trailer that understated the size: the serial read below
            Ok(None) | Err(Stop::Overflow) => {}
        }
    }
    let bytes = inflate_all(path, data)?;
    if bytes.is_empty() {
        return Err(Error::Empty {
            path: path.into(),
            msg: "empty file".into(),
        });
    }
    if looks_like_raw(&bytes) || path.ends_with(".tmsgpack") {
        let (t, k) = read_raw(path, &bytes, source)?;
        return Ok((t, Kind::Raw, Some(k)));
    }
    let t = read_chrome(path, &bytes, source)?;
    Ok((t, Kind::Chrome, None))
}

/// Loads and aligns any number of inputs (files or run directories) into one trace.
/// Added to a pid that another process's input already uses (times 1, 2, ...: the first free).
pub const PID_SHIFT: i64 = 10_000_000;

/// Who holds a pid among the inputs read so far: a number, or a label (a string pid, by its text).
#[derive(Default)]
struct PidOwners {
    numbers: HashMap<i64, u32>,
    labels: HashMap<String, u32>,
    /// where a process's pid (or label) was moved: its other files (raw files of one process) go
    /// to the same place
    moved: HashMap<(u32, i64), i64>,
    moved_labels: HashMap<(u32, String), String>,
}

/// Inputs of different processes that use the same pid (Kineto numbers a GPU's tracks by its device,
/// 0 in every rank, and names its own tracks "Traces" and "Spans"; ranks on two hosts may share an OS
/// pid) would share one process in Perfetto and in every per-process view. The later input's
/// clashing pids move: a number to `pid + k * PID_SHIFT`, the smallest `k` free; a label to
/// `"label (file name)"`, across its events, flows, counters and names. Raw files of one process keep
/// theirs. Decision: renumbered in the model, not only in the writer, as process and thread names
/// carry no source to tell them apart by later.
fn separate_pids(t: &mut Trace, proc: u32, owners: &mut PidOwners) {
    let mut pids: Vec<i64> = t
        .pid
        .iter()
        .copied()
        .chain(t.flows.iter().map(|f| f.pid))
        .chain(t.counters.iter().map(|c| c.pid))
        .chain(t.process_names.iter().map(|p| p.0))
        .chain(t.thread_names.iter().map(|p| p.0))
        .chain(t.process_sort.iter().map(|p| p.0))
        .chain(t.thread_sort.iter().map(|p| p.0))
        .chain(t.process_labels.iter().map(|p| p.0))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    // (the file and its directory: every rank's file may be named trace.json)
    let file = t
        .sources
        .first()
        .map(|s| {
            let p = Path::new(&s.path);
            let name = p
                .file_name()
                .map_or(s.path.clone(), |n| n.to_string_lossy().into_owned());
            match p.parent().and_then(|d| d.file_name()) {
                Some(d) => format!("{}/{name}", d.to_string_lossy()),
                None => name,
            }
        })
        .unwrap_or_default();
    let mut map: HashMap<i64, i64> = HashMap::new();
    for &p in &pids {
        let label = (p >= LABEL_ID_BASE)
            .then(|| t.id_labels.get(&p).map(|&sym| t.strings.get(sym).to_string()))
            .flatten();
        if let Some(label) = label {
            if let Some(new) = owners.moved_labels.get(&(proc, label.clone())).cloned() {
                map.insert(p, t.label_id(&new));
                continue;
            }
            match owners.labels.get(&label) {
                Some(&o) if o != proc => {
                    let new = (1..)
                        .map(|k| match k {
                            1 => format!("{label} ({file})"),
                            k => format!("{label} ({file} #{k})"),
                        })
                        .find(|l| {
                            !owners.labels.contains_key(l) && !t.id_labels.values().any(|&sym| t.strings.get(sym) == l)
                        })
                        .expect("a free label");
                    owners.labels.insert(new.clone(), proc);
                    owners.moved_labels.insert((proc, label.clone()), new.clone());
                    map.insert(p, t.label_id(&new));
                }
                Some(_) => {}
                None => {
                    owners.labels.insert(label, proc);
                }
            }
            continue;
        }
        if let Some(&q) = owners.moved.get(&(proc, p)) {
            map.insert(p, q);
            continue;
        }
        match owners.numbers.get(&p) {
            Some(&o) if o != proc => {
                let q = (1..)
                    .map(|k| p.saturating_add(k * PID_SHIFT))
                    .find(|q| !owners.numbers.contains_key(q) && pids.binary_search(q).is_err())
                    .expect("a free pid");
                owners.numbers.insert(q, proc);
                owners.moved.insert((proc, p), q);
                map.insert(p, q);
            }
            Some(_) => {}
            None => {
                owners.numbers.insert(p, proc);
            }
        }
    }
    if map.is_empty() {
        return;
    }
    let m = |p: &mut i64| {
        if let Some(&q) = map.get(p) {
            *p = q;
        }
    };
    t.pid.iter_mut().for_each(m);
    t.flows.iter_mut().for_each(|f| m(&mut f.pid));
    t.counters.iter_mut().for_each(|c| m(&mut c.pid));
    t.process_names.iter_mut().for_each(|p| m(&mut p.0));
    t.thread_names.iter_mut().for_each(|p| m(&mut p.0));
    t.process_sort.iter_mut().for_each(|p| m(&mut p.0));
    t.thread_sort.iter_mut().for_each(|p| m(&mut p.0));
    t.process_labels.iter_mut().for_each(|p| m(&mut p.0));
}

pub fn load(inputs: &[String], opts: &LoadOptions) -> Result<Trace> {
    if inputs.is_empty() {
        return Err(Error::Config("no input given".into()));
    }
    let mut files: Vec<String> = Vec::new();
    // raw files found in a directory: one its process never started writing may be skipped
    let mut in_dir: Vec<bool> = Vec::new();
    let mut seen: HashMap<(u64, u64), String> = HashMap::new();
    let mut repeated: Vec<String> = Vec::new();
    for i in inputs {
        let dir = Path::new(i).is_dir();
        for f in expand_input(i)? {
            // the same file named twice (`t.json ./t.json`, a file and its run directory) is read once
            if let Ok(md) = std::fs::metadata(&f) {
                use std::os::unix::fs::MetadataExt;
                if md.is_file() {
                    let name = f.display().to_string();
                    if let Some(first) = seen.get(&(md.dev(), md.ino())) {
                        repeated.push(format!("{name}: the same file as {first}; read once"));
                        continue;
                    }
                    seen.insert((md.dev(), md.ino()), name);
                }
            }
            in_dir.push(dir && f.to_string_lossy().ends_with(".tmsgpack"));
            files.push(f.display().to_string());
        }
    }
    if files.len() > u16::MAX as usize {
        return Err(Error::Config(format!("too many input files ({})", files.len())));
    }
    // Files are independent: read them in parallel (decompression + parsing dominate). With fewer
    // files than threads a gzipped file also inflates on a thread of its own while it is parsed.
    let pipeline = if files.len() < rayon::current_num_threads() {
        Pipeline::Auto
    } else {
        Pipeline::Off
    };
    let parts: Vec<Result<(Trace, Kind, Option<ProcessKey>)>> = if files.len() == 1 {
        // one file on the calling thread: handing it to rayon's pool (and waking a worker) and back
        // cost tens of microseconds, a tenth of loading a 0.1 MB trace
        vec![read_file_with(&files[0], 0, pipeline)]
    } else {
        files
            .par_iter()
            .enumerate()
            .map(|(i, f)| read_file_with(f, i as u16, pipeline))
            .collect()
    };
    let mut trace = Trace::new();
    let mut proc_of_source: Vec<u32> = Vec::new();
    let mut procs: HashMap<ProcessKey, u32> = HashMap::new();
    let mut next_proc = 0u32;
    let mut skipped: Vec<Error> = Vec::new();
    let mut pid_owners = PidOwners::default();
    // named inputs that held no events (said: `a.json b.json` where b is `[]` read as one source of
    // a's events, silently); a run directory's raw files of idle processes are not named
    let mut empty_inputs: Vec<&str> = Vec::new();
    for ((part, &in_dir), file) in parts.into_iter().zip(&in_dir).zip(&files) {
        let (t, _kind, key) = match part {
            Ok(p) => p,
            // a process killed between creating its raw file and writing its HEADER (or one still
            // starting): the others are read, and the file is named in a warning
            Err(e) if in_dir && crate::raw::is_unstarted(&e) => {
                skipped.push(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let proc = match key {
            Some(k) => *procs.entry(k).or_insert_with(|| {
                next_proc += 1;
                next_proc - 1
            }),
            None => {
                next_proc += 1;
                next_proc - 1
            }
        };
        proc_of_source.push(proc);
        if !in_dir && t.is_empty() && t.counters.is_empty() {
            empty_inputs.push(file);
        }
        // Source indices were assigned by position; `append` shifts by the sources already present.
        let mut t = t;
        for s in t.source.iter_mut() {
            *s = 0;
        }
        for f in t.flows.iter_mut() {
            f.source = 0;
        }
        let mut t = t;
        for src in t.sources.iter_mut() {
            src.process = proc;
        }
        separate_pids(&mut t, proc, &mut pid_owners);
        trace.append(t);
    }
    if trace.is_empty() {
        if let Some(e) = skipped.into_iter().next() {
            return Err(e);
        }
        return Err(match inputs {
            [one] => Error::Empty {
                path: one.clone(),
                msg: "no events in the input".into(),
            },
            _ => Error::Empty {
                path: inputs[0].clone(),
                msg: format!(
                    "no events in any of the {} inputs ({})",
                    inputs.len(),
                    inputs.join(", ")
                ),
            },
        });
    }
    finish(&mut trace, &proc_of_source, &opts.align);
    for f in empty_inputs {
        trace
            .warnings
            .push(format!("{f}: no events in this input (read with the others)"));
    }
    for e in skipped {
        trace.warnings.push(format!(
            "{e}; skipped (a process that stopped before it wrote its first records)"
        ));
    }
    trace.warnings.extend(repeated);
    Ok(trace)
}
