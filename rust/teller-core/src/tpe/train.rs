//! The TPE trainer.
//!
//! Design (why it is fast):
//! * **Dedupe identical segments first.** Inference traces repeat the same step over and over; we
//!   keep each distinct segment once with a multiplicity (BPE's "word count" trick), so the work
//!   and memory scale with the *distinct* events, and every count update is weighted.
//! * **Flat doubly-linked symbol lists**: one array of `Node { sym, prev, next }` over all distinct
//!   segments (12 bytes per distinct event; one struct so that a visit touches one cache line). A
//!   merge keeps the left node (which takes the new id) and unlinks the right one, so node indices
//!   stay ordered left-to-right inside a segment and the first node of a segment never dies.
//! * **Position index per pair** (node index of the pair's left symbol), not per segment: applying
//!   a merge visits only the occurrences of that pair, never whole segments, so 100k-event steps
//!   cost no more per merge than short ones. Entries go stale when a neighbour merges; they are
//!   validated when used (stale entries never become valid again because every merge produces a
//!   fresh id). The initial lists are one exact-size CSR array (no `Vec` growth slack), read in
//!   place; lists of pairs created later are small recycled `Vec`s sorted before use
//!   (left-to-right order is what makes overlapping pairs like `a a a` merge greedily from the
//!   left, exactly like the reference), freed as soon as the pair can no longer reach
//!   `min_frequency` (counts only decrease after a pair's creation step). Visits prefetch a few
//!   positions ahead (the loop is memory-latency bound).
//! * **Counts are updated incrementally** (`u64`, weighted): merging `(a,b)` at `p` with
//!   neighbours `x`, `y` removes `(x,a)`, `(a,b)`, `(b,y)` and adds `(x,c)`, `(c,y)`.
//! * **Lazily corrected max-heap** of `(count, Reverse(pair))`: after the step that creates a pair
//!   its count can only go down, so a popped entry whose stored count differs from the current
//!   one is stale-high and is simply re-pushed with the current count. Ties: highest count first,
//!   then the smallest `(left, right)`; this is exactly the order of the heap key, so the result is
//!   deterministic and equal to "recount everything, take the max" (the Python reference).
//! * Initial counting runs in parallel with rayon (integer sums: independent of thread count).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

use hashbrown::hash_map::Entry;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use rayon::prelude::*;

use super::{check_ids, pair_key, segment_bounds, unpair, Result, Tpe, TpeError, MAX_VOCAB, NONE};

/// Training parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainConfig {
    /// Number of merges to learn at most (`vocab_size - base_size`); clamped to what fits in `u32`
    /// ids, so `usize::MAX` means "until no pair reaches `min_frequency`".
    pub num_merges: usize,
    /// A pair is merged only if it occurs at least this often (weighted count). Values below 1
    /// act as 1 (a pair that does not occur is never merged).
    pub min_frequency: u64,
    /// A merge whose token would cover more than this many base events is not allowed.
    pub max_token_events: Option<u32>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            num_merges: 0,
            min_frequency: 2,
            max_token_events: None,
        }
    }
}

impl TrainConfig {
    /// A config that learns up to `vocab_size - base_size` merges.
    pub fn with_vocab_size(base_size: u32, vocab_size: u32) -> Self {
        TrainConfig {
            num_merges: vocab_size.saturating_sub(base_size) as usize,
            ..Default::default()
        }
    }
}

/// What [`train`] returns.
#[derive(Debug, Clone)]
pub struct TrainOutput {
    pub tpe: Tpe,
    /// The (weighted) count of every merge at the time it was chosen, in rank order.
    pub merge_counts: Vec<u64>,
    pub stats: TrainStats,
}

/// Sizes seen by the trainer (for logs and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrainStats {
    /// Segments with at least 2 events, and how many of them are distinct.
    pub segments: usize,
    pub distinct_segments: usize,
    /// Events in the distinct segments (the trainer's working size).
    pub distinct_events: usize,
    /// Distinct adjacent pairs before training, and pairs tracked at the end.
    pub initial_pairs: usize,
    pub final_pairs: usize,
}

/// Progress callback: `(merges_done, num_merges) -> keep_going`. Called after every merge (the
/// binding throttles); returning `false` stops training with [`TpeError::Cancelled`].
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize) -> bool;

/// Learns up to `cfg.num_merges` merges from a corpus (see the module docs for `starts`).
pub fn train(
    ids: &[u32],
    starts: &[usize],
    base_size: u32,
    cfg: &TrainConfig,
    progress: Option<Progress<'_>>,
) -> Result<TrainOutput> {
    train_impl(ids, starts, base_size, cfg, progress, false)
}

