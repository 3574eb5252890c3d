//! Reader of teller's raw MessagePack event stream (`docs/trace-format.md`).
//!
//! Decision: a tiny hand-written MessagePack decoder over the byte slice instead of a serde-based
//! one: records are positional arrays, so a pull decoder is both simpler and faster, it tells a
//! *truncated* record (ran out of bytes: warning, keep everything before it) from a *corrupt* one
//! (bad type byte, wrong field type: error with the byte offset), and it skips zero padding.

use crate::error::{Error, Result};
use crate::model::*;
use hashbrown::HashMap;

pub const MAGIC: &str = "teller-trace";
pub const FORMAT_VERSION: i64 = 1;
/// A run of this many zero bytes ends a torn record's leftovers (see `read_raw`).
const TORN_RESYNC_ZEROS: usize = 16;

/// A decoded MessagePack value (borrowing strings from the buffer).
#[derive(Debug, Clone, PartialEq)]
pub enum MVal<'a> {
    Nil,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    // (borrowed from the file; owned only where its bytes were not UTF-8 and were read lossily)
    Str(std::borrow::Cow<'a, str>),
    Bin(&'a [u8]),
    Array(Vec<MVal<'a>>),
    Map(Vec<(MVal<'a>, MVal<'a>)>),
    Ext(i8, &'a [u8]),
}

#[derive(Debug)]
enum DErr {
    /// Ran past the end of the buffer.
    Eof,
    /// Malformed content at this offset.
    Bad(usize, String),
}

struct Dec<'a> {
    b: &'a [u8],
    p: usize,
    /// Strings whose bytes were not UTF-8, read with U+FFFD in place of the bad bytes: one file's
    /// stray argv byte or NVTX message must not cost the whole run its trace (said as a warning).
    lossy: usize,
}

impl<'a> Dec<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], DErr> {
        if self.p + n > self.b.len() {
            return Err(DErr::Eof);
        }
        let s = &self.b[self.p..self.p + n];
        self.p += n;
        Ok(s)
    }
    #[inline]
    fn u8(&mut self) -> std::result::Result<u8, DErr> {
        Ok(self.take(1)?[0])
    }
    #[inline]
    fn be(&mut self, n: usize) -> std::result::Result<u64, DErr> {
        let s = self.take(n)?;
        // (fixed-size loads rather than a byte loop)
        Ok(match n {
            1 => s[0] as u64,
            2 => u16::from_be_bytes([s[0], s[1]]) as u64,
            4 => u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as u64,
            8 => <[u8; 8]>::try_from(s).map_or(0, u64::from_be_bytes),
            _ => s.iter().fold(0u64, |v, &c| (v << 8) | c as u64),
        })
    }
    fn value(&mut self, depth: usize) -> std::result::Result<MVal<'a>, DErr> {
        if depth > 64 {
            return Err(DErr::Bad(self.p, "nesting too deep".into()));
        }
        let at = self.p;
        let t = self.u8()?;
        Ok(match t {
            0x00..=0x7f => MVal::Int(t as i64),
            0xe0..=0xff => MVal::Int((t as i8) as i64),
            0x80..=0x8f => self.map((t & 0x0f) as usize, depth)?,
            0x90..=0x9f => self.array((t & 0x0f) as usize, depth)?,
            0xa0..=0xbf => self.str((t & 0x1f) as usize)?,
            0xc0 => MVal::Nil,
            0xc2 => MVal::Bool(false),
            0xc3 => MVal::Bool(true),
            0xc4 => {
                let n = self.be(1)? as usize;
                MVal::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = self.be(2)? as usize;
                MVal::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.be(4)? as usize;
                MVal::Bin(self.take(n)?)
            }
            0xc7..=0xc9 => {
                let n = self.be([1, 2, 4][(t - 0xc7) as usize])? as usize;
                let ty = self.u8()? as i8;
                MVal::Ext(ty, self.take(n)?)
            }
            0xca => MVal::Float(f32::from_bits(self.be(4)? as u32) as f64),
            0xcb => MVal::Float(f64::from_bits(self.be(8)?)),
            0xcc => MVal::Int(self.be(1)? as i64),
            0xcd => MVal::Int(self.be(2)? as i64),
            0xce => MVal::Int(self.be(4)? as i64),
            0xcf => {
                let v = self.be(8)?;
                if v <= i64::MAX as u64 {
                    MVal::Int(v as i64)
                } else {
                    MVal::UInt(v)
                }
            }
            0xd0 => MVal::Int(self.be(1)? as u8 as i8 as i64),
            0xd1 => MVal::Int(self.be(2)? as u16 as i16 as i64),
            0xd2 => MVal::Int(self.be(4)? as u32 as i32 as i64),
            0xd3 => MVal::Int(self.be(8)? as i64),
            0xd4..=0xd8 => {
                let n = [1, 2, 4, 8, 16][(t - 0xd4) as usize];
                let ty = self.u8()? as i8;
                MVal::Ext(ty, self.take(n)?)
            }
            0xd9 => {
                let n = self.be(1)? as usize;
                self.str(n)?
            }
            0xda => {
                let n = self.be(2)? as usize;
                self.str(n)?
            }
            0xdb => {
                let n = self.be(4)? as usize;
                self.str(n)?
            }
            0xdc => {
                let n = self.be(2)? as usize;
                self.array(n, depth)?
            }
            0xdd => {
                let n = self.be(4)? as usize;
                self.array(n, depth)?
            }
            0xde => {
                let n = self.be(2)? as usize;
                self.map(n, depth)?
            }
            0xdf => {
                let n = self.be(4)? as usize;
                self.map(n, depth)?
            }
            0xc1 => return Err(DErr::Bad(at, "invalid MessagePack byte 0xc1".into())),
        })
    }
    /// The next value as a record: an array's elements decoded into `out` (cleared first) without
    /// an allocation of its own; `Ok(false)` for a value that is not an array (consumed).
    fn record(&mut self, out: &mut Vec<MVal<'a>>) -> std::result::Result<bool, DErr> {
        out.clear();
        let n = match *self.b.get(self.p).ok_or(DErr::Eof)? {
            t @ 0x90..=0x9f => {
                self.p += 1;
                (t & 0x0f) as usize
            }
            0xdc => {
                self.p += 1;
                self.be(2)? as usize
            }
            0xdd => {
                self.p += 1;
                self.be(4)? as usize
            }
            _ => {
                self.value(0)?;
                return Ok(false);
            }
        };
        if n > self.b.len() - self.p {
            return Err(DErr::Eof); // (every element takes at least one byte)
        }
        out.reserve(n);
        for _ in 0..n {
            // (the integers records are mostly made of, decoded here without the call to `value`:
            // about a tenth of reading a file, measured 350 -> 320 ms on a million records)
            match self.b.get(self.p) {
                Some(&c @ 0x00..=0x7f) => {
                    self.p += 1;
                    out.push(MVal::Int(c as i64));
                }
                Some(0xcc) if self.p + 2 <= self.b.len() => {
                    self.p += 2;
                    out.push(MVal::Int(self.b[self.p - 1] as i64));
                }
                Some(0xcd) if self.p + 3 <= self.b.len() => {
                    self.p += 3;
                    out.push(MVal::Int(
                        u16::from_be_bytes([self.b[self.p - 2], self.b[self.p - 1]]) as i64
                    ));
                }
                Some(0xce) if self.p + 5 <= self.b.len() => {
                    let q = self.p + 1;
                    self.p += 5;
                    out.push(MVal::Int(
                        u32::from_be_bytes([self.b[q], self.b[q + 1], self.b[q + 2], self.b[q + 3]]) as i64,
                    ));
                }
                Some(0xcf) if self.p + 9 <= self.b.len() => {
                    let q = self.p + 1;
                    self.p += 9;
                    let v = <[u8; 8]>::try_from(&self.b[q..q + 8]).map_or(0, u64::from_be_bytes);
                    out.push(if v <= i64::MAX as u64 {
                        MVal::Int(v as i64)
                    } else {
                        MVal::UInt(v)
                    });
                }
                _ => out.push(self.value(1)?),
            }
        }
        Ok(true)
    }
    fn str(&mut self, n: usize) -> std::result::Result<MVal<'a>, DErr> {
        let s = self.take(n)?;
        Ok(MVal::Str(match std::str::from_utf8(s) {
            Ok(x) => std::borrow::Cow::Borrowed(x),
            Err(_) => {
                self.lossy += 1;
                String::from_utf8_lossy(s)
            }
        }))
    }
    fn array(&mut self, n: usize, depth: usize) -> std::result::Result<MVal<'a>, DErr> {
        if n > self.b.len() - self.p {
            // every element takes at least one byte
            return Err(DErr::Eof);
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.value(depth + 1)?);
        }
        Ok(MVal::Array(v))
    }
    fn map(&mut self, n: usize, depth: usize) -> std::result::Result<MVal<'a>, DErr> {
        if n > self.b.len() - self.p {
            return Err(DErr::Eof);
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            let x = self.value(depth + 1)?;
            v.push((k, x));
        }
        Ok(MVal::Map(v))
    }
}

