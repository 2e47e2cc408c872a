//! Sliding window counter: `estimate = current + previous × (1 − elapsed / period)`.
//!
//! Windows are aligned to multiples of the period since the epoch, so a key whose counts have both decayed to
//! zero is indistinguishable from a fresh one and may expire. `elapsed` is measured in ticks (1 µs, 1 ms or 1 s,
//! see [`Policy::tick_micros`]) so that `limit × period` stays exact. Only admitted requests are counted. Mirrored
//! line for line by `lua/sliding_window.lua`.

use std::time::Duration;

use super::Step;
use crate::{Decision, Outcome, Policy, Timestamp};

/// Persisted state of one key: about 24 bytes whatever the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SlidingWindowState {
    /// Start of the current window, µs since the epoch (a multiple of the period).
    pub window_start: u64,
    /// Cost admitted in the window before `window_start`.
    pub previous: u64,
    /// Cost admitted since `window_start`.
    pub current: u64,
}

impl SlidingWindowState {
    /// When the full limit is available again: the end of the next window while the current one holds
    /// requests, the end of this one while only the previous one does.
    #[must_use]
    pub const fn reset(&self, period_us: u64, now: u64) -> u64 {
        if self.current > 0 {
            self.window_start + 2 * period_us
        } else if self.previous > 0 {
            self.window_start + period_us
        } else {
            now
        }
    }
}

/// Decides one request of `cost` at `now`. `policy` must be a sliding window policy.
#[must_use]
// Inlined into the store's check, which is generic over the clock and so compiled in the caller's crate (a
// plain `#[inline]` measured not taken: 14 instructions of call and copies per check).
#[inline(always)]
pub fn decide(
    state: Option<SlidingWindowState>,
    policy: &Policy,
    cost: u64,
    now: Timestamp,
) -> Step<SlidingWindowState> {
    let quota = policy.quota();
    let limit = quota.limit();
    let period = quota.period_micros();
    let tick = policy.tick_micros();
    let per_ticks = policy.ticks();
    let ticks = per_ticks.get(); // period / tick
    // `now` is when the request is decided as of; `clock` is the clock's own reading, which retry delays and the
    // decision's instant are measured from (they differ only after the clock stepped back).
    let clock = now.min(Timestamp::LATEST).as_micros();
    let mut now = clock;
    let mut start = now - quota.period_divisor().rem(now);
    let (mut previous, mut current) = (0, 0);
    if let Some(s) = state {
        if s.window_start > start {
            // The clock stepped back: decide as of the stored window's start.
            now = s.window_start;
            start = s.window_start;
        }
        if s.window_start == start {
            (previous, current) = (s.previous, s.current);
        } else if s.window_start + period == start {
            previous = s.current;
        }
    }
    let elapsed = policy.tick().div(now - start);
    // estimate × ticks = current × ticks + previous × (ticks − elapsed)
    let weighted_previous = previous * (ticks - elapsed);
    let mut outcome = Outcome::Limited;
    let mut retry_after = None;
    if cost > limit {
        outcome = Outcome::CostExceedsCapacity;
    } else if current + cost <= limit && weighted_previous <= (limit - current - cost) * ticks {
        outcome = Outcome::Allowed;
        current += cost;
    } else {
        let admit_at = if current + cost <= limit {
            // Later in this window, once the previous window's weight has decayed enough.
            start + (ticks - (limit - current - cost) * ticks / previous) * tick
        } else {
            // In the next window, where this window's count becomes the previous one.
            start + period + (ticks - (limit - cost) * ticks / current) * tick
        };
        retry_after = Some(Duration::from_micros(admit_at - clock));
    }
    let remaining = if current >= limit {
        // A full window: nothing remains, whatever the previous one weighs.
        0
    } else {
        let used = current * ticks + previous * (ticks - elapsed);
        per_ticks.div((limit * ticks).saturating_sub(used))
    };
    let new_state = SlidingWindowState {
        window_start: start,
        previous,
        current,
    };
    let decision = Decision {
        outcome,
        limit,
        remaining,
        reset: Timestamp::from_micros(new_state.reset(period, clock)),
        retry_after,
        now: Timestamp::from_micros(clock),
    };
    let changed = outcome == Outcome::Allowed;
    Step {
        decision,
        state: changed.then_some(new_state),
    }
}
