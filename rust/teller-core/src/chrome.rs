//! Reader for Chrome Trace Event JSON as written by the PyTorch profiler (Kineto), by teller itself,
//! and by other tools that follow the format: a `{"traceEvents": [...]}` object or a bare list;
//! phases X, B/E, i/I/R, s/t/f, M, C; float microseconds parsed exactly; `baseTimeNanoseconds`;
//! pid/tid as ints, numeric strings or labels ("Spans", "stream 7").

use crate::error::{Error, Result};
use crate::inflate::{Feed, Stop};
use crate::json::{decode_str_validated as decode_str, parse_int, parse_scaled, Raw, ScanError, Scanner};
use crate::model::*;
use hashbrown::HashMap;

/// Phases defined by the Trace Event Format that teller reads but does not model (async, object,
/// sample, memory-dump and context events, and Chromium's `=` that links two ids). They are counted and reported as a warning.
const SKIPPED_PHASES: &[u8] = b"bneSTFpPONDVvc()=";

#[derive(Default, Clone, Copy)]
struct Ev {
    ph: u8,
    name: u32,
    cat: Option<u32>,
    ts: Option<i64>,
    dur: Option<i64>,
    pid: i64,
    tid: i64,
    tid_str: bool,
    corr: u64,
    ext: u64,
    device: Option<i64>,
    stream: Option<i64>,
    id: Option<u64>,
    /// `id` is a string's index (with the top bit set), not a number
    id_str: bool,
    /// a string `id`'s text as written (interned), numeric or hex strings too: a counter is named
    /// by it (`"0x8000000000000000"` is not the number -9223372036854775808, nor `"0x10"` 16)
    id_text: Option<u32>,
    bp_e: bool,
    args_start: usize,
    meta_name: Option<u32>,
    /// `args["teller.unfinished"]` (teller's own output: a range still open when the capture ended)
    unfinished: bool,
    /// an instant's scope (`"s"`) as flags: 0 for a thread's (the default), SCOPE_PROCESS, SCOPE_GLOBAL
    scope: u8,
}

/// A 'B' or 'E' event, held until the file is read: the format does not require events in time
/// order, so they are paired per thread in timestamp order (as Perfetto does), not in file order.
struct BeRec {
    ev: Ev,
    ts: i64,
    args: Vec<(u32, ArgValue)>,
}

pub struct ChromeReader<'a, 'f> {
    path: &'a str,
    sc: Scanner<'a>,
    /// Set when the bytes are still arriving (`inflate`): the scanner sees a growing prefix.
    feed: Option<&'f mut Feed<'a>>,
    /// The feed stopped because the gzip trailer's size was wrong (start over serially).
    overflow: bool,
    t: Trace,
    source: u16,
    index: u64,
    /// 'B' and 'E' events per (pid, tid), in file order (paired by `pair_begin_end`).
    be: HashMap<(i64, i64), Vec<BeRec>>,
    unknown_cats: HashMap<u32, u64>,
    skipped_phases: HashMap<u8, u64>,
    neg_dur: u64,
    bad_device: u64,
    unmatched_end: u64,
    // Cached symbols of the argument keys we pull out into columns.
    k_corr: u32,
    k_ext: u32,
    k_ext_lc: u32,
    k_device: u32,
    k_stream: u32,
    k_name: u32,
    /// `writer::CULPRIT_CAT`: copies of highlighted events, skipped
    k_culprit: u32,
}

/// Reads one Chrome trace from its (decompressed) bytes. `source` is the source index events get.
pub fn read_chrome(path: &str, bytes: &[u8], source: u16) -> Result<Trace> {
    let mut r = ChromeReader::new(path, Scanner::new(bytes), None, source);
    r.run()?;
    Ok(r.t)
}

/// Reads one Chrome trace while its bytes arrive through `feed` (a gzip file inflating on another
/// thread). The result, warnings and errors are those of `read_chrome` on the whole text.
pub fn read_chrome_feed(feed: &mut Feed<'_>, source: u16) -> std::result::Result<Trace, Stop> {
    let path = feed.path();
    // the byte order mark check needs the first three bytes
    while feed.slice().len() < 3 && feed.more()? {}
    let sc = Scanner::new(feed.slice());
    let mut r = ChromeReader::new(path, sc, Some(feed), source);
    match r.run() {
        _ if r.overflow => Err(Stop::Overflow),
        Ok(()) => Ok(r.t),
        Err(e) => Err(Stop::Err(e)),
    }
}