impl<'a> MVal<'a> {
    fn as_i64(&self) -> Option<i64> {
        match *self {
            MVal::Int(i) => Some(i),
            MVal::UInt(u) if u <= i64::MAX as u64 => Some(u as i64),
            _ => None,
        }
    }
    fn as_u64(&self) -> Option<u64> {
        match *self {
            MVal::Int(i) if i >= 0 => Some(i as u64),
            MVal::UInt(u) => Some(u),
            _ => None,
        }
    }
    fn get(&self, key: &str) -> Option<&MVal<'a>> {
        match self {
            MVal::Map(kv) => kv
                .iter()
                .find(|(k, _)| matches!(k, MVal::Str(s) if *s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }
    /// JSON text of this value (for metadata and compound arguments).
    pub fn to_json(&self) -> String {
        let mut s = String::new();
        self.write_json(&mut s);
        s
    }
    fn write_json(&self, out: &mut String) {
        match self {
            MVal::Nil => out.push_str("null"),
            MVal::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            MVal::Int(i) => out.push_str(itoa::Buffer::new().format(*i)),
            MVal::UInt(u) => out.push_str(itoa::Buffer::new().format(*u)),
            MVal::Float(f) => {
                if f.is_finite() {
                    out.push_str(ryu::Buffer::new().format(*f))
                } else {
                    out.push_str("null")
                }
            }
            MVal::Str(s) => crate::writer::push_json_str(out, s),
            MVal::Bin(b) | MVal::Ext(_, b) => crate::writer::push_json_str(out, &format!("<{} bytes>", b.len())),
            MVal::Array(v) => {
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    x.write_json(out);
                }
                out.push(']');
            }
            MVal::Map(kv) => {
                out.push('{');
                for (i, (k, x)) in kv.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    match k {
                        MVal::Str(s) => crate::writer::push_json_str(out, s),
                        other => crate::writer::push_json_str(out, &other.to_json()),
                    }
                    out.push(':');
                    x.write_json(out);
                }
                out.push('}');
            }
        }
    }
}

/// Identity of a process across its raw files (host, pid, start).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcessKey {
    pub host: String,
    pub pid: i64,
    pub start_ns: i64,
}

/// Quick check: does this buffer start with a teller raw HEADER record?
pub fn looks_like_raw(b: &[u8]) -> bool {
    let mut d = Dec {
        b: &b[..b.len().min(64)],
        p: 0,
        lossy: 0,
    };
    let first = match d.u8() {
        Ok(x) => x,
        Err(_) => return false,
    };
    if !(0x90..=0x9f).contains(&first) && first != 0xdc {
        return false;
    }
    if first == 0xdc && d.be(2).is_err() {
        return false;
    }
    matches!(d.value(1), Ok(MVal::Int(1))) && matches!(d.value(1), Ok(MVal::Str(s)) if s == MAGIC)
}

/// Is the whole buffer a proper prefix of a HEADER record's opening (array header, type 1, the
/// magic string)? Then the file was cut inside its header, rather than being something else.
fn is_header_prefix(b: &[u8]) -> bool {
    let Some(&first) = b.first() else { return true };
    let rest = match first {
        0x90..=0x9f => &b[1..],
        0xdc => &b[b.len().min(3)..],
        _ => return false,
    };
    let want = header_opening();
    rest.len() < want.len() && want.starts_with(rest)
}

/// A HEADER record's fields up to the magic string: type 1, then the magic as a fixstr.
fn header_opening() -> Vec<u8> {
    let mut want = vec![0x01u8, 0xa0 | MAGIC.len() as u8];
    want.extend_from_slice(MAGIC.as_bytes());
    want
}

/// A duration from two realtime timestamps: never negative, and within what a loaded trace holds
/// (each realtime timestamp lies within 2 * MAX_TIME_NS: in a crafted file, with two offsets far
/// apart, the ends of one span can be further apart than that).
fn span_len(start: i64, end: i64) -> i64 {
    end.saturating_sub(start).clamp(0, 2 * MAX_TIME_NS)
}

struct Open {
    layer: Layer,
    name: u32,
    tid: i64,
    ts: i64,
    args: Vec<(u32, ArgValue)>,
}

const TRUNCATED_HEADER: &str = "truncated before the end of the HEADER record";
const TORN_HEADER: &str = "unfinished or torn HEADER record (the file starts with zero bytes): nothing can be read";

/// Is `e` the error of a raw file its process never finished starting: empty, all zeros (created
/// and pre-allocated, nothing written), or cut inside its HEADER record?
pub fn is_unstarted(e: &Error) -> bool {
    match e {
        Error::Empty { .. } => true,
        Error::Format { msg, .. } => msg == TRUNCATED_HEADER || msg == TORN_HEADER,
        _ => false,
    }
}

