//! The TPE encoders. Three algorithms, identical output (cross-checked by the tests):
//!
//! * **Backtracking** (`backtrack.rs`, the default for [`Tpe::encode`] and
//!   [`Tpe::encode_segment`]): longest valid match in a trie + a compatibility check with the
//!   previous token; ~1.6 sequential trie steps and ~0.7 rank lookups per event. Tables are
//!   built lazily on the first call.
//! * **Bucket queue** (`encode_task`, the fallback when the backtracking tables would be too
//!   large): replays the merges with a linked list and one bucket per rank instead of a heap,
//!   `O(n + merges)` per task of ~16k events.
//! * **Heap** (`encode_into`, [`Tpe::encode_segment_heap`]): a linked list and a min-heap of
//!   `(rank, position)` packed in a `u64`, lazily validated on pop; `O(n log n)` per segment.
//!
//! Why replaying by rank is BPE: popping the lowest rank, leftmost first, and merging is exactly
//! "apply merges in rank order, each left to right", because a merge of rank `r` only creates pairs
//! containing the new id, whose ranks are all `> r` (the naive reference is `O(n * merges)`).
//!
//! Batch encoding first dedupes identical segments (hash of the id slice, confirmed by comparing
//! the slices), encodes each distinct segment once (in parallel), then copies the tokens into place
//! (in parallel). Inference traces repeat the same step heavily, so this is where most of the speed
//! comes from. The output does not depend on the number of threads.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};
use rayon::prelude::*;

use super::backtrack::{Backtrack, BtScratch};
use super::{check_ids, segment_bounds, Result, Tpe, NONE};

/// Which batch encoder to use (all give identical results; see the module docs).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algo {
    /// Bucket queue over ranks (replays the merges, `encode_task`).
    Bucket,
    /// Longest valid match with backtracking (`backtrack.rs`): the default, about 1.7x faster
    /// than `Bucket` on synthetic trace vocabularies; identical output.
    #[default]
    Backtrack,
}

/// The encoding of a whole corpus.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoding {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// `len == tokens.len() + 1`: token `k` covers base events `token_offsets[k]..token_offsets[k+1]`
    /// (global indices into the corpus); the last entry is the number of events.
    pub token_offsets: Vec<usize>,
    /// Index of the first token of every segment (`len == number of segments`, like the input
    /// `starts`); segment `i` has tokens `segment_starts[i]..segment_starts[i+1]` (or to the end).
    pub segment_starts: Vec<usize>,
}

#[derive(Default)]
pub(crate) struct Scratch {
    sym: Vec<u32>,
    next: Vec<u32>,
    prev: Vec<u32>,
    heap: Vec<Reverse<u64>>,
}

/// Events per parallel encoding task (amortizes scheduling and the per-task rank scan).
const TASK_EVENTS: usize = 1 << 14;

/// Scratch of the bucket encoder, reused across tasks on one worker.
#[derive(Default)]
pub(crate) struct BucketScratch {
    sym: Vec<u32>,
    next: Vec<u32>,
    prev: Vec<u32>,
    /// Bucket `r` is a singly linked list through `item_pos`/`item_next` starting at `head[r]`
    /// (4 bytes per rank and an arena: far fewer cache misses than a `Vec` per rank). Items of a
    /// processed bucket go to a free list, so the arena holds at most the pending items (about
    /// one per event), not every push.
    head: Vec<u32>,
    item_pos: Vec<u32>,
    item_next: Vec<u32>,
    free: u32,
    list: Vec<u32>,
    /// Scratch of the backtracking encoder.
    pub(crate) bt: BtScratch,
    /// Bit `r` set when bucket `r` is non-empty: the sweep jumps over empty ranks 64 at a time.
    nonempty: Vec<u64>,
}

