//! A small open-addressing hash table `pair -> rank` for the encoder's hot loop.
//!
//! Linear probing over a power-of-two table at <= 50% load, multiplicative hashing of the packed
//! pair: a lookup is one multiply and usually one cache line. (A general `HashMap` costs 2-3x more
//! here, and the encoder does about three lookups per event.)

use super::pair_key;

const EMPTY: u64 = u64::MAX; // (u32::MAX, u32::MAX) is never a valid pair

#[derive(Debug, Clone)]
pub(crate) struct RankTable {
    keys: Vec<u64>,
    vals: Vec<u32>,
    shift: u32,
    mask: usize,
}

impl RankTable {
    pub(crate) fn new(merges: &[(u32, u32)]) -> Self {
        let cap = (merges.len() * 2).max(16).next_power_of_two();
        let mut t = RankTable {
            keys: vec![EMPTY; cap],
            vals: vec![0; cap],
            shift: 64 - cap.trailing_zeros(),
            mask: cap - 1,
        };
        for (r, &(a, b)) in merges.iter().enumerate() {
            let k = pair_key(a, b);
            let mut i = t.slot(k);
            loop {
                if t.keys[i] == EMPTY {
                    t.keys[i] = k;
                    t.vals[i] = r as u32;
                    break;
                }
                if t.keys[i] == k {
                    break; // duplicates are rejected by `Tpe::new`; keep the first rank
                }
                i = (i + 1) & t.mask;
            }
        }
        t
    }

    #[inline(always)]
    fn slot(&self, k: u64) -> usize {
        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline(always)]
    pub(crate) fn get(&self, a: u32, b: u32) -> Option<u32> {
        let k = pair_key(a, b);
        let mut i = self.slot(k);
        loop {
            // SAFETY-free: indices are masked into range.
            let kk = self.keys[i];
            if kk == k {
                return Some(self.vals[i]);
            }
            if kk == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }
}