/// Reads one raw file. Returns the trace (one source) and its process key.
pub fn read_raw(path: &str, b: &[u8], source: u16) -> Result<(Trace, ProcessKey)> {
    if b.iter().all(|&c| c == 0) {
        return Err(Error::Empty {
            path: path.into(),
            msg: "empty raw trace file (no records)".into(),
        });
    }
    let fe = |off: usize, idx: u64, msg: String| Error::format(path, Some(off as u64), Some(idx), msg);
    // Say what the file is not before decoding it: random bytes or another format would otherwise
    // fail somewhere inside the decoder ("string is not valid UTF-8 at byte 13").
    if !looks_like_raw(b) {
        let msg = if is_header_prefix(b) {
            TRUNCATED_HEADER.to_string()
        } else if b[0] == 0 {
            // the HEADER is written first, at offset 0: zero bytes there mean a write that never
            // finished (or damage), and without the HEADER no record can be read
            TORN_HEADER.to_string()
        } else {
            let head: Vec<String> = b.iter().take(4).map(|c| format!("{c:02x}")).collect();
            format!(
                "not a teller raw trace: it does not start with a \"{MAGIC}\" HEADER record (first bytes {})",
                head.join(" ")
            )
        };
        return Err(Error::format(path, None, None, msg));
    }

    // Pass 1: find the records (their offsets) and read the HEADER, the string table (ids may be
    // defined after use) and the CLOCK_SYNC pairs. Decision: the other records are decoded again in
    // pass 2 rather than kept decoded: a decoded field takes 32 bytes and a record an allocation of
    // its own, about 13 times the file (the collector's default cap of 4 GiB would have needed over
    // 50 GB), and decoding into one reused buffer twice costs less than those allocations did.
    let mut t = Trace::new();
    let mut recs: Vec<usize> = Vec::new();
    let mut header: Vec<MVal> = Vec::new();
    let mut fields: Vec<MVal> = Vec::new();
    let mut sid: HashMap<u64, u32> = HashMap::new();
    let mut clock_syncs: Vec<(i64, i64)> = Vec::new(); // (mono_ns, realtime - mono)
    let mut table_err: Option<Error> = None;
    let mut warnings = Vec::new();
    let mut d = Dec { b, p: 0, lossy: 0 };
    while d.p < b.len() {
        if b[d.p] == 0 {
            // zero padding (pre-allocated, not yet written space)
            match b[d.p..].iter().position(|&c| c != 0) {
                Some(k) => {
                    d.p += k;
                    continue;
                }
                None => break,
            }
        }
        let at = d.p;
        let idx = recs.len() as u64;
        // A torn record: a writer stores a record's first byte (its array header) last, so a record
        // cut by a crash reads as a zero byte followed by loose values, followed by the zero tail of
        // its chunk. Only a malformed record right after zero padding is taken for one: skip to the
        // next run of zeros (a record body never holds that many) and warn. Anything else is corrupt.
        let after_padding = at > 0 && b[at - 1] == 0;
        let torn = |d: &mut Dec, warnings: &mut Vec<String>, msg: String| -> bool {
            if !after_padding {
                return false;
            }
            let mut p = at;
            let mut zeros = 0usize;
            while p < b.len() {
                if b[p] == 0 {
                    zeros += 1;
                    if zeros >= TORN_RESYNC_ZEROS {
                        break;
                    }
                } else {
                    zeros = 0;
                }
                p += 1;
            }
            let next = if p < b.len() { p + 1 - zeros } else { b.len() };
            warnings.push(format!(
                "{path}: torn record at byte {at} ({msg}): skipped {} byte(s)",
                next - at
            ));
            d.p = next;
            true
        };
        match d.record(&mut fields) {
            Ok(true) => {
                if fields.is_empty() || fields[0].as_i64().is_none() {
                    if torn(&mut d, &mut warnings, "record type is not an integer".into()) {
                        continue;
                    }
                    return Err(fe(at, idx, "record does not start with an integer record type".into()));
                }
                if recs.is_empty()
                    && (fields[0].as_i64() != Some(1) || !matches!(fields.get(1), Some(MVal::Str(s)) if *s == MAGIC))
                {
                    return Err(fe(
                        at,
                        0,
                        "not a teller raw trace: the first record is not a HEADER".into(),
                    ));
                }
                // (a bad STRING or CLOCK_SYNC is said after the HEADER's own checks, as when every
                // record was decoded first: a file of another format version says that)
                let table = match fields[0].as_i64() {
                    Some(2) if table_err.is_none() => match (fields.get(1).and_then(|v| v.as_u64()), fields.get(2)) {
                        (Some(id), Some(MVal::Str(s))) => {
                            let v = t.strings.intern(s);
                            sid.insert(id, v);
                            Ok(())
                        }
                        _ => Err(fe(at, idx, "STRING record must be [2, id, text]".into())),
                    },
                    Some(11) if !recs.is_empty() && table_err.is_none() => (|| {
                        let num = |i: usize, what: &str| -> Result<i64> {
                            fields
                                .get(i)
                                .and_then(|v| v.as_i64())
                                .filter(|v| v.unsigned_abs() <= MAX_TIME_NS as u64)
                                .ok_or_else(|| {
                                    fe(
                                        at,
                                        idx,
                                        format!(
                                            "record type 11: field {i} ({what}) must be an integer of at most {MAX_TIME_NS} ns"
                                        ),
                                    )
                                })
                        };
                        let (c, r) = (num(1, "mono_ns")?, num(2, "realtime_ns")?);
                        // (both bounded by MAX_TIME_NS; their difference as well, as in the HEADER)
                        if (r - c).unsigned_abs() > MAX_TIME_NS as u64 {
                            return Err(fe(at, idx, "record type 11: clock offset out of range".into()));
                        }
                        clock_syncs.push((c, r - c));
                        Ok(())
                    })(),
                    _ => Ok(()),
                };
                if let Err(e) = table {
                    table_err = Some(e);
                }
                if recs.is_empty() {
                    header = fields.clone();
                }
                recs.push(at);
            }
            Ok(false) => {
                if torn(&mut d, &mut warnings, "not an array".into()) {
                    continue;
                }
                if recs.is_empty() {
                    return Err(fe(
                        at,
                        0,
                        "not a teller raw trace: the first record is not a HEADER".into(),
                    ));
                }
                return Err(fe(
                    at,
                    idx,
                    format!("record is not a MessagePack array (type byte 0x{:02x})", b[at]),
                ));
            }
            Err(DErr::Eof) => {
                if recs.is_empty() {
                    return Err(fe(at, 0, TRUNCATED_HEADER.into()));
                }
                warnings.push(format!(
                    "{path}: truncated: the last {} byte(s) from byte {at} hold an incomplete record; {} complete record(s) read",
                    b.len() - at,
                    recs.len()
                ));
                break;
            }
            Err(DErr::Bad(off, msg)) => {
                if torn(&mut d, &mut warnings, msg.clone()) {
                    continue;
                }
                return Err(fe(off, idx, msg));
            }
        }
    }

    if d.lossy > 0 {
        warnings.push(format!(
            "{path}: {} string(s) not valid UTF-8 (an argument, a thread name or an NVTX message in \
             another encoding): read with U+FFFD in place of the bad bytes",
            d.lossy
        ));
    }

    let header = &header;
    let version = header.get(2).and_then(|v| v.as_i64()).unwrap_or(-1);
    if version != FORMAT_VERSION {
        return Err(fe(
            recs[0],
            0,
            format!("unsupported raw format version {version} (this teller reads version {FORMAT_VERSION})"),
        ));
    }
    let meta = header.get(3).cloned().unwrap_or(MVal::Map(vec![]));
    if !matches!(meta, MVal::Map(_)) {
        return Err(fe(recs[0], 0, "HEADER meta must be a map".into()));
    }
    let pid = meta.get("pid").and_then(|v| v.as_i64()).unwrap_or(0);
    let host = match meta.get("host") {
        Some(MVal::Str(s)) => s.to_string(),
        _ => String::new(),
    };
    let start_ns = meta.get("start_ns").and_then(|v| v.as_i64()).unwrap_or(0);
    let header_sync: Option<(i64, i64)> = match meta.get("clock_sync") {
        Some(MVal::Array(v)) if v.len() == 2 => match (v[0].as_i64(), v[1].as_i64()) {
            (Some(c), Some(r))
                if c.unsigned_abs() <= MAX_TIME_NS as u64
                    && r.unsigned_abs() <= MAX_TIME_NS as u64
                    && (r - c).unsigned_abs() <= MAX_TIME_NS as u64 =>
            {
                Some((c, r - c))
            }
            _ => {
                return Err(fe(
                    recs[0],
                    0,
                    "HEADER clock_sync must be [clock_ns, realtime_ns]".into(),
                ))
            }
        },
        None => None, // (said below where no CLOCK_SYNC gives one either)
        _ => {
            return Err(fe(
                recs[0],
                0,
                "HEADER clock_sync must be [clock_ns, realtime_ns]".into(),
            ))
        }
    };
    if let Some(MVal::Array(errs)) = meta.get("errors") {
        for e in errs {
            if let MVal::Str(s) = e {
                warnings.push(format!("{path}: collector reported: {s}"));
            }
        }
    }

    // String table (ids may be defined after use) and CLOCK_SYNC pairs. A sync record sits in the
    // chunk of whichever thread took a chunk when it was due, so file order is not time order: the
    // pairs (the HEADER's and every CLOCK_SYNC) are put in the order of the file's own clock, and a
    // timestamp's offset is interpolated linearly between the pairs around it (the first's before
    // them, the last's after). NTP slews the realtime clock smoothly, so the offset drifts between
    // syncs (50 ppm is 0.5 ms in a 10 s interval): a constant offset per interval would make that a
    // jump at every sync, moving one side of a range against the other and breaking nesting. The map
    // is monotone (unless realtime went back by more than the interval), so every timestamp keeps
    // its order and every range its nesting; a step of the realtime clock is spread over its interval.
    if let Some(e) = table_err {
        return Err(e);
    }
    let mut syncs: Vec<(i64, i64)> = header_sync.into_iter().chain(clock_syncs).collect();
    syncs.sort_by_key(|s| s.0); // (stable: of two syncs at one instant the later in the file wins)
    syncs.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            earlier.1 = later.1;
        }
        same
    });
    if syncs.is_empty() {
        warnings.push(format!(
            "{path}: no clock_sync pair (HEADER or CLOCK_SYNC); timestamps are kept on the file's own clock"
        ));
    }
    // A realtime step between two syncs is spread over their interval (the durations in it scaled by
    // 1 + step / interval), and one back by more than the interval makes the map go back: said, once
    // per file, for the largest. (CLOCK_MONOTONIC takes NTP's frequency corrections too, so between
    // steps the offset moves by read noise only: tens of nanoseconds, under the 1 ms floor.)
    let step = syncs
        .windows(2)
        .map(|w| (w[1].1 - w[0].1, w[1].0 - w[0].0))
        .filter(|&(d, dt)| d.unsigned_abs() >= 1_000_000 && d.unsigned_abs() as f64 > 1e-3 * dt as f64)
        .max_by_key(|&(d, _)| d.unsigned_abs());
    if let Some((d, dt)) = step {
        let slope = d as f64 / dt as f64;
        warnings.push(format!(
            "{path}: the realtime clock moved {:+.3} ms against the monotonic clock in {:.3} s (a clock \
             step?); timestamps between the two syncs are interpolated, {}",
            d as f64 / 1e6,
            dt as f64 / 1e9,
            if slope < -1.0 {
                "out of order (realtime went back by more than the interval)".to_string()
            } else {
                format!("their durations scaled by {:.4}", 1.0 + slope)
            }
        ));
    }
    let constant = syncs.windows(2).all(|w| w[0].1 == w[1].1);
    let first_offset = syncs.first().map_or(0, |s| s.1);
    let base_offset = first_offset;
    // a timestamp of the file's own clock on the realtime base
    // (the interval of the previous timestamp is tried first: a thread's records come in time order,
    // and the binary search was an eighth of reading a file with a sync every thousand records)
    let last_k = std::cell::Cell::new(0usize);
    let real = |ts: i64| -> i64 {
        let off = if constant {
            first_offset
        } else {
            let k = last_k.get();
            let k = if k > 0 && k < syncs.len() && syncs[k - 1].0 <= ts && ts < syncs[k].0 {
                k
            } else {
                let k = syncs.partition_point(|s| s.0 <= ts);
                last_k.set(k);
                k
            };
            match k {
                0 => first_offset,
                k if k == syncs.len() => syncs[k - 1].1,
                k => {
                    let ((t0, o0), (t1, o1)) = (syncs[k - 1], syncs[k]);
                    // (i64 where it fits: drift is nanoseconds to milliseconds over seconds)
                    o0 + match (o1 - o0).checked_mul(ts - t0) {
                        Some(p) => p / (t1 - t0),
                        None => ((o1 - o0) as i128 * (ts - t0) as i128 / (t1 - t0) as i128) as i64,
                    }
                }
            }
        };
        ts.saturating_add(off)
    };
    let mut undefined: HashMap<u64, ()> = HashMap::new();

    let mut open: HashMap<u64, Open> = HashMap::new();
    // ENDs read before their BEGIN, by range id: a range ended on another thread has its END in that
    // thread's chunk, which may lie earlier in the file than the chunk holding the BEGIN.
    let mut early_end: HashMap<u64, i64> = HashMap::new();
    let mut repeated_end = 0usize;
    let mut unknown_types: HashMap<i64, u64> = HashMap::new();
    // DROPPED records summed per reason: the shim writes one per chunk hand-out, so a long run that
    // filled its file (or a program whose signal handlers call NVTX) has thousands of them.
    let mut dropped: Vec<(u32, u64, u64)> = Vec::new(); // (reason, records, reports), first seen first
    let mut last_ts = i64::MIN;
    let cats: Vec<u32> = LAYER_DEFAULT_CATS.iter().map(|c| t.strings.intern(c)).collect();

    // Pass 2: the records again, into events (each decoded as in pass 1, which checked it)
    let mut d = Dec { b, p: 0, lossy: 0 };
    for (ri, &at) in recs.iter().enumerate().skip(1) {
        let ri = ri as u64;
        d.p = at;
        if !matches!(d.record(&mut fields), Ok(true)) {
            return Err(fe(
                at,
                ri,
                "record changed while it was read (the file is being written?)".into(),
            ));
        }
        let f = &fields;
        let ty = f.first().and_then(|v| v.as_i64()).unwrap_or(-1);
        let field = |i: usize, what: &str| -> Result<&MVal> {
            f.get(i)
                .ok_or_else(|| fe(at, ri, format!("record type {ty}: missing field {i} ({what})")))
        };
        let int = |i: usize, what: &str| -> Result<i64> {
            let v = field(i, what)?.as_i64().ok_or_else(|| {
                fe(
                    at,
                    ri,
                    format!("record type {ty}: field {i} ({what}) must be an integer"),
                )
            })?;
            if matches!(what, "ts" | "start" | "end" | "mono_ns" | "realtime_ns")
                && v.unsigned_abs() > MAX_TIME_NS as u64
            {
                return Err(fe(
                    at,
                    ri,
                    format!("record type {ty}: field {i} ({what}) is out of range (at most {MAX_TIME_NS} ns)"),
                ));
            }
            if what == "device" && !(-1..=i32::MAX as i64).contains(&v) {
                return Err(fe(
                    at,
                    ri,
                    format!("record type {ty}: field {i} (device) {v} is not a device index"),
                ));
            }
            Ok(v)
        };
        let opt_u = |i: usize, what: &str| -> Result<u64> {
            match f.get(i) {
                None | Some(MVal::Nil) => Ok(0),
                Some(v) => v.as_u64().ok_or_else(|| {
                    fe(
                        at,
                        ri,
                        format!("record type {ty}: field {i} ({what}) must be a non-negative integer"),
                    )
                }),
            }
        };
        let layer_at = |i: usize| -> Result<Layer> {
            let v = int(i, "layer")?;
            Layer::from_u8(v as u8)
                .filter(|_| (0..NUM_LAYERS as i64).contains(&v))
                .ok_or_else(|| fe(at, ri, format!("record type {ty}: unknown layer code {v}")))
        };
        let mut name_at = |t: &mut Trace, i: usize| -> Result<u32> {
            match field(i, "name")? {
                MVal::Str(s) => Ok(t.strings.intern(s)),
                v => match v.as_u64() {
                    Some(0) => Ok(0),
                    Some(id) => Ok(match sid.get(&id) {
                        Some(&x) => x,
                        None => {
                            undefined.insert(id, ());
                            t.strings.intern(&format!("<string #{id}>"))
                        }
                    }),
                    None => Err(fe(
                        at,
                        ri,
                        format!("record type {ty}: field {i} (name) must be a string id or a string"),
                    )),
                },
            }
        };
        let args_at = |t: &mut Trace, i: usize| -> Result<Vec<(u32, ArgValue)>> {
            match f.get(i) {
                None | Some(MVal::Nil) => Ok(vec![]),
                Some(MVal::Map(kv)) => {
                    let mut out = Vec::with_capacity(kv.len());
                    for (k, v) in kv {
                        let key = match k {
                            MVal::Str(s) => t.strings.intern(s),
                            _ => return Err(fe(at, ri, format!("record type {ty}: args keys must be strings"))),
                        };
                        let val = match v {
                            MVal::Nil => ArgValue::Null,
                            MVal::Bool(b) => ArgValue::Bool(*b),
                            MVal::Int(i) => ArgValue::Int(*i),
                            MVal::Float(x) => ArgValue::Float(*x),
                            MVal::Str(s) => ArgValue::Str(t.strings.intern(s)),
                            other => ArgValue::Json(t.strings.intern(&other.to_json())),
                        };
                        out.push((key, val));
                    }
                    Ok(out)
                }
                Some(_) => Err(fe(at, ri, format!("record type {ty}: field {i} (args) must be a map"))),
            }
        };
        match ty {
            1 => return Err(fe(at, ri, "a second HEADER record in one file".into())),
            2 => {}
            3 => {
                let layer = layer_at(1)?;
                let name = name_at(&mut t, 2)?;
                let tid = int(3, "tid")?;
                let start = int(4, "start")?;
                let end = int(5, "end")?;
                let corr = opt_u(6, "corr")?;
                let ext = opt_u(7, "ext")?;
                let args = args_at(&mut t, 8)?;
                t.args.extend(args);
                let (start, end) = (real(start), real(end));
                last_ts = last_ts.max(end);
                t.push_event(
                    layer,
                    name,
                    cats[layer as usize],
                    start,
                    span_len(start, end),
                    pid,
                    tid,
                    -1,
                    corr,
                    ext,
                    0,
                    source,
                );
            }
            4 => {
                let layer = layer_at(1)?;
                let name = name_at(&mut t, 2)?;
                let device = int(3, "device")?;
                let stream = int(4, "stream")?;
                let start = int(5, "start")?;
                let end = int(6, "end")?;
                let corr = opt_u(7, "corr")?;
                let args = args_at(&mut t, 8)?;
                t.args.extend(args);
                let (start, end) = (real(start), real(end));
                last_ts = last_ts.max(end);
                // GPU tracks use the Kineto convention: pid = device, tid = stream.
                t.push_event(
                    layer,
                    name,
                    cats[layer as usize],
                    start,
                    span_len(start, end),
                    device,
                    stream,
                    device as i32,
                    corr,
                    0,
                    0,
                    source,
                );
            }
            5 => {
                let id = int(1, "range_id")? as u64;
                let layer = layer_at(2)?;
                let name = name_at(&mut t, 3)?;
                let tid = int(4, "tid")?;
                let ts = int(5, "ts")?;
                let mut args = args_at(&mut t, 7)?;
                if let Some(dom) = f.get(6) {
                    if !matches!(dom, MVal::Nil) && dom.as_u64() != Some(0) {
                        let d = name_at(&mut t, 6)?;
                        let k = t.strings.intern("domain");
                        args.push((k, ArgValue::Str(d)));
                    }
                }
                let ts = real(ts);
                last_ts = last_ts.max(ts);
                match (!early_end.is_empty()).then(|| early_end.remove(&id)).flatten() {
                    Some(end) => {
                        t.args.extend(args);
                        // (ext: the range's own id, as a SPAN's; the runtime calls made inside it
                        // carry it as their external correlation id)
                        t.push_event(
                            layer,
                            name,
                            cats[layer as usize],
                            ts,
                            span_len(ts, end),
                            pid,
                            tid,
                            -1,
                            0,
                            id,
                            0,
                            source,
                        );
                    }
                    None => {
                        open.insert(
                            id,
                            Open {
                                layer,
                                name,
                                tid,
                                ts,
                                args,
                            },
                        );
                    }
                }
            }
            6 => {
                let id = int(1, "range_id")? as u64;
                let _tid = int(2, "tid")?;
                let ts = real(int(3, "ts")?);
                last_ts = last_ts.max(ts);
                match open.remove(&id) {
                    Some(o) => {
                        t.args.extend(o.args);
                        t.push_event(
                            o.layer,
                            o.name,
                            cats[o.layer as usize],
                            o.ts,
                            span_len(o.ts, ts),
                            pid,
                            o.tid,
                            -1,
                            0,
                            id,
                            0,
                            source,
                        );
                    }
                    None => match early_end.entry(id) {
                        // (a second END of one id: ignored, counted as a record; the first stands)
                        hashbrown::hash_map::Entry::Occupied(_) => repeated_end += 1,
                        hashbrown::hash_map::Entry::Vacant(v) => {
                            v.insert(ts);
                        }
                    },
                }
            }
            7 => {
                let layer = layer_at(1)?;
                let name = name_at(&mut t, 2)?;
                let tid = int(3, "tid")?;
                let ts = int(4, "ts")?;
                let args = args_at(&mut t, 5)?;
                t.args.extend(args);
                let ts = real(ts);
                last_ts = last_ts.max(ts);
                t.push_event(
                    layer,
                    name,
                    cats[layer as usize],
                    ts,
                    0,
                    pid,
                    tid,
                    -1,
                    0,
                    0,
                    flags::INSTANT,
                    source,
                );
            }
            8 => {
                let tid = int(1, "tid")?;
                let name = name_at(&mut t, 2)?;
                t.thread_names.push((pid, tid, name));
            }
            9 => {
                let name = name_at(&mut t, 1)?;
                let ts = int(2, "ts")?;
                let value = match field(3, "value")? {
                    MVal::Float(x) => *x,
                    v => v
                        .as_i64()
                        .ok_or_else(|| fe(at, ri, "COUNTER value must be a number".into()))?
                        as f64,
                };
                let series = t.strings.intern("value");
                t.counters.push(CounterSample {
                    name,
                    series,
                    pid,
                    ts: real(ts),
                    value,
                });
            }
            10 => {
                let n = int(1, "count")?;
                let reason = name_at(&mut t, 2)?;
                let n = n.max(0) as u64;
                match dropped.iter_mut().find(|d| d.0 == reason) {
                    Some(d) => {
                        d.1 += n;
                        d.2 += 1;
                    }
                    None => dropped.push((reason, n, 1)),
                }
            }
            11 => {} // (read with the string table, above)
            12 => {
                let sev = int(2, "severity")?;
                let msg = name_at(&mut t, 3)?;
                let lvl = ["info", "warning", "error"]
                    .get(sev as usize)
                    .copied()
                    .unwrap_or("diag");
                warnings.push(format!("{path}: collector {lvl}: {}", t.strings.get(msg)));
            }
            other => *unknown_types.entry(other).or_insert(0) += 1,
        }
    }
    if !open.is_empty() {
        let mut v: Vec<(u64, Open)> = open.into_iter().collect();
        v.sort_by_key(|(id, o)| (o.ts, *id));
        let n = v.len();
        for (id, o) in v {
            t.args.extend(o.args);
            t.push_event(
                o.layer,
                o.name,
                cats[o.layer as usize],
                o.ts,
                span_len(o.ts, last_ts),
                pid,
                o.tid,
                -1,
                0,
                id,
                flags::UNFINISHED,
                source,
            );
        }
        warnings.push(format!("{path}: {n} range(s) still open at the end of the file (process killed?) were closed at its last timestamp"));
    }
    if !early_end.is_empty() || repeated_end > 0 {
        warnings.push(format!(
            "{path}: {} END record(s) without a BEGIN were ignored",
            early_end.len() + repeated_end
        ));
    }
    if !undefined.is_empty() {
        warnings.push(format!(
            "{path}: {} string id(s) used but never defined",
            undefined.len()
        ));
    }
    if !unknown_types.is_empty() {
        let mut v: Vec<_> = unknown_types.into_iter().collect();
        v.sort();
        warnings.push(format!(
            "{path}: skipped records of unknown types {v:?} (written by a newer collector?)"
        ));
    }
    for (reason, n, reports) in dropped {
        let times = if reports > 1 {
            format!(" ({reports} reports)")
        } else {
            String::new()
        };
        warnings.push(format!(
            "{path}: the collector dropped {n} record(s){times}: {}",
            t.strings.get(reason)
        ));
    }
    if let Some(MVal::Str(argv0)) = meta.get("argv").and_then(|a| match a {
        MVal::Array(v) => v.first(),
        _ => None,
    }) {
        let name = argv0.rsplit('/').next().unwrap_or(argv0);
        let n = t.strings.intern(name);
        t.process_names.push((pid, n));
    }
    let mut devices: Vec<i32> = t.device.iter().copied().filter(|&d| d >= 0).collect();
    devices.sort_unstable();
    devices.dedup();
    for d in devices {
        let n = t.strings.intern(&format!("GPU {d}"));
        t.process_names.push((d as i64, n));
    }
    let producer = match meta.get("producer") {
        Some(MVal::Str(s)) => Some(s.to_string()),
        _ => None,
    };
    kineto_names(&mut t);
    t.warnings = warnings;
    let mut metadata = vec![("header".to_string(), meta.to_json())];
    // A producer that knows its GPUs writes them as Kineto does (`deviceProperties`: a list of
    // {id, name, totalGlobalMem, computeMajor, ...}); lifted out of the header so that the Chrome
    // output carries them where Perfetto, HTA and teller's own Chrome reader look.
    if let Some(v @ MVal::Array(_)) = meta.get("deviceProperties") {
        metadata.push(("deviceProperties".to_string(), v.to_json()));
    }
    t.sources.push(SourceInfo {
        path: path.to_string(),
        kind: "raw".into(),
        base_ns: base_offset,
        pid: Some(pid),
        host: Some(host.clone()),
        producer,
        events: t.len() as u64,
        metadata,
        ..Default::default()
    });
    Ok((t, ProcessKey { host, pid, start_ns }))
}

