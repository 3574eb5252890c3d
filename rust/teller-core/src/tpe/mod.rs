//! TPE: Trace Pair Encoding, a BPE-style merge tokenizer over trace-event symbols.
//!
//! Everything here works on integer symbol ids; the base vocabulary (symbol names, the UNK id) is
//! owned by the Python/serialization layer.
//!
//! # Corpus convention
//!
//! A corpus is `ids: &[u32]` (base symbol ids, each `< base_size`) plus `starts: &[usize]`, the
//! **start** offset of every segment (a segment is one step / one trace window). Segment `i` covers
//! `ids[starts[i]..starts[i+1]]`, the last one ends at `ids.len()`. Starts must be non-decreasing,
//! `<= ids.len()`, and the first must be 0 when `ids` is non-empty (so every event is in a segment).
//! Empty segments are allowed (a trailing start equal to `ids.len()` is an empty last segment).
//! Merges never cross a segment boundary.
//!
//! # Token ids
//!
//! Base symbols are `0..base_size`; the token created by merge of rank `r` has id `base_size + r`.
//!
//! * [`train`]: the trainer (deduplicated segments, linked lists, incremental pair counts,
//!   lazily-corrected max-heap).
//! * [`Tpe`]: a trained model (merges in rank order + derived tables), [`Tpe::encode`] (batch,
//!   deduplicated, parallel), [`Tpe::encode_segment`], [`Tpe::decode`]; see `encode.rs` and
//!   `backtrack.rs` for the three encoders.
//! * [`map_rare_symbols`]: UNK preprocessing before training; [`starts_from_i64`].
//! * [`features`]: per-token timing features and [`SymbolStats`].
//! * [`synth`]: a deterministic synthetic, LLM-inference-shaped corpus generator.
//! * [`naive`]: slow, obviously-correct reference implementations (for tests).

mod backtrack;
mod encode;
pub mod features;
pub mod naive;
mod ranks;
pub mod synth;
mod train;

#[cfg(test)]
mod tests;

pub use encode::{Algo, Encoding};
pub use features::{token_features, SymbolStats, N_FEATURES};
pub use train::{train, train_checked, Progress, TrainConfig, TrainOutput, TrainStats};

use hashbrown::HashMap;

/// Sentinel: "no node" / "dead symbol". Also why ids must stay below `u32::MAX`.
pub(crate) const NONE: u32 = u32::MAX;

/// Largest vocabulary (base + merges) we accept; ids must stay below the sentinel.
pub const MAX_VOCAB: u64 = (u32::MAX - 1) as u64;

/// Errors of the TPE module. Never a panic on bad input from Python.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TpeError {
    #[error("symbol id {id} at index {index} is out of range (base vocabulary size {base_size})")]
    IdOutOfRange { index: usize, id: u32, base_size: u32 },
    #[error("token id {id} at index {index} is out of range (vocabulary size {vocab_size})")]
    TokenOutOfRange { index: usize, id: u32, vocab_size: u32 },
    #[error("bad segment offsets: {detail} (at offset index {index})")]
    BadOffsets { index: usize, detail: String },
    #[error("array length mismatch: {what} has length {got}, expected {expected}")]
    LengthMismatch {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("merge of rank {rank} ({left}, {right}) refers to an id not defined before it (vocabulary at that rank: {limit})")]
    BadMerge {
        rank: usize,
        left: u32,
        right: u32,
        limit: u32,
    },
    #[error("vocabulary too large: {0} ids (at most {MAX_VOCAB})")]
    VocabTooLarge(u64),
    #[error("invalid configuration: {0}")]
    BadConfig(String),
    #[error("training cancelled by the progress callback after {0} merges")]
    Cancelled(usize),
}

pub type Result<T> = std::result::Result<T, TpeError>;

#[inline]
pub(crate) fn pair_key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

#[inline]
pub(crate) fn unpair(k: u64) -> (u32, u32) {
    ((k >> 32) as u32, k as u32)
}

