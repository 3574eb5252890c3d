//! Inputs with no size: pipes, FIFOs, character devices. Their first bytes decide whether the rest
//! is read (`load::read_input`), so an endless stream of something that is not a trace fails at
//! once instead of being read until memory runs out.
#![cfg(unix)]

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use teller_core::load::{read_file, read_input};

const TRACE: &str = r#"{"traceEvents":[{"ph":"X","name":"k","pid":1,"tid":1,"ts":1.0,"dur":2.0,"cat":"kernel"}]}"#;

fn fixture(name: &str) -> String {
    format!("{}/../../tests/data/{}", env!("CARGO_MANIFEST_DIR"), name)
}

/// A fresh directory under the temp directory, removed (with what is in it) when dropped, so a
/// run leaves nothing behind, failed assertions included.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("teller-streams-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // (a detached writer may still hold a FIFO open: unlinking it is fine on Unix)
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A FIFO in a fresh directory, with the guard that removes it (None where `mkfifo` is missing:
/// the test then says so and passes).
fn fifo(name: &str) -> Option<(Scratch, PathBuf)> {
    let dir = Scratch::new(name);
    let p = dir.0.join(name);
    match Command::new("mkfifo").arg(&p).status() {
        Ok(s) if s.success() => Some((dir, p)),
        _ => {
            eprintln!("mkfifo not available: skipped");
            None
        }
    }
}

/// Writes `bytes` into the FIFO, then holds it open for `hold` before closing it.
fn writer(p: PathBuf, bytes: Vec<u8>, hold: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        // (the reader may stop early: a broken pipe here is the point, not a failure)
        let _ = f.write_all(&bytes);
        let _ = f.flush();
        std::thread::sleep(hold);
    })
}

#[test]
fn dev_zero_fails_at_its_first_byte() {
    if !std::path::Path::new("/dev/zero").exists() {
        eprintln!("/dev/zero not available: skipped");
        return;
    }
    let t0 = Instant::now();
    let e = read_file("/dev/zero", 0).expect_err("an error").to_string();
    assert!(e.contains("/dev/zero") && e.contains("not a Chrome trace"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5), "read on for {:?}", t0.elapsed());
}

#[test]
fn a_trace_through_a_fifo_is_read_whole() {
    let Some((_dir, p)) = fifo("trace.json") else { return };
    let w = writer(p.clone(), TRACE.as_bytes().to_vec(), Duration::ZERO);
    let (t, _, _) = read_file(p.to_str().unwrap(), 0).unwrap();
    w.join().unwrap();
    assert_eq!(t.len(), 1);
    // and gzipped, past the first bytes
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    gz.write_all(TRACE.as_bytes()).unwrap();
    let w = writer(p.clone(), gz.finish().unwrap(), Duration::ZERO);
    let (t, _, _) = read_file(p.to_str().unwrap(), 0).unwrap();
    w.join().unwrap();
    assert_eq!(t.len(), 1);
}

#[test]
fn a_stream_that_opens_with_no_trace_is_not_read_to_its_end() {
    let Some((_dir, p)) = fifo("junk") else { return };
    // 64 bytes that open nothing teller reads, and a writer that keeps the pipe open for 20 s: a
    // reader waiting for the end would wait that long
    let w = writer(p.clone(), vec![0u8; 64], Duration::from_secs(20));
    let t0 = Instant::now();
    let e = read_file(p.to_str().unwrap(), 0).expect_err("an error").to_string();
    assert!(t0.elapsed() < Duration::from_secs(10), "read on for {:?}", t0.elapsed());
    assert!(e.contains("at byte 0") && e.contains("not a Chrome trace"), "{e}");
    drop(w); // (detached: it closes its end when its sleep is over)
}

#[test]
fn a_short_head_that_stays_open_is_decided_on_what_arrived() {
    // five bytes of no trace, and another compression's magic, each with the pipe held open: the
    // first bytes decide, no wait for 64 of them or for the end
    for (name, bytes, says) in [
        ("hello", b"hello".to_vec(), "not a Chrome trace"),
        ("zstd", vec![0x28, 0xb5, 0x2f, 0xfd, 0, 0], "zstd-compressed"),
    ] {
        let Some((_dir, p)) = fifo(name) else { return };
        let _w = writer(p.clone(), bytes, Duration::from_secs(20));
        let t0 = Instant::now();
        let e = read_file(p.to_str().unwrap(), 0).expect_err("an error").to_string();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{name}: waited {:?}",
            t0.elapsed()
        );
        assert!(e.contains(says), "{name}: {e}");
    }
}

#[test]
fn leading_whitespace_and_raw_streams_through_a_fifo() {
    let Some((_dir, p)) = fifo("ws.json") else { return };
    let mut spaced = vec![b' '; 5000];
    spaced.extend_from_slice(TRACE.as_bytes());
    let w = writer(p.clone(), spaced, Duration::ZERO);
    assert_eq!(read_file(p.to_str().unwrap(), 0).unwrap().0.len(), 1);
    w.join().unwrap();
    let raw = fixture("gpu/h200_llama_tiny/raw/teller-vm-742-0.tmsgpack");
    let want = read_file(&raw, 0).unwrap().0.len();
    let Some((_dir, p)) = fifo("raw.tmsgpack") else { return };
    let w = writer(p.clone(), std::fs::read(&raw).unwrap(), Duration::ZERO);
    assert_eq!(read_file(p.to_str().unwrap(), 0).unwrap().0.len(), want);
    w.join().unwrap();
}

#[test]
fn a_regular_file_reads_as_before() {
    let dir = Scratch::new("file");
    let p = dir.0.join("zeros.json");
    std::fs::write(&p, vec![0u8; 1000]).unwrap();
    // a file is read whole (its size is known), and says the same as the stream did
    assert_eq!(read_input(p.to_str().unwrap()).unwrap().len(), 1000);
    let e = read_file(p.to_str().unwrap(), 0).err().unwrap().to_string();
    assert!(e.contains("at byte 0") && e.contains("not a Chrome trace"), "{e}");
}