/// Kineto's names for what CUPTI recorded raw (see `names`): kernels demangled, API calls without their
/// version suffix, torch's operator NVTX ranges as host operators. Once per distinct name id: a file
/// has thousands of events but tens of names.
fn kineto_names(t: &mut Trace) {
    let host_op_cat = t.strings.intern(LAYER_DEFAULT_CATS[Layer::HostOp as usize]);
    let mut renamed: HashMap<(u8, u32), (u8, u32)> = HashMap::new();
    for i in 0..t.len() {
        let layer = t.layer[i];
        let api = layer == Layer::Runtime as u8 || layer == Layer::Driver as u8;
        let ann = layer == Layer::Annotation as u8;
        if !(api || ann || layer == Layer::Kernel as u8) {
            continue;
        }
        let id = t.name[i];
        let (l, new) = *renamed.entry((layer, id)).or_insert_with(|| {
            let s = t.strings.get(id);
            let (l, n) = if api {
                let x = crate::names::strip_api_version(s);
                (layer, (x.len() != s.len()).then(|| x.to_string()))
            } else if ann {
                match crate::names::torch_nvtx_range(s) {
                    Some((true, op)) => (Layer::HostOp as u8, Some(op.to_string())),
                    Some((false, scope)) => (layer, Some(scope.to_string())),
                    None => (layer, None),
                }
            } else {
                (layer, crate::names::demangle_kernel(s))
            };
            match n {
                Some(n) => (l, t.strings.intern(&n)),
                None => (l, id),
            }
        });
        t.name[i] = new;
        if l != layer {
            t.layer[i] = l;
            t.cat[i] = host_op_cat;
        }
    }
}