/// Validates segment start offsets against a corpus of `n` events and returns the half-open
/// `(start, end)` of every segment.
pub fn segment_bounds(n: usize, starts: &[usize]) -> Result<Vec<(usize, usize)>> {
    if n > 0 && starts.first() != Some(&0) {
        // (the value itself, not Rust's `Some(2)`, in a message Python users read)
        let detail = match starts.first() {
            Some(s) => format!("the first segment must start at 0, got {s} (for {n} events)"),
            None => format!("no segment starts for {n} events (the first segment starts at 0)"),
        };
        return Err(TpeError::BadOffsets { index: 0, detail });
    }
    let mut out = Vec::with_capacity(starts.len());
    for (i, &s) in starts.iter().enumerate() {
        let e = if i + 1 < starts.len() { starts[i + 1] } else { n };
        if s > n {
            return Err(TpeError::BadOffsets {
                index: i,
                detail: format!("start {s} > number of events {n}"),
            });
        }
        if e < s {
            return Err(TpeError::BadOffsets {
                index: i + 1,
                detail: format!("starts must be non-decreasing ({s} then {e})"),
            });
        }
        out.push((s, e));
    }
    Ok(out)
}

/// Converts `int64` segment start offsets (what the Python fast path passes) to `usize`,
/// rejecting negative values. Validation against the corpus happens in the callee.
pub fn starts_from_i64(starts: &[i64]) -> Result<Vec<usize>> {
    starts
        .iter()
        .enumerate()
        .map(|(index, &s)| {
            usize::try_from(s).map_err(|_| TpeError::BadOffsets {
                index,
                detail: format!("negative start offset {s}"),
            })
        })
        .collect()
}

/// Checks that every id is `< base_size`.
pub(crate) fn check_ids(ids: &[u32], base_size: u32) -> Result<()> {
    // Fast path: one vectorizable max; locate the culprit only on failure.
    let max = ids.iter().copied().max().unwrap_or(0);
    if !ids.is_empty() && max >= base_size {
        let index = ids.iter().position(|&x| x >= base_size).unwrap();
        return Err(TpeError::IdOutOfRange {
            index,
            id: ids[index],
            base_size,
        });
    }
    Ok(())
}

/// Result of [`map_rare_symbols`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RareMapping {
    /// The corpus with every rare symbol replaced by `unk_id`.
    pub ids: Vec<u32>,
    /// Total count of every base symbol in the input (`len == base_size`).
    pub symbol_counts: Vec<u64>,
    /// The symbols that were mapped to UNK, ascending.
    pub rare: Vec<u32>,
}

/// Counts every base symbol (`len == base_size`).
pub fn symbol_counts(ids: &[u32], base_size: u32) -> Result<Vec<u64>> {
    check_ids(ids, base_size)?;
    let mut counts = vec![0u64; base_size as usize];
    for &x in ids {
        counts[x as usize] += 1;
    }
    Ok(counts)
}

/// Preprocessing before training: every symbol whose total count is `< min_symbol_count` is
/// replaced by `unk_id` (which must be `< base_size`; the UNK symbol itself is never "rare").
pub fn map_rare_symbols(ids: &[u32], base_size: u32, min_symbol_count: u64, unk_id: u32) -> Result<RareMapping> {
    if unk_id >= base_size {
        return Err(TpeError::BadConfig(format!(
            "unk_id {unk_id} must be < base_size {base_size}"
        )));
    }
    let symbol_counts = symbol_counts(ids, base_size)?;
    let is_rare: Vec<bool> = symbol_counts
        .iter()
        .enumerate()
        .map(|(s, &c)| c < min_symbol_count && s as u32 != unk_id && c > 0)
        .collect();
    let rare: Vec<u32> = (0..base_size).filter(|&s| is_rare[s as usize]).collect();
    let ids = if rare.is_empty() {
        ids.to_vec()
    } else {
        ids.iter()
            .map(|&x| if is_rare[x as usize] { unk_id } else { x })
            .collect()
    };
    Ok(RareMapping {
        ids,
        symbol_counts,
        rare,
    })
}

/// A trained TPE model: the base vocabulary size and the merges in rank order, plus tables
/// derived from them (built by [`Tpe::new`], which is also the constructor used when loading).
#[derive(Clone)]
pub struct Tpe {
    base_size: u32,
    merges: Vec<(u32, u32)>,
    /// pair -> rank (the merged token is `base_size + rank`).
    ranks: ranks::RankTable,
    /// Number of base events covered by every token id (`len == vocab_size`).
    token_len: Vec<u32>,
    /// Tables of the backtracking encoder, built on first use (so loading stays cheap); `None`
    /// when the trie would be too large (see [`backtrack::MAX_TRIE_EVENTS`]).
    backtrack: std::sync::OnceLock<Option<backtrack::Backtrack>>,
}

