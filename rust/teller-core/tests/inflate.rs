//! Parsing a gzipped trace while a second thread inflates it (`teller_core::inflate`) gives what
//! the serial read gives: the same trace for chunk sizes down to one byte (events cut anywhere),
//! and the same error for corrupt gzip, broken JSON and invalid UTF-8.
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::Write;
use teller_core::inflate::{announced_size, CHUNK};
use teller_core::load::{read_bytes, read_file_with, Kind, Pipeline};
use teller_core::Trace;

fn fixture(name: &str) -> String {
    format!("{}/../../tests/data/{}", env!("CARGO_MANIFEST_DIR"), name)
}

/// Everything a read produces, in a stable text (hash maps sorted).
fn digest(t: &Trace) -> String {
    let mut labels: Vec<_> = t.id_labels.iter().collect();
    labels.sort();
    format!(
        "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        t.strings.iter().collect::<Vec<_>>(),
        t.layer,
        t.name,
        t.cat,
        t.ts,
        t.dur,
        t.pid,
        t.tid,
        t.device,
        t.corr,
        t.ext,
        t.flags,
        t.args_off,
        t.args,
        t.flows,
        t.counters,
        t.process_names,
        t.thread_names,
        labels,
        (&t.sources, &t.warnings),
    )
}

fn serial(path: &str) -> Result<(Trace, Kind), String> {
    read_file_with(path, 0, Pipeline::Off)
        .map(|(t, k, _)| (t, k))
        .map_err(|e| e.to_string())
}