/// A minimal MessagePack encoder for raw records (tests, tools and benchmarks write raw files with it;
/// the collector has its own C writer and Python has `teller.rawfmt`).
pub mod encode {
    pub enum V<'a> {
        I(i64),
        S(&'a str),
        A(Vec<V<'a>>),
        M(Vec<(&'a str, V<'a>)>),
        Nil,
    }

    pub fn write(out: &mut Vec<u8>, v: &V) {
        match v {
            V::Nil => out.push(0xc0),
            V::I(i) => int(out, *i),
            V::S(s) => {
                let n = s.len();
                if n < 32 {
                    out.push(0xa0 | n as u8);
                } else if n < 256 {
                    out.extend_from_slice(&[0xd9, n as u8]);
                } else if n < 65536 {
                    out.push(0xda);
                    out.extend_from_slice(&(n as u16).to_be_bytes());
                } else {
                    out.push(0xdb);
                    out.extend_from_slice(&(n as u32).to_be_bytes());
                }
                out.extend_from_slice(s.as_bytes());
            }
            V::A(items) => {
                let n = items.len();
                if n < 16 {
                    out.push(0x90 | n as u8);
                } else {
                    out.push(0xdc);
                    out.extend_from_slice(&(n as u16).to_be_bytes());
                }
                for x in items {
                    write(out, x);
                }
            }
            V::M(kv) => {
                let n = kv.len();
                if n < 16 {
                    out.push(0x80 | n as u8);
                } else {
                    out.push(0xde);
                    out.extend_from_slice(&(n as u16).to_be_bytes());
                }
                for (k, x) in kv {
                    write(out, &V::S(k));
                    write(out, x);
                }
            }
        }
    }

    fn int(out: &mut Vec<u8>, i: i64) {
        if (0..128).contains(&i) {
            out.push(i as u8);
        } else if (-32..0).contains(&i) {
            out.push(i as i8 as u8);
        } else if i >= 0 && i <= u32::MAX as i64 {
            out.push(0xce);
            out.extend_from_slice(&(i as u32).to_be_bytes());
        } else {
            out.push(0xd3);
            out.extend_from_slice(&i.to_be_bytes());
        }
    }

    /// A HEADER record for pid with a clock-sync pair.
    pub fn header(out: &mut Vec<u8>, pid: i64, clock_ns: i64, realtime_ns: i64) {
        write(
            out,
            &V::A(vec![
                V::I(1),
                V::S(super::MAGIC),
                V::I(super::FORMAT_VERSION),
                V::M(vec![
                    ("pid", V::I(pid)),
                    ("host", V::S("test")),
                    ("clock_sync", V::A(vec![V::I(clock_ns), V::I(realtime_ns)])),
                ]),
            ]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::encode::{header, write, V};
    use super::*;
    use proptest::prelude::*;

    fn span(out: &mut Vec<u8>, layer: i64, name: &str, tid: i64, start: i64, end: i64) {
        write(
            out,
            &V::A(vec![
                V::I(3),
                V::I(layer),
                V::S(name),
                V::I(tid),
                V::I(start),
                V::I(end),
            ]),
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn write_read_round_trip(evs in proptest::collection::vec((0i64..6, "[a-z:_]{0,40}", 1i64..5, 0i64..1_000_000, 0i64..100_000), 1..40)) {
            let mut b = Vec::new();
            header(&mut b, 9, 0, 1_000);
            for (l, n, tid, s, d) in &evs {
                span(&mut b, *l, n, *tid, *s, s + d);
            }
            let (t, _) = read_raw("p", &b, 0).unwrap();
            prop_assert_eq!(t.len(), evs.len());
            prop_assert!(t.warnings.is_empty());
            for (i, (l, n, tid, s, d)) in evs.iter().enumerate() {
                prop_assert_eq!(t.layer[i] as i64, *l);
                prop_assert_eq!(t.name_of(i), n.as_str());
                prop_assert_eq!(t.tid[i], *tid);
                prop_assert_eq!(t.ts[i], s + 1_000);
                prop_assert_eq!(t.dur[i], *d);
            }
        }

        #[test]
        fn truncation_keeps_every_complete_record(n in 1usize..12, long in 0usize..300) {
            let mut b = Vec::new();
            header(&mut b, 9, 0, 0);
            let mut ends = vec![];
            let name = "k".repeat(long);
            for i in 0..n {
                span(&mut b, 6, &name, 1, i as i64 * 10, i as i64 * 10 + 5);
                ends.push(b.len());
            }
            let header_end = ends[0] - {
                let mut one = Vec::new();
                span(&mut one, 6, &name, 1, 0, 5);
                one.len()
            };
            for cut in 1..=b.len() {
                let complete = ends.iter().filter(|&&e| e <= cut).count();
                match read_raw("p", &b[..cut], 0) {
                    Ok((t, _)) => {
                        prop_assert_eq!(t.len(), complete, "cut {}", cut);
                        let truncated = t.warnings.iter().any(|w| w.contains("truncated"));
                        prop_assert_eq!(truncated, cut != b.len() && !ends.contains(&cut) && cut != header_end);
                    }
                    Err(e) => prop_assert!(cut < header_end, "cut {} error {}", cut, e),
                }
            }
        }
    }

    #[test]
    fn clock_syncs_apply_by_time_not_file_order() {
        // A sync record lands in the chunk of the thread that took a chunk when it was due: here the
        // sync of mono 1 ms lies before earlier events in the file. Realtime slewed back 100 ns over
        // that millisecond: the offset is interpolated between the pairs around each timestamp.
        let mut b = Vec::new();
        header(&mut b, 9, 0, 1_000);
        let sync = |b: &mut Vec<u8>, mono: i64, off: i64| write(b, &V::A(vec![V::I(11), V::I(mono), V::I(mono + off)]));
        sync(&mut b, 1_000_000, 900);
        let mark = |b: &mut Vec<u8>, name: &str, ts: i64| {
            write(
                b,
                &V::A(vec![
                    V::I(7),
                    V::I(Layer::Annotation as i64),
                    V::S(name),
                    V::I(1),
                    V::I(ts),
                ]),
            )
        };
        let begin = |b: &mut Vec<u8>, id: i64, name: &str, ts: i64| {
            write(
                b,
                &V::A(vec![
                    V::I(5),
                    V::I(id),
                    V::I(Layer::Annotation as i64),
                    V::S(name),
                    V::I(1),
                    V::I(ts),
                ]),
            )
        };
        let end = |b: &mut Vec<u8>, id: i64, ts: i64| write(b, &V::A(vec![V::I(6), V::I(id), V::I(1), V::I(ts)]));
        mark(&mut b, "before", 500_000);
        mark(&mut b, "after", 1_500_000);
        span(&mut b, Layer::Annotation as i64, "span", 1, 400_000, 600_000);
        // an inner range ending 10 ns before the sync inside an outer one ending at it: kept nested
        begin(&mut b, 1, "outer", 100_000);
        begin(&mut b, 2, "inner", 999_000);
        end(&mut b, 2, 999_990);
        end(&mut b, 1, 1_000_000);
        begin(&mut b, 3, "open", 1_200_000);
        sync(&mut b, 2_000_000, 900);
        let (t, _) = read_raw("p", &b, 0).unwrap();
        let got: HashMap<&str, (i64, i64)> = (0..t.len()).map(|i| (t.name_of(i), (t.ts[i], t.dur[i]))).collect();
        assert_eq!(got["before"], (500_950, 0));
        assert_eq!(got["after"], (1_500_900, 0));
        assert_eq!(got["span"], (400_960, 199_980)); // (offsets 960 and 940 at its ends)
        assert_eq!(got["outer"], (100_990, 899_910));
        assert_eq!(got["inner"], (999_901, 990));
        let (o, i) = (got["outer"], got["inner"]);
        assert!(i.0 >= o.0 && i.0 + i.1 <= o.0 + o.1, "nesting kept");
        // (left open: closed at the file's last timestamp, mark "after")
        assert_eq!(got["open"], (1_200_900, 300_000));
        // (100 ns in a millisecond: read noise, not a step)
        assert!(!t.warnings.iter().any(|w| w.contains("clock")), "{:?}", t.warnings);
        // realtime ahead by 100 ns after 1 ms (a forward drift), an inner range starting after that
        // sync and ending 50 ns before its outer one: the start's offset applied to both ends of
        // each range (the code before) ended the inner one after the outer
        let mut b = Vec::new();
        header(&mut b, 9, 0, 1_000);
        sync(&mut b, 1_000_000, 1_100);
        begin(&mut b, 1, "outer", 500_000);
        begin(&mut b, 2, "inner", 1_200_000);
        end(&mut b, 2, 1_499_950);
        end(&mut b, 1, 1_500_000);
        let (t, _) = read_raw("p", &b, 0).unwrap();
        let got: HashMap<&str, (i64, i64)> = (0..t.len()).map(|i| (t.name_of(i), (t.ts[i], t.dur[i]))).collect();
        let (o, i) = (got["outer"], got["inner"]);
        assert_eq!((o, i), ((501_050, 1_000_050), (1_201_100, 299_950)));
        assert!(i.0 >= o.0 && i.0 + i.1 <= o.0 + o.1, "nesting kept");
        // no pair in the HEADER: the first CLOCK_SYNC's offset from the start (not the file's own
        // clock, as the warning said); a step of the realtime clock between two syncs is said
        let mut b = Vec::new();
        write(
            &mut b,
            &V::A(vec![
                V::I(1),
                V::S(super::MAGIC),
                V::I(super::FORMAT_VERSION),
                V::M(vec![("pid", V::I(9))]),
            ]),
        );
        sync(&mut b, 1_000, 7_000);
        mark(&mut b, "m", 0);
        sync(&mut b, 1_000_000_000, 10_007_000); // (+10 ms in a second)
        let (t, _) = read_raw("p", &b, 0).unwrap();
        assert_eq!(t.ts[0], 7_000);
        assert_eq!(t.sources[0].base_ns, 7_000);
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        assert!(
            t.warnings[0].contains("moved +10.000 ms against the monotonic clock in 1.000 s")
                && t.warnings[0].contains("durations scaled by 1.0100"),
            "{:?}",
            t.warnings
        );
        // a sync with a bad field names the record
        let mut b = Vec::new();
        header(&mut b, 9, 0, 0);
        write(&mut b, &V::A(vec![V::I(11), V::I(500), V::S("x")]));
        let e = read_raw("p", &b, 0).unwrap_err().to_string();
        assert!(e.contains("record type 11: field 2 (realtime_ns)"), "{e}");
    }

    #[test]
    fn the_header_is_checked_before_the_string_table() {
        // a file of another format version whose STRING records look different says its version,
        // not that a STRING is malformed; a bad STRING names its own record
        let hdr = |b: &mut Vec<u8>, version: i64| {
            write(
                b,
                &V::A(vec![
                    V::I(1),
                    V::S(MAGIC),
                    V::I(version),
                    V::M(vec![("pid", V::I(1)), ("clock_sync", V::A(vec![V::I(0), V::I(0)]))]),
                ]),
            )
        };
        let mut b = Vec::new();
        hdr(&mut b, 2);
        write(&mut b, &V::A(vec![V::I(2), V::S("a new layout"), V::I(7)]));
        let e = read_raw("p", &b, 0).unwrap_err().to_string();
        assert!(e.contains("unsupported raw format version 2"), "{e}");
        let mut b = Vec::new();
        hdr(&mut b, FORMAT_VERSION);
        write(&mut b, &V::A(vec![V::I(2), V::I(1), V::S("ok")]));
        write(&mut b, &V::A(vec![V::I(2), V::S("bad"), V::I(7)]));
        let e = read_raw("p", &b, 0).unwrap_err();
        assert!(e.to_string().contains("STRING record must be [2, id, text]"), "{e}");
        assert!(matches!(e, Error::Format { index: Some(2), .. }), "{e:?}");
    }

    #[test]
    fn interpolation_is_the_same_in_any_timestamp_order() {
        // many syncs, timestamps in runs (as a thread's records come) and jumping between intervals
        // (as chunks interleave): each is mapped as a search from scratch maps it
        let mut b = Vec::new();
        header(&mut b, 9, 0, 0);
        let syncs: Vec<(i64, i64)> = (1..=40).map(|k| (k * 100_000, (k * k * 37) % 5_000 - 2_500)).collect();
        for &(mono, off) in syncs.iter().rev() {
            write(&mut b, &V::A(vec![V::I(11), V::I(mono), V::I(mono + off)]));
        }
        let mut x: u64 = 12345;
        let mut want = Vec::new();
        for i in 0..3_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let ts = if i % 7 == 0 {
                (x >> 20) as i64 % 4_300_000
            } else {
                50 * i as i64
            };
            let all: Vec<(i64, i64)> = std::iter::once((0, 0)).chain(syncs.iter().copied()).collect();
            let k = all.partition_point(|s| s.0 <= ts);
            let off = match k {
                k if k == all.len() => all[k - 1].1,
                k => all[k - 1].1 + (all[k].1 - all[k - 1].1) * (ts - all[k - 1].0) / (all[k].0 - all[k - 1].0),
            };
            want.push(ts + off);
            write(
                &mut b,
                &V::A(vec![
                    V::I(7),
                    V::I(Layer::Annotation as i64),
                    V::S("m"),
                    V::I(1),
                    V::I(ts),
                ]),
            );
        }
        let (t, _) = read_raw("p", &b, 0).unwrap();
        assert_eq!(t.ts, want);
    }

    #[test]
    fn dropped_records_are_summed_per_reason() {
        let mut b = Vec::new();
        header(&mut b, 9, 0, 0);
        let dropped = |b: &mut Vec<u8>, n: i64, why: &str| write(b, &V::A(vec![V::I(10), V::I(n), V::S(why)]));
        dropped(&mut b, 3, "trace file full or unwritable");
        span(&mut b, Layer::Annotation as i64, "a", 1, 0, 5);
        dropped(&mut b, 6, "NVTX called from a signal handler");
        dropped(&mut b, 4, "trace file full or unwritable");
        let (t, _) = read_raw("p", &b, 0).unwrap();
        let w: Vec<&String> = t.warnings.iter().filter(|w| w.contains("dropped")).collect();
        assert_eq!(
            w,
            [
                "p: the collector dropped 7 record(s) (2 reports): trace file full or unwritable",
                "p: the collector dropped 6 record(s): NVTX called from a signal handler",
            ]
        );
    }

    #[test]
    fn kernels_are_demangled_and_api_names_lose_their_version() {
        let mut b = Vec::new();
        header(&mut b, 9, 0, 0);
        let (rt, drv, k) = (Layer::Runtime as i64, Layer::Driver as i64, Layer::Kernel as i64);
        span(&mut b, rt, "cudaLaunchKernel_v7000", 1, 0, 5);
        span(&mut b, rt, "cudaLaunchKernel_v7000", 1, 10, 15);
        span(&mut b, drv, "cuMemAlloc_v2", 1, 20, 25);
        span(&mut b, k, "_Z6kernelPfi", 7, 30, 35);
        span(&mut b, k, "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT", 7, 40, 45);
        span(&mut b, Layer::Annotation as i64, "_Z6kernelPfi_v1234", 1, 50, 55);
        span(
            &mut b,
            Layer::Annotation as i64,
            "aten::mul, seq = 3, op_id = 7",
            1,
            60,
            65,
        );
        span(&mut b, Layer::Annotation as i64, "my_scope, op_id = 8", 1, 70, 75);
        let (t, _) = read_raw("p", &b, 0).unwrap();
        assert_eq!(t.layer_of(6), Layer::HostOp);
        assert_eq!(t.strings.get(t.cat[6]), LAYER_DEFAULT_CATS[Layer::HostOp as usize]);
        assert_eq!(t.layer_of(5), Layer::Annotation);
        assert_eq!(t.layer_of(7), Layer::Annotation);
        let names: Vec<&str> = (0..t.len()).map(|i| t.name_of(i)).collect();
        assert_eq!(
            names,
            [
                "cudaLaunchKernel",
                "cudaLaunchKernel",
                "cuMemAlloc_v2",
                "kernel(float*, int)",
                "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT",
                "_Z6kernelPfi_v1234", // an annotation is the user's text
                "aten::mul",          // torch's operator range: a host operator
                "my_scope"            // torch's record_function scope: an annotation, suffix dropped
            ]
        );
    }

    #[test]
    fn device_properties_in_the_header_reach_the_chrome_output() {
        let dev =
            |id: i64, name: &'static str| V::M(vec![("id", V::I(id)), ("name", V::S(name)), ("computeMajor", V::I(9))]);
        let file = |pid: i64, devs: Vec<V<'static>>| {
            let mut b = Vec::new();
            write(
                &mut b,
                &V::A(vec![
                    V::I(1),
                    V::S(MAGIC),
                    V::I(FORMAT_VERSION),
                    V::M(vec![
                        ("pid", V::I(pid)),
                        ("host", V::S("test")),
                        ("clock_sync", V::A(vec![V::I(0), V::I(1_000)])),
                        ("deviceProperties", V::A(devs)),
                    ]),
                ]),
            );
            span(&mut b, 6, "k", 1, 10, 20);
            b
        };
        let a = file(1, vec![dev(1, "GPU-B"), dev(0, "GPU-A")]);
        let (ta, _) = read_raw("a", &a, 0).unwrap();
        let md = &ta.sources[0].metadata;
        assert_eq!(md[0].0, "header");
        let (k, v) = &md[1];
        assert_eq!(k, "deviceProperties");
        assert!(
            v.starts_with('[') && v.contains("\"GPU-A\"") && v.contains("\"GPU-B\""),
            "{v}"
        );
        // two processes of one job: one list, by id, each device once
        let b = file(2, vec![dev(1, "GPU-B (rank 1's view)"), dev(2, "GPU-C")]);
        let (tb, _) = read_raw("b", &b, 1).unwrap();
        let texts: Vec<&str> = [&ta, &tb]
            .iter()
            .flat_map(|t| t.sources[0].metadata.iter())
            .filter(|(k, _)| k == "deviceProperties")
            .map(|(_, v)| v.as_str())
            .collect();
        let merged = crate::writer::merge_device_properties(&texts).unwrap();
        let names: Vec<&str> = ["GPU-A", "GPU-B", "GPU-C", "rank 1's view"]
            .into_iter()
            .filter(|n| merged.contains(n))
            .collect();
        assert_eq!(names, ["GPU-A", "GPU-B", "GPU-C"], "{merged}");
        assert!(merged.find("GPU-A").unwrap() < merged.find("GPU-B").unwrap());
        // a header without the key: only the header metadata
        let mut c = Vec::new();
        header(&mut c, 3, 0, 0);
        span(&mut c, 6, "k", 1, 10, 20);
        let (tc, _) = read_raw("c", &c, 0).unwrap();
        assert_eq!(tc.sources[0].metadata.len(), 1);
    }

    #[test]
    fn padding_and_errors() {
        let mut b = Vec::new();
        header(&mut b, 1, 0, 0);
        b.extend_from_slice(&[0; 100]);
        span(&mut b, 2, "x", 1, 1, 2);
        b.extend_from_slice(&[0; 10]);
        let (t, _) = read_raw("p", &b, 0).unwrap();
        assert_eq!(t.len(), 1);
        // a non-array record right after another record is corrupt: an error with its offset
        let mut c = Vec::new();
        header(&mut c, 1, 0, 0);
        span(&mut c, 2, "x", 1, 1, 2);
        let off = c.len();
        c.push(0x05);
        match read_raw("p", &c, 0) {
            Err(Error::Format { offset, .. }) => assert_eq!(offset, Some(off as u64)),
            other => panic!("{other:?}"),
        }
        // ... but after zero padding it is a torn record (its zero header byte never written): the
        // leftovers are skipped up to the next zero run and the records after it are kept
        let mut c = Vec::new();
        header(&mut c, 1, 0, 0);
        span(&mut c, 2, "x", 1, 1, 2);
        let torn_at = c.len() + 1;
        c.push(0);
        c.extend_from_slice(&[0x03, 0x02, 0xa1, b'y', 0x01, 0x00, 0x00, 0x05]);
        c.extend_from_slice(&[0; 40]);
        span(&mut c, 2, "z", 1, 3, 4);
        let (t, _) = read_raw("p", &c, 0).unwrap();
        assert_eq!((0..t.len()).map(|i| t.name_of(i)).collect::<Vec<_>>(), vec!["x", "z"]);
        assert!(
            t.warnings
                .iter()
                .any(|w| w.contains(&format!("torn record at byte {torn_at}"))),
            "{:?}",
            t.warnings
        );
        // not a raw file: said before decoding (random bytes used to read "string is not valid UTF-8")
        for junk in [
            &b"[1,2]"[..],
            &[0xa3, 0xff, 0xfe, 0x00][..],
            &[0x93, 0x01, 0x02, 0x03][..],
        ] {
            let e = read_raw("p", junk, 0).unwrap_err().to_string();
            assert!(e.contains("not a teller raw trace"), "{e}");
        }
        // cut inside the HEADER's opening, or torn before its first byte was written
        for cut in 1..14 {
            let e = read_raw("p", &b[..cut], 0).unwrap_err().to_string();
            assert!(e.contains("truncated before the end of the HEADER"), "{cut}: {e}");
        }
        let mut torn = b.clone();
        torn[0] = 0;
        let e = read_raw("p", &torn, 0).unwrap_err().to_string();
        assert!(e.contains("torn HEADER record"), "{e}");
        // a zero byte, loose values, zeros: once skipped as a torn record, leaving no HEADER (a panic)
        let mut z = vec![0u8, 0x03, 0x02, 0xa1, b'y'];
        z.extend_from_slice(&[0; 64]);
        let e = read_raw("p", &z, 0).unwrap_err().to_string();
        assert!(e.contains("HEADER"), "{e}");
        assert!(!looks_like_raw(b"{\"traceEvents\": []}"));
        assert!(looks_like_raw(&b));
        // a wrong version
        let mut v = Vec::new();
        write(&mut v, &V::A(vec![V::I(1), V::S(MAGIC), V::I(99), V::M(vec![])]));
        let e = read_raw("p", &v, 0).unwrap_err().to_string();
        assert!(e.contains("unsupported raw format version 99"), "{e}");
    }
}