impl BucketScratch {
    #[inline(always)]
    fn push(&mut self, r: u32, p: u32) {
        let r = r as usize;
        let it = if self.free != NONE {
            let it = self.free;
            self.free = self.item_next[it as usize];
            self.item_pos[it as usize] = p;
            self.item_next[it as usize] = self.head[r];
            it
        } else {
            self.item_next.push(self.head[r]);
            self.item_pos.push(p);
            self.item_pos.len() as u32 - 1
        };
        self.head[r] = it;
        self.nonempty[r >> 6] |= 1 << (r & 63);
    }
}

impl Tpe {
    pub(crate) fn backtrack_tables(&self) -> Option<&Backtrack> {
        self.backtrack.get_or_init(|| Backtrack::build_if_useful(self)).as_ref()
    }

    /// Encodes one segment of base ids: `(tokens, offsets)` with `offsets.len() == tokens.len() + 1`
    /// relative to the segment start (token `k` covers `offsets[k]..offsets[k+1]`).
    pub fn encode_segment(&self, ids: &[u32]) -> Result<(Vec<u32>, Vec<usize>)> {
        check_ids(ids, self.base_size)?;
        let mut toks = Vec::new();
        let mut offs = Vec::new();
        let done = match self.backtrack_tables() {
            Some(bt) => self.encode_backtrack(bt, ids, &mut BtScratch::default(), &mut toks, &mut offs),
            None => false,
        };
        if !done {
            self.encode_into(ids, &mut Scratch::default(), &mut toks, &mut offs);
        }
        let mut offsets: Vec<usize> = offs.into_iter().map(|x| x as usize).collect();
        offsets.push(ids.len());
        Ok((toks, offsets))
    }

    /// [`Tpe::encode_segment`] with the heap encoder (for tests and benchmarks).
    #[doc(hidden)]
    pub fn encode_segment_heap(&self, ids: &[u32]) -> Result<(Vec<u32>, Vec<usize>)> {
        check_ids(ids, self.base_size)?;
        let mut sc = Scratch::default();
        let mut toks = Vec::new();
        let mut offs = Vec::new();
        self.encode_into(ids, &mut sc, &mut toks, &mut offs);
        let mut offsets: Vec<usize> = offs.into_iter().map(|x| x as usize).collect();
        offsets.push(ids.len());
        Ok((toks, offsets))
    }

    /// Encodes a corpus (see the module docs for `starts`). Parallel over segments with the
    /// current rayon pool; the result is identical to sequential encoding.
    pub fn encode(&self, ids: &[u32], starts: &[usize]) -> Result<Encoding> {
        self.encode_opts(ids, starts, true, Algo::default())
    }

    /// [`Tpe::encode`] with the segment dedupe and the algorithm selectable (benchmarks, tests).
    #[doc(hidden)]
    pub fn encode_opts(&self, ids: &[u32], starts: &[usize], dedupe: bool, algo: Algo) -> Result<Encoding> {
        let bounds = segment_bounds(ids.len(), starts)?;
        check_ids(ids, self.base_size)?;
        let (distinct, seg_distinct) = if dedupe {
            dedupe_segments(ids, &bounds)
        } else {
            (bounds.clone(), (0..bounds.len() as u32).collect())
        };
        Ok(self.encode_distinct(ids, &bounds, &distinct, &seg_distinct, algo))
    }

