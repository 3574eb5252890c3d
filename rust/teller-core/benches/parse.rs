//! Criterion benches of the trace core on the real fixtures: read (decompress + parse) and
//! load (read + align); the gz read serial and pipelined (`inflate`); the raw MessagePack file the
//! shim wrote on an H200 (read, load). Run with `cargo bench -p teller-core --bench parse`.
//! (`benches/bench_raw.py` reads raw files of a million records against msgpack-python.)
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use teller_core::load::{read_bytes, read_file_with, Pipeline};
use teller_core::{load, LoadOptions};

fn fixtures() -> Vec<(String, String)> {
    let dir = format!("{}/../../tests/data/traces", env!("CARGO_MANIFEST_DIR"));
    let mut v: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().replace(".kineto.json.gz", ""),
                p.display().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

fn bench(c: &mut Criterion) {
    for (name, path) in fixtures() {
        let plain = read_bytes(&path).unwrap();
        let mut g = c.benchmark_group(format!("trace/{name}"));
        g.sample_size(10);
        g.throughput(Throughput::Bytes(plain.len() as u64));
        g.bench_function("parse_json", |b| {
            b.iter(|| teller_core::chrome::read_chrome(&path, &plain, 0).unwrap())
        });
        // inflate, then parse (one thread) against parse while a second thread inflates
        g.bench_function("read_gz_serial", |b| {
            b.iter(|| read_file_with(&path, 0, Pipeline::Off).unwrap())
        });
        g.bench_function("read_gz_pipelined", |b| {
            b.iter(|| read_file_with(&path, 0, Pipeline::Auto).unwrap())
        });
        g.bench_function("load_gz_and_align", |b| {
            b.iter(|| load(std::slice::from_ref(&path), &LoadOptions::default()).unwrap())
        });
        g.finish();
    }
    let raw = format!(
        "{}/../../tests/data/gpu/h200_llama_tiny/raw/teller-vm-742-0.tmsgpack",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&raw).unwrap();
    let mut g = c.benchmark_group("trace/h200_llama_tiny_raw");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("read_raw", |b| {
        b.iter(|| teller_core::raw::read_raw(&raw, &bytes, 0).unwrap())
    });
    g.bench_function("load_raw_and_align", |b| {
        b.iter(|| load(std::slice::from_ref(&raw), &LoadOptions::default()).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
