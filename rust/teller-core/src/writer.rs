//! Chrome Trace Event JSON output that opens in Perfetto (and reads back through `chrome`).
//!
//! Times are written as microseconds with exactly 3 decimals relative to `baseTimeNanoseconds`
//! (like Kineto), so epoch-scale nanoseconds survive the trip through a double in the viewer.
//! Linked GPU work gets `ac2g` flow arrows from its launching call.

use crate::error::{Error, Result};
use crate::model::*;
use hashbrown::HashMap;
use std::io::Write;

pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    let b = s.as_bytes();
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        let esc: Option<&str> = match c {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0..=0x1f => None,
            _ => continue,
        };
        out.push_str(&s[start..i]);
        match esc {
            Some(e) => out.push_str(e),
            None => out.push_str(&format!("\\u{:04x}", c)),
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[inline]
fn push_i64(out: &mut String, v: i64) {
    out.push_str(itoa::Buffer::new().format(v));
}

/// `ns` as microseconds with 3 decimals.
#[inline]
fn push_us(out: &mut String, ns: i64) {
    let neg = ns < 0;
    let a = ns.unsigned_abs();
    if neg {
        out.push('-');
    }
    out.push_str(itoa::Buffer::new().format(a / 1000));
    let frac = (a % 1000) as u32;
    if frac != 0 {
        out.push('.');
        let d = [(frac / 100) as u8, (frac / 10 % 10) as u8, (frac % 10) as u8];
        let keep = if d[2] != 0 {
            3
        } else if d[1] != 0 {
            2
        } else {
            1
        };
        for &x in &d[..keep] {
            out.push((b'0' + x) as char);
        }
    }
}

fn push_id(out: &mut String, t: &Trace, id: i64) {
    if id >= LABEL_ID_BASE {
        if let Some(&sym) = t.id_labels.get(&id) {
            push_json_str(out, t.strings.get(sym));
            return;
        }
    }
    push_i64(out, id);
}

fn push_arg_value(out: &mut String, t: &Trace, v: &ArgValue) {
    match *v {
        ArgValue::Int(i) => push_i64(out, i),
        ArgValue::Float(f) => {
            if f.is_finite() {
                out.push_str(ryu::Buffer::new().format(f))
            } else {
                out.push_str("null")
            }
        }
        ArgValue::Bool(b) => out.push_str(if b { "true" } else { "false" }),
        ArgValue::Str(s) => push_json_str(out, t.strings.get(s)),
        ArgValue::Json(s) => out.push_str(t.strings.get(s)),
        ArgValue::Null => out.push_str("null"),
    }
}

/// Options for the Chrome writer.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// Events to mark (diagnosis culprits): they get `"teller.highlight": true` and a colour.
    pub highlight: Vec<u32>,
}

/// Whether the strings in a JSON text kept as read (a top-level key's value, already checked for
/// its grammar by the reader) are valid as written: no raw control character, only the escapes JSON
/// has. The reader is lenient there; a value that fails is left out of the written trace rather than
/// making it unreadable.
fn strings_are_strict(text: &str) -> bool {
    let b = text.as_bytes();
    let (mut i, mut in_str) = (0, false);
    while i < b.len() {
        let c = b[i];
        if !in_str {
            in_str = c == b'"';
        } else if c == b'"' {
            in_str = false;
        } else if c < 0x20 {
            return false;
        } else if c == b'\\' {
            match b.get(i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 1,
                Some(b'u') if b.len() >= i + 6 && b[i + 2..i + 6].iter().all(u8::is_ascii_hexdigit) => i += 5,
                _ => return false,
            }
        }
        i += 1;
    }
    !in_str
}

/// One `deviceProperties` list from several sources' (JSON array texts): entries deduplicated by
/// their `id` (the first source's entry wins) and sorted by it; entries without an integer `id` are
/// kept once per distinct text, after those with one. A text that is not a JSON array of objects is
/// passed through alone when it is the only one, else skipped (it cannot be merged). None when
/// nothing is left.
pub fn merge_device_properties(texts: &[&str]) -> Option<String> {
    use crate::json::{parse_int, Raw, Scanner};
    fn entries(text: &str) -> Option<Vec<(Option<i64>, &str)>> {
        let mut sc = Scanner::new(text.as_bytes());
        sc.skip_ws();
        sc.expect(b'[').ok()?;
        let mut out = Vec::new();
        sc.skip_ws();
        if sc.peek() == Some(b']') {
            return Some(out);
        }
        loop {
            sc.skip_ws();
            let Raw::Object(obj) = sc.value_raw().ok()? else {
                return None;
            };
            let mut id = None;
            let mut o = Scanner::new(obj);
            o.expect(b'{').ok()?;
            o.skip_ws();
            if o.peek() != Some(b'}') {
                loop {
                    o.skip_ws();
                    let key = o.string().ok()?;
                    o.skip_ws();
                    o.expect(b':').ok()?;
                    o.skip_ws();
                    let v = o.value_raw().ok()?;
                    if key == "id" {
                        if let Raw::Num(n) = v {
                            id = parse_int(n);
                        }
                    }
                    if !o.comma_or(b'}').ok()? {
                        break;
                    }
                }
            }
            out.push((id, std::str::from_utf8(obj).ok()?));
            if !sc.comma_or(b']').ok()? {
                break;
            }
        }
        Some(out)
    }
    if texts.len() == 1 && entries(texts[0]).is_none() {
        return Some(texts[0].to_string());
    }
    let mut by_id: Vec<(i64, &str)> = Vec::new();
    let mut no_id: Vec<&str> = Vec::new();
    for t in texts {
        for (id, obj) in entries(t).unwrap_or_default() {
            match id {
                Some(i) if !by_id.iter().any(|(j, _)| *j == i) => by_id.push((i, obj)),
                Some(_) => {}
                None if !no_id.contains(&obj) => no_id.push(obj),
                None => {}
            }
        }
    }
    if by_id.is_empty() && no_id.is_empty() {
        return None;
    }
    by_id.sort_by_key(|(i, _)| *i);
    let parts: Vec<&str> = by_id.iter().map(|(_, o)| *o).chain(no_id).collect();
    Some(format!("[{}]", parts.join(", ")))
}

