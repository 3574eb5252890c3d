//! The backtracking encoder (after GitHub's `bpe` crate, "So many tokens, so little time").
//!
//! Fact used: with token ids ordered by merge rank (ours are: `base_size + rank`), the BPE
//! encoding of a sequence is the unique tokenization into *valid* tokens (a token is valid when BPE
//! encodes its own expansion to itself) in which every adjacent pair of tokens is *compatible*
//! (BPE encodes the concatenation of the two expansions to exactly these two tokens). So we walk
//! left to right taking the longest valid token that matches (a trie over expansions), check
//! compatibility with the previous token by undoing the two merge trees from the top
//! (`valid_pair`, `O(depth)` rank lookups), try the next shorter valid prefix token on failure,
//! and backtrack (pop the previous token, mark the position unreachable) when none fits.
//!
//! Cost: ~1.4 trie steps and ~0.8 rank lookups per event on the synthetic trace corpus, versus ~3
//! rank lookups and ~3 queue operations per event when replaying merges. The trie is renumbered
//! depth-first (largest subtree first) so that walking a long token is mostly a sequential scan
//! (`first_sym`); without that, every trie step was a cache miss and this encoder was 2x *slower*
//! than the bucket encoder. Measured ~1.7x faster than the bucket encoder (docs/tpe-notes.md).
//! Tables: built on first use from the merges in `O(merges * depth + trie nodes)`. If it ever cannot find a tokenization (which the fact
//! above rules out), the caller falls back to the bucket encoder.

use super::ranks::{RankTable, U64Map};
use super::{Tpe, NONE};

/// Per-worker scratch of the backtracking encoder. (A direct-mapped cache of pair checks was
/// tried and removed: on the noisy corpus only ~5% of the checks repeat within a worker.)
#[derive(Default)]
pub(crate) struct BtScratch {
    reach: Vec<bool>,
}

/// Bound on trie nodes: when the tokens are so long that the trie could exceed this (e.g. tokens
/// that are whole repeated steps), the tables would cost more memory (~25 bytes per node) than
/// they save time, and the bucket encoder is used instead.
pub(crate) const MAX_TRIE_EVENTS: u64 = 1 << 25;

#[derive(Debug, Clone)]
pub(crate) struct Backtrack {
    /// Trie nodes are numbered in depth-first order, largest subtree first, so the most likely
    /// child of node `i` is node `i + 1` (walking a long token is a sequential scan):
    /// `first_sym[i]` is the symbol leading to child `i + 1` (`NONE` for a leaf).
    first_sym: Vec<u32>,
    /// The other children: `(node << 32 | symbol) -> child node`; node 0 is the root.
    children: U64Map,
    /// Whether a node has children in `children` (skips a failing hash lookup at chain ends).
    has_other: Vec<bool>,
    /// The root's children, by base symbol (every base symbol is a valid one-event token).
    root: Vec<u32>,
    /// The valid token whose expansion ends at this node, or `NONE`.
    node_token: Vec<u32>,
    /// Per token id: the longest valid token that is a proper prefix of it, or `NONE`.
    prefix: Vec<u32>,
    /// Per token id: its two parts (base symbols: itself).
    split: Split,
    /// Per token id: BPE encodes its expansion to itself (kept for the tests).
    #[allow(dead_code)]
    pub(crate) valid: Vec<bool>,
}

/// The two parts of every token id (base symbols: itself), and which ids occur as a left / right
/// part of some merge.
#[derive(Debug, Clone)]
pub(crate) struct Split {
    left: Vec<u32>,
    right: Vec<u32>,
    left_bits: Vec<u64>,
    right_bits: Vec<u64>,
}

impl Split {
    fn new(tpe: &Tpe) -> Split {
        let base = tpe.base_size;
        let vocab = tpe.vocab_size() as usize;
        let mut left: Vec<u32> = (0..base).collect();
        let mut right: Vec<u32> = (0..base).collect();
        let mut left_bits = vec![0u64; vocab.div_ceil(64)];
        let mut right_bits = vec![0u64; vocab.div_ceil(64)];
        for &(a, b) in &tpe.merges {
            left.push(a);
            right.push(b);
            left_bits[a as usize >> 6] |= 1 << (a & 63);
            right_bits[b as usize >> 6] |= 1 << (b & 63);
        }
        Split {
            left,
            right,
            left_bits,
            right_bits,
        }
    }

    #[inline(always)]
    fn is_left(&self, t: u32) -> bool {
        self.left_bits[t as usize >> 6] >> (t & 63) & 1 != 0
    }

    #[inline(always)]
    fn is_right(&self, t: u32) -> bool {
        self.right_bits[t as usize >> 6] >> (t & 63) & 1 != 0
    }
}