/// Same as [`train`] but recounts every pair by brute force after every merge and panics if the
/// incremental counts disagree. Test-only (quadratic).
#[doc(hidden)]
pub fn train_checked(ids: &[u32], starts: &[usize], base_size: u32, cfg: &TrainConfig) -> Result<TrainOutput> {
    train_impl(ids, starts, base_size, cfg, None, true)
}

/// One symbol of a distinct segment (dead nodes have `sym == NONE`).
#[derive(Debug, Clone, Copy)]
struct Node {
    sym: u32,
    prev: u32,
    next: u32,
}

/// How many positions ahead `apply` prefetches.
const PREFETCH: usize = 8;

#[inline(always)]
fn prefetch<T>(v: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < v.len() {
        // SAFETY: prefetching is only a hint; the address is in bounds.
        unsafe { std::arch::x86_64::_mm_prefetch(v.as_ptr().add(i) as *const i8, std::arch::x86_64::_MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (v, i);
}

/// 16 bytes per pair ever seen (there are ~10x more pairs created during training than initial
/// ones, so this matters for the peak memory).
struct Pair {
    count: u64,
    /// Index into `Trainer::lists` of the positions of a pair created during training (`NONE`
    /// when it has none; initial pairs use the CSR arrays).
    list: u32,
    /// `step` of the last merge step that put this pair on the `touched` list.
    touched: u32,
}

struct Trainer {
    base_size: u32,
    nodes: Vec<Node>,
    /// First node of every distinct segment, plus a final sentinel (= number of nodes).
    seg_start: Vec<u32>,
    seg_weight: Vec<u64>,
    pair_map: HashMap<u64, u32>,
    pairs: Vec<Pair>,
    n_initial: usize,
    csr_start: Vec<u32>,
    csr_pos: Vec<u32>,
    tok_len: Vec<u32>,
    max_tok: u32,
    min_freq: u64,
    heap: BinaryHeap<(u64, Reverse<u64>)>,
    /// Pairs created in the current step: (index, key).
    touched: Vec<(u32, u64)>,
    /// Position lists of pairs created during training, recycled through `free_lists`: only pairs
    /// that can still be merged hold one.
    lists: Vec<Vec<u32>>,
    free_lists: Vec<u32>,
    step: u32,
    n_segments: usize,
}

fn train_impl(
    ids: &[u32],
    starts: &[usize],
    base_size: u32,
    cfg: &TrainConfig,
    mut progress: Option<Progress<'_>>,
    check: bool,
) -> Result<TrainOutput> {
    let bounds = segment_bounds(ids.len(), starts)?;
    check_ids(ids, base_size)?;
    if base_size as u64 > MAX_VOCAB {
        return Err(TpeError::VocabTooLarge(base_size as u64));
    }
    // More merges than ids can name are never possible: clamp (so `usize::MAX` means "until no
    // pair reaches min_frequency").
    let num_merges = cfg.num_merges.min((MAX_VOCAB - base_size as u64) as usize);
    let mut t = Trainer::build(ids, &bounds, base_size, cfg)?;
    let min_freq = t.min_freq;
    let mut merges: Vec<(u32, u32)> = Vec::with_capacity(num_merges.min(1 << 20));
    let mut merge_counts = Vec::with_capacity(merges.capacity());
    if check {
        t.check_counts();
    }
    while merges.len() < num_merges {
        let Some((cnt, Reverse(key))) = t.heap.pop() else { break };
        let idx = t.pair_map[&key];
        let cur = t.pairs[idx as usize].count;
        if cur != cnt {
            debug_assert!(cur < cnt, "counts only decrease after a pair's creation step");
            if cur >= min_freq {
                t.heap.push((cur, Reverse(key)));
            }
            continue;
        }
        let (a, b) = unpair(key);
        let c = base_size + merges.len() as u32;
        merges.push((a, b));
        merge_counts.push(cnt);
        t.tok_len.push(t.tok_len[a as usize] + t.tok_len[b as usize]);
        t.step += 1;
        t.apply(idx, a, b, c);
        debug_assert_eq!(t.pairs[idx as usize].count, 0);
        let touched = std::mem::take(&mut t.touched);
        for &(i, key) in &touched {
            let cnt = t.pairs[i as usize].count;
            // Pairs touched this step were created this step: only the final count matters.
            if cnt >= min_freq {
                t.heap.push((cnt, Reverse(key)));
            } else {
                // Counts only go down from here: this pair can never be merged, free its positions
                // (most new pairs are rare, so this keeps the position lists small).
                t.release_list(i);
            }
        }
        t.touched = touched;
        t.touched.clear();
        if check {
            t.check_counts();
        }
        if let Some(cb) = progress.as_deref_mut() {
            if !cb(merges.len(), num_merges) {
                return Err(TpeError::Cancelled(merges.len()));
            }
        }
    }
    let stats = TrainStats {
        segments: t.n_segments,
        distinct_segments: t.seg_weight.len(),
        distinct_events: t.nodes.len(),
        initial_pairs: t.n_initial,
        final_pairs: t.pairs.len(),
    };
    drop(t);
    let tpe = Tpe::new(base_size, merges)?;
    Ok(TrainOutput {
        tpe,
        merge_counts,
        stats,
    })
}

/// Rough number of events per parallel counting chunk.
const CHUNK_EVENTS: usize = 1 << 16;

impl Trainer {
    fn build(ids: &[u32], bounds: &[(usize, usize)], base_size: u32, cfg: &TrainConfig) -> Result<Trainer> {
        // 1. Dedupe segments (only those with at least one pair matter).
        let hasher = DefaultHashBuilder::default();
        let hashes: Vec<u64> = bounds
            .par_iter()
            .map(|&(s, e)| if e - s >= 2 { hasher.hash_one(&ids[s..e]) } else { 0 })
            .collect();
        let mut table: HashTable<u32> = HashTable::new();
        let mut distinct: Vec<(usize, usize)> = Vec::new();
        let mut seg_weight: Vec<u64> = Vec::new();
        let mut dist_hash: Vec<u64> = Vec::new();
        for (i, &(s, e)) in bounds.iter().enumerate() {
            if e - s < 2 {
                continue;
            }
            let h = hashes[i];
            let slice = &ids[s..e];
            match table.find(h, |&d| {
                let (ds, de) = distinct[d as usize];
                &ids[ds..de] == slice
            }) {
                Some(&d) => seg_weight[d as usize] += 1,
                None => {
                    let d = distinct.len() as u32;
                    distinct.push((s, e));
                    seg_weight.push(1);
                    dist_hash.push(h);
                    table.insert_unique(h, d, |&d| dist_hash[d as usize]);
                }
            }
        }
        drop(table);
        drop(hashes);
        drop(dist_hash);
        let n_nodes: usize = distinct.iter().map(|&(s, e)| e - s).sum();
        if n_nodes as u64 >= NONE as u64 {
            return Err(TpeError::BadConfig(format!(
                "too many distinct events for training: {n_nodes}"
            )));
        }

        // 2. Flat linked lists.
        let mut nodes: Vec<Node> = Vec::with_capacity(n_nodes);
        let mut seg_start = Vec::with_capacity(distinct.len() + 1);
        for &(s, e) in &distinct {
            let base = nodes.len() as u32;
            seg_start.push(base);
            let len = (e - s) as u32;
            nodes.extend(ids[s..e].iter().enumerate().map(|(i, &x)| {
                let i = i as u32;
                Node {
                    sym: x,
                    prev: if i == 0 { NONE } else { base + i - 1 },
                    next: if i + 1 == len { NONE } else { base + i + 1 },
                }
            }));
        }
        seg_start.push(nodes.len() as u32);

        // 3. Initial pair counts, in parallel over chunks of distinct segments.
        let mut chunks: Vec<(usize, usize)> = Vec::new(); // ranges of distinct segment indices
        let mut lo = 0;
        while lo < distinct.len() {
            let mut hi = lo;
            let mut ev = 0;
            while hi < distinct.len() && ev < CHUNK_EVENTS {
                ev += (seg_start[hi + 1] - seg_start[hi]) as usize;
                hi += 1;
            }
            chunks.push((lo, hi));
            lo = hi;
        }
        // key -> (weighted count, occurrences)
        let counted: HashMap<u64, (u64, u32)> = chunks
            .par_iter()
            .map(|&(lo, hi)| {
                let mut m: HashMap<u64, (u64, u32)> = HashMap::new();
                for d in lo..hi {
                    let w = seg_weight[d];
                    let (s, e) = (seg_start[d] as usize, seg_start[d + 1] as usize);
                    for win in nodes[s..e].windows(2) {
                        let v = m.entry(pair_key(win[0].sym, win[1].sym)).or_insert((0, 0));
                        v.0 += w;
                        v.1 += 1;
                    }
                }
                m
            })
            .reduce(HashMap::new, |mut x, mut y| {
                if x.len() < y.len() {
                    std::mem::swap(&mut x, &mut y);
                }
                for (k, (w, o)) in y {
                    let v = x.entry(k).or_insert((0, 0));
                    v.0 += w;
                    v.1 += o;
                }
                x
            });

        let max_tok = cfg.max_token_events.unwrap_or(u32::MAX);
        let min_freq = cfg.min_frequency.max(1);
        let n_initial = counted.len();
        let mut pair_map: HashMap<u64, u32> = HashMap::with_capacity(n_initial * 2);
        let mut pairs: Vec<Pair> = Vec::with_capacity(n_initial * 2);
        let mut csr_start: Vec<u32> = Vec::with_capacity(n_initial + 1);
        let mut heap_items: Vec<(u64, Reverse<u64>)> = Vec::new();
        let mut total = 0u32;
        for (k, (w, o)) in counted {
            let i = pairs.len() as u32;
            pair_map.insert(k, i);
            pairs.push(Pair {
                count: w,
                list: NONE,
                touched: 0,
            });
            csr_start.push(total);
            // Base-symbol pairs cover 2 events; with max_token_events < 2 nothing is allowed.
            if max_tok >= 2 {
                total += o;
                if w >= min_freq {
                    heap_items.push((w, Reverse(k)));
                }
            }
        }
        csr_start.push(total);

        // 4. Fill the CSR position lists in node order (so they come out sorted).
        let mut csr_pos = vec![0u32; total as usize];
        if max_tok >= 2 {
            let mut cursor: Vec<u32> = csr_start[..n_initial].to_vec();
            for d in 0..distinct.len() {
                let (s, e) = (seg_start[d] as usize, seg_start[d + 1] as usize);
                for p in s..e - 1 {
                    let i = pair_map[&pair_key(nodes[p].sym, nodes[p + 1].sym)] as usize;
                    csr_pos[cursor[i] as usize] = p as u32;
                    cursor[i] += 1;
                }
            }
        }

        Ok(Trainer {
            base_size,
            nodes,
            seg_start,
            seg_weight,
            pair_map,
            pairs,
            n_initial,
            csr_start,
            csr_pos,
            tok_len: vec![1; base_size as usize],
            max_tok,
            min_freq,
            heap: BinaryHeap::from(heap_items),
            touched: Vec::new(),
            lists: Vec::new(),
            free_lists: Vec::new(),
            step: 0,
            n_segments: bounds.iter().filter(|&&(s, e)| e - s >= 2).count(),
        })
    }

    /// Frees the position list of pair `i` (if any) for reuse.
    #[inline]
    fn release_list(&mut self, i: u32) {
        let l = self.pairs[i as usize].list;
        if l != NONE {
            self.lists[l as usize] = Vec::new();
            self.free_lists.push(l);
            self.pairs[i as usize].list = NONE;
        }
    }

    #[inline]
    fn dec(&mut self, x: u32, y: u32, w: u64) {
        let i = self.pair_map[&pair_key(x, y)];
        let pr = &mut self.pairs[i as usize];
        debug_assert!(pr.count >= w);
        pr.count -= w;
        if pr.count < self.min_freq && pr.touched != self.step && pr.list != NONE {
            // Can never be merged any more (see the touched loop in `train_impl`).
            self.release_list(i);
        }
    }

    #[inline]
    fn inc(&mut self, x: u32, y: u32, w: u64, pos: u32) {
        let key = pair_key(x, y);
        let i = match self.pair_map.entry(key) {
            Entry::Occupied(o) => *o.get(),
            Entry::Vacant(v) => {
                let i = self.pairs.len() as u32;
                v.insert(i);
                self.pairs.push(Pair {
                    count: 0,
                    list: NONE,
                    touched: 0,
                });
                i
            }
        };
        let allowed = self.tok_len[x as usize] as u64 + self.tok_len[y as usize] as u64 <= self.max_tok as u64;
        let step = self.step;
        let pr = &mut self.pairs[i as usize];
        pr.count += w;
        if allowed {
            if pr.list == NONE {
                pr.list = match self.free_lists.pop() {
                    Some(l) => l,
                    None => {
                        self.lists.push(Vec::new());
                        self.lists.len() as u32 - 1
                    }
                };
            }
            self.lists[pr.list as usize].push(pos);
            if pr.touched != step {
                pr.touched = step;
                self.touched.push((i, key));
            }
        }
    }

    /// Applies merge `(a, b) -> c` at every (still valid) occurrence, left to right.
    fn apply(&mut self, idx: u32, a: u32, b: u32, c: u32) {
        // Initial pairs read their positions in place from the CSR array (no copy: the list of the
        // most frequent pair can be a large part of the corpus); later pairs own a sorted `Vec`.
        let from_csr = (idx as usize) < self.n_initial;
        let (csr_lo, n_pos, owned): (usize, usize, Vec<u32>) = if from_csr {
            let (lo, hi) = (
                self.csr_start[idx as usize] as usize,
                self.csr_start[idx as usize + 1] as usize,
            );
            (lo, hi - lo, Vec::new())
        } else {
            let l = self.pairs[idx as usize].list;
            let mut v = if l == NONE {
                Vec::new()
            } else {
                std::mem::take(&mut self.lists[l as usize])
            };
            self.release_list(idx);
            v.sort_unstable();
            (0, v.len(), v)
        };
        // Cache of the current segment (positions are ascending).
        let (mut seg_lo, mut seg_hi, mut w) = (1u32, 0u32, 0u64);
        for k in 0..n_pos {
            let (p, ahead) = if from_csr {
                (
                    self.csr_pos[csr_lo + k],
                    self.csr_pos.get(csr_lo + k + PREFETCH).filter(|_| k + PREFETCH < n_pos),
                )
            } else {
                (owned[k], owned.get(k + PREFETCH))
            };
            // The positions are sorted but sparse: prefetch a few ahead (memory latency bound).
            if let Some(&ahead) = ahead {
                prefetch(&self.nodes, ahead as usize);
            }
            let np = self.nodes[p as usize];
            if np.sym != a {
                continue; // dead node, or the left symbol has been merged already
            }
            let q = np.next;
            if q == NONE {
                continue;
            }
            let nq = self.nodes[q as usize];
            if nq.sym != b {
                continue;
            }
            if !(seg_lo <= p && p < seg_hi) {
                let d = self.seg_start.partition_point(|&s| s <= p) - 1;
                seg_lo = self.seg_start[d];
                seg_hi = self.seg_start[d + 1];
                w = self.seg_weight[d];
            }
            let x = np.prev;
            let y = nq.next;
            let sx = if x != NONE { self.nodes[x as usize].sym } else { NONE };
            let sy = if y != NONE { self.nodes[y as usize].sym } else { NONE };
            if x != NONE {
                self.dec(sx, a, w);
            }
            // The merged pair's own index is known: no lookup.
            self.pairs[idx as usize].count -= w;
            if y != NONE {
                self.dec(b, sy, w);
            }
            self.nodes[p as usize].sym = c;
            self.nodes[p as usize].next = y;
            self.nodes[q as usize].sym = NONE;
            if y != NONE {
                self.nodes[y as usize].prev = p;
            }
            if x != NONE {
                self.inc(sx, c, w, x);
            }
            if y != NONE {
                self.inc(c, sy, w, p);
            }
        }
    }

    /// Brute-force recount from the linked lists; panics on any disagreement (tests only).
    fn check_counts(&self) {
        let mut brute: HashMap<u64, u64> = HashMap::new();
        for d in 0..self.seg_weight.len() {
            let w = self.seg_weight[d];
            let mut p = self.seg_start[d];
            let mut n_seen = 0;
            assert_eq!(self.nodes[p as usize].prev, NONE);
            while p != NONE {
                assert_ne!(self.nodes[p as usize].sym, NONE, "dead node linked");
                let q = self.nodes[p as usize].next;
                if q != NONE {
                    assert_eq!(self.nodes[q as usize].prev, p, "broken back link");
                    assert!(q > p && q < self.seg_start[d + 1], "link leaves its segment");
                    *brute
                        .entry(pair_key(self.nodes[p as usize].sym, self.nodes[q as usize].sym))
                        .or_default() += w;
                }
                n_seen += 1;
                p = q;
            }
            assert!(n_seen >= 1);
        }
        for (&k, &i) in &self.pair_map {
            let b = brute.get(&k).copied().unwrap_or(0);
            assert_eq!(
                self.pairs[i as usize].count,
                b,
                "incremental count of pair {:?} differs from recount",
                unpair(k)
            );
        }
        assert_eq!(self.pair_map.len(), self.pairs.len());
        for (&k, &v) in &brute {
            let i = self
                .pair_map
                .get(&k)
                .unwrap_or_else(|| panic!("pair {:?} missing", unpair(k)));
            assert_eq!(self.pairs[*i as usize].count, v);
        }
        debug_assert!(self.tok_len.len() >= self.base_size as usize);
    }
}
