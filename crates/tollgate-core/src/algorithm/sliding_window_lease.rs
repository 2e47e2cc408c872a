//! Token leases on a sliding window counter: an instance takes k slots of the current window in one store call
//! and spends them locally before the window ends. Mirrored line for line by `lua/sliding_window_lease.lua`.
//!
//! # The rules
//!
//! - **A lease** of k slots adds k to the current window's count, as k admitted requests would, and only if
//!   the estimate plus k stays within the limit (the store grants the most that fits, up to `want`).
//! - **A batch is spent in the window it is counted in**: its deadline is the end of that window (the instance
//!   measures it from its send instant, so it ends earlier than the store's window, less a clock-drift margin).
//! - **A return** takes unspent slots off the count of the window they were granted in, if that is still the
//!   current or the previous window (older counts no longer matter), never below zero.
//!
//! - **A lockout** ([`lockout::lease`](super::lockout::lease)): a lease call on a locked key grants nothing
//!   (returns still apply) and answers with the lockout's end; batches counted before it are spent in their
//!   window.
//!
//! # Why it is exact
//!
//! The sliding window counter's state is per window: a request counted at t0 and one counted at t' in the same
//! window weigh the same in every later estimate. A leased slot spent at t' (same window) is therefore, for
//! every later decision, the plain request it stands for, counted at the lease's instant; and the plain path
//! would have admitted it at t' too, because the estimate of a window with a given count only falls as time
//! passes (the previous window's weight decays), and the lease was granted only where it fit. Decisions made
//! while unspent slots were still counted were stricter than needed; a return makes the counts what plain
//! requests alone would have left. So the fleet admits no request the plain path could not, and what leases
//! cost is bounded under-admission: slots counted but not spent (an instance that dies holding a batch, or
//! whose return is lost) until their window leaves the estimate.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::algorithm::sliding_window_lease;
//! use tollgate_core::token_lease::TokenLeaseRequest;
//! use tollgate_core::{Policy, Quota, Timestamp};
//!
//! let policy = Policy::sliding_window(Quota::per_second(10)?)?;
//! let now = Timestamp::from_micros(1_000_250_000);
//! let ask = TokenLeaseRequest::take(1, 1, 6, Duration::from_secs(1));
//! let (grant, state) = sliding_window_lease::lease(None, &policy, &ask, now);
//! assert_eq!((grant.granted, grant.remaining), (6, 4));
//! assert_eq!(grant.expires, Timestamp::from_micros(1_001_000_000)); // the window's end
//! // Two slots were not spent: returned, the window counts 4.
//! let back = ask.next(2).ending(2).holding(2, grant.window_start);
//! let (_, state) = sliding_window_lease::lease(state, &policy, &back, now);
//! assert_eq!(state.map(|s| s.current), Some(4));
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

use std::time::Duration;

use super::sliding_window::SlidingWindowState;
use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Policy, Timestamp};

/// Answers one lease call at `now`: the grant, and the new state when it changed.
#[must_use]
pub fn lease(
    state: Option<SlidingWindowState>,
    policy: &Policy,
    request: &TokenLeaseRequest,
    now: Timestamp,
) -> (TokenLeaseGrant, Option<SlidingWindowState>) {
    let quota = policy.quota();
    let limit = quota.limit();
    let period = quota.period_micros();
    let tick = policy.tick_micros();
    let ticks = period / tick;
    let want = request.want.min(limit);
    // As sliding_window::decide: after a clock step back the window decides as of its stored start.
    let clock = now.min(Timestamp::LATEST).as_micros();
    let mut now = clock;
    let mut start = now - now % period;
    let (mut previous, mut current) = (0, 0);
    if let Some(s) = state {
        if s.window_start > start {
            now = s.window_start;
            start = s.window_start;
        }
        if s.window_start == start {
            (previous, current) = (s.previous, s.current);
        } else if s.window_start + period == start {
            previous = s.current;
        }
    }
    let mut changed = false;
    if request.unspent > 0 {
        if request.window_start == start {
            current -= request.unspent.min(current);
            changed = true;
        } else if request.window_start + period == start {
            previous -= request.unspent.min(previous);
            changed = true;
        }
    }
    let elapsed = (now - start) / tick;
    let weighted_previous = previous * (ticks - elapsed);
    // The most slots k with current + k + previous × (ticks − elapsed) / ticks ≤ limit.
    let granted = (limit * ticks)
        .checked_sub(current * ticks + weighted_previous)
        .map_or(0, |room| want.min(room / ticks));
    if granted > 0 {
        current += granted;
        changed = true;
    }
    let retry_after = (granted < want).then(|| {
        let admit_at = if current + want <= limit {
            start + (ticks - (limit - current - want) * ticks / previous) * tick
        } else {
            start + period + (ticks - (limit - want) * ticks / current) * tick
        };
        Duration::from_micros(admit_at - clock)
    });
    let used = current * ticks + previous * (ticks - elapsed);
    let new_state = SlidingWindowState {
        window_start: start,
        previous,
        current,
    };
    let grant = TokenLeaseGrant {
        granted,
        remaining: (limit * ticks).saturating_sub(used) / ticks,
        reset: Timestamp::from_micros(new_state.reset(period, clock)),
        retry_after,
        now: Timestamp::from_micros(clock),
        expires: Timestamp::from_micros(start + period),
        window_start: start,
        stale: false,
    };
    (grant, changed.then_some(new_state))
}
