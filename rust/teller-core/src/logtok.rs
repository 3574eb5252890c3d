//! The log tokenizer's line splitter and encoder (`teller.data.tokenize.LogTokenizer`).
//!
//! The definition is Python's: `teller.data.tokenize._TOKEN_RE`, a leftmost-first alternation of
//! placeholders (time stamps, addresses, paths, request ids, hex, numbers), words and punctuation.
//! Splitting ~140 lines per sample with Python's `re` cost ~13 ms of every sample `teller tokenize`
//! encodes and ~5 ms of every `teller diagnose` call. Here the same pattern runs on the regex crate
//! (leftmost-first too, so the same match at every position) with its classes spelled out as
//! Python's `str` classes are on ASCII (`\w` = `[0-9A-Za-z_]`, `\s` also holds `\x1c-\x1f`).
//! Beyond ASCII, Python's `\w`, `\d`, `\s` and `\b` follow `str.isalnum` / `str.isspace`, which no
//! regex class here reproduces exactly, so a line holding any non-ASCII byte is not split here: it
//! is reported back and the caller splits it with the Python definition. Numbers are returned as
//! parsed, their `sign * log1p(|v|)` left to numpy (whose SIMD `log1p` and libm's differ by an ulp).

use hashbrown::HashMap;
use regex_automata::meta::Regex;
use regex_automata::{util::syntax, Input};
use std::sync::OnceLock;

/// Python's `_TOKEN_RE`, one pattern per alternative in its order, with ASCII classes (see the
/// module comment). One multi-pattern regex with leftmost-first semantics is the alternation: the
/// leftmost match, and at one start the first pattern that matches, as with `re`; the matched
/// pattern's id is the kind, straight from the lazy DFA (capture groups would need the slower
/// PikeVM: 12 us a line against ~1).
const PATTERNS: [&str; 8] = [
    r"\b[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]\b",
    r"\b[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?::[0-9]+)?\b",
    r"(?:/[0-9A-Za-z_.@+-]+){2,}/?|\b[0-9A-Za-z_-]+\.(?:py|json|cpp|cu|so|yaml)(?::[0-9]+)?\b",
    r"\b(?:cmpl|chatcmpl|req)-[0-9a-f]+\b",
    r"\b0x[0-9a-fA-F]+\b|\b[0-9a-f]{12,}\b",
    r"[-+]?[0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?%?",
    r"[A-Za-z_][A-Za-z_']*",
    r"[^\t\n\x0B\x0C\r\x1C-\x1F A-Za-z0-9_]",
];

/// The token kinds, in the pattern order: the first six are placeholders (`<kind>`).
pub const KINDS: [&str; 8] = ["time", "ip", "path", "id", "hex", "num", "word", "punct"];

fn pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::builder()
            .syntax(syntax::Config::new().unicode(false).utf8(false))
            .build_many(&PATTERNS)
            .expect("the log token patterns compile")
    })
}

/// Calls `f(kind, token)` for each token of an ASCII line, in order (`re.finditer`).
pub fn split_ascii(line: &[u8], mut f: impl FnMut(usize, &[u8])) {
    let re = pattern();
    let mut at = 0;
    while at < line.len() {
        // (the span starts at `at`; \b still sees the byte before it)
        let Some(m) = re.find(Input::new(line).span(at..line.len())) else {
            break;
        };
        f(m.pattern().as_usize(), &line[m.start()..m.end()]);
        at = m.end().max(m.start() + 1);
    }
}

