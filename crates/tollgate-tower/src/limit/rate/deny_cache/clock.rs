//! The local clock an entry is timed on, and what the store's replies say about the store's clock against it.

use std::time::Instant;

use tollgate_core::{Clock, Decision, Timestamp};

use super::{MARGIN_PPM_DIVISOR, OFFSET_MAX_AGE_MICROS};

/// The default local clock: the system's monotonic clock (`Instant`: `CLOCK_MONOTONIC` on Linux), which an NTP
/// daemon slews but never steps, so an entry on it needs no allowance for a step of its own clock.
pub(super) struct Monotonic(pub(super) Instant);

impl Clock for Monotonic {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(u64::try_from(self.0.elapsed().as_micros()).unwrap_or(u64::MAX))
    }
}

/// What the store's replies for a key say about its clock against the local one: `bound` is the store's
/// instant of a decision minus the local instant `at` its request was sent at (µs). The store decided after the
/// send, so its clock then ran ahead of the local one by at most `bound`; `at + Δ` later, by at most `bound` +
/// 500 ppm of Δ.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offset {
    bound: i64,
    at: u64,
}

impl Offset {
    /// The bound one reply gives: `decision` of a request sent at local instant `sent`.
    pub(super) fn of(sent: u64, decision: &Decision) -> Self {
        Self {
            bound: signed(decision.now.as_micros()).saturating_sub(signed(sent)),
            at: sent,
        }
    }

    /// The bound as of local instant `t` (no earlier than `at`): drift of at most 500 ppm since.
    pub(super) fn by(self, t: u64) -> i64 {
        self.bound
            .saturating_add(signed(t.saturating_sub(self.at) / MARGIN_PPM_DIVISOR))
    }

    /// The tighter of two bounds, as of the later one's instant (both then age alike); a bound older than
    /// [`OFFSET_MAX_AGE_MICROS`] by then loses.
    pub(super) fn min(self, other: Self) -> Self {
        let (older, newer) = if self.at <= other.at {
            (self, other)
        } else {
            (other, self)
        };
        if newer.at - older.at > OFFSET_MAX_AGE_MICROS || newer.bound <= older.by(newer.at) {
            newer
        } else {
            older
        }
    }

    /// The local instant, by this bound, no later than the one at which the store's clock reads `instant` (µs),
    /// before the allowance for a step of the local clock: `instant − bound`, less 500 ppm of the time from `at`
    /// to then.
    pub(super) fn local(self, instant: u64) -> u64 {
        let estimate = i128::from(instant) - i128::from(self.bound);
        let drift = (estimate - i128::from(self.at)).max(0) / i128::from(MARGIN_PPM_DIVISOR);
        u64::try_from((estimate - drift).max(0)).unwrap_or(u64::MAX)
    }
}

/// `x` as a signed number of µs (saturating: no clock reads 2^63 µs).
fn signed(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}
