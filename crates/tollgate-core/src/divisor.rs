//! Division by a number fixed when a quota is made, as two multiplications: a hot key's check divides by the
//! quota's constants on every request, and a 64-bit division takes several times as long as a multiplication.

use std::fmt;
use std::hash::{Hash, Hasher};

/// A divisor `d > 0` with its reciprocal `m = ⌈2^128 ÷ d⌉`: `⌊m × n ÷ 2^128⌋ = ⌊n ÷ d⌋` for every 64-bit `n`
/// (Lemire, Kaser and Kurz, "Faster remainder by direct computation", 2019, with 128 fractional bits for 64-bit
/// numerators), kept as its high and low 64 bits (so that a policy holding several stays 8-byte aligned and
/// small). `m` is 0 for `d = 1`, whose quotient is `n`. Compared and hashed by `d` alone.
#[derive(Clone, Copy)]
pub(crate) struct Divisor {
    d: u64,
    mh: u64,
    ml: u64,
}

impl Divisor {
    /// `d`, which must not be 0.
    pub(crate) const fn new(d: u64) -> Self {
        assert!(d > 0, "a divisor is never 0");
        // ⌈2^128 ÷ d⌉ = ⌊(2^128 − 1) ÷ d⌋ + 1 for d ≥ 2 (at most 2^127 + 1: no overflow).
        let m = if d == 1 { 0 } else { u128::MAX / d as u128 + 1 };
        Self {
            d,
            mh: (m >> 64) as u64,
            ml: m as u64,
        }
    }

    /// The divisor.
    pub(crate) const fn get(self) -> u64 {
        self.d
    }

    /// `⌊n ÷ d⌋`.
    #[inline(always)]
    pub(crate) const fn div(self, n: u64) -> u64 {
        if self.d == 1 {
            return n;
        }
        // m × n = mh × n × 2^64 + ml × n; its top 64 of 192 bits are ⌊(mh × n + ⌊ml × n ÷ 2^64⌋) ÷ 2^64⌋ (mh ≤ 2^63:
        // the sum stays below 2^128).
        let low = (self.ml as u128 * n as u128) >> 64;
        ((self.mh as u128 * n as u128 + low) >> 64) as u64
    }

    /// `⌈n ÷ d⌉`.
    #[inline(always)]
    pub(crate) const fn div_ceil(self, n: u64) -> u64 {
        let q = self.div(n);
        q + (q * self.d != n) as u64
    }

    /// `n mod d`.
    #[inline(always)]
    pub(crate) const fn rem(self, n: u64) -> u64 {
        n - self.div(n) * self.d
    }
}

impl PartialEq for Divisor {
    fn eq(&self, other: &Self) -> bool {
        self.d == other.d
    }
}

impl Eq for Divisor {}

impl Hash for Divisor {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.d.hash(state);
    }
}

impl fmt::Debug for Divisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.d.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Divisor;

    fn check(d: u64, n: u64) {
        let divisor = Divisor::new(d);
        assert_eq!(divisor.div(n), n / d, "{n} / {d}");
        assert_eq!(divisor.div_ceil(n), n.div_ceil(d), "⌈{n} / {d}⌉");
        assert_eq!(divisor.rem(n), n % d, "{n} mod {d}");
    }

    #[test]
    fn edges_divide_exactly() {
        let divisors = [
            1,
            2,
            3,
            7,
            10,
            1_000,
            3_600_000_000,
            1 << 32,
            (1 << 32) + 1,
            u64::MAX / 3,
            u64::MAX - 1,
            u64::MAX,
        ];
        for d in divisors {
            for n in [
                0,
                1,
                d - 1,
                d,
                d.saturating_add(1),
                2 * (d / 2),
                u64::MAX - 1,
                u64::MAX,
            ] {
                check(d, n);
            }
            // The numerators just below and at each multiple the reciprocal's rounding could cross.
            for k in [2, 3, 1_000, 1 << 20, u64::MAX / d] {
                if let Some(at) = d.checked_mul(k) {
                    check(d, at - 1);
                    check(d, at);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn any_numerator_and_divisor_divide_exactly(d in 1..=u64::MAX, n: u64) {
            check(d, n);
        }

        #[test]
        fn small_divisors_divide_exactly(d in 1_u64..100_000, n: u64) {
            check(d, n);
        }
    }
}
