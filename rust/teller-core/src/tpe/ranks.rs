//! A small open-addressing hash table `pair -> rank` for the encoder's hot loop.
//!
//! Linear probing over a power-of-two table at <= 50% load, multiplicative hashing of the packed
//! pair: a lookup is one multiply and usually one cache line. When the vocabulary fits in 16 bits
//! (the common case: a few thousand symbols + 30k merges) a slot is a single `u64`
//! (`a:16 | b:16 | rank:32`), so the table is half the size and stays in L2 next to the encoder's
//! working set. (A general `HashMap` is 2-3x slower here; the encoder does ~3 lookups per event.)

const EMPTY: u64 = u64::MAX;

#[derive(Debug, Clone)]
pub(crate) struct RankTable {
    /// Compact slots (`key32 << 32 | rank`) when `small`, else keys of the wide layout.
    slots: Vec<u64>,
    /// Ranks of the wide layout (empty when `small`).
    vals: Vec<u32>,
    small: bool,
    shift: u32,
    mask: usize,
}

#[inline(always)]
fn hash(k: u64, shift: u32) -> usize {
    (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

impl RankTable {
    pub(crate) fn new(merges: &[(u32, u32)], vocab_size: u32) -> Self {
        let cap = (merges.len() * 2).max(16).next_power_of_two();
        // (strictly below 2^16: with id 65535 the compact key of (65535, 65535) is 0xFFFF_FFFF, which
        // with any rank reads as an EMPTY slot's key)
        let small = vocab_size < 1 << 16;
        let mut t = RankTable {
            slots: vec![EMPTY; cap],
            vals: if small { Vec::new() } else { vec![0; cap] },
            small,
            shift: 64 - cap.trailing_zeros(),
            mask: cap - 1,
        };
        for (r, &(a, b)) in merges.iter().enumerate() {
            let k = t.key(a, b);
            let mut i = hash(k, t.shift);
            loop {
                let s = t.slots[i];
                if s == EMPTY {
                    if small {
                        t.slots[i] = (k << 32) | r as u64;
                    } else {
                        t.slots[i] = k;
                        t.vals[i] = r as u32;
                    }
                    break;
                }
                if (small && s >> 32 == k) || (!small && s == k) {
                    break; // duplicates are rejected by `Tpe::new`; keep the first rank
                }
                i = (i + 1) & t.mask;
            }
        }
        t
    }

    #[inline(always)]
    fn key(&self, a: u32, b: u32) -> u64 {
        if self.small {
            ((a as u64) << 16) | b as u64
        } else {
            ((a as u64) << 32) | b as u64
        }
    }

    #[inline(always)]
    pub(crate) fn get(&self, a: u32, b: u32) -> Option<u32> {
        let k = self.key(a, b);
        let mut i = hash(k, self.shift);
        if self.small {
            loop {
                let s = self.slots[i];
                if s >> 32 == k {
                    return Some(s as u32);
                }
                if s == EMPTY {
                    return None;
                }
                i = (i + 1) & self.mask;
            }
        } else {
            loop {
                let s = self.slots[i];
                if s == k {
                    return Some(self.vals[i]);
                }
                if s == EMPTY {
                    return None;
                }
                i = (i + 1) & self.mask;
            }
        }
    }
}

/// Open-addressing `u64 -> u32` map (linear probing, <= 50% load) for the encoder's trie.
#[derive(Debug, Clone)]
pub(crate) struct U64Map {
    keys: Vec<u64>,
    vals: Vec<u32>,
    len: usize,
    shift: u32,
    mask: usize,
}

impl U64Map {
    pub(crate) fn with_capacity(n: usize) -> Self {
        let cap = (n * 2).max(16).next_power_of_two();
        U64Map {
            keys: vec![EMPTY; cap],
            vals: vec![0; cap],
            len: 0,
            shift: 64 - cap.trailing_zeros(),
            mask: cap - 1,
        }
    }

    fn grow(&mut self) {
        let old_k = std::mem::take(&mut self.keys);
        let old_v = std::mem::take(&mut self.vals);
        *self = U64Map::with_capacity(old_k.len());
        for (k, v) in old_k.into_iter().zip(old_v) {
            if k != EMPTY {
                self.insert(k, v);
            }
        }
    }

    /// Inserts (or overwrites) `k -> v`. `k` must not be `u64::MAX`.
    pub(crate) fn insert(&mut self, k: u64, v: u32) {
        if (self.len + 1) * 2 > self.keys.len() {
            self.grow();
        }
        let mut i = hash(k, self.shift);
        loop {
            if self.keys[i] == EMPTY {
                self.keys[i] = k;
                self.vals[i] = v;
                self.len += 1;
                return;
            }
            if self.keys[i] == k {
                self.vals[i] = v;
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline(always)]
    pub(crate) fn get(&self, k: u64) -> Option<u32> {
        let mut i = hash(k, self.shift);
        loop {
            let s = self.keys[i];
            if s == k {
                return Some(self.vals[i]);
            }
            if s == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }
}

impl U64Map {
    /// All `(key, value)` entries, in table order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.keys
            .iter()
            .zip(&self.vals)
            .filter(|(&k, _)| k != EMPTY)
            .map(|(&k, &v)| (k, v))
    }
}