fn piped(path: &str, chunk: usize) -> Result<(Trace, Kind), String> {
    read_file_with(path, 0, Pipeline::Always { chunk })
        .map(|(t, k, _)| (t, k))
        .map_err(|e| e.to_string())
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::new(6));
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A file's directory under the temp directory, removed when dropped (failed assertions included).
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `bytes` written to `name` in a fresh directory, with the guard that removes it.
fn temp(name: &str, bytes: &[u8]) -> (Scratch, String) {
    let dir = std::env::temp_dir().join(format!("teller-inflate-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    (Scratch(dir), p.display().to_string())
}

#[test]
fn every_fixture_reads_alike_for_any_chunk() {
    for (f, chunks) in [
        (
            "traces/b300_cuda13_moe.kineto.json.gz",
            &[1usize, 2, 3, 7, 61, 4093, CHUNK][..],
        ),
        ("traces/mi250_rocm62_tiny.kineto.json.gz", &[1, 5, 4093, CHUNK]),
        (
            "traces/mi300x_sglang_decode_hipgraph.kineto.json.gz",
            &[97, 4093, CHUNK],
        ),
        ("traces/a100_nccl_2rank.kineto.json.gz", &[65_521, CHUNK]),
        ("traces/resnet50_2020_barelist.kineto.json.gz", &[65_521, CHUNK]),
    ] {
        let path = fixture(f);
        let (want, kind) = serial(&path).unwrap();
        assert_eq!(kind, Kind::Chrome);
        let want = digest(&want);
        for &c in chunks {
            let (got, kind) = piped(&path, c).unwrap_or_else(|e| panic!("{f} chunk {c}: {e}"));
            assert_eq!(kind, Kind::Chrome);
            assert!(digest(&got) == want, "{f}: chunk {c} read differently");
        }
    }
}

#[test]
fn numbers_cut_by_a_chunk_end_are_not_read_short() {
    // a top-level number followed by the end of what has arrived must wait for its last digits
    let json = br#"{"schemaVersion": 1234567, "traceEvents": [{"ph": "X", "name": "k", "ts": 12345.678, "dur": 100, "pid": 1, "tid": 2}], "baseTimeNanoseconds": 1700000000000000000, "displayTimeUnit": "ms"}"#;
    let (_dir, path) = temp("numbers.json.gz", &gz(json));
    let (want, _) = serial(&path).unwrap();
    assert_eq!(want.sources[0].base_ns, 1_700_000_000_000_000_000);
    for c in 1..40 {
        let (got, _) = piped(&path, c).unwrap();
        assert_eq!(digest(&got), digest(&want), "chunk {c}");
    }
}

#[test]
fn a_long_number_cut_by_a_chunk_end_leaves_no_string_behind() {
    // an integer too long for i64 is kept as its text (interned); cut short, it must not stay in
    // the string table and move every later id
    let json = br#"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": "t1", "args": {"big": 123456789012345678901234567890, "s": "x"}}, {"ph": "X", "name": "b", "ts": 5, "dur": 1, "pid": 1, "tid": "t2"}]}"#;
    let (_dir, path) = temp("bignum.json.gz", &gz(json));
    let (want, _) = serial(&path).unwrap();
    for c in 1..200 {
        let (got, _) = piped(&path, c).unwrap();
        assert_eq!(digest(&got), digest(&want), "chunk {c}");
    }
}

#[test]
fn invalid_utf8_anywhere_wins_over_an_error_found_before_it() {
    // the serial read validates the whole text first; the pipelined one must read on to see it
    let good = read_bytes(&fixture("traces/mi300x_sglang_decode_hipgraph.kineto.json.gz")).unwrap();
    let events_at = good.windows(13).position(|w| w == b"\"traceEvents\"").unwrap();
    let mut no_ts = br#"{"traceEvents": [{"ph": "X", "name": "k", "pid": 1, "tid": 1}, "#.to_vec();
    no_ts.extend_from_slice(&good[events_at + 17..]);
    let mut no_events = br#"{"schemaVersion": 1, "other": "#.to_vec();
    no_events.extend_from_slice(&good[events_at + 15..]);
    let mut trailing = good.clone();
    trailing.extend_from_slice(b" x");
    for (name, mut doc) in [("no_ts", no_ts), ("no_events", no_events), ("trailing", trailing)] {
        let n = doc.len();
        doc[n - 300] = 0xff;
        let (_dir, path) = temp(&format!("{name}_utf8.json.gz"), &gz(&doc));
        let want = serial(&path).map(|(t, _)| digest(&t));
        assert!(
            want.as_ref().is_err_and(|e| e.contains("invalid UTF-8")),
            "{name}: {want:?}"
        );
        for c in [4093, CHUNK] {
            assert_eq!(piped(&path, c).map(|(t, _)| digest(&t)), want, "{name} chunk {c}");
        }
    }
}

#[test]
fn errors_are_the_serial_ones() {
    let good = read_bytes(&fixture("traces/b300_cuda13_moe.kineto.json.gz")).unwrap();
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // broken JSON in the middle of an event
    let mut broken = good.clone();
    let at = broken.len() / 2;
    broken[at] = b'@';
    cases.push(("broken.json.gz", gz(&broken)));
    // truncated JSON (the gzip stream itself is whole)
    cases.push(("cut.json.gz", gz(&good[..good.len() * 2 / 3])));
    // invalid UTF-8 after a JSON error: the serial read validates first
    let mut utf = broken.clone();
    let n = utf.len();
    utf[n - 10] = 0xff;
    cases.push(("utf8.json.gz", gz(&utf)));
    // a multi-byte character cut by the end of the file
    let mut cutchar = good.clone();
    cutchar.extend_from_slice(&[b' ', 0xe2, 0x82]);
    cases.push(("cutchar.json.gz", gz(&cutchar)));
    // content after the end
    let mut after = good.clone();
    after.extend_from_slice(b" {}");
    cases.push(("after.json.gz", gz(&after)));
    // a corrupt deflate stream (the trailer intact, so the pipeline is taken)
    let mut corrupt = gz(&good);
    let m = corrupt.len() / 2;
    for b in &mut corrupt[m..m + 16] {
        *b ^= 0x5a;
    }
    cases.push(("corrupt.json.gz", corrupt));
    // a gzip stream cut short, its last 8 bytes standing in for a trailer
    let whole = gz(&good);
    cases.push(("truncated.json.gz", whole[..whole.len() - 100].to_vec()));
    for (name, bytes) in cases {
        let (_dir, path) = temp(name, &bytes);
        let want = serial(&path).map(|(t, _)| digest(&t));
        assert!(want.is_err(), "{name} reads without error");
        for c in [1usize, 13, 4093, CHUNK] {
            let got = piped(&path, c).map(|(t, _)| digest(&t));
            assert_eq!(got, want, "{name} chunk {c}");
        }
    }
}

#[test]
fn several_members_or_a_raw_stream_fall_back_to_the_serial_read() {
    let good = read_bytes(&fixture("traces/mi300x_sglang_decode_hipgraph.kineto.json.gz")).unwrap();
    // two members: the trailer states the second one's size only, the buffer overflows
    let (a, b) = good.split_at(good.len() - 200_000);
    let mut two = gz(a);
    two.extend_from_slice(&gz(b));
    let announced = announced_size(&two).expect("the second member's size looks plausible");
    assert_eq!(announced, 200_000);
    let (_dir, path) = temp("two.json.gz", &two);
    let (want, _) = serial(&path).unwrap();
    for c in [4093, CHUNK] {
        assert_eq!(digest(&piped(&path, c).unwrap().0), digest(&want), "chunk {c}");
    }
    // teller's own raw stream, gzipped under a JSON name
    let raw = std::fs::read(fixture("gpu/h200_llama_tiny/raw/teller-vm-742-0.tmsgpack")).unwrap();
    let (_dir, path) = temp("raw.json.gz", &gz(&raw));
    let (want, kind) = serial(&path).unwrap();
    assert_eq!(kind, Kind::Raw);
    let (got, kind) = piped(&path, 4093).unwrap();
    assert_eq!(kind, Kind::Raw);
    assert_eq!(digest(&got), digest(&want));
}