/// Per source, the pids its events and flows are written under (as `push_id` writes them: a number,
/// or a label as a JSON string), sorted and unique.
fn source_pids(t: &Trace) -> Vec<Vec<String>> {
    // (a set, and the previous pair skipped: events come in runs of one process, and a sort of
    // every event's pid cost as much as writing a small trace)
    let mut seen: hashbrown::HashSet<(u16, i64)> = hashbrown::HashSet::new();
    let mut last = None;
    let pairs = (t.source.iter().zip(&t.pid)).chain(t.flows.iter().map(|f| (&f.source, &f.pid)));
    for (&s, &p) in pairs {
        if last != Some((s, p)) {
            seen.insert((s, p));
            last = Some((s, p));
        }
    }
    let mut ids: Vec<Vec<i64>> = vec![Vec::new(); t.sources.len()];
    for (s, p) in seen {
        if let Some(v) = ids.get_mut(s as usize) {
            v.push(p);
        }
    }
    ids.into_iter()
        .map(|mut v| {
            v.sort_unstable();
            v.dedup();
            v.into_iter()
                .map(|p| {
                    let mut o = String::new();
                    push_id(&mut o, t, p);
                    o
                })
                .collect()
        })
        .collect()
}

/// What a process's entry in `teller.sources` says: its (first) input's path, kind and metadata,
/// every input's path where it wrote several (`paths`: the files of one pid and start time, as
/// the collector reopens its file), the events of all, the pids its events are written under, and
/// the metadata that names its rank (a raw file's `header`, a profiler file's `distributedInfo`;
/// JSON text as strings, as `Trace.sources` gives them). Read back, a merged file's GPU tracks find their input (and rank)
/// by pid (`teller.findings.origin`). Decision: written for one source too; a single raw file's
/// header is in no other top-level key.
fn source_entry(t: &Trace, group: &[usize], pids: &[String]) -> String {
    let s = &t.sources[group[0]];
    let mut out = String::from("{\"path\": ");
    push_json_str(&mut out, &s.path);
    if group.len() > 1 {
        out.push_str(", \"paths\": [");
        for (i, &g) in group.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            push_json_str(&mut out, &t.sources[g].path);
        }
        out.push(']');
    }
    out.push_str(", \"kind\": ");
    push_json_str(&mut out, &s.kind);
    out.push_str(", \"events\": ");
    push_i64(&mut out, group.iter().map(|&g| t.sources[g].events as i64).sum());
    out.push_str(", \"pids\": [");
    out.push_str(&pids.join(", "));
    out.push_str("], \"metadata\": {");
    // (a merged file teller wrote whose entries could not be kept: its top-level distributedInfo
    // is its first input's, not every rank's)
    let merged = teller_entries(s).is_some_and(|e| e.len() > 1);
    let keep = s.metadata.iter().filter(|(k, _)| {
        matches!(
            (s.kind.as_str(), k.as_str()),
            ("raw", "header") | ("chrome", "distributedInfo")
        ) && !(merged && k == "distributedInfo")
    });
    for (i, (k, v)) in keep.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_json_str(&mut out, k);
        out.push_str(": ");
        match k.as_str() {
            "header" => push_json_str(&mut out, &header_subset(v)),
            _ => push_json_str(&mut out, v),
        }
    }
    out.push_str("}}");
    out
}

/// The keys of a raw file's header that say which process it was (`pid`, `host`, `start_ns`, and
/// `env`: the launcher's RANK, LOCAL_RANK, WORLD_SIZE, CUDA_VISIBLE_DEVICES, ...), as a JSON object.
/// Decision: not `argv`: a trace file is shared more widely than the run directory, and a command
/// line may carry a token.
fn header_subset(text: &str) -> String {
    use crate::json::Scanner;
    let mut sc = Scanner::new(text.as_bytes());
    let mut out = String::from("{");
    let mut scan = || -> Option<()> {
        sc.expect(b'{').ok()?;
        if sc.peek()? == b'}' {
            return Some(());
        }
        loop {
            let key = sc.string().ok()?;
            sc.expect(b':').ok()?;
            let start = sc.pos;
            sc.skip_value().ok()?;
            if matches!(key.as_ref(), "pid" | "host" | "start_ns" | "env") {
                if out.len() > 1 {
                    out.push_str(", ");
                }
                push_json_str(&mut out, &key);
                out.push_str(": ");
                let v = std::str::from_utf8(&sc.buf[start..sc.pos]).ok()?.trim_start();
                match key.as_ref() {
                    "env" => out.push_str(&topology_env(v)?),
                    _ => out.push_str(v),
                }
            }
            if !sc.comma_or(b'}').ok()? {
                return Some(());
            }
        }
    };
    match scan() {
        Some(()) => out + "}",
        None => "{}".to_string(),
    }
}

/// The launcher's topology variables of a header's `env` object (RANK, LOCAL_RANK, WORLD_SIZE,
/// LOCAL_WORLD_SIZE, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), not teller's own (TELLER_*: the trace
/// directory and other local paths), as a JSON object. (The keys are `teller.rawfmt.TOPOLOGY_ENV`'s
/// and the shim's `env_wanted`, without TELLER_*.)
fn topology_env(text: &str) -> Option<String> {
    use crate::json::Scanner;
    const KEYS: [&str; 6] = [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    ];
    let mut sc = Scanner::new(text.as_bytes());
    let mut out = String::from("{");
    sc.expect(b'{').ok()?;
    if sc.peek()? == b'}' {
        return Some("{}".into());
    }
    loop {
        let key = sc.string().ok()?;
        sc.expect(b':').ok()?;
        let start = sc.pos;
        sc.skip_value().ok()?;
        // (compact, as the raw reader gives the header: the same bytes where nothing is dropped)
        if KEYS.contains(&key.as_ref()) {
            if out.len() > 1 {
                out.push(',');
            }
            push_json_str(&mut out, &key);
            out.push(':');
            out.push_str(std::str::from_utf8(&sc.buf[start..sc.pos]).ok()?.trim_start());
        }
        if !sc.comma_or(b'}').ok()? {
            return Some(out + "}");
        }
    }
}

