//! Deterministic synthetic corpus shaped like an LLM-inference trace.
//!
//! * `n_symbols` base symbols with Zipf-like frequencies (symbol 0 most frequent, like
//!   `cudaLaunchKernel`);
//! * a step (one segment) is a prologue, `n_layers` repetitions of the template's per-layer block
//!   (2-4 motifs of 6-40 events: launch/kernel-like interleavings), and an epilogue;
//! * a few step templates (prefill/decode/different batch shapes); most steps are exact repeats of
//!   a template, `mutation_prob` of them get 1-4 random edits (substitution, insertion of a rare
//!   symbol, deletion, a repeated motif), so there are both heavy repeats and many distinct steps;
//! * per-symbol log-normal durations with rare stragglers, sequential start times with small gaps.
//!
//! Same config, same corpus, on every machine (SplitMix64, no float-to-string dependence).

/// Generator parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthConfig {
    pub seed: u64,
    /// Total events (the last step is cut to fit exactly).
    pub n_events: usize,
    /// Base vocabulary size.
    pub n_symbols: u32,
    /// Target mean step length in events (steps vary by about +-30%).
    pub step_events: usize,
    /// Number of distinct step templates.
    pub n_templates: usize,
    /// Probability that a step is an edited copy of its template.
    pub mutation_prob: f64,
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
            mutation_prob: 0.3,
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

/// Generates the corpus.
pub fn generate(cfg: &SynthConfig) -> SynthCorpus {
    let n_symbols = cfg.n_symbols.max(4);
    let mut rng = Rng::new(cfg.seed);
    let zipf = Zipf::new(n_symbols, cfg.zipf_s);
    // Per-symbol duration model: log(µs) mean in [0, 7], spread 0.1-0.5.
    let dur_mu: Vec<f64> = (0..n_symbols).map(|_| rng.f64() * 7.0).collect();
    let dur_sigma: Vec<f64> = (0..n_symbols).map(|_| 0.1 + rng.f64() * 0.4).collect();

    // Motif pool: launch-like frequent symbols interleaved with kernel-like Zipf symbols.
    let n_motifs = 32;
    let motifs: Vec<Vec<u32>> = (0..n_motifs)
        .map(|_| {
            let len = rng.range(6, 41);
            let launch = rng.range(0, 4) as u32; // one of the 4 most frequent symbols
            (0..len).map(|i| if i % 2 == 0 { launch } else { zipf.sample(&mut rng) }).collect()
        })
        .collect();

    // Templates.
    let step_events = cfg.step_events.max(8);
    let templates: Vec<Vec<u32>> = (0..cfg.n_templates.max(1))
        .map(|_| {
            let mut t: Vec<u32> = (0..rng.range(5, 31)).map(|_| zipf.sample(&mut rng)).collect();
            let block: Vec<u32> = (0..rng.range(2, 5)).flat_map(|_| motifs[rng.range(0, n_motifs)].clone()).collect();
            let epilogue: Vec<u32> = (0..rng.range(5, 31)).map(|_| zipf.sample(&mut rng)).collect();
            let target = (step_events as f64 * (0.7 + 0.6 * rng.f64())) as usize;
            let n_layers = (target.saturating_sub(t.len() + epilogue.len()) / block.len()).max(1);
            for _ in 0..n_layers {
                t.extend_from_slice(&block);
            }
            t.extend_from_slice(&epilogue);
            t
        })
        .collect();

    let mut ids = Vec::with_capacity(cfg.n_events);
    let mut starts = Vec::new();
    let mut step = Vec::new();
    while ids.len() < cfg.n_events {
        let t = &templates[(zipf.sample(&mut rng) as usize) % templates.len()];
        step.clear();
        step.extend_from_slice(t);
        if rng.f64() < cfg.mutation_prob {
            for _ in 0..rng.range(1, 5) {
                let p = rng.range(0, step.len());
                match rng.range(0, 4) {
                    0 => step[p] = zipf.sample(&mut rng),
                    1 => step.insert(p, n_symbols / 2 + zipf.sample(&mut rng) % (n_symbols / 2)),
                    2 => {
                        if step.len() > 2 {
                            step.remove(p);
                        }
                    }
                    _ => {
                        let m = &motifs[rng.range(0, n_motifs)];
                        step.splice(p..p, m.iter().copied());
                    }
                }
            }
        }
        starts.push(ids.len());
        let room = cfg.n_events - ids.len();
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
        let gap = if rng.f64() < 0.01 { (rng.f64() * 500_000.0) as i64 } else { (rng.f64() * 2_000.0) as i64 };
        t += gap;
        start_ns.push(t);
        dur_ns.push(d);
        t += d;
    }
    SynthCorpus { base_size: n_symbols, ids, starts, dur_ns, start_ns }
}