    fn encode_distinct(
        &self,
        ids: &[u32],
        bounds: &[(usize, usize)],
        distinct: &[(usize, usize)],
        seg_distinct: &[u32],
        algo: Algo,
    ) -> Encoding {
        let bt = match algo {
            Algo::Backtrack => self.backtrack_tables(),
            _ => None,
        };
        // Encode every distinct segment once, in parallel tasks of consecutive segments.
        let mut tasks: Vec<(usize, usize)> = Vec::new();
        let mut lo = 0;
        while lo < distinct.len() {
            let mut hi = lo;
            let mut ev = 0;
            while hi < distinct.len() && ev < TASK_EVENTS {
                ev += distinct[hi].1 - distinct[hi].0;
                hi += 1;
            }
            tasks.push((lo, hi));
            lo = hi;
        }
        // Per task: tokens, relative offsets, and the end (within the task) of each segment's tokens.
        let encoded: Vec<(Vec<u32>, Vec<u32>, Vec<u32>)> = tasks
            .par_iter()
            .map_init(BucketScratch::default, |sc, &(lo, hi)| {
                let mut toks = Vec::new();
                let mut offs = Vec::new();
                let mut ends = Vec::with_capacity(hi - lo);
                match bt {
                    Some(bt) => {
                        for &(s, e) in &distinct[lo..hi] {
                            if !self.encode_backtrack(bt, &ids[s..e], &mut sc.bt, &mut toks, &mut offs) {
                                debug_assert!(false, "backtracking encoder got stuck");
                                let mut e2 = Vec::new();
                                self.encode_task(ids, &[(s, e)], sc, &mut toks, &mut offs, &mut e2);
                            }
                            ends.push(toks.len() as u32);
                        }
                    }
                    None => self.encode_task(ids, &distinct[lo..hi], sc, &mut toks, &mut offs, &mut ends),
                }
                (toks, offs, ends)
            })
            .collect();
        // (task, start within task, end within task) of every distinct segment.
        let mut where_: Vec<(u32, u32, u32)> = Vec::with_capacity(distinct.len());
        for (t, (_, _, ends)) in encoded.iter().enumerate() {
            let mut prev = 0u32;
            for &e in ends {
                where_.push((t as u32, prev, e));
                prev = e;
            }
        }

        // Lay out the output and copy, in parallel over groups of segments.
        let mut segment_starts = Vec::with_capacity(bounds.len());
        let mut n_tok = 0usize;
        for &d in seg_distinct {
            segment_starts.push(n_tok);
            let (_, a, b) = where_[d as usize];
            n_tok += (b - a) as usize;
        }
        let mut tokens = vec![0u32; n_tok];
        let mut token_offsets = vec![0usize; n_tok + 1];
        token_offsets[n_tok] = ids.len();
        {
            // Split the outputs into groups of consecutive segments (~TASK_EVENTS tokens each).
            let mut groups: Vec<(usize, usize, &mut [u32], &mut [usize])> = Vec::new();
            let mut tok_rest: &mut [u32] = &mut tokens;
            let mut off_rest: &mut [usize] = &mut token_offsets[..n_tok];
            let mut g_lo = 0;
            while g_lo < bounds.len() {
                let mut g_hi = g_lo;
                let t0 = segment_starts[g_lo];
                while g_hi < bounds.len() && segment_starts[g_hi] - t0 < TASK_EVENTS {
                    g_hi += 1;
                }
                let t1 = if g_hi < bounds.len() {
                    segment_starts[g_hi]
                } else {
                    n_tok
                };
                let (ta, tb) = std::mem::take(&mut tok_rest).split_at_mut(t1 - t0);
                let (oa, ob) = std::mem::take(&mut off_rest).split_at_mut(t1 - t0);
                tok_rest = tb;
                off_rest = ob;
                groups.push((g_lo, g_hi, ta, oa));
                g_lo = g_hi;
            }
            groups.into_par_iter().for_each(|(g_lo, g_hi, toks, offs)| {
                let mut k = 0usize;
                for i in g_lo..g_hi {
                    let (t, a, b) = where_[seg_distinct[i] as usize];
                    let (src_t, src_o, _) = &encoded[t as usize];
                    let (a, b) = (a as usize, b as usize);
                    let n = b - a;
                    toks[k..k + n].copy_from_slice(&src_t[a..b]);
                    let base = bounds[i].0;
                    for (dst, &o) in offs[k..k + n].iter_mut().zip(&src_o[a..b]) {
                        *dst = base + o as usize;
                    }
                    k += n;
                }
            });
        }
        Encoding {
            tokens,
            token_offsets,
            segment_starts,
        }
    }