/// The `teller.sources` entries of a Chrome source teller wrote (as their JSON text), where every
/// entry lists its pids, no pid is listed twice, and each is a pid of this source as loaded; else
/// None (the source is then its own entry).
fn earlier_entries(s: &SourceInfo, pids: &[String]) -> Option<Vec<String>> {
    let entries = teller_entries(s)?;
    let mut listed: Vec<String> = Vec::new();
    for e in &entries {
        listed.extend(entry_pids(e.as_bytes())?);
    }
    let n = listed.len();
    listed.sort_unstable();
    listed.dedup();
    let fits = listed.len() == n && listed.iter().all(|p| pids.contains(p));
    (fits && !entries.is_empty() && entries.iter().all(|e| strings_are_strict(e))).then_some(entries)
}

/// The `teller.sources` entries of a Chrome source teller wrote, as their JSON text; None for
/// another source, or where they are not a list of objects.
fn teller_entries(s: &SourceInfo) -> Option<Vec<String>> {
    use crate::json::{Raw, Scanner};
    if s.kind != "chrome" {
        return None;
    }
    let text = &s.metadata.iter().find(|(k, _)| k == "teller")?.1;
    let mut sc = Scanner::new(text.as_bytes());
    let mut entries: Option<Vec<String>> = None;
    sc.expect(b'{').ok()?;
    if sc.peek()? != b'}' {
        loop {
            let key = sc.string().ok()?;
            sc.expect(b':').ok()?;
            match sc.value_raw().ok()? {
                Raw::Array(arr) if key == "sources" => entries = Some(entry_texts(arr)?),
                _ => {}
            }
            if !sc.comma_or(b'}').ok()? {
                break;
            }
        }
    }
    entries
}

/// The objects of a JSON array, as their text; None where an element is not an object.
fn entry_texts(arr: &[u8]) -> Option<Vec<String>> {
    use crate::json::{Raw, Scanner};
    let mut sc = Scanner::new(arr);
    let mut out = Vec::new();
    sc.expect(b'[').ok()?;
    if sc.peek()? == b']' {
        return Some(out);
    }
    loop {
        match sc.value_raw().ok()? {
            Raw::Object(o) => out.push(std::str::from_utf8(o).ok()?.to_string()),
            _ => return None,
        }
        if !sc.comma_or(b']').ok()? {
            return Some(out);
        }
    }
}

/// An entry's `pids` as `push_id` writes them (numbers as integers, labels as JSON strings); None
/// where it has none or one is neither.
fn entry_pids(obj: &[u8]) -> Option<Vec<String>> {
    use crate::json::{Raw, Scanner};
    let mut sc = Scanner::new(obj);
    sc.expect(b'{').ok()?;
    if sc.peek()? == b'}' {
        return None;
    }
    loop {
        let key = sc.string().ok()?;
        sc.expect(b':').ok()?;
        let v = sc.value_raw().ok()?;
        if key == "pids" {
            let Raw::Array(arr) = v else { return None };
            let mut a = Scanner::new(arr);
            let mut out = Vec::new();
            a.expect(b'[').ok()?;
            if a.peek()? == b']' {
                return Some(out);
            }
            loop {
                match a.value_raw().ok()? {
                    Raw::Num(n) => out.push(crate::json::parse_int(n)?.to_string()),
                    Raw::Str(raw, esc) => {
                        let mut o = String::new();
                        push_json_str(&mut o, &crate::json::decode_str(raw, esc).ok()?);
                        out.push(o);
                    }
                    _ => return None,
                }
                if !a.comma_or(b']').ok()? {
                    return Some(out);
                }
            }
        }
        if !sc.comma_or(b'}').ok()? {
            return None;
        }
    }
}

