//! Chrome Trace Event JSON output that opens in Perfetto (and reads back through `chrome`).
//!
//! Times are written as microseconds with exactly 3 decimals relative to `baseTimeNanoseconds`
//! (like Kineto), so epoch-scale nanoseconds survive the trip through a double in the viewer.
//! Linked GPU work gets `ac2g` flow arrows from its launching call.

use crate::error::{Error, Result};
use crate::model::*;
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
    // Keep the device properties and distributed info of the first source that had them.
    for key in ["deviceProperties", "distributedInfo"] {
        if let Some(v) = t.sources.iter().flat_map(|s| s.metadata.iter()).find(|(k, _)| k == key) {
            push_json_str(&mut out, key);
            out.push_str(": ");
            out.push_str(&v.1);
            out.push_str(",\n");
        }
    }
    out.push_str("\"teller\": {\"version\": ");
    push_json_str(&mut out, crate::VERSION);
    out.push_str(", \"sources\": [");
    for (i, s) in t.sources.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str("{\"path\": ");
        push_json_str(&mut out, &s.path);
        out.push_str(", \"kind\": ");
        push_json_str(&mut out, &s.kind);
        out.push_str(", \"events\": ");
        push_i64(&mut out, s.events as i64);
        out.push('}');
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
        out.push_str(if instant {
            "{\"ph\": \"i\", \"s\": \"t\", \"cat\": "
        } else {
            "{\"ph\": \"X\", \"cat\": "
        });
        let cat = if t.cat[i] != 0 {
            t.strings.get(t.cat[i])
        } else {
            LAYER_DEFAULT_CATS[t.layer[i] as usize]
        };
        push_json_str(&mut out, cat);
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
        for (k, v) in t.args_of(i) {
            let key = t.strings.get(*k);
            if key.starts_with(teller_prefix) {
                continue;
            }
            asep(&mut out);
            push_json_str(&mut out, key);
            out.push_str(": ");
            push_arg_value(&mut out, t, v);
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
    for f in &t.flows {
        let cat = t.strings.get(f.cat);
        if cat == "ac2g" || cat == "async" {
            continue;
        }
        sep(&mut out);
        let id = (f.id & !(1 << 63)) as i64 + (1i64 << 40);
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
    for c in &t.counters {
        sep(&mut out);
        out.push_str("{\"ph\": \"C\", \"name\": ");
        push_json_str(&mut out, t.strings.get(c.name));
        out.push_str(", \"pid\": ");
        push_id(&mut out, t, c.pid);
        out.push_str(", \"ts\": ");
        push_us(&mut out, c.ts - base);
        out.push_str(", \"args\": {");
        push_json_str(&mut out, t.strings.get(c.series));
        out.push_str(": ");
        out.push_str(ryu::Buffer::new().format(c.value));
        out.push_str("}}");
    }
    out.push_str("\n]\n}\n");
    w.write_all(out.as_bytes())?;
    Ok(())
}

/// Writes the trace to `path`, gzip-compressed when the path ends in `.gz`. Writes to a temporary
/// file next to it and renames, so an existing file is never left half-written.
pub fn write_chrome_file(t: &Trace, path: &str, opts: &WriteOptions) -> Result<()> {
    let p = std::path::Path::new(path);
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        return Err(Error::NotFound {
            path: dir.display().to_string(),
        });
    }
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        p.file_name().map(|s| s.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    let tmp_s = tmp.display().to_string();
    let res = (|| -> std::io::Result<()> {
        let f = std::fs::File::create(&tmp)?;
        let mut bw = std::io::BufWriter::with_capacity(1 << 20, f);
        if path.ends_with(".gz") {
            let mut gz = flate2::write::GzEncoder::new(bw, flate2::Compression::new(4));
            write_chrome(t, &mut gz, opts)?;
            bw = gz.finish()?;
        } else {
            write_chrome(t, &mut bw, opts)?;
        }
        bw.flush()?;
        Ok(())
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&tmp_s, &e));
    }
    std::fs::rename(&tmp, p).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, &e)
    })
}
