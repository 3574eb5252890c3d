//! Deterministic synthetic corpus shaped like an LLM-inference trace.
//!
//! * `n_symbols` base symbols with Zipf-like frequencies (symbol 0 most frequent, like
//!   `cudaLaunchKernel`); rare symbols come from the tail;
//! * a pool of motifs (6-40 events: a launch-like frequent symbol interleaved with kernel-like
//!   Zipf symbols, e.g. one attention or MLP sub-block);
//! * a few step templates (prefill/decode/batch shapes): a prologue, `n_layers` layers of 2-4 motif
//!   slots (each slot has 1-3 variant motifs: kernel selection by shape), an epilogue;
//! * a step (one segment) is, with probability `repeat_prob`, an exact repeat of its template's
//!   canonical step (CUDA-graph-like decode steps); otherwise it is built fresh: every slot picks a
//!   non-default variant with probability `variant_prob`, and every event is replaced/duplicated/
//!   dropped with probability `noise_prob` (rare symbols, retries, missing events);
//! * per-symbol log-normal durations with rare stragglers, sequential start times with small gaps
//!   and occasional idle periods.
//!
//! Same config, same corpus, on every machine (SplitMix64, no platform-dependent code paths).

/// Generator parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthConfig {
    pub seed: u64,
    /// Total events (the last step is cut to fit exactly).
    pub n_events: usize,
    /// Base vocabulary size.
    pub n_symbols: u32,
    /// Target mean step length in events (templates vary by about +-30%).
    pub step_events: usize,
    /// Number of step templates.
    pub n_templates: usize,
    /// Number of motifs in the pool.
    pub n_motifs: usize,
    /// Probability that a step is an exact repeat of its template's canonical step.
    pub repeat_prob: f64,
    /// Probability that a motif slot uses a non-default variant (fresh steps only).
    pub variant_prob: f64,
    /// Per-event edit probability (fresh steps only).
    pub noise_prob: f64,
    /// Zipf exponent of the symbol frequencies.
    pub zipf_s: f64,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            seed: 42,
            n_events: 1_000_000,
            n_symbols: 1500,
            step_events: 2000,
            n_templates: 8,
            n_motifs: 200,
            repeat_prob: 0.5,
            variant_prob: 0.2,
            noise_prob: 0.01,
            zipf_s: 1.1,
        }
    }
}

/// A generated corpus (`starts` = segment start offsets, one segment per step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthCorpus {
    pub base_size: u32,
    pub ids: Vec<u32>,
    pub starts: Vec<usize>,
    pub dur_ns: Vec<i64>,
    pub start_ns: Vec<i64>,
}

/// SplitMix64: tiny, deterministic, good enough for synthetic data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo) as u64) as usize
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.f64().max(1e-300);
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u32, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut acc = 0.0;
        for k in 1..=n {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in cdf.iter_mut() {
            *c /= acc;
        }
        Zipf { cdf }
    }
    fn sample(&self, rng: &mut Rng) -> u32 {
        let u = rng.f64();
        (self.cdf.partition_point(|&c| c < u) as u32).min(self.cdf.len() as u32 - 1)
    }
}

struct Template {
    prologue: Vec<u32>,
    /// Motif slots of one layer; each slot lists variant motif indices (the first is the default).
    slots: Vec<Vec<usize>>,
    n_layers: usize,
    epilogue: Vec<u32>,
    canonical: Vec<u32>,
}

