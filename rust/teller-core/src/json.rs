//! A small pull-style JSON scanner over a byte slice.
//!
//! Decision: hand-written rather than serde_json because (1) trace timestamps are decimal
//! microseconds with up to 3 decimals on top of epoch-scale integers, which f64 cannot hold exactly
//! (2^53 ns is only ~104 days), so numbers are handed out as raw text and parsed exactly by the
//! caller; (2) errors must carry a byte offset; (3) the Chrome reader only needs a handful of keys per
//! event and skips the rest (argument arrays, device properties) with memchr-driven skipping, never
//! building a DOM. Strings without escapes are borrowed, not copied.

use std::borrow::Cow;

pub struct Scanner<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
    /// The whole buffer is known to be valid UTF-8.
    pub validated: bool,
}

/// A scanner error: byte offset and message. The caller adds the file name and event index.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanError {
    pub offset: usize,
    pub msg: String,
}

pub type SResult<T> = Result<T, ScanError>;

/// The raw text of a scalar or a skipped compound value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Raw<'a> {
    Str(&'a [u8], bool), // contents between quotes, has_escapes
    Num(&'a [u8]),
    True,
    False,
    Null,
    Array(&'a [u8]),  // whole text incl. brackets
    Object(&'a [u8]), // whole text incl. braces
}

const MAX_DEPTH: usize = 512;

impl<'a> Scanner<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        // Skip a UTF-8 byte order mark.
        let pos = if buf.starts_with(b"\xEF\xBB\xBF") { 3 } else { 0 };
        Scanner {
            buf,
            pos,
            validated: false,
        }
    }

    #[inline]
    pub fn err<T>(&self, msg: impl Into<String>) -> SResult<T> {
        Err(ScanError {
            offset: self.pos,
            msg: msg.into(),
        })
    }

    #[inline]
    pub fn skip_ws(&mut self) {
        while self.pos < self.buf.len() {
            match self.buf[self.pos] {
                b' ' | b'\n' | b'\r' | b'\t' => self.pos += 1,
                _ => break,
            }
        }
    }

    /// Next non-whitespace byte, not consumed.
    #[inline]
    pub fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.buf.get(self.pos).copied()
    }

    #[inline]
    pub fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    #[inline]
    pub fn expect(&mut self, c: u8) -> SResult<()> {
        match self.peek() {
            Some(b) if b == c => {
                self.pos += 1;
                Ok(())
            }
            Some(b) => self.err(format!("expected '{}' but found '{}'", c as char, printable(b))),
            None => self.err(format!(
                "unexpected end of input (truncated file?), expected '{}'",
                c as char
            )),
        }
    }

    /// After a value inside an array/object: consume ',' and return true, or the closing byte and
    /// return false.
    #[inline]
    pub fn comma_or(&mut self, close: u8) -> SResult<bool> {
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                Ok(true)
            }
            Some(b) if b == close => {
                self.pos += 1;
                Ok(false)
            }
            Some(b) => self.err(format!(
                "expected ',' or '{}' but found '{}'",
                close as char,
                printable(b)
            )),
            None => self.err(format!(
                "unexpected end of input (truncated file?), expected ',' or '{}'",
                close as char
            )),
        }
    }

    /// Reads a string token and returns its raw contents (between the quotes) and whether it has escapes.
    #[inline]
    pub fn string_raw(&mut self) -> SResult<(&'a [u8], bool)> {
        self.expect(b'"')?;
        let start = self.pos;
        let mut escapes = false;
        // Most strings in traces are short keys and categories: a plain scan of the first bytes beats
        // setting up a SIMD search.
        let b = self.buf;
        let lim = (start + 24).min(b.len());
        let mut p = start;
        while p < lim {
            match b[p] {
                b'"' => {
                    self.pos = p + 1;
                    return Ok((&b[start..p], false));
                }
                b'\\' => break,
                _ => p += 1,
            }
        }
        self.pos = p;
        loop {
            match memchr::memchr2(b'"', b'\\', &self.buf[self.pos..]) {
                None => {
                    self.pos = self.buf.len();
                    return self.err("unterminated string (truncated file?)");
                }
                Some(k) => {
                    let at = self.pos + k;
                    if self.buf[at] == b'"' {
                        self.pos = at + 1;
                        return Ok((&self.buf[start..at], escapes));
                    }
                    escapes = true;
                    if at + 1 >= self.buf.len() {
                        self.pos = self.buf.len();
                        return self.err("unterminated string (truncated file?)");
                    }
                    self.pos = at + 2;
                }
            }
        }
    }

    /// Reads a string and decodes it (borrowed when it has no escapes).
    #[inline]
    pub fn string(&mut self) -> SResult<Cow<'a, str>> {
        let start = self.pos;
        let (raw, esc) = self.string_raw()?;
        let r = if self.validated {
            decode_str_validated(raw, esc)
        } else {
            decode_str(raw, esc)
        };
        r.map_err(|m| ScanError { offset: start, msg: m })
    }

    /// Validates the whole buffer as UTF-8 once, so strings need no further checks.
    pub fn validate_utf8(&mut self) -> SResult<()> {
        match std::str::from_utf8(self.buf) {
            Ok(_) => {
                self.validated = true;
                Ok(())
            }
            Err(e) => Err(ScanError {
                offset: e.valid_up_to(),
                msg: "invalid UTF-8".into(),
            }),
        }
    }

    /// Reads a number token and returns its text.
    #[inline]
    pub fn number_raw(&mut self) -> SResult<&'a [u8]> {
        self.skip_ws();
        let start = self.pos;
        let b = self.buf;
        let mut p = self.pos;
        if p < b.len() && b[p] == b'-' {
            p += 1;
        }
        let ds = p;
        while p < b.len() && b[p].is_ascii_digit() {
            p += 1;
        }
        if p == ds {
            return self.err("invalid number");
        }
        if p - ds > 1 && b[ds] == b'0' {
            // (JSON has no leading zeros: `01` kept in an args list was written back as it was)
            self.pos = ds;
            return self.err("invalid number: a leading zero");
        }
        if p < b.len() && b[p] == b'.' {
            p += 1;
            let fs = p;
            while p < b.len() && b[p].is_ascii_digit() {
                p += 1;
            }
            if p == fs {
                self.pos = p;
                return self.err("invalid number: no digits after '.'");
            }
        }
        if p < b.len() && (b[p] == b'e' || b[p] == b'E') {
            p += 1;
            if p < b.len() && (b[p] == b'+' || b[p] == b'-') {
                p += 1;
            }
            let es = p;
            while p < b.len() && b[p].is_ascii_digit() {
                p += 1;
            }
            if p == es {
                self.pos = p;
                return self.err("invalid number: bad exponent");
            }
        }
        self.pos = p;
        Ok(&b[start..p])
    }

    fn literal(&mut self, lit: &[u8], v: Raw<'a>) -> SResult<Raw<'a>> {
        if self.buf[self.pos..].starts_with(lit) {
            self.pos += lit.len();
            Ok(v)
        } else if lit.starts_with(&self.buf[self.pos..]) {
            self.err("unexpected end of input (truncated file?)")
        } else {
            self.err(format!(
                "invalid literal starting with '{}'",
                printable(self.buf[self.pos])
            ))
        }
    }

    /// Reads any value; compound values are skipped and returned as their raw text.
    #[inline]
    pub fn value_raw(&mut self) -> SResult<Raw<'a>> {
        match self.peek() {
            Some(b'"') => {
                let (s, e) = self.string_raw()?;
                Ok(Raw::Str(s, e))
            }
            Some(b'{') => {
                let start = self.pos;
                self.skip_compound()?;
                Ok(Raw::Object(&self.buf[start..self.pos]))
            }
            Some(b'[') => {
                let start = self.pos;
                self.skip_compound()?;
                Ok(Raw::Array(&self.buf[start..self.pos]))
            }
            Some(b't') => self.literal(b"true", Raw::True),
            Some(b'f') => self.literal(b"false", Raw::False),
            Some(b'n') => self.literal(b"null", Raw::Null),
            Some(b'-' | b'0'..=b'9') => Ok(Raw::Num(self.number_raw()?)),
            Some(b) => self.err(format!("unexpected character '{}'", printable(b))),
            None => self.err("unexpected end of input (truncated file?)"),
        }
    }

    /// Skips one value of any kind.
    #[inline]
    pub fn skip_value(&mut self) -> SResult<()> {
        match self.peek() {
            Some(b'{' | b'[') => self.skip_compound(),
            _ => self.value_raw().map(|_| ()),
        }
    }

    /// Skips an array or object starting at the current position, validating it as JSON: values,
    /// ',' and ':' where the grammar puts them, numbers and literals well-formed, string escapes
    /// valid. Decision: strict, because a skipped compound's text is kept as it was (args arrays,
    /// `deviceProperties`) and written back out by the writer, which must emit valid JSON; the
    /// loop is a small state machine (no recursion, no allocation), strings are still jumped over
    /// with memchr. Not checked: raw control characters inside strings. Cost, measured against the
    /// bracket-only skip (2026-12-07, min of runs): resnet50 (316k nested `Input dims` lists) 110-115 ->
    /// 115-124 ms, a100 29 -> 30-31 ms, the small fixtures unchanged.
    fn skip_compound(&mut self) -> SResult<()> {
        #[derive(Clone, Copy, PartialEq)]
        enum St {
            Value,
            ValueOrClose,
            Key,
            KeyOrClose,
            Colon,
            CommaOrClose,
        }
        let mut stack: [u8; MAX_DEPTH] = [0; MAX_DEPTH];
        let mut depth = 0usize;
        let mut st = St::Value;
        loop {
            self.skip_ws();
            let Some(&c) = self.buf.get(self.pos) else {
                return self.err("unexpected end of input inside an array/object (truncated file?)");
            };
            match st {
                St::Value | St::ValueOrClose if !(st == St::ValueOrClose && c == b']') => {
                    match c {
                        b'{' | b'[' => {
                            if depth == MAX_DEPTH {
                                return self.err("nesting too deep");
                            }
                            stack[depth] = if c == b'{' { b'}' } else { b']' };
                            depth += 1;
                            self.pos += 1;
                            st = if c == b'{' { St::KeyOrClose } else { St::ValueOrClose };
                            continue;
                        }
                        b'"' => self.string_checked()?,
                        b't' => self.literal(b"true", Raw::True).map(|_| ())?,
                        b'f' => self.literal(b"false", Raw::False).map(|_| ())?,
                        b'n' => self.literal(b"null", Raw::Null).map(|_| ())?,
                        b'-' | b'0'..=b'9' => self.number_raw().map(|_| ())?,
                        _ => return self.err(format!("unexpected character '{}'", printable(c))),
                    }
                    st = St::CommaOrClose;
                    continue;
                }
                St::Key | St::KeyOrClose if !(st == St::KeyOrClose && c == b'}') => {
                    if c != b'"' {
                        return self.err(format!("expected a string key but found '{}'", printable(c)));
                    }
                    self.string_checked()?;
                    st = St::Colon;
                    continue;
                }
                St::Colon => {
                    if c != b':' {
                        return self.err(format!("expected ':' but found '{}'", printable(c)));
                    }
                    self.pos += 1;
                    st = St::Value;
                    continue;
                }
                St::CommaOrClose if c == b',' => {
                    self.pos += 1;
                    st = if stack[depth - 1] == b'}' { St::Key } else { St::Value };
                    continue;
                }
                _ => {}
            }
            // a closing bracket, where one may stand
            if (c == b'}' || c == b']') && depth > 0 {
                if stack[depth - 1] != c {
                    return self.err(format!("mismatched '{}'", c as char));
                }
                depth -= 1;
                self.pos += 1;
                if depth == 0 {
                    return Ok(());
                }
                st = St::CommaOrClose;
                continue;
            }
            let close = stack[depth - 1] as char;
            return self.err(format!("expected ',' or '{close}' but found '{}'", printable(c)));
        }
    }

    /// A string whose escapes are valid JSON (`\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t`,
    /// `\u` and four hex digits).
    #[inline]
    fn string_checked(&mut self) -> SResult<()> {
        let start = self.pos;
        let (raw, esc) = self.string_raw()?;
        if esc {
            let mut i = 0;
            while let Some(k) = memchr::memchr(b'\\', &raw[i..]) {
                let at = i + k;
                let ok = match raw.get(at + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => true,
                    Some(b'u') => raw.len() >= at + 6 && raw[at + 2..at + 6].iter().all(u8::is_ascii_hexdigit),
                    _ => false,
                };
                if !ok {
                    return Err(ScanError {
                        offset: start + 1 + at,
                        msg: "invalid escape in a string".into(),
                    });
                }
                i = at + if raw[at + 1] == b'u' { 6 } else { 2 };
            }
        }
        Ok(())
    }
}

