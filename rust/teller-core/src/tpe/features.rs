//! Per-token timing features.
//!
//! With `x(e) = ln(1 + max(dur_ns(e), 0) / 1000)` (log1p of the duration in µs), a token covering
//! the events `s..e` of a segment gets, in this order (`N_FEATURES = 5` columns, `f32`):
//!
//! 0. `count`: number of base events `e - s`;
//! 1. `sum_log_dur`: sum of `x` over the events;
//! 2. `max_log_dur`: max of `x`;
//! 3. `max_z`: max over the events of `(x - mean[sym]) / max(std[sym], STD_FLOOR)` with the
//!    per-base-symbol statistics of [`SymbolStats`] (0 for a symbol with no statistics);
//! 4. `log_gap`: idle gap before the token: `ln(1 + max(0, start_ns(s) - anchor) / 1000)` where
//!    `p = s - 1` is the previous event and `anchor` is its end if it ended by then, else its start
//!    (it encloses the token: the gap is the parent's time before this child); 0 for the first token
//!    of a segment. (Not "since the latest end of all earlier events": in call-chain order the step's
//!    own range encloses everything, which made that definition 0 everywhere.)
//!
//! Sums are accumulated in `f64` in event order and converted to `f32` at the end.

use rayon::prelude::*;

use super::{Encoding, Result, TpeError};

/// Number of feature columns.
pub const N_FEATURES: usize = 5;
/// Floor on the per-symbol standard deviation (log1p-µs units) used in z-scores.
pub const STD_FLOOR: f64 = 0.1;

/// `ln(1 + max(dur_ns, 0) / 1000)`.
#[inline]
pub fn log_dur(dur_ns: i64) -> f64 {
    (dur_ns.max(0) as f64 / 1000.0).ln_1p()
}

/// Per-base-symbol statistics of the log-duration `x`: count, mean, population std.
#[derive(Debug, Clone, PartialEq)]
pub struct SymbolStats {
    pub count: Vec<u64>,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
}

/// Fixed chunk size for the parallel statistics: fixed (not per-thread) chunks summed in order
/// make the floating-point result independent of the thread count.
const STATS_CHUNK: usize = 1 << 17;

impl SymbolStats {
    /// Computes the statistics from a corpus of base ids with durations.
    pub fn from_corpus(ids: &[u32], dur_ns: &[i64], base_size: u32) -> Result<Self> {
        if dur_ns.len() != ids.len() {
            return Err(TpeError::LengthMismatch {
                what: "dur_ns",
                got: dur_ns.len(),
                expected: ids.len(),
            });
        }
        super::check_ids(ids, base_size)?;
        let nb = base_size as usize;
        // One pass: count, sum and sum of squares per symbol, per fixed chunk, combined in chunk
        // order. (x is a log-duration in [0, ~25] and the variance is floored at STD_FLOOR^2 when
        // used, so the sum-of-squares formula loses nothing that matters; the reference's
        // two-pass result agrees to ~1e-12.)
        let partial: Vec<(Vec<u64>, Vec<f64>, Vec<f64>)> = ids
            .par_chunks(STATS_CHUNK)
            .zip(dur_ns.par_chunks(STATS_CHUNK))
            .map(|(ic, dc)| {
                let mut c = vec![0u64; nb];
                let mut s = vec![0f64; nb];
                let mut q = vec![0f64; nb];
                for (&i, &d) in ic.iter().zip(dc) {
                    let x = log_dur(d);
                    c[i as usize] += 1;
                    s[i as usize] += x;
                    q[i as usize] += x * x;
                }
                (c, s, q)
            })
            .collect();
        let mut count = vec![0u64; nb];
        let mut sum = vec![0f64; nb];
        let mut sq = vec![0f64; nb];
        for (c, s, q) in &partial {
            for k in 0..nb {
                count[k] += c[k];
                sum[k] += s[k];
                sq[k] += q[k];
            }
        }
        let mean: Vec<f64> = (0..nb)
            .map(|k| if count[k] > 0 { sum[k] / count[k] as f64 } else { 0.0 })
            .collect();
        let std = (0..nb)
            .map(|k| {
                if count[k] > 0 {
                    (sq[k] / count[k] as f64 - mean[k] * mean[k]).max(0.0).sqrt()
                } else {
                    0.0
                }
            })
            .collect();
        Ok(SymbolStats { count, mean, std })
    }