/// Generates the corpus.
pub fn generate(cfg: &SynthConfig) -> SynthCorpus {
    let n_symbols = cfg.n_symbols.max(4);
    let mut rng = Rng::new(cfg.seed);
    let zipf = Zipf::new(n_symbols, cfg.zipf_s);
    // Per-symbol duration model: log(µs) mean in [0, 7], spread 0.1-0.5.
    let dur_mu: Vec<f64> = (0..n_symbols).map(|_| rng.f64() * 7.0).collect();
    let dur_sigma: Vec<f64> = (0..n_symbols).map(|_| 0.1 + rng.f64() * 0.4).collect();

    let n_motifs = cfg.n_motifs.max(1);
    let motifs: Vec<Vec<u32>> = (0..n_motifs)
        .map(|_| {
            let len = rng.range(6, 41);
            let launch = rng.range(0, 4) as u32; // one of the 4 most frequent symbols
            (0..len)
                .map(|i| if i % 2 == 0 { launch } else { zipf.sample(&mut rng) })
                .collect()
        })
        .collect();

    let step_events = cfg.step_events.max(8);
    let mut templates: Vec<Template> = (0..cfg.n_templates.max(1))
        .map(|_| {
            let prologue: Vec<u32> = (0..rng.range(5, 31)).map(|_| zipf.sample(&mut rng)).collect();
            let epilogue: Vec<u32> = (0..rng.range(5, 31)).map(|_| zipf.sample(&mut rng)).collect();
            let slots: Vec<Vec<usize>> = (0..rng.range(2, 5))
                .map(|_| (0..rng.range(1, 4)).map(|_| rng.range(0, n_motifs)).collect())
                .collect();
            let layer_len: usize = slots.iter().map(|v| motifs[v[0]].len()).sum();
            let target = (step_events as f64 * (0.7 + 0.6 * rng.f64())) as usize;
            let n_layers = (target.saturating_sub(prologue.len() + epilogue.len()) / layer_len).max(1);
            Template {
                prologue,
                slots,
                n_layers,
                epilogue,
                canonical: Vec::new(),
            }
        })
        .collect();
    for t in templates.iter_mut() {
        let mut c = t.prologue.clone();
        for _ in 0..t.n_layers {
            for v in &t.slots {
                c.extend_from_slice(&motifs[v[0]]);
            }
        }
        c.extend_from_slice(&t.epilogue);
        t.canonical = c;
    }

    let mut ids = Vec::with_capacity(cfg.n_events);
    let mut starts = Vec::new();
    let mut step: Vec<u32> = Vec::new();
    let rare = |rng: &mut Rng| n_symbols / 2 + zipf.sample(rng) % (n_symbols - n_symbols / 2);
    while ids.len() < cfg.n_events {
        let t = &templates[(zipf.sample(&mut rng) as usize) % templates.len()];
        starts.push(ids.len());
        let room = cfg.n_events - ids.len();
        if rng.f64() < cfg.repeat_prob {
            ids.extend_from_slice(&t.canonical[..t.canonical.len().min(room)]);
            continue;
        }
        step.clear();
        step.extend_from_slice(&t.prologue);
        for _ in 0..t.n_layers {
            for v in &t.slots {
                let m = if v.len() > 1 && rng.f64() < cfg.variant_prob {
                    v[rng.range(1, v.len())]
                } else {
                    v[0]
                };
                for &x in &motifs[m] {
                    if rng.f64() < cfg.noise_prob {
                        match rng.range(0, 3) {
                            0 => step.push(rare(&mut rng)),
                            1 => {
                                step.push(x);
                                step.push(x);
                            }
                            _ => {}
                        }
                    } else {
                        step.push(x);
                    }
                }
            }
        }
        step.extend_from_slice(&t.epilogue);
        ids.extend_from_slice(&step[..step.len().min(room)]);
    }
    let mut dur_ns = Vec::with_capacity(ids.len());
    let mut start_ns = Vec::with_capacity(ids.len());
    let mut t: i64 = 1_000_000_000;
    for &s in &ids {
        let mut us = (dur_mu[s as usize] + dur_sigma[s as usize] * rng.normal()).exp();
        if rng.f64() < 0.001 {
            us *= 20.0; // straggler
        }
        let d = (us * 1000.0) as i64;
        let gap = if rng.f64() < 0.01 {
            (rng.f64() * 500_000.0) as i64
        } else {
            (rng.f64() * 2_000.0) as i64
        };
        t += gap;
        start_ns.push(t);
        dur_ns.push(d);
        t += d;
    }
    SynthCorpus {
        base_size: n_symbols,
        ids,
        starts,
        dur_ns,
        start_ns,
    }
}
