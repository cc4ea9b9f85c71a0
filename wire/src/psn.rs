//! Packet sequence numbers: 24-bit values that wrap at 2^24 and compare modulo 2^24
//! (IBTA §9.7.1). The MSN of an AETH uses the same arithmetic.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A 24-bit packet (or message) sequence number.
///
/// Arithmetic wraps at 2^24. Ordering is modular: `a.is_before(b)` when `b` is less than 2^23
/// steps ahead of `a`, so it is not a total order and `Ord` is deliberately not implemented.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The mask of the 24 significant bits.
    pub const MASK: u32 = 0xFF_FFFF;
    /// The largest PSN, 2^24 − 1; the next one is 0.
    pub const MAX: Psn = Psn(Self::MASK);

    /// A PSN from the low 24 bits of `value` (the verbs `sq_psn`/`rq_psn` are masked the same way).
    pub const fn new(value: u32) -> Psn {
        Psn(value & Self::MASK)
    }

    /// The PSN as an integer in 0..2^24.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n` modulo 2^24.
    #[must_use]
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The signed distance from `self` to `other` in -2^23..2^23: positive when `other` is
    /// ahead of `self`.
    pub const fn distance_to(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back to sign-extend it.
        ((other.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }

    /// `self` comes strictly before `other` in sequence space.
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance_to(other) > 0
    }

    /// `self` comes strictly after `other` in sequence space.
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance_to(other) < 0
    }

    /// `self` lies in the inclusive window `first..=last` (taken in sequence order).
    pub const fn is_within(self, first: Psn, last: Psn) -> bool {
        let span = first.distance_to(last);
        let off = first.distance_to(self);
        span >= 0 && off >= 0 && off <= span
    }
}

impl Add<u32> for Psn {
    type Output = Psn;
    fn add(self, rhs: u32) -> Psn {
        self.wrapping_add(rhs)
    }
}

impl AddAssign<u32> for Psn {
    fn add_assign(&mut self, rhs: u32) {
        *self = self.wrapping_add(rhs);
    }
}

impl Sub<Psn> for Psn {
    type Output = i32;
    /// `a - b` is the signed distance from `b` to `a`.
    fn sub(self, rhs: Psn) -> i32 {
        rhs.distance_to(self)
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_at_2_pow_24() {
        assert_eq!(Psn::MAX + 1, Psn::new(0));
        assert_eq!(Psn::new(0).wrapping_sub(1), Psn::MAX);
        assert_eq!(Psn::new(0x1FF_FFFF), Psn::MAX);
        let mut p = Psn::new(0xFF_FFFE);
        p += 3;
        assert_eq!(p.value(), 1);
    }

    #[test]
    fn modular_order() {
        assert!(Psn::MAX.is_before(Psn::new(0)));
        assert!(Psn::new(0).is_after(Psn::MAX));
        assert_eq!(Psn::MAX.distance_to(Psn::new(5)), 6);
        assert_eq!(Psn::new(5) - Psn::MAX, 6);
        assert_eq!(Psn::new(5).distance_to(Psn::MAX), -6);
        assert!(!Psn::new(3).is_before(Psn::new(3)));
        // Exactly half the space away counts as behind (distance -2^23).
        assert_eq!(Psn::new(0).distance_to(Psn::new(0x80_0000)), -0x80_0000);
        assert!(Psn::new(0).is_within(Psn::MAX, Psn::new(2)));
        assert!(!Psn::new(3).is_within(Psn::MAX, Psn::new(2)));
        assert!(!Psn::new(0).is_within(Psn::new(2), Psn::MAX));
    }

    #[test]
    fn formatting() {
        assert_eq!(format!("{}", Psn::new(0x35c1c6)), "0x35c1c6");
        assert_eq!(format!("{:?}", Psn::new(1)), "Psn(0x000001)");
    }

    proptest! {
        #[test]
        fn add_then_distance(a in 0u32..1 << 24, n in 0u32..(1 << 23)) {
            let p = Psn::new(a);
            let q = p + n;
            prop_assert_eq!(p.distance_to(q), n as i32);
            prop_assert_eq!(q.distance_to(p), -(n as i32));
            prop_assert_eq!(q.wrapping_sub(n), p);
            prop_assert!(n == 0 || p.is_before(q));
            prop_assert!(p.is_within(p, q) && q.is_within(p, q));
        }
    }
}