/// Can BPE produce the tokens `t1 t2` next to each other, counting only merges with an id below
/// `limit` for the pair `(t1, t2)` itself? Undo the later-created token's last merge step by step;
/// whenever the pair across the split would have been merged earlier (smaller id; for the right
/// token also an equal id: leftmost wins ties), it is not compatible. `O(depth)` rank lookups.
#[inline]
fn compatible(ranks: &RankTable, base: u32, split: &Split, mut t1: u32, mut t2: u32, mut limit: u32) -> bool {
    let (left, right) = (&split.left, &split.right);
    loop {
        // Most cross pairs are not merges: skip the table when `t1` is never a left part or `t2`
        // never a right part of any merge (two bit tests on small, hot bitsets).
        if split.is_left(t1) && split.is_right(t2) {
            if let Some(r) = ranks.get(t1, t2) {
                if base + r < limit {
                    return false;
                }
            }
        }
        if t1 > t2 {
            limit = t1;
            t1 = right[t1 as usize];
            if t1 == limit {
                limit = t2 + 1;
                t2 = left[t2 as usize];
                if t2 + 1 == limit {
                    return true;
                }
            }
        } else {
            limit = t2 + 1;
            t2 = left[t2 as usize];
            if t2 + 1 == limit {
                limit = t1;
                t1 = right[t1 as usize];
                if t1 == limit {
                    return true;
                }
            }
        }
    }
}

/// Validity of every token id by brute force: encode its expansion (tests only).
#[cfg(test)]
pub(crate) fn validity_by_encoding(tpe: &Tpe) -> Vec<bool> {
    let base = tpe.base_size;
    let mut valid = vec![true; tpe.vocab_size() as usize];
    let mut stack = Vec::new();
    for t in base..tpe.vocab_size() {
        let mut exp = Vec::new();
        tpe.expand_into(t, &mut exp, &mut stack);
        let (toks, _) = tpe.encode_segment_heap(&exp).unwrap();
        valid[t as usize] = toks == [t];
    }
    valid
}

impl Backtrack {
    /// Builds the tables, or `None` when the model has no merges or the trie would be too large.
    pub(crate) fn build_if_useful(tpe: &Tpe) -> Option<Backtrack> {
        // Inserting token `t = (a, b)` adds at most `len(b)` trie nodes below the node of `a`.
        let bound: u64 = tpe.merges.iter().map(|&(_, b)| tpe.token_len[b as usize] as u64).sum();
        if tpe.merges.is_empty() || bound > MAX_TRIE_EVENTS {
            return None;
        }
        Some(Backtrack::build(tpe))
    }

    pub(crate) fn build(tpe: &Tpe) -> Backtrack {
        let base = tpe.base_size;
        let vocab = tpe.vocab_size() as usize;
        let split = Split::new(tpe);
        // A token is valid (BPE encodes its expansion to itself) iff both parts are valid and
        // compatible with each other counting only earlier merges (the construction of GitHub's
        // `bpe` crate; cross-checked against brute-force encoding in the tests).
        let mut valid = vec![true; vocab];
        for (r, &(a, b)) in tpe.merges.iter().enumerate() {
            let t = base + r as u32;
            valid[t as usize] = valid[a as usize] && valid[b as usize] && compatible(&tpe.ranks, base, &split, a, b, t);
        }
        // Trie over the expansions of valid tokens: the node of `t = (a, b)` is reached from the
        // node of `a` (valid, created earlier) by walking the expansion of `b`.
        let mut children = U64Map::with_capacity(base as usize + tpe.merges.len() * 4);
        let mut node_token: Vec<u32> = vec![NONE];
        let mut end_node: Vec<u32> = vec![NONE; vocab];
        for s in 0..base {
            let node = node_token.len() as u32;
            children.insert(s as u64, node);
            node_token.push(s);
            end_node[s as usize] = node;
        }
        let mut exp = Vec::new();
        let mut stack = Vec::new();
        for (r, &(a, b)) in tpe.merges.iter().enumerate() {
            let t = base as usize + r;
            if !valid[t] {
                continue;
            }
            exp.clear();
            tpe.expand_into(b, &mut exp, &mut stack);
            let mut node = end_node[a as usize];
            for &x in &exp {
                let key = ((node as u64) << 32) | x as u64;
                node = match children.get(key) {
                    Some(c) => c,
                    None => {
                        let c = node_token.len() as u32;
                        children.insert(key, c);
                        node_token.push(NONE);
                        c
                    }
                };
            }
            debug_assert_eq!(node_token[node as usize], NONE, "two valid tokens with one expansion");
            node_token[node as usize] = t as u32;
            end_node[t] = node;
        }
        drop(end_node);

        // Renumber the trie in depth-first order (largest subtree first), and find every valid
        // token's longest valid proper prefix (the nearest token above it on its path).
        let n_nodes = node_token.len();
        let mut edges: Vec<(u32, u32, u32)> = children.iter().map(|(k, c)| ((k >> 32) as u32, k as u32, c)).collect();
        drop(children);
        edges.sort_unstable();
        let mut parent = vec![NONE; n_nodes];
        for &(p, _, c) in &edges {
            parent[c as usize] = p;
        }
        // Children are created after their parent, so ids decrease towards the root.
        let mut size = vec![1u32; n_nodes];
        for c in (1..n_nodes).rev() {
            let p = parent[c];
            size[p as usize] += size[c];
        }
        let mut edge_start = vec![0usize; n_nodes + 1];
        for &(p, _, _) in &edges {
            edge_start[p as usize + 1] += 1;
        }
        for i in 0..n_nodes {
            edge_start[i + 1] += edge_start[i];
        }
        let mut new_id = vec![NONE; n_nodes];
        let mut near = vec![NONE; n_nodes]; // nearest token at or above each (old) node
        let mut prefix = vec![NONE; vocab];
        let mut order: Vec<u32> = Vec::with_capacity(n_nodes);
        let mut stack: Vec<u32> = vec![0];
        let mut kids: Vec<(u32, u32)> = Vec::new();
        while let Some(old) = stack.pop() {
            new_id[old as usize] = order.len() as u32;
            order.push(old);
            let up = if old == 0 {
                NONE
            } else {
                near[parent[old as usize] as usize]
            };
            let t = node_token[old as usize];
            if t != NONE {
                prefix[t as usize] = up;
                near[old as usize] = t;
            } else {
                near[old as usize] = up;
            }
            kids.clear();
            kids.extend(
                edges[edge_start[old as usize]..edge_start[old as usize + 1]]
                    .iter()
                    .map(|&(_, _, c)| (size[c as usize], c)),
            );
            // Smallest first on the stack so that the largest subtree is visited next.
            kids.sort_unstable();
            stack.extend(kids.iter().map(|&(_, c)| c));
        }
        drop(near);
        let mut first_sym = vec![NONE; n_nodes];
        let mut children = U64Map::with_capacity(edges.len() / 8 + 16);
        let mut root = vec![NONE; base as usize];
        let mut has_other = vec![false; n_nodes];
        for &(p, x, c) in &edges {
            let (np, nc) = (new_id[p as usize], new_id[c as usize]);
            if p == 0 {
                root[x as usize] = nc;
            } else if nc == np + 1 {
                first_sym[np as usize] = x;
            } else {
                children.insert(((np as u64) << 32) | x as u64, nc);
                has_other[np as usize] = true;
            }
        }
        let node_token = order.iter().map(|&old| node_token[old as usize]).collect();
        Backtrack {
            first_sym,
            children,
            has_other,
            root,
            node_token,
            prefix,
            split,
            valid,
        }
    }

