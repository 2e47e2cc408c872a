//! Fixed window: at most `limit` per window, windows aligned to multiples of the period since the epoch — the
//! counting of envoyproxy/ratelimit and limitador, for users who need their numbers exactly.
//!
//! A client can pass up to twice the limit across a window's boundary (the end of one window and the start of the
//! next); tollgate's sliding window counter does not allow that, which is why it is the default elsewhere. Only
//! admitted requests are counted. A key whose window has ended is indistinguishable from a fresh one, so the
//! window's end is its time to live. Mirrored line for line by `lua/fixed_window.lua`.
//!
//! ```
//! use tollgate_core::algorithm::fixed_window;
//! use tollgate_core::{Policy, Quota, Timestamp};
//!
//! let policy = Policy::fixed_window(Quota::per_minute(2)?)?;
//! let now = Timestamp::from_micros(1_700_000_080_000_000); // 40 s into a minute
//! let first = fixed_window::decide(None, &policy, 2, now);
//! assert!(first.decision.is_allowed());
//! let refused = fixed_window::decide(first.state, &policy, 1, now);
//! assert_eq!(refused.decision.retry_after.map(|d| d.as_secs()), Some(20)); // at the next minute
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

use std::time::Duration;

use super::Step;
use crate::{Decision, Outcome, Policy, Timestamp};

/// Persisted state of one key: the window and what it admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FixedWindowState {
    /// Start of the window, µs since the epoch (a multiple of the period).
    pub window_start: u64,
    /// Cost admitted in it.
    pub count: u64,
}

/// Decides one request of `cost` at `now`. `policy` must be a fixed window policy.
#[must_use]
#[inline]
pub fn decide(
    state: Option<FixedWindowState>,
    policy: &Policy,
    cost: u64,
    now: Timestamp,
) -> Step<FixedWindowState> {
    let quota = policy.quota();
    let limit = quota.limit();
    let period = quota.period_micros();
    // `clock` is the clock's own reading, which retry delays and the decision's instant count from.
    let clock = now.min(Timestamp::LATEST).as_micros();
    let mut start = clock - clock % period;
    let mut count = 0;
    if let Some(s) = state {
        if s.window_start > start {
            // The clock stepped back: decide in the stored window.
            start = s.window_start;
        }
        if s.window_start == start {
            count = s.count;
        }
    }
    let end = start + period;
    let mut outcome = Outcome::Limited;
    let mut retry_after = None;
    if cost > limit {
        outcome = Outcome::CostExceedsCapacity;
    } else if count + cost <= limit {
        outcome = Outcome::Allowed;
        count += cost;
    } else {
        retry_after = Some(Duration::from_micros(end - clock));
    }
    let reset = if count > 0 { end } else { clock };
    let decision = Decision {
        outcome,
        limit,
        remaining: limit.saturating_sub(count),
        reset: Timestamp::from_micros(reset),
        retry_after,
        now: Timestamp::from_micros(clock),
    };
    Step {
        decision,
        state: (outcome == Outcome::Allowed).then_some(FixedWindowState {
            window_start: start,
            count,
        }),
    }
}
