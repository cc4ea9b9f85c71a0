//! The hasher of the tables keyed by a 32-bit number: QPNs, SRQ numbers, L_Keys and R_Keys.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a 32-bit number (a QPN or SRQ number, mostly sequential; an L_Key/R_Key, random) by
/// one multiply that spreads it over 64 bits: a probe costs a few instructions where the
/// standard library's SipHash costs tens of nanoseconds per lookup, and these lookups are per
/// packet. A peer chooses which numbers it looks up but never what is in a table, so it
/// cannot build collisions.
#[derive(Default, Debug, Clone, Copy)]
pub struct NumberHasher(u64);

const SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for NumberHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(SPREAD);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(SPREAD);
    }
}

/// A map keyed by a QPN, SRQ number or memory key.
pub type NumberMap<V> = HashMap<u32, V, BuildHasherDefault<NumberHasher>>;

/// A set of QPNs, SRQ numbers or memory keys.
pub type NumberSet = HashSet<u32, BuildHasherDefault<NumberHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_spread_over_the_high_bits() {
        // hashbrown takes its bucket from the low bits and its tag from the top 7: sequential
        // numbers must differ in both.
        let h = |n: u32| {
            let mut s = NumberHasher::default();
            s.write_u32(n);
            s.finish()
        };
        let tops: HashSet<u64> = (0..128u32).map(|n| h(n) >> 57).collect();
        assert!(
            tops.len() > 64,
            "top bits of 128 sequential numbers: {}",
            tops.len()
        );
        let lows: HashSet<u64> = (0..128u32).map(|n| h(n) & 127).collect();
        assert!(
            lows.len() > 64,
            "low bits of 128 sequential numbers: {}",
            lows.len()
        );
        let mut m: NumberMap<u32> = NumberMap::default();
        for n in 0..1000 {
            m.insert(n * 7, n);
        }
        assert!((0..1000).all(|n| m[&(n * 7)] == n));
    }
}