pub fn printable(b: u8) -> String {
    if b.is_ascii_graphic() {
        (b as char).to_string()
    } else {
        format!("\\x{b:02x}")
    }
}

/// Decodes string contents (between quotes) of a buffer already validated as UTF-8 as a whole
/// (`std::str::from_utf8` on the whole input runs at memory speed; per-string checks cost ~6% of a
/// parse). Slices between ASCII quotes of valid UTF-8 are valid UTF-8.
#[inline]
pub fn decode_str_validated(raw: &[u8], escapes: bool) -> Result<Cow<'_, str>, String> {
    if !escapes {
        // SAFETY: the caller validated the whole buffer and `raw` starts and ends at ASCII bytes.
        return Ok(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(raw) }));
    }
    decode_str(raw, true)
}

/// Decodes string contents (between quotes).
pub fn decode_str(raw: &[u8], escapes: bool) -> Result<Cow<'_, str>, String> {
    if !escapes {
        return std::str::from_utf8(raw)
            .map(Cow::Borrowed)
            .map_err(|e| format!("invalid UTF-8 in string: {e}"));
    }
    let mut out: Vec<u8> = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let c = raw[i];
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        i += 1;
        let e = *raw.get(i).ok_or("bad escape at end of string")?;
        i += 1;
        match e {
            b'"' => out.push(b'"'),
            b'\\' => out.push(b'\\'),
            b'/' => out.push(b'/'),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'u' => {
                let hi = hex4(raw, i)?;
                i += 4;
                let cp = if (0xD800..0xDC00).contains(&hi) {
                    if raw.get(i) == Some(&b'\\') && raw.get(i + 1) == Some(&b'u') {
                        let lo = hex4(raw, i + 2)?;
                        if (0xDC00..0xE000).contains(&lo) {
                            i += 6;
                            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                        } else {
                            0xFFFD
                        }
                    } else {
                        0xFFFD
                    }
                } else if (0xDC00..0xE000).contains(&hi) {
                    0xFFFD
                } else {
                    hi
                };
                let ch = char::from_u32(cp).unwrap_or('\u{FFFD}');
                let mut tmp = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
            }
            other => return Err(format!("invalid escape '\\{}' in string", printable(other))),
        }
    }
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|e| format!("invalid UTF-8 in string: {e}"))
}