    /// The batch encoder: encodes several segments (`ranges` of `ids`, already validated) together
    /// with a **bucket queue indexed by rank** instead of a heap. Ranks are popped in increasing
    /// order and a merge of rank `r` only creates pairs of rank `> r`, so one forward sweep over the
    /// ranks is a valid priority queue: `O(n + num_merges)` per task plus small sorts (a bucket
    /// receives ascending runs of positions; it is sorted only when it is not already in order,
    /// which keeps "leftmost first" for overlapping pairs like `a a a`). Segments do not interact:
    /// their lists are separated by `NONE` links. Appends tokens, offsets relative to each segment,
    /// and the end (in `toks`) of each segment's tokens.
    #[inline(never)]
    pub(crate) fn encode_task(
        &self,
        ids: &[u32],
        ranges: &[(usize, usize)],
        sc: &mut BucketScratch,
        toks: &mut Vec<u32>,
        offs: &mut Vec<u32>,
        ends: &mut Vec<u32>,
    ) {
        let nm = self.merges.len();
        if sc.head.len() < nm {
            sc.head.resize(nm, NONE);
            sc.nonempty.resize(nm.div_ceil(64), 0);
        }
        sc.sym.clear();
        sc.next.clear();
        sc.prev.clear();
        sc.item_pos.clear();
        sc.item_next.clear();
        sc.free = NONE;
        let mut first = Vec::with_capacity(ranges.len());
        let mut pending = 0usize;
        for &(s, e) in ranges {
            let base = sc.sym.len() as u32;
            first.push(base);
            let seg = &ids[s..e];
            sc.sym.extend_from_slice(seg);
            let n = seg.len() as u32;
            sc.next.extend(base + 1..=base + n);
            sc.prev.extend((base..base + n).map(|i| i.wrapping_sub(1)));
            if n > 0 {
                sc.next[(base + n - 1) as usize] = NONE;
                sc.prev[base as usize] = NONE;
            }
            if nm > 0 {
                for (i, w) in seg.windows(2).enumerate() {
                    if let Some(r) = self.ranks.get(w[0], w[1]) {
                        sc.push(r, base + i as u32);
                        pending += 1;
                    }
                }
            }
        }
        let mut word = 0usize;
        let mut list = std::mem::take(&mut sc.list);
        while pending > 0 {
            // Next non-empty rank (all set bits are >= the current rank: pushes go to higher ranks).
            while sc.nonempty[word] == 0 {
                word += 1;
            }
            let r = word * 64 + sc.nonempty[word].trailing_zeros() as usize;
            sc.nonempty[word] &= sc.nonempty[word] - 1;
            list.clear();
            let mut it = sc.head[r];
            sc.head[r] = NONE;
            while it != NONE {
                list.push(sc.item_pos[it as usize]);
                let nx = sc.item_next[it as usize];
                sc.item_next[it as usize] = sc.free;
                sc.free = it;
                it = nx;
            }
            pending -= list.len();
            list.reverse();
            if !list.windows(2).all(|w| w[0] < w[1]) {
                list.sort_unstable();
            }
            let (a, b) = self.merges[r];
            let c = self.base_size + r as u32;
            for &p in &list {
                let p = p as usize;
                if sc.sym[p] != a {
                    continue;
                }
                let q = sc.next[p];
                if q == NONE || sc.sym[q as usize] != b {
                    continue;
                }
                let y = sc.next[q as usize];
                sc.sym[p] = c;
                sc.sym[q as usize] = NONE;
                sc.next[p] = y;
                if y != NONE {
                    sc.prev[y as usize] = p as u32;
                    if let Some(r2) = self.ranks.get(c, sc.sym[y as usize]) {
                        debug_assert!(r2 as usize > r);
                        sc.push(r2, p as u32);
                        pending += 1;
                    }
                }
                let x = sc.prev[p];
                if x != NONE {
                    if let Some(r2) = self.ranks.get(sc.sym[x as usize], c) {
                        debug_assert!(r2 as usize > r);
                        sc.push(r2, x);
                        pending += 1;
                    }
                }
            }
        }
        sc.list = list;
        let (sym, next) = (&sc.sym, &sc.next);
        for (&f, &(s, e)) in first.iter().zip(ranges) {
            if e > s {
                let mut p = f;
                while p != NONE {
                    toks.push(sym[p as usize]);
                    offs.push(p - f);
                    p = next[p as usize];
                }
            }
            ends.push(toks.len() as u32);
        }
    }