    /// Rebuilds statistics from stored columns (for loading).
    pub fn from_parts(count: Vec<u64>, mean: Vec<f64>, std: Vec<f64>) -> Result<Self> {
        if mean.len() != count.len() {
            return Err(TpeError::LengthMismatch {
                what: "mean",
                got: mean.len(),
                expected: count.len(),
            });
        }
        if std.len() != count.len() {
            return Err(TpeError::LengthMismatch {
                what: "std",
                got: std.len(),
                expected: count.len(),
            });
        }
        Ok(SymbolStats { count, mean, std })
    }

    /// Number of base symbols covered.
    pub fn len(&self) -> usize {
        self.count.len()
    }

    pub fn is_empty(&self) -> bool {
        self.count.is_empty()
    }

    /// z-score of log-duration `x` for base symbol `s` (0 for a symbol never seen).
    #[inline]
    pub fn z(&self, s: u32, x: f64) -> f64 {
        let s = s as usize;
        if self.count[s] == 0 {
            0.0
        } else {
            (x - self.mean[s]) / self.std[s].max(STD_FLOOR)
        }
    }
}

/// Feature 4 of a token starting at event `s > 0` of its segment (see the module docs).
#[inline]
pub fn log_gap(start_ns: &[i64], dur_ns: &[i64], s: usize) -> f64 {
    let p = s - 1;
    let prev_end = start_ns[p].saturating_add(dur_ns[p].max(0));
    let anchor = if prev_end <= start_ns[s] { prev_end } else { start_ns[p] };
    (start_ns[s].saturating_sub(anchor).max(0) as f64 / 1000.0).ln_1p()
}

/// Computes the `n_tokens x N_FEATURES` features (row-major `f32`) of an encoded corpus.
///
/// `token_offsets` (`len == n_tokens + 1`, last `== ids.len()`) and `segment_starts` (token index
/// of every segment's first token) are those of an [`Encoding`].
pub fn token_features(
    ids: &[u32],
    dur_ns: &[i64],
    start_ns: &[i64],
    token_offsets: &[usize],
    segment_starts: &[usize],
    stats: &SymbolStats,
) -> Result<Vec<f32>> {
    let n = ids.len();
    if dur_ns.len() != n {
        return Err(TpeError::LengthMismatch {
            what: "dur_ns",
            got: dur_ns.len(),
            expected: n,
        });
    }
    if start_ns.len() != n {
        return Err(TpeError::LengthMismatch {
            what: "start_ns",
            got: start_ns.len(),
            expected: n,
        });
    }
    super::check_ids(ids, stats.len() as u32)?;
    if token_offsets.is_empty() {
        return Err(TpeError::BadOffsets {
            index: 0,
            detail: "token_offsets must have n_tokens + 1 entries".into(),
        });
    }
    let n_tok = token_offsets.len() - 1;
    if token_offsets[0] != 0 || token_offsets[n_tok] != n {
        return Err(TpeError::BadOffsets {
            index: 0,
            detail: format!(
                "token_offsets must run from 0 to {n} (got {} .. {})",
                token_offsets[0], token_offsets[n_tok]
            ),
        });
    }
    for k in 0..n_tok {
        if token_offsets[k + 1] <= token_offsets[k] {
            return Err(TpeError::BadOffsets {
                index: k + 1,
                detail: "token_offsets must be strictly increasing".into(),
            });
        }
    }
    // Segment ranges over tokens (reuse the corpus-offset validation on the token axis).
    let seg = super::segment_bounds(n_tok, segment_starts)?;
    let rows: Vec<Vec<f32>> = seg
        .par_chunks(64)
        .map(|group| {
            let mut out = Vec::new();
            for &(t0, t1) in group {
                for k in t0..t1 {
                    let (s, e) = (token_offsets[k], token_offsets[k + 1]);
                    let gap = if k == t0 { 0.0 } else { log_gap(start_ns, dur_ns, s) };
                    let (mut sum, mut mx, mut mz) = (0f64, f64::NEG_INFINITY, f64::NEG_INFINITY);
                    for j in s..e {
                        let x = log_dur(dur_ns[j]);
                        sum += x;
                        mx = mx.max(x);
                        mz = mz.max(stats.z(ids[j], x));
                    }
                    out.extend_from_slice(&[(e - s) as f32, sum as f32, mx as f32, mz as f32, gap as f32]);
                }
            }
            out
        })
        .collect();
    let mut out = Vec::with_capacity(n_tok * N_FEATURES);
    for r in rows {
        out.extend_from_slice(&r);
    }
    Ok(out)
}

impl Encoding {
    /// [`token_features`] for this encoding.
    pub fn features(&self, ids: &[u32], dur_ns: &[i64], start_ns: &[i64], stats: &SymbolStats) -> Result<Vec<f32>> {
        token_features(ids, dur_ns, start_ns, &self.token_offsets, &self.segment_starts, stats)
    }
}