/// The whole trace as Chrome JSON, streamed to `w` in chunks.
pub fn write_chrome<W: Write>(t: &Trace, w: &mut W, opts: &WriteOptions) -> std::io::Result<()> {
    let n = t.len();
    let min_ts = t.ts.iter().copied().min().unwrap_or(0);
    let base: i64 = if min_ts > 0 {
        (min_ts / 1_000_000_000) * 1_000_000_000
    } else {
        0
    };
    let mut out = String::with_capacity(1 << 20);
    out.push_str("{\n\"schemaVersion\": 1,\n\"displayTimeUnit\": \"ms\",\n\"baseTimeNanoseconds\": ");
    push_i64(&mut out, base);
    out.push_str(",\n");
    // The device properties of every source, merged by device id (each process of a job lists
    // the GPUs it sees); the distributed info of the first source that had it.
    let devs: Vec<&str> = t
        .sources
        .iter()
        .flat_map(|s| s.metadata.iter())
        .filter(|(k, _)| k == "deviceProperties")
        .map(|(_, v)| v.as_str())
        .collect();
    if let Some(v) = merge_device_properties(&devs).filter(|v| strings_are_strict(v)) {
        out.push_str("\"deviceProperties\": ");
        out.push_str(&v);
        out.push_str(",\n");
    }
    if let Some(v) = t
        .sources
        .iter()
        .flat_map(|s| s.metadata.iter())
        .find(|(k, v)| k == "distributedInfo" && strings_are_strict(v))
    {
        out.push_str("\"distributedInfo\": ");
        out.push_str(&v.1);
        out.push_str(",\n");
    }
    // The other top-level keys of the Chrome inputs (Kineto's traceName, cupti_version,
    // cuda_runtime_version, ...; validated JSON text as read), the first input's where several
    // have one: written back, as a conversion keeps them.
    let mut seen: Vec<&str> = Vec::new();
    for s in t.sources.iter().filter(|s| s.kind == "chrome") {
        for (k, v) in &s.metadata {
            let ours = matches!(
                k.as_str(),
                "traceEvents"
                    | "deviceProperties"
                    | "distributedInfo"
                    | "schemaVersion"
                    | "displayTimeUnit"
                    | "baseTimeNanoseconds"
                    | "teller"
            );
            if ours || v.is_empty() || seen.contains(&k.as_str()) || !strings_are_strict(v) {
                continue;
            }
            seen.push(k);
            push_json_str(&mut out, k);
            out.push_str(": ");
            out.push_str(v);
            out.push_str(",\n");
        }
    }
    out.push_str("\"teller\": {\"version\": ");
    push_json_str(&mut out, crate::VERSION);
    out.push_str(", \"sources\": [");
    let pids = source_pids(t);
    let mut k = 0;
    // one entry per process (the raw files one process wrote share its pids), in input order
    let mut procs: Vec<u32> = Vec::new();
    for s in &t.sources {
        if !procs.contains(&s.process) {
            procs.push(s.process);
        }
    }
    for p in procs {
        let group: Vec<usize> = (0..t.sources.len()).filter(|&i| t.sources[i].process == p).collect();
        let mut gp: Vec<String> = Vec::new();
        for &i in &group {
            for q in &pids[i] {
                if !gp.contains(q) {
                    gp.push(q.clone());
                }
            }
        }
        let first = &t.sources[group[0]];
        // a merged file teller wrote, read back: its inputs' entries again, where its pids are
        // still theirs (not moved apart from another input's on this load)
        let entries = match group.len() {
            1 => earlier_entries(first, &gp),
            _ => None,
        }
        .unwrap_or_else(|| vec![source_entry(t, &group, &gp)]);
        for e in entries {
            if k > 0 {
                out.push_str(", ");
            }
            out.push_str(&e);
            k += 1;
        }
    }
    out.push_str("], \"steps\": ");
    push_i64(&mut out, t.steps.len() as i64);
    out.push_str(", \"warnings\": [");
    for (i, s) in t.warnings.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_json_str(&mut out, s);
    }
    out.push_str("]},\n\"traceEvents\": [\n");
    let mut first = true;
    let mut sep = |out: &mut String| {
        if first {
            first = false;
        } else {
            out.push_str(",\n");
        }
    };
    for &(pid, name) in &t.process_names {
        sep(&mut out);
        out.push_str("{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": ");
        push_id(&mut out, t, pid);
        out.push_str(", \"tid\": 0, \"args\": {\"name\": ");
        push_json_str(&mut out, t.strings.get(name));
        out.push_str("}}");
    }
    for &(pid, tid, name) in &t.thread_names {
        sep(&mut out);
        out.push_str("{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": ");
        push_id(&mut out, t, pid);
        out.push_str(", \"tid\": ");
        push_id(&mut out, t, tid);
        out.push_str(", \"args\": {\"name\": ");
        push_json_str(&mut out, t.strings.get(name));
        out.push_str("}}");
    }
    for &(pid, l) in &t.process_labels {
        sep(&mut out);
        out.push_str("{\"ph\": \"M\", \"name\": \"process_labels\", \"pid\": ");
        push_id(&mut out, t, pid);
        out.push_str(", \"tid\": 0, \"args\": {\"labels\": ");
        push_json_str(&mut out, t.strings.get(l));
        out.push_str("}}");
    }
    for &(pid, idx) in &t.process_sort {
        sep(&mut out);
        out.push_str("{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": ");
        push_id(&mut out, t, pid);
        out.push_str(", \"tid\": 0, \"args\": {\"sort_index\": ");
        push_i64(&mut out, idx);
        out.push_str("}}");
    }
    for &(pid, tid, idx) in &t.thread_sort {
        sep(&mut out);
        out.push_str("{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": ");
        push_id(&mut out, t, pid);
        out.push_str(", \"tid\": ");
        push_id(&mut out, t, tid);
        out.push_str(", \"args\": {\"sort_index\": ");
        push_i64(&mut out, idx);
        out.push_str("}}");
    }
    let mut highlight = vec![false; n];
    for &h in &opts.highlight {
        if (h as usize) < n {
            highlight[h as usize] = true;
        }
    }
    let teller_prefix = "teller.";
    for i in 0..n {
        sep(&mut out);
        let instant = t.flags[i] & flags::INSTANT != 0;
        out.push_str(if !instant {
            "{\"ph\": \"X\""
        } else if t.flags[i] & flags::SCOPE_GLOBAL != 0 {
            "{\"ph\": \"i\", \"s\": \"g\""
        } else if t.flags[i] & flags::SCOPE_PROCESS != 0 {
            "{\"ph\": \"i\", \"s\": \"p\""
        } else {
            "{\"ph\": \"i\", \"s\": \"t\""
        });
        // An event read without a category is written without one where the reader's default for
        // its phase gives its layer back (a complete event: other; an instant: marker), so it reads
        // back as it was (Kineto's "Iteration Start" instants came back with cat "marker"); else the
        // layer's own category keeps the layer.
        let default_layer = if instant { Layer::Marker } else { Layer::Other } as u8;
        let cat = if t.cat[i] != 0 {
            Some(t.strings.get(t.cat[i]))
        } else if t.layer[i] == default_layer {
            None
        } else {
            Some(LAYER_DEFAULT_CATS[t.layer[i] as usize])
        };
        if let Some(cat) = cat {
            out.push_str(", \"cat\": ");
            push_json_str(&mut out, cat);
        }
        out.push_str(", \"name\": ");
        push_json_str(&mut out, t.strings.get(t.name[i]));
        out.push_str(", \"pid\": ");
        push_id(&mut out, t, t.pid[i]);
        out.push_str(", \"tid\": ");
        push_id(&mut out, t, t.tid[i]);
        out.push_str(", \"ts\": ");
        push_us(&mut out, t.ts[i] - base);
        if !instant {
            out.push_str(", \"dur\": ");
            push_us(&mut out, t.dur[i]);
        }
        if highlight[i] {
            out.push_str(", \"cname\": \"terrible\"");
        }
        out.push_str(", \"args\": {");
        let mut a_first = true;
        let mut asep = |out: &mut String| {
            if a_first {
                a_first = false;
            } else {
                out.push_str(", ");
            }
        };
        if t.ext[i] != 0 {
            asep(&mut out);
            out.push_str("\"External id\": ");
            push_i64(&mut out, t.ext[i] as i64);
        }
        if t.corr[i] != 0 {
            asep(&mut out);
            out.push_str("\"correlation\": ");
            push_i64(&mut out, t.corr[i] as i64);
        }
        let mut has_device = false;
        for (k, v) in t.args_of(i) {
            let key = t.strings.get(*k);
            if key.starts_with(teller_prefix) {
                continue;
            }
            has_device |= key == "device";
            asep(&mut out);
            push_json_str(&mut out, key);
            out.push_str(": ");
            push_arg_value(&mut out, t, v);
        }
        if !has_device && t.device[i] >= 0 && (!t.layer_of(i).on_gpu() || t.pid[i] != t.device[i] as i64) {
            // (a sync record's GPU, and a GPU activity whose pid is not its device (a pid moved
            // apart from another process's, load::separate_pids): a column, read back from
            // args.device, where the reader would take the pid)
            asep(&mut out);
            out.push_str("\"device\": ");
            push_i64(&mut out, t.device[i] as i64);
        }
        if !t.step.is_empty() && t.step[i] >= 0 {
            asep(&mut out);
            out.push_str("\"teller.step\": ");
            push_i64(&mut out, t.step[i] as i64);
        }
        if t.flags[i] & flags::UNFINISHED != 0 {
            asep(&mut out);
            out.push_str("\"teller.unfinished\": true");
        }
        if highlight[i] {
            asep(&mut out);
            out.push_str("\"teller.highlight\": true");
        }
        out.push_str("}}");
        if out.len() > (1 << 20) {
            w.write_all(out.as_bytes())?;
            out.clear();
        }
    }
    // Flows: launch -> GPU work arrows (fresh ids, one pair per linked activity), then the original
    // non-correlation flows (fwdbwd and the like) as they were.
    let flow = |out: &mut String, ph: char, cat: &str, name: &str, id: i64, pid: i64, tid: i64, ts: i64, bp_e: bool| {
        out.push_str("{\"ph\": \"");
        out.push(ph);
        out.push_str("\", \"cat\": ");
        push_json_str(out, cat);
        out.push_str(", \"name\": ");
        push_json_str(out, name);
        out.push_str(", \"id\": ");
        push_i64(out, id);
        out.push_str(", \"pid\": ");
        push_id(out, t, pid);
        out.push_str(", \"tid\": ");
        push_id(out, t, tid);
        out.push_str(", \"ts\": ");
        push_us(out, ts - base);
        if bp_e {
            out.push_str(", \"bp\": \"e\"");
        }
        out.push('}');
    };
    let mut flow_id: i64 = 1;
    for i in 0..t.link.len() {
        let j = t.link[i];
        if j < 0 {
            continue;
        }
        let j = j as usize;
        sep(&mut out);
        flow(
            &mut out, 's', "ac2g", "ac2g", flow_id, t.pid[j], t.tid[j], t.ts[j], false,
        );
        out.push_str(",\n");
        flow(
            &mut out, 'f', "ac2g", "ac2g", flow_id, t.pid[i], t.tid[i], t.ts[i], true,
        );
        flow_id += 1;
        if out.len() > (1 << 20) {
            w.write_all(out.as_bytes())?;
            out.clear();
        }
    }
    // Other flows get new ids after the ac2g ones, one per (source, id): a flow id pairs events
    // within its file only (two ranks' `fwdbwd` 3 are two flows), a string id is an index into its
    // file's strings, and a negative one is a u64 near 2^64; written as they were, they collided.
    let mut flow_ids: HashMap<(u16, u64), i64> = HashMap::new();
    for f in &t.flows {
        let cat = t.strings.get(f.cat);
        if cat == "ac2g" || cat == "async" {
            continue;
        }
        sep(&mut out);
        let next = flow_id + flow_ids.len() as i64;
        let id = *flow_ids.entry((f.source, f.id)).or_insert(next);
        flow(
            &mut out,
            f.phase as char,
            cat,
            t.strings.get(f.name),
            id,
            f.pid,
            f.tid,
            f.ts,
            f.binding_enclosing,
        );
    }
    // The samples of one counter at one time (the series of one `C` event, read one after another)
    // go back into one event: chrome://tracing takes a counter's series from its first event and
    // draws a series an event lacks as 0.
    let mut k = 0;
    while k < t.counters.len() {
        let c = &t.counters[k];
        let mut end = k + 1;
        while end < t.counters.len() && {
            let d = &t.counters[end];
            (d.name, d.pid, d.ts) == (c.name, c.pid, c.ts) && !t.counters[k..end].iter().any(|e| e.series == d.series)
        } {
            end += 1;
        }
        sep(&mut out);
        out.push_str("{\"ph\": \"C\", \"name\": ");
        push_json_str(&mut out, t.strings.get(c.name));
        out.push_str(", \"pid\": ");
        push_id(&mut out, t, c.pid);
        out.push_str(", \"ts\": ");
        push_us(&mut out, c.ts - base);
        out.push_str(", \"args\": {");
        for (j, d) in t.counters[k..end].iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            push_json_str(&mut out, t.strings.get(d.series));
            out.push_str(": ");
            // (JSON has no NaN or infinity: a raw COUNTER's may be one; written null, read back as no
            // sample)
            push_arg_value(&mut out, t, &ArgValue::Float(d.value));
        }
        out.push_str("}}");
        k = end;
    }
    write_culprit_tracks(&mut out, t, &highlight, base, &mut sep);
    out.push_str("\n]\n}\n");
    w.write_all(out.as_bytes())?;
    Ok(())
}

/// The process that holds copies of the highlighted events, and the category of the copies (the
/// Chrome reader skips them: a highlighted trace reads back as the trace it was written from).
pub const CULPRIT_PROCESS: &str = "teller: culprits";
pub const CULPRIT_CAT: &str = "teller.culprit";

/// Highlighted events, copied onto a process of their own, one track per track they come from (so
/// their nesting stays valid), sorted first: in Perfetto they are the first thing seen, aligned in
/// time with the real tracks. Decision: copies, not a colour alone, because Perfetto ignores
/// `cname` (only the legacy chrome://tracing viewer colours by it), and not renamed originals, which
/// would no longer read back under their own names.
fn write_culprit_tracks(out: &mut String, t: &Trace, highlight: &[bool], base: i64, sep: &mut impl FnMut(&mut String)) {
    let mut tracks: HashMap<(i64, i64), i64> = HashMap::new();
    let mut order: Vec<(i64, i64)> = Vec::new();
    for i in (0..t.len()).filter(|&i| highlight[i]) {
        let key = (t.pid[i], t.tid[i]);
        if !tracks.contains_key(&key) {
            tracks.insert(key, order.len() as i64 + 1);
            order.push(key);
        }
    }
    if order.is_empty() {
        return;
    }
    let pname: HashMap<i64, &str> = t.process_names.iter().map(|&(p, n)| (p, t.strings.get(n))).collect();
    let tname: HashMap<(i64, i64), &str> = t
        .thread_names
        .iter()
        .map(|&(p, th, n)| ((p, th), t.strings.get(n)))
        .collect();
    let id_text = |id: i64| -> String {
        if id >= LABEL_ID_BASE {
            if let Some(&sym) = t.id_labels.get(&id) {
                return t.strings.get(sym).to_string();
            }
        }
        id.to_string()
    };
    sep(out);
    out.push_str("{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": ");
    push_json_str(out, CULPRIT_PROCESS);
    out.push_str(", \"tid\": 0, \"args\": {\"name\": ");
    push_json_str(out, CULPRIT_PROCESS);
    out.push_str("}},\n{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": ");
    push_json_str(out, CULPRIT_PROCESS);
    out.push_str(", \"tid\": 0, \"args\": {\"sort_index\": -1000000}}");
    for (k, &(pid, tid)) in order.iter().enumerate() {
        let p = pname
            .get(&pid)
            .map_or_else(|| id_text(pid), |n| format!("{n} {}", id_text(pid)));
        let th = tname.get(&(pid, tid)).map_or_else(|| id_text(tid), |n| n.to_string());
        sep(out);
        out.push_str("{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": ");
        push_json_str(out, CULPRIT_PROCESS);
        out.push_str(", \"tid\": ");
        push_i64(out, k as i64 + 1);
        out.push_str(", \"args\": {\"name\": ");
        push_json_str(out, &format!("{p} / {th}"));
        out.push_str("}}");
    }
    for i in (0..t.len()).filter(|&i| highlight[i]) {
        sep(out);
        let instant = t.flags[i] & flags::INSTANT != 0;
        out.push_str(if instant {
            "{\"ph\": \"i\", \"s\": \"t\", \"cat\": "
        } else {
            "{\"ph\": \"X\", \"cat\": "
        });
        push_json_str(out, CULPRIT_CAT);
        out.push_str(", \"name\": ");
        push_json_str(out, t.strings.get(t.name[i]));
        out.push_str(", \"pid\": ");
        push_json_str(out, CULPRIT_PROCESS);
        out.push_str(", \"tid\": ");
        push_i64(out, tracks[&(t.pid[i], t.tid[i])]);
        out.push_str(", \"ts\": ");
        push_us(out, t.ts[i] - base);
        if !instant {
            out.push_str(", \"dur\": ");
            push_us(out, t.dur[i]);
        }
        out.push_str(", \"cname\": \"terrible\", \"args\": {\"teller.event\": ");
        push_i64(out, i as i64);
        out.push_str("}}");
    }
}

/// What a write through `p` lands in: the file at the end of its symbolic links (relative targets
/// from the link's directory, at most 40 hops), or one of this process's open descriptors where the
/// way passes through a descriptor alias (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`): its
/// "target" is then not a name to replace but a descriptor to write to, at its own position.
/// `alias` is also set for another process's descriptor (`/proc/PID/fd/N`), which has no position
/// of ours to share.
struct Target {
    path: std::path::PathBuf,
    fd: Option<i32>,
    alias: bool,
}

fn own_fd(p: &std::path::Path) -> Option<i32> {
    let s = p.to_str()?;
    match s {
        "/dev/stdin" => return Some(0),
        "/dev/stdout" => return Some(1),
        "/dev/stderr" => return Some(2),
        _ => {}
    }
    let n = s
        .strip_prefix("/dev/fd/")
        .or_else(|| s.strip_prefix("/proc/self/fd/"))
        .or_else(|| {
            let rest = s.strip_prefix("/proc/")?;
            let (pid, n) = rest.split_once("/fd/")?;
            (pid.parse::<u32>().ok()? == std::process::id()).then_some(n)
        })?;
    n.parse().ok()
}

fn resolve_links(p: &std::path::Path) -> Target {
    let mut cur = p.to_path_buf();
    let is_alias = |c: &std::path::Path| c.starts_with("/proc") || c.starts_with("/dev/fd");
    let mut t = Target {
        path: cur.clone(),
        fd: own_fd(&cur),
        alias: is_alias(&cur),
    };
    for _ in 0..40 {
        if t.fd.is_some() {
            break;
        }
        match std::fs::symlink_metadata(&cur) {
            Ok(md) if md.file_type().is_symlink() => match std::fs::read_link(&cur) {
                Ok(l) if l.is_absolute() => cur = l,
                Ok(l) => cur = cur.parent().unwrap_or(std::path::Path::new("")).join(l),
                Err(_) => break,
            },
            _ => break,
        }
        t.fd = own_fd(&cur);
        t.alias |= is_alias(&cur);
    }
    t.path = cur;
    t
}

fn write_error(path: &str, what: &str, e: &std::io::Error) -> Error {
    Error::Io {
        path: path.to_string(),
        msg: format!("cannot write it: {what}{e}"),
        errno: e.raw_os_error(),
    }
}

fn write_to(t: &Trace, f: std::fs::File, gz: bool, opts: &WriteOptions) -> std::io::Result<()> {
    let mut bw = std::io::BufWriter::with_capacity(1 << 20, f);
    if gz {
        let mut z = flate2::write::GzEncoder::new(bw, flate2::Compression::new(4));
        write_chrome(t, &mut z, opts)?;
        bw = z.finish()?;
    } else {
        write_chrome(t, &mut bw, opts)?;
    }
    bw.flush()
}

/// Writes the trace to `path`, gzip-compressed when the path ends in `.gz`. A regular file is written
/// to a temporary file beside it and renamed over it, so an existing file is never left half-written;
/// it keeps the old file's permissions. A symbolic link is written through (its target replaced). A
/// device or FIFO (`/dev/null`, a named pipe) is written in place: a rename would replace the node
/// with a regular file. One of this process's descriptors (`/dev/stdout`, `/dev/fd/N`) is written
/// through a duplicate that shares its position.
pub fn write_chrome_file(t: &Trace, path: &str, opts: &WriteOptions) -> Result<()> {
    let gz = path.to_ascii_lowercase().ends_with(".gz"); // (`X.JSON.GZ` too)
    let Target {
        path: target,
        fd: own,
        alias,
    } = resolve_links(std::path::Path::new(path));
    if let Some(n) = own {
        // one of our own descriptors (`-o /dev/stdout`): written through a duplicate, which shares
        // its position, so that what the program prints next follows the trace instead of
        // overwriting it (a reopened path would have a position of its own, at 0)
        // SAFETY: `n` is only borrowed for the duplicate; a closed descriptor fails the dup (EBADF).
        let dup = unsafe { std::os::fd::BorrowedFd::borrow_raw(n) }.try_clone_to_owned();
        let f = std::fs::File::from(dup.map_err(|e| write_error(path, "", &e))?);
        return write_to(t, f, gz, opts).map_err(|e| write_error(path, "", &e));
    }
    let existing = std::fs::metadata(path).ok();
    if let Some(md) = &existing {
        if md.is_dir() {
            return Err(Error::Io {
                path: path.to_string(),
                msg: "is a directory (name a file to write)".into(),
                errno: Some(21), // EISDIR
            });
        }
        if !md.is_file() || alias {
            // (a device or pipe; or another process's descriptor: appended to, as its `>>` would)
            let f = std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(|e| write_error(path, "", &e))?;
            return write_to(t, f, gz, opts).map_err(|e| write_error(path, "", &e));
        }
    }
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        // the output's directory is missing, or something in its path is a file: said which
        let blocker = dir.ancestors().find(|a| a.exists() && !a.as_os_str().is_empty());
        return Err(match blocker {
            Some(f) if !f.is_dir() => Error::Io {
                path: f.display().to_string(),
                msg: "exists and is not a directory (the output's directory lies under it)".into(),
                errno: Some(20), // ENOTDIR
            },
            _ => Error::NotFound {
                path: dir.display().to_string(),
            },
        });
    }
    // (pid and a per-process count: threads of one process write at once, the GIL released)
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        target.file_name().map(|s| s.to_string_lossy()).unwrap_or_default(),
        std::process::id(),
        WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let f = std::fs::File::create(&tmp).map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!("its directory {} is not writable (", dir.display())
        } else {
            format!("cannot create a temporary file in {} (", dir.display())
        };
        let mut err = write_error(path, &what, &e);
        if let Error::Io { msg, .. } = &mut err {
            msg.push(')');
        }
        err
    })?;
    let res = (|| -> std::io::Result<()> {
        if let Some(md) = &existing {
            // (a file of the user's own: kept as private, or as shared, as it was)
            f.set_permissions(md.permissions())?;
        }
        write_to(t, f, gz, opts)
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(write_error(path, "", &e));
    }
    std::fs::rename(&tmp, &target).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        write_error(path, "", &e)
    })
}