/// The value a `<num>` token stood for: its text without commas and a trailing `%`, as Python's
/// `float()` reads it (the pattern admits nothing `float()` refuses; 0 if it did).
pub fn parse_num(tok: &[u8]) -> f64 {
    let mut t: Vec<u8> = tok.iter().copied().filter(|&b| b != b',').collect();
    if t.last() == Some(&b'%') {
        t.pop();
    }
    std::str::from_utf8(&t)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// The count of every token string over lines (a word lower-cased, a placeholder as `<kind>`), what
/// a log tokenizer's vocabulary is built from; and the lines with non-ASCII text, not counted.
pub fn token_counts<S: AsRef<[u8]>>(lines: &[S]) -> (HashMap<Vec<u8>, u64>, Vec<usize>) {
    let mut cnt: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut deferred = Vec::new();
    let mut key = Vec::new();
    for (li, text) in lines.iter().enumerate() {
        let text = text.as_ref();
        if !text.is_ascii() {
            deferred.push(li);
            continue;
        }
        split_ascii(text, |kind, tok| {
            key.clear();
            match kind {
                6 => key.extend(tok.iter().map(u8::to_ascii_lowercase)),
                7 => key.extend_from_slice(tok),
                k => {
                    key.push(b'<');
                    key.extend_from_slice(KINDS[k].as_bytes());
                    key.push(b'>');
                }
            }
            match cnt.get_mut(&key) {
                Some(c) => *c += 1,
                None => {
                    cnt.insert(key.clone(), 1);
                }
            }
        });
    }
    (cnt, deferred)
}

/// The encoding of a log's lines.
#[derive(Debug, Default)]
pub struct LogEncoding {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Per token, its line.
    pub line: Vec<u32>,
    /// Per token, the parsed number of a `<num>` token (NaN for every other token).
    pub num: Vec<f64>,
    /// Lines with non-ASCII bytes, not split: (line, the token index where its tokens go, after
    /// its `[BOL]` and stream token).
    pub deferred: Vec<(u32, u32)>,
}

/// Word vocabulary of a log tokenizer: the ids of `[UNK]`, `[BOL]`, `<stdout>`, `<stderr>` and the
/// six placeholders, and every word.
pub struct LogVocab {
    index: HashMap<Vec<u8>, u32>,
    unk: u32,
    bol: u32,
    streams: [u32; 2],
    placeholders: [u32; 6],
}

impl LogVocab {
    pub fn new(vocab: &[String]) -> Result<Self, String> {
        let mut index = HashMap::with_capacity(vocab.len());
        for (i, w) in vocab.iter().enumerate() {
            // a word listed twice maps to its last id, as the Python dict built in order does
            index.insert(w.as_bytes().to_vec(), i as u32);
        }
        let need = |w: &str| {
            index
                .get(w.as_bytes())
                .copied()
                .ok_or_else(|| format!("the vocabulary has no {w}"))
        };
        let unk = need("[UNK]")?;
        // (Python looks placeholders up with a default of [UNK], and the specials without one)
        let ph = |w: &str| index.get(w.as_bytes()).copied().unwrap_or(unk);
        let placeholders = [
            ph("<time>"),
            ph("<ip>"),
            ph("<path>"),
            ph("<id>"),
            ph("<hex>"),
            ph("<num>"),
        ];
        Ok(Self {
            unk,
            bol: need("[BOL]")?,
            streams: [need("<stdout>")?, need("<stderr>")?],
            placeholders,
            index,
        })
    }

    /// Encodes lines: per line `[BOL]`, its stream token (`stderr[i]`: `<stderr>`), then its tokens
    /// (a placeholder, a lower-cased word or `[UNK]`, punctuation as itself or `[UNK]`).
    pub fn encode<S: AsRef<[u8]>>(&self, lines: &[S], stderr: &[bool]) -> LogEncoding {
        let mut out = LogEncoding::default();
        let mut word = Vec::new();
        for (li, text) in lines.iter().enumerate() {
            let text = text.as_ref();
            let l = li as u32;
            out.ids.push(self.bol);
            out.ids
                .push(self.streams[usize::from(stderr.get(li).copied().unwrap_or(false))]);
            out.line.extend([l, l]);
            out.num.extend([f64::NAN, f64::NAN]);
            if !text.is_ascii() {
                out.deferred.push((l, out.ids.len() as u32));
                continue;
            }
            split_ascii(text, |kind, tok| {
                let (id, v) = match kind {
                    5 => (self.placeholders[5], parse_num(tok)),
                    6 => {
                        word.clear();
                        word.extend(tok.iter().map(u8::to_ascii_lowercase));
                        (self.index.get(&word).copied().unwrap_or(self.unk), f64::NAN)
                    }
                    7 => (self.index.get(tok).copied().unwrap_or(self.unk), f64::NAN),
                    k => (self.placeholders[k], f64::NAN),
                };
                out.ids.push(id);
                out.line.push(l);
                out.num.push(v);
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        split_ascii(s.as_bytes(), |k, t| {
            v.push((KINDS[k], String::from_utf8_lossy(t).into_owned()))
        });
        v
    }

    #[test]
    fn splits_a_vllm_line() {
        let v = split("INFO 11-24 16:48:57 [loggers.py:116] Running: 24 reqs, KV 61.9% 0x1f cmpl-9ab");
        let kinds: Vec<_> = v.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                "word", "time", "punct", "path", "punct", "word", "punct", "num", "word", "punct", "word", "num",
                "hex", "id"
            ]
        );
        assert_eq!(v[7].1, "24");
        assert_eq!(v[11].1, "61.9%");
    }

    #[test]
    fn alternation_order_and_boundaries() {
        // an address before a number; a path of two segments; a lone segment is punctuation + word
        assert_eq!(split("10.0.171.187:45005")[0], ("ip", "10.0.171.187:45005".into()));
        assert_eq!(split("/usr/lib/x.so")[0], ("path", "/usr/lib/x.so".into()));
        assert_eq!(split("/tmp").iter().map(|x| x.0).collect::<Vec<_>>(), ["punct", "word"]);
        // 12+ lower-case hex digits are hex; 11 are a number then a word
        assert_eq!(split("deadbeef0123")[0].0, "hex");
        // whitespace and control separators of Python's \s are not punctuation
        assert!(split("a\x1cb").iter().all(|x| x.0 == "word"));
        assert_eq!(split("a\x01b")[1], ("punct", "\x01".into()));
    }

    #[test]
    fn counts_tokens() {
        let (c, d) = token_counts(&["Running: 3 running", "caf\u{e9}", "x 0x1f"]);
        assert_eq!(c[b"running".as_slice()], 2);
        assert_eq!(c[b"<num>".as_slice()], 1);
        assert_eq!(c[b"<hex>".as_slice()], 1);
        assert_eq!(c[b":".as_slice()], 1);
        assert_eq!(d, [1]);
    }

    #[test]
    fn numbers_as_python_float_reads_them() {
        assert_eq!(parse_num(b"1,024"), 1024.0);
        assert_eq!(parse_num(b"61.9%"), 61.9);
        assert_eq!(parse_num(b"+3e2"), 300.0);
        assert_eq!(parse_num(b"-0.5"), -0.5);
        assert!(parse_num(b"1e999").is_infinite());
    }

    #[test]
    fn encodes_and_defers_non_ascii_lines() {
        let vocab: Vec<String> = [
            "[PAD]", "[UNK]", "[BOL]", "<stdout>", "<stderr>", "<num>", "<hex>", "<ip>", "<path>", "<time>", "<id>",
            "running", ":",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let v = LogVocab::new(&vocab).unwrap();
        let e = v.encode(&["Running: 3 zz", "caf\u{e9}", "x"], &[false, true, false]);
        assert_eq!(e.ids, [2, 3, 11, 12, 5, 1, 2, 4, 2, 3, 1]);
        assert_eq!(e.line, [0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2]);
        assert_eq!(e.num[4], 3.0);
        assert!(e.num[2].is_nan());
        assert_eq!(e.deferred, [(1, 8)]);
        assert!(LogVocab::new(&vocab[..4]).is_err()); // (no <stderr>)
    }
}