    /// Longest valid token matching `ids[pos..]` (every base symbol is one, so never `NONE` for a
    /// validated, non-empty input).
    #[inline(always)]
    fn longest_match(&self, ids: &[u32], pos: usize) -> u32 {
        let mut node = self.root[ids[pos] as usize];
        let mut best = self.node_token[node as usize];
        for &x in &ids[pos + 1..] {
            let c = if self.first_sym[node as usize] == x {
                Some(node + 1)
            } else if self.has_other[node as usize] {
                self.children.get(((node as u64) << 32) | x as u64)
            } else {
                None
            };
            match c {
                Some(c) => {
                    node = c;
                    let t = self.node_token[c as usize];
                    if t != NONE {
                        best = t;
                    }
                }
                None => break,
            }
        }
        best
    }
}

impl Tpe {
    #[inline]
    fn valid_pair(&self, bt: &Backtrack, t1: u32, t2: u32) -> bool {
        compatible(&self.ranks, self.base_size, &bt.split, t1, t2, u32::MAX)
    }

    /// Backtracking encoding of one segment (validated ids), appending tokens and their starts
    /// relative to the segment. Returns `false` (having appended nothing) if it got stuck.
    pub(crate) fn encode_backtrack(
        &self,
        bt: &Backtrack,
        ids: &[u32],
        sc: &mut BtScratch,
        toks: &mut Vec<u32>,
        offs: &mut Vec<u32>,
    ) -> bool {
        let n = ids.len();
        let t0 = toks.len();
        if n == 0 {
            return true;
        }
        let reach = &mut sc.reach;
        reach.clear();
        reach.resize(n + 1, true);
        let len = &self.token_len;
        let mut pos = 0usize;
        let mut next = bt.longest_match(ids, 0);
        while next != NONE {
            let mut token = next;
            let last = if toks.len() > t0 {
                Some(toks[toks.len() - 1])
            } else {
                None
            };
            loop {
                let end = pos + len[token as usize] as usize;
                // (The pair check only runs when the end is still reachable.)
                if reach[end]
                    && match last {
                        None => true,
                        Some(l) => self.valid_pair(bt, l, token),
                    }
                {
                    toks.push(token);
                    offs.push(pos as u32);
                    pos = end;
                    next = if pos < n { bt.longest_match(ids, pos) } else { NONE };
                    break;
                } else if bt.prefix[token as usize] != NONE {
                    token = bt.prefix[token as usize];
                } else {
                    reach[pos] = false;
                    let Some(l) = last else {
                        toks.truncate(t0);
                        offs.truncate(t0);
                        return false;
                    };
                    toks.pop();
                    offs.pop();
                    pos -= len[l as usize] as usize;
                    next = l;
                    break;
                }
            }
        }
        debug_assert_eq!(pos, n);
        true
    }
}
