//! TPE benchmark on the deterministic synthetic corpus (`teller_core::tpe::synth`).
//!
//! ```text
//! cargo run --release -p teller-core --example tpe_bench -- [--events N] [--merges M]
//!     [--step-events S] [--repeat P] [--noise P] [--variant P] [--motifs N] [--templates N] [--threads T] [--max-token-events K] [--skip-train-threads]
//! ```
//! Prints training time (1 and T threads), peak memory of training per corpus event (Linux:
//! `/proc/self/clear_refs` + `VmHWM`), and encode throughput with 1 and T threads.

use std::time::Instant;

use teller_core::tpe::{synth, train, Algo, SymbolStats, TrainConfig};

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn status_kb(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User + system CPU seconds of the whole process (robust to other processes sharing the cores).
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0 // utime, stime in clock ticks (USER_HZ = 100)
}

fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn main() {
    let events: usize = arg("--events", 1_000_000);
    let merges: usize = arg("--merges", 30_000);
    let step_events: usize = arg("--step-events", 2000);
    let d = synth::SynthConfig::default();
    let repeat: f64 = arg("--repeat", d.repeat_prob);
    let noise: f64 = arg("--noise", d.noise_prob);
    let variant: f64 = arg("--variant", d.variant_prob);
    let n_motifs: usize = arg("--motifs", d.n_motifs);
    let n_templates: usize = arg("--templates", d.n_templates);
    let threads: usize = arg("--threads", 2);
    let max_tok: u32 = arg("--max-token-events", 0);
    let reps: usize = arg("--reps", 3);
    let skip_mt = std::env::args().any(|a| a == "--skip-train-threads");

    let t0 = Instant::now();
    let corpus = synth::generate(&synth::SynthConfig {
        n_events: events,
        step_events,
        repeat_prob: repeat,
        noise_prob: noise,
        variant_prob: variant,
        n_motifs,
        n_templates,
        ..Default::default()
    });
    let gen_s = t0.elapsed().as_secs_f64();
    let synth::SynthCorpus {
        base_size,
        ids,
        starts,
        dur_ns,
        start_ns,
    } = corpus;
    let n_distinct = {
        let mut v: Vec<&[u32]> = starts
            .iter()
            .enumerate()
            .map(|(i, &s)| &ids[s..starts.get(i + 1).copied().unwrap_or(ids.len())])
            .collect();
        v.sort_unstable();
        v.dedup();
        (v.len(), v.iter().map(|s| s.len()).sum::<usize>())
    };
    println!(
        "corpus: {} events, {} segments ({} distinct, {} distinct events = {:.1}%), base {} symbols, generated in {:.2}s",
        ids.len(),
        starts.len(),
        n_distinct.0,
        n_distinct.1,
        100.0 * n_distinct.1 as f64 / ids.len() as f64,
        base_size,
        gen_s
    );
    let cfg = TrainConfig {
        num_merges: merges,
        min_frequency: 2,
        max_token_events: if max_tok > 0 { Some(max_tok) } else { None },
    };

    // Training, single thread (with peak-memory measurement), then `threads` threads.
    let pool1 = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let pool_n = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let rss0 = status_kb("VmRSS:").unwrap_or(0);
    reset_peak();
    let t0 = Instant::now();
    let c0 = cpu_s();
    let out = pool1.install(|| train(&ids, &starts, base_size, &cfg, None).unwrap());
    let train1 = t0.elapsed().as_secs_f64();
    let train1_cpu = cpu_s() - c0;
    let hwm = status_kb("VmHWM:").unwrap_or(0);
    println!(
        "train 1 thread: {:.3}s wall ({:.2} CPU-s), {} merges (last count {}), peak RSS during training {} MiB (+{} MiB over the {} MiB before) = {:.1} B/event over baseline",
        train1,
        train1_cpu,
        out.tpe.merges().len(),
        out.merge_counts.last().copied().unwrap_or(0),
        hwm / 1024,
        hwm.saturating_sub(rss0) / 1024,
        rss0 / 1024,
        hwm.saturating_sub(rss0) as f64 * 1024.0 / ids.len() as f64
    );
    println!("  trainer sizes: {:?}", out.stats);
    if !skip_mt {
        let t0 = Instant::now();
        let out2 = pool_n.install(|| train(&ids, &starts, base_size, &cfg, None).unwrap());
        println!(
            "train {threads} threads: {:.3}s (identical: {})",
            t0.elapsed().as_secs_f64(),
            out2.tpe.merges() == out.tpe.merges()
        );
    }

    // Encoding.
    let tpe = &out.tpe;
    {
        let t0 = Instant::now();
        tpe.encode(&ids[..1], &[0]).unwrap();
        println!(
            "backtracking tables built on first encode: {:.3}s",
            t0.elapsed().as_secs_f64()
        );
    }
    if std::env::args().any(|a| a == "--junctions") {
        // How many adjacent corpus pairs can never be inside a token (hard split points)?
        let m = tpe.merges();
        let b = tpe.base_size();
        let mut first: Vec<u32> = (0..b).collect();
        let mut last: Vec<u32> = (0..b).collect();
        let mut junction = std::collections::HashSet::new();
        for &(x, y) in m {
            first.push(first[x as usize]);
            last.push(last[y as usize]);
            junction.insert((last[x as usize], first[y as usize]));
        }
        let mut hard = 0usize;
        for w in ids.windows(2) {
            if !junction.contains(&(w[0], w[1])) {
                hard += 1;
            }
        }
        println!(
            "junction pairs {}, hard split points {} = one per {:.1} events",
            junction.len(),
            hard,
            ids.len() as f64 / hard as f64
        );
        let mut blocks = std::collections::HashSet::new();
        let mut distinct_ev = 0usize;
        for (i, &s) in starts.iter().enumerate() {
            let e = starts.get(i + 1).copied().unwrap_or(ids.len());
            let mut b0 = s;
            for j in s + 1..=e {
                if j == e || !junction.contains(&(ids[j - 1], ids[j])) {
                    if blocks.insert(&ids[b0..j]) {
                        distinct_ev += j - b0;
                    }
                    b0 = j;
                }
            }
        }
        println!(
            "blocks: {} distinct, {:.1}% of events in distinct blocks",
            blocks.len(),
            100.0 * distinct_ev as f64 / ids.len() as f64
        );
    }
    let profile: usize = arg("--profile-encode", 0);
    if profile > 0 {
        // Only the encoder, repeatedly (for `perf record`).
        let t0 = Instant::now();
        let c0 = cpu_s();
        let algo = if std::env::args().any(|a| a == "--bucket") {
            Algo::Bucket
        } else {
            Algo::Backtrack
        };
        for _ in 0..profile {
            pool1.install(|| tpe.encode_opts(&ids, &starts, false, algo).unwrap());
        }
        let n = (profile * ids.len()) as f64;
        println!(
            "profile (no dedupe, 1 thread): {:.1} M events/s wall, {:.1} M events per CPU-second",
            n / t0.elapsed().as_secs_f64() / 1e6,
            n / (cpu_s() - c0) / 1e6
        );
        return;
    }
    for (name, pool) in [("1 thread", &pool1), ("N threads", &pool_n)] {
        let mut best = f64::INFINITY;
        let mut n_tok = 0;
        let c0 = cpu_s();
        for _ in 0..reps {
            let t0 = Instant::now();
            let enc = pool.install(|| tpe.encode(&ids, &starts).unwrap());
            best = best.min(t0.elapsed().as_secs_f64());
            n_tok = enc.tokens.len();
        }
        let cpu = (cpu_s() - c0) / reps as f64;
        println!(
            "encode {} ({}): best of {reps} {:.4}s = {:.1} M events/s (mean {:.3} CPU-s), {} tokens ({:.2} events/token)",
            name,
            if name == "1 thread" { 1 } else { threads },
            best,
            ids.len() as f64 / best / 1e6,
            cpu,
            n_tok,
            ids.len() as f64 / n_tok as f64
        );
    }
    // Encoding without the segment dedupe: every segment encoded (the bucket encoder's own speed),
    // and the single-segment heap encoder.
    for algo in [Algo::Backtrack, Algo::Bucket] {
        for (name, pool) in [("1 thread", &pool1), ("N threads", &pool_n)] {
            let t0 = Instant::now();
            let c0 = cpu_s();
            let enc = pool.install(|| tpe.encode_opts(&ids, &starts, false, algo).unwrap());
            let dt = t0.elapsed().as_secs_f64();
            println!(
                "encode without segment dedupe, {algo:?}, {name}: {:.4}s = {:.1} M events/s ({:.3} CPU-s, {} tokens)",
                dt,
                ids.len() as f64 / dt / 1e6,
                cpu_s() - c0,
                enc.tokens.len()
            );
        }
    }
    {
        let t0 = Instant::now();
        let mut toks = 0usize;
        for (i, &s) in starts.iter().enumerate() {
            let e = starts.get(i + 1).copied().unwrap_or(ids.len());
            toks += tpe.encode_segment_heap(&ids[s..e]).unwrap().0.len();
        }
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "encode_segment (heap encoder) per segment, 1 thread: {:.4}s = {:.1} M events/s ({toks} tokens)",
            dt,
            ids.len() as f64 / dt / 1e6
        );
    }
    // Features.
    let enc = tpe.encode(&ids, &starts).unwrap();
    let t0 = Instant::now();
    let stats = pool_n.install(|| SymbolStats::from_corpus(&ids, &dur_ns, base_size).unwrap());
    let f = pool_n.install(|| enc.features(&ids, &dur_ns, &start_ns, &stats).unwrap());
    println!(
        "stats + features ({threads} threads): {:.4}s for {} rows",
        t0.elapsed().as_secs_f64(),
        f.len() / 5
    );
    // Decode.
    let t0 = Instant::now();
    let dec = tpe.decode(&enc.tokens).unwrap();
    println!("decode: {:.4}s, lossless: {}", t0.elapsed().as_secs_f64(), dec == ids);
}
