//! Criterion benchmarks of TPE on the synthetic corpus (small sizes; the large 1M/10M-event
//! measurements are in `examples/tpe_bench.rs`, see docs/tpe-notes.md).
//!
//! `cargo bench -p teller-core --bench tpe`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use teller_core::tpe::{synth, train, Algo, SymbolStats, TrainConfig};

fn corpus(n_events: usize, step_events: usize) -> synth::SynthCorpus {
    synth::generate(&synth::SynthConfig {
        n_events,
        step_events,
        noise_prob: 0.05,
        variant_prob: 0.3,
        ..Default::default()
    })
}

fn bench_tpe(c: &mut Criterion) {
    let corp = corpus(300_000, 2000);
    let cfg = TrainConfig {
        num_merges: 5000,
        min_frequency: 2,
        max_token_events: None,
    };
    let mut g = c.benchmark_group("tpe");
    g.sample_size(10);
    g.throughput(Throughput::Elements(corp.ids.len() as u64));
    g.bench_function("train_300k_events_5k_merges", |b| {
        b.iter(|| train(black_box(&corp.ids), &corp.starts, corp.base_size, &cfg, None).unwrap())
    });
    let tpe = train(&corp.ids, &corp.starts, corp.base_size, &cfg, None).unwrap().tpe;
    let pool1 = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    g.bench_function("encode_batch_1thread", |b| {
        b.iter(|| pool1.install(|| tpe.encode(black_box(&corp.ids), &corp.starts).unwrap()))
    });
    for algo in [Algo::Backtrack, Algo::Bucket] {
        g.bench_function(format!("encode_batch_no_dedupe_1thread_{algo:?}"), |b| {
            b.iter(|| {
                pool1.install(|| {
                    tpe.encode_opts(black_box(&corp.ids), &corp.starts, false, algo)
                        .unwrap()
                })
            })
        });
    }
    g.bench_function("encode_batch_pool", |b| {
        b.iter(|| tpe.encode(black_box(&corp.ids), &corp.starts).unwrap())
    });
    g.bench_function("encode_segment_heap", |b| {
        b.iter(|| {
            let mut n = 0;
            for (i, &s) in corp.starts.iter().enumerate() {
                let e = corp.starts.get(i + 1).copied().unwrap_or(corp.ids.len());
                n += tpe.encode_segment_heap(black_box(&corp.ids[s..e])).unwrap().0.len();
            }
            n
        })
    });
    let enc = tpe.encode(&corp.ids, &corp.starts).unwrap();
    g.bench_function("decode", |b| b.iter(|| tpe.decode(black_box(&enc.tokens)).unwrap()));
    let stats = SymbolStats::from_corpus(&corp.ids, &corp.dur_ns, corp.base_size).unwrap();
    g.bench_function("stats_and_features", |b| {
        b.iter(|| {
            let st = SymbolStats::from_corpus(black_box(&corp.ids), &corp.dur_ns, corp.base_size).unwrap();
            enc.features(&corp.ids, &corp.dur_ns, &corp.start_ns, &st).unwrap()
        })
    });
    let _ = stats;
    g.finish();
}

criterion_group!(benches, bench_tpe);
criterion_main!(benches);