fn hex4(raw: &[u8], i: usize) -> Result<u32, String> {
    let s = raw.get(i..i + 4).ok_or("truncated \\u escape")?;
    let mut v = 0u32;
    for &c in s {
        let d = (c as char).to_digit(16).ok_or("invalid \\u escape")?;
        v = v * 16 + d;
    }
    Ok(v)
}

/// Parses a JSON number given in some unit into an integer count of `10^-scale_digits` of that unit,
/// exactly when it is a plain decimal (`1234.567` µs with scale 3 -> 1234567 ns), rounding half away
/// from zero beyond `scale_digits` decimals; exponents fall back to f64.
/// Returns None if it does not fit in i64.
#[inline]
pub fn parse_scaled(raw: &[u8], scale_digits: u32) -> Option<i64> {
    let (neg, digits) = match raw.first() {
        Some(b'-') => (true, &raw[1..]),
        _ => (false, raw),
    };
    let mut int: i64 = 0;
    let mut i = 0;
    while i < digits.len() && digits[i].is_ascii_digit() {
        int = int.checked_mul(10)?.checked_add((digits[i] - b'0') as i64)?;
        i += 1;
    }
    let mut frac: i64 = 0;
    let mut nfrac = 0u32;
    let mut round_up = false;
    if i < digits.len() && digits[i] == b'.' {
        i += 1;
        while i < digits.len() && digits[i].is_ascii_digit() {
            if nfrac < scale_digits {
                frac = frac * 10 + (digits[i] - b'0') as i64;
                nfrac += 1;
            } else if nfrac == scale_digits {
                round_up = digits[i] >= b'5';
                nfrac += 1;
            }
            i += 1;
        }
    }
    if i < digits.len() {
        // exponent: rare in traces; go through f64.
        let s = std::str::from_utf8(raw).ok()?;
        let v: f64 = s.parse().ok()?;
        let scaled = (v * 10f64.powi(scale_digits as i32)).round();
        if !scaled.is_finite() || scaled.abs() > 9.2e18 {
            return None;
        }
        return Some(scaled as i64);
    }
    let used = nfrac.min(scale_digits);
    let mut v = int.checked_mul(10i64.pow(scale_digits))?;
    v = v.checked_add(frac * 10i64.pow(scale_digits - used))?;
    if round_up {
        v = v.checked_add(1)?;
    }
    Some(if neg { -v } else { v })
}