impl<'a, 'f> ChromeReader<'a, 'f> {
    fn new(path: &'a str, sc: Scanner<'a>, feed: Option<&'f mut Feed<'a>>, source: u16) -> Self {
        let mut t = Trace::new();
        let k_corr = t.strings.intern("correlation");
        let k_ext = t.strings.intern("External id");
        let k_ext_lc = t.strings.intern("external id");
        let k_device = t.strings.intern("device");
        let k_stream = t.strings.intern("stream");
        let k_name = t.strings.intern("name");
        let k_culprit = t.strings.intern(crate::writer::CULPRIT_CAT);
        ChromeReader {
            path,
            sc,
            feed,
            overflow: false,
            t,
            source,
            index: 0,
            be: HashMap::new(),
            unknown_cats: HashMap::new(),
            skipped_phases: HashMap::new(),
            neg_dur: 0,
            bad_device: 0,
            unmatched_end: 0,
            k_corr,
            k_ext,
            k_ext_lc,
            k_device,
            k_stream,
            k_name,
            k_culprit,
        }
    }

    /// Waits for more of the input (with a feed): true when the scanner's buffer grew, false when
    /// there is no more (or no feed). A stream that stops with an error ends the read with it.
    fn grow(&mut self) -> Result<bool> {
        let Some(feed) = self.feed.as_deref_mut() else {
            return Ok(false);
        };
        match feed.more() {
            Ok(true) => {
                self.sc.buf = feed.slice();
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(Stop::Err(e)) => Err(e),
            Err(Stop::Overflow) => {
                self.overflow = true;
                Err(Error::Config("gzip size trailer was wrong".into()))
            }
        }
    }

    /// Runs one piece of the parse that ends on a closing byte (an event object, a top-level
    /// value with the ',' or '}' after it). If it fails while more input can arrive, it may have
    /// been cut by the end of what has arrived: wait for more and parse it again from its start.
    /// What it added is undone first (args, the `bad_device` count, strings it interned: a number
    /// cut short may have been interned as an argument's text), so ids match a serial read.
    #[inline]
    fn attempt<T>(&mut self, mut f: impl FnMut(&mut Self) -> Result<T>) -> Result<T> {
        let (pos, nargs, bad, nstr) = (self.sc.pos, self.t.args.len(), self.bad_device, self.t.strings.len());
        loop {
            match f(self) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    if !self.grow()? {
                        return Err(e);
                    }
                    self.sc.pos = pos;
                    self.t.args.truncate(nargs);
                    self.bad_device = bad;
                    if self.t.strings.len() > nstr {
                        self.t.strings.truncate(nstr);
                        self.t.id_labels.retain(|_, s| (*s as usize) < nstr);
                    }
                }
            }
        }
    }

    /// `Scanner::peek`, waiting for input when what has arrived ends in whitespace.
    fn peek_wait(&mut self) -> Result<Option<u8>> {
        loop {
            if let Some(b) = self.sc.peek() {
                return Ok(Some(b));
            }
            if !self.grow()? {
                return Ok(None);
            }
        }
    }

    fn ferr(&self, e: ScanError, in_event: bool) -> Error {
        Error::format(
            self.path,
            Some(e.offset as u64),
            if in_event { Some(self.index) } else { None },
            e.msg,
        )
    }

    fn run(&mut self) -> Result<()> {
        if self.feed.is_some() {
            // the feed hands out validated UTF-8 only
            self.sc.validated = true;
        } else {
            self.sc.validate_utf8().map_err(|e| self.ferr(e, false))?;
        }
        let mut base_ns: i64 = 0;
        let mut metadata = Vec::new();
        match self.peek_wait()? {
            None => {
                return Err(Error::Empty {
                    path: self.path.into(),
                    msg: "empty file: no JSON content".into(),
                })
            }
            Some(b'[') => self.events_array()?,
            Some(b'{') => {
                self.sc.pos += 1;
                let mut saw_events = false;
                if self.peek_wait()? == Some(b'}') {
                    self.sc.pos += 1;
                } else {
                    loop {
                        let key = self.attempt(|r| {
                            let key = r.sc.string().map_err(|e| r.ferr(e, false))?.into_owned();
                            r.sc.expect(b':').map_err(|e| r.ferr(e, false))?;
                            Ok(key)
                        })?;
                        // a value and the ',' or '}' after it are one attempt: a number cut by the
                        // end of what has arrived would otherwise read as a shorter number
                        let more = match key.as_str() {
                            "traceEvents" => {
                                if self.peek_wait()? != Some(b'[') {
                                    let off = self.sc.pos as u64;
                                    return Err(Error::format(
                                        self.path,
                                        Some(off),
                                        None,
                                        "'traceEvents' must be an array",
                                    ));
                                }
                                self.events_array()?;
                                saw_events = true;
                                self.attempt(|r| r.sc.comma_or(b'}').map_err(|e| r.ferr(e, false)))?
                            }
                            "baseTimeNanoseconds" => {
                                let (b, more) = self.attempt(|r| {
                                    let off = r.sc.pos;
                                    let v = r.sc.value_raw().map_err(|e| r.ferr(e, false))?;
                                    let b = match v {
                                        Raw::Num(n) => parse_int(n),
                                        _ => None,
                                    }
                                    .filter(|b| b.unsigned_abs() <= MAX_TIME_NS as u64)
                                    .ok_or_else(|| {
                                        Error::format(
                                            r.path,
                                            Some(off as u64),
                                            None,
                                            "'baseTimeNanoseconds' must be an integer of at most 4e18 (ns)",
                                        )
                                    })?;
                                    Ok((b, r.sc.comma_or(b'}').map_err(|e| r.ferr(e, false))?))
                                })?;
                                base_ns = b;
                                more
                            }
                            _ => {
                                let (text, more) = self.attempt(|r| {
                                    let start = r.sc.pos;
                                    r.sc.skip_value().map_err(|e| r.ferr(e, false))?;
                                    let end = r.sc.pos;
                                    let more = r.sc.comma_or(b'}').map_err(|e| r.ferr(e, false))?;
                                    Ok((String::from_utf8_lossy(&r.sc.buf[start..end]).trim().to_string(), more))
                                })?;
                                metadata.push((key, text));
                                more
                            }
                        };
                        if !more {
                            break;
                        }
                    }
                }
                if !saw_events {
                    return Err(Error::format(
                        self.path,
                        Some(0),
                        None,
                        "not a Chrome trace: the object has no 'traceEvents' array",
                    ));
                }
            }
            Some(b) => {
                return Err(Error::format(
                    self.path,
                    Some(self.sc.pos as u64),
                    None,
                    format!(
                        "not a Chrome trace: expected '{{' or '[' but found '{}'",
                        crate::json::printable(b)
                    ),
                ))
            }
        }
        if self.peek_wait()?.is_some() {
            let off = self.sc.pos as u64;
            return Err(Error::format(
                self.path,
                Some(off),
                None,
                "unexpected content after the end of the trace",
            ));
        }
        self.pair_begin_end();
        self.finish_warnings();
        if base_ns != 0 {
            // (each time was bounded alone; with the base added it must still be within what a loaded
            // trace holds, or the trace written from it could not be read back)
            let out_of_range = |v: i64| v.saturating_add(base_ns).unsigned_abs() > MAX_TIME_NS as u64;
            if self
                .t
                .ts
                .iter()
                .chain(self.t.flows.iter().map(|f| &f.ts))
                .chain(self.t.counters.iter().map(|c| &c.ts))
                .any(|&v| out_of_range(v))
            {
                return Err(Error::format(
                    self.path,
                    None,
                    None,
                    format!("a time plus 'baseTimeNanoseconds' ({base_ns}) is beyond 4e18 ns"),
                ));
            }
            for ts in self.t.ts.iter_mut() {
                *ts = ts.saturating_add(base_ns);
            }
            for f in self.t.flows.iter_mut() {
                f.ts = f.ts.saturating_add(base_ns);
            }
            for c in self.t.counters.iter_mut() {
                c.ts = c.ts.saturating_add(base_ns);
            }
        }
        let n = self.t.len() as u64;
        self.t.sources.push(SourceInfo {
            path: self.path.to_string(),
            kind: "chrome".into(),
            base_ns,
            events: n,
            metadata,
            ..Default::default()
        });
        Ok(())
    }

    fn events_array(&mut self) -> Result<()> {
        self.attempt(|r| r.sc.expect(b'[').map_err(|e| r.ferr(e, false)))?;
        if self.peek_wait()? == Some(b']') {
            self.sc.pos += 1;
            return Ok(());
        }
        loop {
            let ev_start = self.sc.pos;
            let ev = self.attempt(|r| r.event(ev_start))?;
            self.dispatch(ev, ev_start)?;
            self.index += 1;
            if !self.attempt(|r| r.sc.comma_or(b']').map_err(|e| r.ferr(e, true)))? {
                return Ok(());
            }
        }
    }

    fn id_value(&mut self, v: Raw<'a>, what: &str, off: usize) -> Result<(i64, bool)> {
        match v {
            Raw::Num(n) => parse_int(n).map(|x| (x, false)).ok_or_else(|| {
                Error::format(
                    self.path,
                    Some(off as u64),
                    Some(self.index),
                    format!("'{what}' must be an integer"),
                )
            }),
            Raw::Str(s, esc) => {
                let s =
                    decode_str(s, esc).map_err(|m| Error::format(self.path, Some(off as u64), Some(self.index), m))?;
                let st = s.trim();
                if let Some(x) = parse_int(st.as_bytes()) {
                    return Ok((x, true));
                }
                if let Some(rest) = st.strip_prefix("stream ") {
                    if let Some(x) = parse_int(rest.trim().as_bytes()) {
                        return Ok((x, true));
                    }
                }
                Ok((self.t.label_id(st), true))
            }
            _ => Err(Error::format(
                self.path,
                Some(off as u64),
                Some(self.index),
                format!("'{what}' must be an integer or a string"),
            )),
        }
    }

    /// Parses one event object; `dispatch` files it. Nothing here outlives a failed attempt but
    /// interned strings and the args it pushed (truncated again by `attempt`).
    /// A flow's or counter's `id`: a number, a numeric or hex string as that number, another string
    /// as its interned index with the top bit set; anything else 0.
    /// (the id, whether it is a string's index rather than a number: a negative number has the top
    /// bit set too)
    fn id_of(&mut self, v: Raw) -> (u64, bool) {
        match v {
            Raw::Num(n) => (parse_int(n).unwrap_or(0) as u64, false),
            Raw::Str(s, esc) => {
                let s = decode_str(s, esc).unwrap_or_default();
                let st = s.trim();
                if let Some(h) = st.strip_prefix("0x").or_else(|| st.strip_prefix("0X")) {
                    (u64::from_str_radix(h, 16).unwrap_or(0), false)
                } else if let Some(x) = parse_int(st.as_bytes()) {
                    (x as u64, false)
                } else {
                    (self.t.strings.intern(st) as u64 | (1 << 63), true)
                }
            }
            _ => (0, false),
        }
    }

    fn event(&mut self, ev_start: usize) -> Result<Ev> {
        if self.sc.peek() != Some(b'{') {
            let off = self.sc.pos as u64;
            let found = match self.sc.peek() {
                Some(b) => format!("'{}'", crate::json::printable(b)),
                None => "end of input (truncated file?)".into(),
            };
            return Err(Error::format(
                self.path,
                Some(off),
                Some(self.index),
                format!("expected an event object, found {found}"),
            ));
        }
        self.sc.pos += 1;
        let mut ev = Ev {
            args_start: self.t.args.len(),
            ..Default::default()
        };
        let mut has_ph = false;
        if self.sc.peek() == Some(b'}') {
            self.sc.pos += 1;
        } else {
            loop {
                let (kraw, kesc) = self.sc.string_raw().map_err(|e| self.ferr(e, true))?;
                self.sc.expect(b':').map_err(|e| self.ferr(e, true))?;
                let voff = {
                    self.sc.skip_ws();
                    self.sc.pos
                };
                let key: std::borrow::Cow<[u8]> = if kesc {
                    match decode_str(kraw, true) {
                        Ok(s) => std::borrow::Cow::Owned(s.into_owned().into_bytes()),
                        Err(m) => return Err(Error::format(self.path, Some(voff as u64), Some(self.index), m)),
                    }
                } else {
                    std::borrow::Cow::Borrowed(kraw)
                };
                match &*key {
                    b"ph" => {
                        let s = self.expect_str(voff, "ph")?;
                        let b = s.as_bytes();
                        if b.len() != 1 {
                            return Err(Error::format(
                                self.path,
                                Some(voff as u64),
                                Some(self.index),
                                format!("unknown phase {s:?}"),
                            ));
                        }
                        ev.ph = b[0];
                        has_ph = true;
                    }
                    b"name" => {
                        let s = self.expect_str(voff, "name")?;
                        ev.name = self.t.strings.intern(&s);
                    }
                    b"cat" => {
                        let s = self.expect_str(voff, "cat")?;
                        ev.cat = Some(self.t.strings.intern(&s));
                    }
                    b"ts" => ev.ts = Some(self.expect_time(voff, "ts")?),
                    b"dur" => ev.dur = Some(self.expect_time(voff, "dur")?),
                    b"pid" => {
                        let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
                        ev.pid = self.id_value(v, "pid", voff)?.0;
                    }
                    b"tid" => {
                        let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
                        let (x, s) = self.id_value(v, "tid", voff)?;
                        ev.tid = x;
                        ev.tid_str = s;
                    }
                    b"id" => {
                        let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
                        // (null: no id, as if absent; a counter's id names its series)
                        (ev.id, ev.id_str, ev.id_text) = match v {
                            Raw::Null => (None, false, None),
                            v => {
                                let (x, s) = self.id_of(v);
                                // (a counter's only: `ph` is read by now in nearly every file, and
                                // an async or flow event's hex id need not be interned)
                                let text = match v {
                                    _ if !matches!(ev.ph, b'C' | 0) => None,
                                    Raw::Str(..) if s => Some((x & !(1 << 63)) as u32),
                                    Raw::Str(t, esc) => {
                                        let t = decode_str(t, esc).unwrap_or_default();
                                        Some(self.t.strings.intern(t.trim()))
                                    }
                                    _ => None,
                                };
                                (Some(x), s, text)
                            }
                        };
                    }
                    b"s" => {
                        // (an instant's scope; kept so that a global marker stays global when written)
                        let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
                        ev.scope = match v {
                            Raw::Str(b"g", _) => flags::SCOPE_GLOBAL,
                            Raw::Str(b"p", _) => flags::SCOPE_PROCESS,
                            _ => 0,
                        };
                    }
                    b"bp" => {
                        let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
                        ev.bp_e = matches!(v, Raw::Str(b"e", _));
                    }
                    b"args" => self.args(&mut ev, voff)?,
                    _ => self.sc.skip_value().map_err(|e| self.ferr(e, true))?,
                }
                if !self.sc.comma_or(b'}').map_err(|e| self.ferr(e, true))? {
                    break;
                }
            }
        }
        if !has_ph {
            return Err(Error::format(
                self.path,
                Some(ev_start as u64),
                Some(self.index),
                "event has no 'ph' (phase)",
            ));
        }
        Ok(ev)
    }

    fn expect_str(&mut self, off: usize, what: &str) -> Result<std::borrow::Cow<'a, str>> {
        if self.sc.peek() != Some(b'"') {
            let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
            return Err(Error::format(
                self.path,
                Some(off as u64),
                Some(self.index),
                format!("'{what}' must be a string, found {}", kind_of(&v)),
            ));
        }
        self.sc.string().map_err(|e| self.ferr(e, true))
    }

    fn expect_time(&mut self, off: usize, what: &str) -> Result<i64> {
        let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
        match v {
            Raw::Num(n) => parse_scaled(n, 3)
                .filter(|v| v.unsigned_abs() <= MAX_TIME_NS as u64)
                .ok_or_else(|| {
                    Error::format(
                        self.path,
                        Some(off as u64),
                        Some(self.index),
                        format!(
                            "'{what}' is out of range ({} us; teller reads -{max}..{max} us)",
                            String::from_utf8_lossy(&n[..n.len().min(40)]),
                            max = MAX_TIME_NS / 1000
                        ),
                    )
                }),
            other => Err(Error::format(
                self.path,
                Some(off as u64),
                Some(self.index),
                format!("'{what}' must be a number (microseconds), found {}", kind_of(&other)),
            )),
        }
    }

    fn args(&mut self, ev: &mut Ev, off: usize) -> Result<()> {
        match self.sc.peek() {
            Some(b'{') => {}
            Some(b'n') => {
                self.sc.skip_value().map_err(|e| self.ferr(e, true))?;
                return Ok(());
            }
            _ => {
                let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
                return Err(Error::format(
                    self.path,
                    Some(off as u64),
                    Some(self.index),
                    format!("'args' must be an object, found {}", kind_of(&v)),
                ));
            }
        }
        self.sc.pos += 1;
        if self.sc.peek() == Some(b'}') {
            self.sc.pos += 1;
            return Ok(());
        }
        loop {
            let k = self.sc.string().map_err(|e| self.ferr(e, true))?;
            if k.starts_with("teller.") {
                // what teller's writer derived (teller.step, teller.highlight): derived again, not
                // kept as args that would go stale; teller.unfinished is the flag it stands for
                self.sc.expect(b':').map_err(|e| self.ferr(e, true))?;
                let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
                ev.unfinished |= k == "teller.unfinished" && matches!(v, Raw::True);
                if !self.sc.comma_or(b'}').map_err(|e| self.ferr(e, true))? {
                    return Ok(());
                }
                continue;
            }
            let key = self.t.strings.intern(&k);
            self.sc.expect(b':').map_err(|e| self.ferr(e, true))?;
            let v = self.sc.value_raw().map_err(|e| self.ferr(e, true))?;
            let val = match v {
                Raw::Num(n) => match parse_int(n) {
                    Some(i) => ArgValue::Int(i),
                    None => {
                        let is_float = n.iter().any(|&c| c == b'.' || c == b'e' || c == b'E');
                        match (
                            is_float,
                            std::str::from_utf8(n).ok().and_then(|s| s.parse::<f64>().ok()),
                        ) {
                            (true, Some(f)) => ArgValue::Float(f),
                            _ => ArgValue::Json(self.t.strings.intern(&String::from_utf8_lossy(n))),
                        }
                    }
                },
                Raw::Str(s, esc) => {
                    let s = decode_str(s, esc)
                        .map_err(|m| Error::format(self.path, Some(off as u64), Some(self.index), m))?;
                    ArgValue::Str(self.t.strings.intern(&s))
                }
                Raw::True => ArgValue::Bool(true),
                Raw::False => ArgValue::Bool(false),
                Raw::Null => ArgValue::Null,
                Raw::Array(text) | Raw::Object(text) => {
                    let text = decode_str(text, false)
                        .map_err(|m| Error::format(self.path, Some(off as u64), Some(self.index), m))?;
                    ArgValue::Json(self.t.strings.intern(&text))
                }
            };
            // Pull the correlation keys into columns; they are written back from the columns.
            let as_int = |v: &ArgValue| -> Option<i64> {
                match *v {
                    ArgValue::Int(i) => Some(i),
                    _ => None,
                }
            };
            if key == self.k_corr {
                ev.corr = as_int(&val).unwrap_or(0).max(0) as u64;
            } else if key == self.k_ext || key == self.k_ext_lc {
                ev.ext = as_int(&val).unwrap_or(0).max(0) as u64;
            } else {
                if key == self.k_device {
                    ev.device = as_int(&val);
                    if ev.device.is_some_and(|d| !(-1..=i32::MAX as i64).contains(&d)) {
                        // an index that does not fit would wrap into another GPU's: not read as one
                        // (a host event's args.device is no concern of ours; counted, said once)
                        ev.device = None;
                        self.bad_device += 1;
                    }
                } else if key == self.k_stream {
                    ev.stream = as_int(&val);
                } else if key == self.k_name {
                    if let ArgValue::Str(s) = val {
                        ev.meta_name = Some(s);
                    }
                }
                self.t.args.push((key, val));
            }
            if !self.sc.comma_or(b'}').map_err(|e| self.ferr(e, true))? {
                return Ok(());
            }
        }
    }

    fn layer_for(&mut self, cat: Option<u32>, default: Layer) -> Layer {
        match cat {
            None => default,
            Some(c) => match layer_from_category(self.t.strings.get(c)) {
                Some(Layer::Other) if default == Layer::Marker => Layer::Marker,
                Some(l) => l,
                None => {
                    *self.unknown_cats.entry(c).or_insert(0) += 1;
                    default
                }
            },
        }
    }

    fn need_ts(&self, ev: &Ev, off: usize) -> Result<i64> {
        ev.ts.ok_or_else(|| {
            Error::format(
                self.path,
                Some(off as u64),
                Some(self.index),
                format!("'{}' event has no 'ts'", ev.ph as char),
            )
        })
    }

    fn dispatch(&mut self, ev: Ev, off: usize) -> Result<()> {
        let culprit_copy = ev.cat == Some(self.k_culprit)
            || (ev.ph == b'M'
                && ev.pid >= LABEL_ID_BASE
                && self.t.id_labels.get(&ev.pid).map(|&s| self.t.strings.get(s))
                    == Some(crate::writer::CULPRIT_PROCESS));
        if culprit_copy {
            // (a diagnosis's copy of an event that is in the file itself, and its track names: the
            // trace reads back as the one it was written from)
            self.t.args.truncate(ev.args_start);
            return Ok(());
        }
        match ev.ph {
            b'X' => {
                let ts = self.need_ts(&ev, off)?;
                let mut dur = ev.dur.unwrap_or(0);
                if dur < 0 {
                    self.neg_dur += 1;
                    dur = 0;
                }
                let layer = self.layer_for(ev.cat, Layer::Other);
                self.push(layer, &ev, ts, dur, 0);
            }
            b'i' | b'I' | b'R' => {
                let ts = self.need_ts(&ev, off)?;
                let layer = self.layer_for(ev.cat, Layer::Marker);
                self.push(layer, &ev, ts, 0, flags::INSTANT | ev.scope);
            }
            b'B' | b'E' => {
                let ts = self.need_ts(&ev, off)?;
                let args = self.t.args.split_off(ev.args_start);
                self.be
                    .entry((ev.pid, ev.tid))
                    .or_default()
                    .push(BeRec { ev, ts, args });
            }
            b's' | b't' | b'f' => {
                let ts = self.need_ts(&ev, off)?;
                self.t.args.truncate(ev.args_start);
                self.t.flows.push(Flow {
                    id: ev.id.unwrap_or(0),
                    phase: ev.ph,
                    cat: ev.cat.unwrap_or(0),
                    name: ev.name,
                    ts,
                    pid: ev.pid,
                    tid: ev.tid,
                    binding_enclosing: ev.bp_e,
                    source: self.source,
                });
            }
            b'M' => {
                let nm = self.t.strings.get(ev.name);
                if let Some(v) = ev.meta_name {
                    if nm == "process_name" {
                        self.t.process_names.push((ev.pid, v));
                    } else if nm == "thread_name" {
                        self.t.thread_names.push((ev.pid, ev.tid, v));
                    }
                }
                if nm == "process_labels" {
                    // ("labels": Kineto's "CPU" / "GPU 0", shown beside the process name)
                    let labels = self.t.args[ev.args_start..].iter().rev().find_map(|(k, v)| match *v {
                        ArgValue::Str(s) if self.t.strings.get(*k) == "labels" => Some(s),
                        _ => None,
                    });
                    if let Some(l) = labels {
                        self.t.process_labels.push((ev.pid, l));
                    }
                }
                if nm == "process_sort_index" || nm == "thread_sort_index" {
                    // args.sort_index orders the tracks in the viewers (Kineto puts the GPUs after the
                    // host this way): kept, written back as read. A whole number only, as the viewers
                    // read it; anything else is left out.
                    let idx = self.t.args[ev.args_start..].iter().rev().find_map(|(k, v)| {
                        (self.t.strings.get(*k) == "sort_index").then_some(()).and(match *v {
                            ArgValue::Int(i) => Some(i),
                            ArgValue::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(f as i64),
                            _ => None,
                        })
                    });
                    if let Some(i) = idx {
                        if nm == "process_sort_index" {
                            self.t.process_sort.push((ev.pid, i));
                        } else {
                            self.t.thread_sort.push((ev.pid, ev.tid, i));
                        }
                    }
                }
                self.t.args.truncate(ev.args_start);
            }
            b'C' => {
                let ts = self.need_ts(&ev, off)?;
                let args = self.t.args.split_off(ev.args_start);
                // (the format: "When an id field exists, the combination of the event name and id is
                // used as the counter name"; Perfetto names the track "name id")
                let name = match ev.id {
                    Some(id) => {
                        let idt = match ev.id_text {
                            Some(t) => self.t.strings.get(t).to_string(),
                            None => (id as i64).to_string(), // (a number: -1 reads as -1)
                        };
                        let full = format!("{} {idt}", self.t.strings.get(ev.name));
                        self.t.strings.intern(&full)
                    }
                    None => ev.name,
                };
                for (k, v) in args {
                    let value = match v {
                        ArgValue::Int(i) => i as f64,
                        ArgValue::Float(f) => f,
                        // (a number written as a string, "1024": Perfetto reads it as the number)
                        ArgValue::Str(s) => match self.t.strings.get(s).trim().parse::<f64>() {
                            Ok(f) if f.is_finite() => f,
                            _ => continue,
                        },
                        _ => continue,
                    };
                    self.t.counters.push(CounterSample {
                        name,
                        series: k,
                        pid: ev.pid,
                        ts,
                        value,
                    });
                }
            }
            p if SKIPPED_PHASES.contains(&p) => {
                self.t.args.truncate(ev.args_start);
                *self.skipped_phases.entry(p).or_insert(0) += 1;
            }
            p => {
                return Err(Error::format(
                    self.path,
                    Some(off as u64),
                    Some(self.index),
                    format!(
                        "unknown phase '{}' (not in the Trace Event Format)",
                        crate::json::printable(p)
                    ),
                ))
            }
        }
        Ok(())
    }

    #[inline]
    fn push(&mut self, layer: Layer, ev: &Ev, ts: i64, dur: i64, fl: u8) {
        let fl = if ev.unfinished { fl | flags::UNFINISHED } else { fl };
        let device = if layer.on_gpu() {
            match ev.device {
                Some(d) => d as i32,
                None => self.device_of_pid(ev.pid),
            }
        } else if layer == Layer::Sync {
            // a host thread waiting on a GPU: the GPU it waits on (args.device), as in raw records
            ev.device.map_or(-1, |d| d as i32)
        } else {
            -1
        };
        // Old Kineto wrote GPU tids as "stream 7"; the numeric stream is what we keep.
        let tid = if layer.on_gpu() && ev.tid_str {
            ev.stream.unwrap_or(ev.tid)
        } else {
            ev.tid
        };
        let cat = ev.cat.unwrap_or(0);
        self.t.push_event(
            layer,
            ev.name,
            cat,
            ts,
            dur,
            ev.pid,
            tid,
            device,
            ev.corr,
            ev.ext,
            fl,
            self.source,
        );
    }

    /// A GPU activity without `args.device`: its pid is its device (the Kineto convention), a label
    /// pid "GPU 1" names it; another label or a pid past i32 is no device index (-1, counted and
    /// said once; it was the label's string number or a wrapped pid).
    fn device_of_pid(&mut self, pid: i64) -> i32 {
        if (0..=i32::MAX as i64).contains(&pid) {
            return pid as i32;
        }
        let named = (pid >= LABEL_ID_BASE)
            .then(|| self.t.id_labels.get(&pid).map(|&s| self.t.strings.get(s)))
            .flatten()
            .and_then(|l| {
                let l = l.trim();
                let rest = l.get(..3).filter(|p| p.eq_ignore_ascii_case("gpu")).map(|_| &l[3..])?;
                rest.trim_start_matches([' ', ':', '#']).parse::<u32>().ok()
            })
            .filter(|&d| d <= i32::MAX as u32);
        named.map_or_else(
            || {
                self.bad_device += 1;
                -1
            },
            |d| d as i32,
        )
    }

    /// Pair each thread's 'B' and 'E' events in timestamp order (ties: file order) and push the
    /// ranges; a 'B' left open is closed at the trace's last timestamp and flagged UNFINISHED.
    fn pair_begin_end(&mut self) {
        let mut threads: Vec<((i64, i64), Vec<BeRec>)> = self.be.drain().collect();
        if threads.is_empty() {
            return;
        }
        threads.sort_unstable_by_key(|(k, _)| *k);
        let mut open: Vec<BeRec> = Vec::new();
        let mut unsorted = 0usize;
        for (_, mut recs) in threads {
            if recs.windows(2).any(|w| w[1].ts < w[0].ts) {
                unsorted += 1;
                recs.sort_by_key(|r| r.ts); // (stable: equal timestamps keep their file order)
            }
            let mut stack: Vec<BeRec> = Vec::new();
            for r in recs {
                if r.ev.ph == b'B' {
                    stack.push(r);
                    continue;
                }
                let Some(b) = stack.pop() else {
                    self.unmatched_end += 1;
                    continue;
                };
                // The range is the B's (name, category, ids, device, stream); the E may add args
                // (its own value of a key the B has is dropped: one value per key) and fill in a
                // device or stream the B lacks.
                let layer = self.layer_for(b.ev.cat, Layer::Other);
                let ev = Ev {
                    device: b.ev.device.or(r.ev.device),
                    stream: b.ev.stream.or(r.ev.stream),
                    unfinished: b.ev.unfinished || r.ev.unfinished,
                    ..b.ev
                };
                if r.args.is_empty() {
                    self.t.args.extend(b.args);
                } else {
                    let keys: Vec<u32> = b.args.iter().map(|(k, _)| *k).collect();
                    self.t.args.extend(b.args);
                    self.t
                        .args
                        .extend(r.args.into_iter().filter(|(k, _)| !keys.contains(k)));
                }
                self.push(layer, &ev, b.ts, r.ts - b.ts, 0);
            }
            open.append(&mut stack);
        }
        if unsorted > 0 {
            // (said: a producer whose 'E' is stamped a hair before its 'B' pairs it with the enclosing
            // range's 'B' this way, where file order would have kept the nesting)
            self.t.warnings.push(format!(
                "{}: the 'B'/'E' events of {unsorted} thread(s) are not in time order in the file: paired \
                 in time order, as Perfetto does",
                self.path
            ));
        }
        if open.is_empty() {
            return;
        }
        let last = self.t.ts.iter().zip(&self.t.dur).map(|(a, b)| a + b).max().unwrap_or(0);
        let last = open.iter().map(|r| r.ts).fold(last, i64::max);
        open.sort_by_key(|r| (r.ts, r.ev.pid, r.ev.tid));
        let n = open.len();
        for r in open {
            let layer = self.layer_for(r.ev.cat, Layer::Other);
            self.t.args.extend(r.args);
            self.push(layer, &r.ev, r.ts, last - r.ts, flags::UNFINISHED);
        }
        self.t.warnings.push(format!(
            "{}: {n} 'B' event(s) without a matching 'E' were closed at the end of the trace",
            self.path
        ));
    }

    fn finish_warnings(&mut self) {
        let path = self.path;
        if !self.unknown_cats.is_empty() {
            let mut v: Vec<(String, u64)> = self
                .unknown_cats
                .iter()
                .map(|(&c, &n)| (self.t.strings.get(c).to_string(), n))
                .collect();
            v.sort();
            let list: Vec<String> = v.iter().map(|(c, n)| format!("{c:?} x{n}")).collect();
            self.t.warnings.push(format!(
                "{path}: unknown categories read as layer 'other': {}",
                list.join(", ")
            ));
        }
        if !self.skipped_phases.is_empty() {
            let mut v: Vec<(u8, u64)> = self.skipped_phases.iter().map(|(&p, &n)| (p, n)).collect();
            v.sort();
            let list: Vec<String> = v.iter().map(|(p, n)| format!("'{}' x{n}", *p as char)).collect();
            self.t.warnings.push(format!(
                "{path}: events with phases teller does not model were skipped: {}",
                list.join(", ")
            ));
        }
        if self.bad_device > 0 {
            self.t.warnings.push(format!(
                "{path}: {} event(s) with an args.device, or a GPU activity's pid, that is not a device index: no device read from it",
                self.bad_device
            ));
        }
        if self.neg_dur > 0 {
            self.t.warnings.push(format!(
                "{path}: {} event(s) with a negative duration were clamped to 0",
                self.neg_dur
            ));
        }
        if self.unmatched_end > 0 {
            self.t.warnings.push(format!(
                "{path}: {} 'E' event(s) without a matching 'B' were ignored",
                self.unmatched_end
            ));
        }
    }
}

fn kind_of(v: &Raw) -> &'static str {
    match v {
        Raw::Str(..) => "a string",
        Raw::Num(_) => "a number",
        Raw::True | Raw::False => "a boolean",
        Raw::Null => "null",
        Raw::Array(_) => "an array",
        Raw::Object(_) => "an object",
    }
}