    /// Encodes `ids` (already validated) with the heap encoder, appending tokens and their start offsets (relative to the
    /// start of `ids`) to `toks` / `offs`.
    pub(crate) fn encode_into(&self, ids: &[u32], sc: &mut Scratch, toks: &mut Vec<u32>, offs: &mut Vec<u32>) {
        let n = ids.len();
        if n < 2 || self.merges.is_empty() {
            toks.extend_from_slice(ids);
            offs.extend(0..n as u32);
            return;
        }
        let Scratch {
            sym,
            next,
            prev,
            heap: heap_buf,
        } = sc;
        sym.clear();
        sym.extend_from_slice(ids);
        next.clear();
        next.extend(1..=n as u32);
        next[n - 1] = NONE;
        prev.clear();
        prev.extend((0..n as u32).map(|i| i.wrapping_sub(1)));
        heap_buf.clear();
        for i in 0..n - 1 {
            if let Some(r) = self.rank(ids[i], ids[i + 1]) {
                heap_buf.push(Reverse(((r as u64) << 32) | i as u64));
            }
        }
        let mut heap = BinaryHeap::from(std::mem::take(heap_buf));
        while let Some(Reverse(item)) = heap.pop() {
            let r = (item >> 32) as u32;
            let p = item as u32 as usize;
            let (a, b) = self.merges[r as usize];
            if sym[p] != a {
                continue;
            }
            let q = next[p];
            if q == NONE || sym[q as usize] != b {
                continue;
            }
            let c = self.base_size + r;
            let y = next[q as usize];
            sym[p] = c;
            sym[q as usize] = NONE;
            next[p] = y;
            if y != NONE {
                prev[y as usize] = p as u32;
                if let Some(r2) = self.rank(c, sym[y as usize]) {
                    heap.push(Reverse(((r2 as u64) << 32) | p as u64));
                }
            }
            let x = prev[p];
            if x != NONE {
                if let Some(r2) = self.rank(sym[x as usize], c) {
                    heap.push(Reverse(((r2 as u64) << 32) | x as u64));
                }
            }
        }
        *heap_buf = heap.into_vec();
        let mut p = 0u32;
        while p != NONE {
            toks.push(sym[p as usize]);
            offs.push(p);
            p = next[p as usize];
        }
    }
}

/// Groups identical segments: returns the distinct segments (first occurrences, in order) and the
/// distinct index of every segment. Hashes in parallel; equal hashes are confirmed by comparing the
/// slices, so a collision can never merge different segments.
pub(crate) fn dedupe_segments(ids: &[u32], bounds: &[(usize, usize)]) -> (Vec<(usize, usize)>, Vec<u32>) {
    let hasher = DefaultHashBuilder::default();
    let hashes: Vec<u64> = bounds.par_iter().map(|&(s, e)| hasher.hash_one(&ids[s..e])).collect();
    let mut table: HashTable<u32> = HashTable::new();
    let mut distinct: Vec<(usize, usize)> = Vec::new();
    let mut dist_hash: Vec<u64> = Vec::new();
    let mut seg_distinct: Vec<u32> = Vec::with_capacity(bounds.len());
    for (i, &(s, e)) in bounds.iter().enumerate() {
        let slice = &ids[s..e];
        let h = hashes[i];
        let d = match table.find(h, |&d| {
            let (ds, de) = distinct[d as usize];
            &ids[ds..de] == slice
        }) {
            Some(&d) => d,
            None => {
                let d = distinct.len() as u32;
                distinct.push((s, e));
                dist_hash.push(h);
                table.insert_unique(h, d, |&d| dist_hash[d as usize]);
                d
            }
        };
        seg_distinct.push(d);
    }
    (distinct, seg_distinct)
}