/// Parses a JSON number as i64 if it is an integer literal.
#[inline]
pub fn parse_int(raw: &[u8]) -> Option<i64> {
    let (neg, d) = match raw.first() {
        Some(b'-') => (true, &raw[1..]),
        _ => (false, raw),
    };
    if d.is_empty() || d.len() > 19 {
        return None;
    }
    // accumulated negative: i64::MIN (-9223372036854775808) has no positive counterpart
    let mut v: i64 = 0;
    for &c in d {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_sub((c - b'0') as i64)?;
    }
    if neg {
        Some(v)
    } else {
        v.checked_neg()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_span_all_of_i64() {
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"9223372036854775808"), None);
        assert_eq!(parse_int(b"-9223372036854775809"), None);
        assert_eq!(parse_int(b"-0"), Some(0));
        assert_eq!(parse_int(b"-"), None);
        assert_eq!(parse_int(b"12a"), None);
    }

    #[test]
    fn scaled_parsing_is_exact() {
        assert_eq!(parse_scaled(b"4458676522690.655", 3), Some(4458676522690655));
        assert_eq!(parse_scaled(b"1606910596297023", 3), Some(1606910596297023000));
        assert_eq!(parse_scaled(b"1.5", 3), Some(1500));
        assert_eq!(parse_scaled(b"1.23456", 3), Some(1235));
        assert_eq!(parse_scaled(b"-2.5", 3), Some(-2500));
        assert_eq!(parse_scaled(b"1e3", 3), Some(1_000_000));
        assert_eq!(parse_scaled(b"0", 3), Some(0));
        assert_eq!(parse_scaled(b"99999999999999999999", 3), None);
    }

    #[test]
    fn strings_and_escapes() {
        let mut s = Scanner::new(br#""a\"b\u00e9\ud83d\ude00" "plain""#);
        assert_eq!(s.string().unwrap(), "a\"b\u{e9}\u{1F600}");
        assert!(matches!(s.string().unwrap(), Cow::Borrowed("plain")));
    }

    #[test]
    fn skip_values_and_truncation() {
        let mut s = Scanner::new(br#"{"a": [1, {"b": "]"}], "c": null} 5"#);
        s.skip_value().unwrap();
        assert_eq!(s.value_raw().unwrap(), Raw::Num(b"5"));
        let mut t = Scanner::new(br#"{"a": [1, 2"#);
        let e = t.skip_value().unwrap_err();
        assert!(e.msg.contains("truncated"));
        let mut u = Scanner::new(br#"[1, 2}"#);
        assert!(u.skip_value().unwrap_err().msg.contains("mismatched"));
    }

    #[test]
    fn skipped_compounds_are_valid_json() {
        // (their text is written back out as it was: what is not JSON is refused where it is)
        let good: &[&[u8]] = &[
            br#"[]"#,
            br#"{}"#,
            br#" [ 1 , -2.5e+3 , "a\"\u00e9" , true , false , null , [ [ ] ] , { } ] "#,
            br#"{"a": {"b": [1, {"c": "]"}]}, "d": ""}"#,
        ];
        for g in good {
            let mut s = Scanner::new(g);
            s.skip_value()
                .unwrap_or_else(|e| panic!("{}: {e:?}", String::from_utf8_lossy(g)));
            assert!(s.at_end());
        }
        let bad: &[(&[u8], &str, usize)] = &[
            (br#"[1 2]"#, "expected ',' or ']'", 3),
            (br#"[1, @@ ]"#, "unexpected character '@'", 4),
            (br#"{"k" 5}"#, "expected ':'", 5),
            (br#"{5: 1}"#, "expected a string key", 1),
            (br#"[1,]"#, "unexpected character ']'", 3),
            (br#"{"a": 1,}"#, "expected a string key", 8),
            (br#"[tru]"#, "invalid literal", 1),
            (br#"[1.]"#, "no digits after '.'", 3),
            (br#"["\x"]"#, "invalid escape", 2),
            (br#"["\u12"]"#, "invalid escape", 2),
            (br#"[oops nope]"#, "unexpected character 'o'", 1),
            (br#"[1, 01]"#, "a leading zero", 4),
            (br#"[-00.5]"#, "a leading zero", 2),
            (br#"{"a": [1, 2}"#, "mismatched '}'", 11),
        ];
        for (b, said, at) in bad {
            let e = Scanner::new(b).skip_value().unwrap_err();
            assert!(e.msg.contains(said), "{}: {e:?}", String::from_utf8_lossy(b));
            assert_eq!(e.offset, *at, "{}: {e:?}", String::from_utf8_lossy(b));
        }
    }
}