#[cfg(test)]
mod device_tests {
    use super::{merge_device_properties as merge, strings_are_strict};

    #[test]
    fn strict_strings_are_told_from_what_json_refuses() {
        for ok in [r#""a\u00e9\n\"b\\""#, r#"{"k": ["x", 1, null]}"#, "3", r#""""#] {
            assert!(strings_are_strict(ok), "{ok}");
        }
        for bad in [r#""a\qb""#, "\"a\tb\"", r#""a\u12g4""#, r#""a\u12""#, r#""open"#] {
            assert!(!strings_are_strict(bad), "{bad}");
        }
    }

    #[test]
    fn merges_by_id_and_keeps_what_it_cannot_merge() {
        assert_eq!(merge(&[]), None);
        assert_eq!(merge(&["[]"]), None);
        assert_eq!(
            merge(&[
                r#"[{"id": 1, "name": "b"}, {"id": 0, "name": "a"}]"#,
                r#"[{"name": "x", "id": 1}]"#
            ])
            .as_deref(),
            Some(r#"[{"id": 0, "name": "a"}, {"id": 1, "name": "b"}]"#)
        );
        // entries without an integer id: once per distinct text, after the numbered ones
        assert_eq!(
            merge(&[r#"[{"name": "n"}, {"id": 3}]"#, r#"[{"name": "n"}, {"id": "7"}]"#]).as_deref(),
            Some(r#"[{"id": 3}, {"name": "n"}, {"id": "7"}]"#)
        );
        // a single source's value that is not a list of objects passes through as it was
        assert_eq!(merge(&[r#"{"weird": true}"#]).as_deref(), Some(r#"{"weird": true}"#));
        // several sources: the one that cannot be merged is skipped
        assert_eq!(
            merge(&[r#"{"weird": true}"#, r#"[{"id": 2}]"#]).as_deref(),
            Some(r#"[{"id": 2}]"#)
        );
    }
}

#[cfg(test)]
mod source_entry_tests {
    use super::{earlier_entries, header_subset, source_entry};
    use crate::model::SourceInfo;

    fn chrome(teller: &str) -> SourceInfo {
        SourceInfo {
            path: "merged.json".into(),
            process: 0,
            kind: "chrome".into(),
            base_ns: 0,
            pid: None,
            host: None,
            producer: None,
            events: 4,
            metadata: vec![("teller".into(), teller.into())],
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    const TWO: &str = r#"{"version": "0.1.0", "sources": [
        {"path": "a.tmsgpack", "kind": "raw", "events": 2, "pids": [0, 7], "metadata": {}},
        {"path": "b.tmsgpack", "kind": "raw", "events": 2, "pids": [10000000, "Spans"], "metadata": {}}],
        "steps": 1}"#;

    #[test]
    fn a_merged_files_entries_are_kept_while_its_pids_are_its_own() {
        let s = chrome(TWO);
        let e = earlier_entries(&s, &ids(&["0", "7", "10000000", "\"Spans\"", "10000007"])).expect("kept");
        assert_eq!(e.len(), 2);
        assert!(e[1].starts_with(r#"{"path": "b.tmsgpack""#), "{}", e[1]);
        // a pid moved on this load (another input had it): the file is its own entry
        assert!(earlier_entries(&s, &ids(&["0", "7", "20000000", "\"Spans\""])).is_none());
        // a pid listed by two entries, an entry without pids, not teller's header: no
        let twice = TWO.replace("[10000000,", "[7,");
        assert!(earlier_entries(&chrome(&twice), &ids(&["0", "7", "\"Spans\""])).is_none());
        let bare = TWO.replace(r#""pids": [0, 7], "#, "");
        assert!(earlier_entries(&chrome(&bare), &ids(&["0", "7", "10000000", "\"Spans\""])).is_none());
        assert!(earlier_entries(&chrome("[1, 2]"), &ids(&["0"])).is_none());
        assert!(earlier_entries(&chrome("{\"sources\": [1]}"), &ids(&["0"])).is_none());
        let mut raw = chrome(TWO);
        raw.kind = "raw".into();
        assert!(earlier_entries(&raw, &ids(&["0", "7", "10000000", "\"Spans\""])).is_none());
    }

    #[test]
    fn an_entry_names_its_pids_and_rank_but_not_the_command_line() {
        let h = r#"{"pid":7,"ppid":1,"host":"h","argv":["python","--token","s3cret"],"start_ns":1,"env":{"RANK":"1"}}"#;
        assert_eq!(
            header_subset(h),
            r#"{"pid": 7, "host": "h", "start_ns": 1, "env": {"RANK":"1"}}"#
        );
        assert_eq!(header_subset("not json"), "{}");
        let s = SourceInfo {
            path: "r1/a.tmsgpack".into(),
            process: 0,
            kind: "raw".into(),
            base_ns: 0,
            pid: Some(7),
            host: None,
            producer: None,
            events: 3,
            metadata: vec![("header".into(), h.into()), ("other".into(), "1".into())],
        };
        let mut t = crate::model::Trace::new();
        t.sources.push(s.clone());
        let e = source_entry(&t, &[0], &ids(&["0", "7"]));
        assert!(
            e.contains(r#""pids": [0, 7]"#) && e.contains(r#"\"RANK\":\"1\""#),
            "{e}"
        );
        assert!(
            !e.contains("s3cret") && !e.contains("other") && !e.contains("paths"),
            "{e}"
        );
        // a second file of the process: one entry, both paths, the events of both
        let mut s2 = s.clone();
        s2.path = "r1/b.tmsgpack".into();
        s2.events = 4;
        t.sources.push(s2);
        let e = source_entry(&t, &[0, 1], &ids(&["0", "7"]));
        assert!(
            e.contains(r#""paths": ["r1/a.tmsgpack", "r1/b.tmsgpack"]"#) && e.contains(r#""events": 7"#),
            "{e}"
        );
        // a merged file whose entries could not be kept: not its first input's rank for all
        let mut m = chrome(TWO);
        m.metadata.push(("distributedInfo".into(), r#"{"rank": 0}"#.into()));
        let mut t = crate::model::Trace::new();
        t.sources.push(m.clone());
        assert!(!source_entry(&t, &[0], &ids(&["0"])).contains("rank"));
        // (one input: its rank is the file's)
        m.metadata[0].1 = r#"{"sources": [{"path": "a", "pids": [0]}]}"#.into();
        let mut t = crate::model::Trace::new();
        t.sources.push(m);
        assert!(source_entry(&t, &[0], &ids(&["0"])).contains("rank"));
    }

    #[test]
    fn a_header_keeps_the_topology_not_tellers_own_variables() {
        let h = r#"{"pid": 7, "env": {"RANK": "1", "TELLER_TRACE_DIR": "/home/u/run", "CUDA_VISIBLE_DEVICES": "0,1"}}"#;
        assert_eq!(
            header_subset(h),
            r#"{"pid": 7, "env": {"RANK":"1","CUDA_VISIBLE_DEVICES":"0,1"}}"#
        );
        assert_eq!(header_subset(r#"{"env": {}}"#), r#"{"env": {}}"#);
    }
}
