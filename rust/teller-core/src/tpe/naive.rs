//! Slow, obviously-correct reference implementations (the Rust twin of
//! `python/teller/_reference/tpe.py`), used by the tests.

use hashbrown::HashMap;

use super::TrainConfig;

/// Replaces every non-overlapping occurrence of `pair`, left to right.
pub fn merge_pair(seg: &[u32], pair: (u32, u32), new_id: u32) -> Vec<u32> {
    let mut out = Vec::with_capacity(seg.len());
    let mut i = 0;
    while i < seg.len() {
        if i + 1 < seg.len() && (seg[i], seg[i + 1]) == pair {
            out.push(new_id);
            i += 2;
        } else {
            out.push(seg[i]);
            i += 1;
        }
    }
    out
}

/// Recounts all pairs every iteration; picks the max count, ties by the smallest pair.
pub fn train(segments: &[Vec<u32>], base_size: u32, cfg: &TrainConfig) -> Vec<(u32, u32)> {
    let mut segs: Vec<Vec<u32>> = segments.to_vec();
    let mut len: Vec<u64> = vec![1; base_size as usize];
    let mut merges = Vec::new();
    let max_tok = cfg.max_token_events.map(|m| m as u64).unwrap_or(u64::MAX);
    while merges.len() < cfg.num_merges {
        let mut counts: HashMap<(u32, u32), u64> = HashMap::new();
        for s in &segs {
            for w in s.windows(2) {
                *counts.entry((w[0], w[1])).or_default() += 1;
            }
        }
        let best = counts
            .iter()
            .filter(|(&(a, b), _)| len[a as usize] + len[b as usize] <= max_tok)
            .max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0)));
        let Some((&pair, &count)) = best else { break };
        if count < cfg.min_frequency.max(1) {
            break;
        }
        let new_id = base_size + merges.len() as u32;
        len.push(len[pair.0 as usize] + len[pair.1 as usize]);
        merges.push(pair);
        for s in segs.iter_mut() {
            *s = merge_pair(s, pair, new_id);
        }
    }
    merges
}

/// Applies the merges in rank order, each over the whole segment (O(n * merges)).
/// Returns tokens and offsets (`len == tokens.len() + 1`).
pub fn encode(segment: &[u32], merges: &[(u32, u32)], base_size: u32) -> (Vec<u32>, Vec<usize>) {
    let mut toks: Vec<u32> = segment.to_vec();
    let mut lens: Vec<usize> = vec![1; segment.len()];
    for (r, &pair) in merges.iter().enumerate() {
        let new_id = base_size + r as u32;
        let (mut t2, mut l2) = (Vec::with_capacity(toks.len()), Vec::with_capacity(toks.len()));
        let mut i = 0;
        while i < toks.len() {
            if i + 1 < toks.len() && (toks[i], toks[i + 1]) == pair {
                t2.push(new_id);
                l2.push(lens[i] + lens[i + 1]);
                i += 2;
            } else {
                t2.push(toks[i]);
                l2.push(lens[i]);
                i += 1;
            }
        }
        toks = t2;
        lens = l2;
    }
    let mut offsets = Vec::with_capacity(toks.len() + 1);
    let mut o = 0;
    offsets.push(0);
    for l in lens {
        o += l;
        offsets.push(o);
    }
    (toks, offsets)
}