impl std::fmt::Debug for Tpe {
    // The derived tables are large; show the model's identity only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tpe")
            .field("base_size", &self.base_size)
            .field("num_merges", &self.merges.len())
            .field("backtrack_tables_built", &self.backtrack.get().is_some())
            .finish()
    }
}

impl Tpe {
    /// Builds a model from merges in rank order. Merge `r` may only use ids `< base_size + r`.
    /// A duplicated pair is rejected (it could never be applied).
    pub fn new(base_size: u32, merges: Vec<(u32, u32)>) -> Result<Self> {
        let vocab = base_size as u64 + merges.len() as u64;
        if vocab > MAX_VOCAB {
            return Err(TpeError::VocabTooLarge(vocab));
        }
        let mut seen = HashMap::with_capacity(merges.len());
        let mut token_len: Vec<u32> = vec![1; base_size as usize];
        token_len.reserve(merges.len());
        for (r, &(a, b)) in merges.iter().enumerate() {
            let limit = base_size + r as u32;
            if a >= limit || b >= limit {
                return Err(TpeError::BadMerge {
                    rank: r,
                    left: a,
                    right: b,
                    limit,
                });
            }
            if seen.insert(pair_key(a, b), r as u32).is_some() {
                return Err(TpeError::BadConfig(format!(
                    "merge ({a}, {b}) appears twice (second at rank {r})"
                )));
            }
            // (a chain of doubling merges in a hand-made file overflows u32 in 32 steps; decoding
            // such a token would allocate without bound)
            let len = token_len[a as usize]
                .checked_add(token_len[b as usize])
                .ok_or_else(|| {
                    TpeError::BadConfig(format!(
                        "merge of rank {r} ({a}, {b}) makes a token of more than {} events",
                        u32::MAX
                    ))
                })?;
            token_len.push(len);
        }
        let ranks = ranks::RankTable::new(&merges, vocab as u32);
        Ok(Tpe {
            base_size,
            merges,
            ranks,
            token_len,
            backtrack: std::sync::OnceLock::new(),
        })
    }

    pub fn base_size(&self) -> u32 {
        self.base_size
    }

    /// `base_size + merges.len()`.
    pub fn vocab_size(&self) -> u32 {
        self.base_size + self.merges.len() as u32
    }

    /// The merges in rank order.
    pub fn merges(&self) -> &[(u32, u32)] {
        &self.merges
    }

    /// Number of base events covered by every token id (`len == vocab_size`).
    pub fn token_lens(&self) -> &[u32] {
        &self.token_len
    }

    /// The rank of a pair, if it is a merge.
    #[inline]
    pub fn rank(&self, a: u32, b: u32) -> Option<u32> {
        self.ranks.get(a, b)
    }

    /// Appends the base-symbol expansion of `token` to `out` (iterative, no recursion).
    pub(crate) fn expand_into(&self, token: u32, out: &mut Vec<u32>, stack: &mut Vec<u32>) {
        stack.clear();
        stack.push(token);
        while let Some(t) = stack.pop() {
            if t < self.base_size {
                out.push(t);
            } else {
                let (a, b) = self.merges[(t - self.base_size) as usize];
                stack.push(b);
                stack.push(a);
            }
        }
    }

    /// Lossless decoding of token ids back to base symbol ids.
    pub fn decode(&self, tokens: &[u32]) -> Result<Vec<u32>> {
        let vocab = self.vocab_size();
        let mut total = 0usize;
        for (index, &t) in tokens.iter().enumerate() {
            if t >= vocab {
                return Err(TpeError::TokenOutOfRange {
                    index,
                    id: t,
                    vocab_size: vocab,
                });
            }
            total += self.token_len[t as usize] as usize;
        }
        let mut out = Vec::with_capacity(total);
        let mut stack = Vec::new();
        for &t in tokens {
            self.expand_into(t, &mut out, &mut stack);
        }
        Ok(out)
    }
}
