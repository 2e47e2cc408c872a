//! Cost known after the response: a charge (`delta > 0`) or refund (`delta < 0`) applied to a key's state after
//! its request was decided, mirrored by `lua/token_bucket_charge.lua` and `lua/sliding_window_charge.lua`.
//!
//! A charge is never refused: it may overdraw, and the key then waits until the debt is repaid. The debt has a
//! floor: a token bucket's content goes down to `−burst` (a deficit of two buckets), a sliding window's count up
//! to `2 × limit`; a larger charge is cut there. The next request is refused with `remaining` 0 and a
//! `retry_after` (so `Retry-After`) of the time until the debt is repaid and its own cost accrued.
//!
//! A refund can never leave the state better than if the request had not happened: a bucket is never fuller
//! than full, and a window gives back only what it still counts of the request — from the window the request
//! was decided in (`decided_at`), and nothing once that window has passed out of the estimate.
//!
//! ```
//! use tollgate_core::algorithm::{charge, token_bucket};
//! use tollgate_core::{Outcome, Quota, Timestamp};
//!
//! let quota = Quota::per_second(10)?;
//! let t = Timestamp::from_micros(1_000_000);
//! let first = token_bucket::decide(None, &quota, 1, t);
//! // The response says it cost 15: 14 more, overdrawing the bucket of 10 by 5 tokens.
//! let owed = charge::token_bucket(first.state, &quota, 14, t);
//! let next = token_bucket::decide(Some(owed), &quota, 1, t);
//! assert_eq!(next.decision.outcome, Outcome::Limited);
//! assert_eq!(next.decision.remaining, 0);
//! assert_eq!(next.decision.retry_after.unwrap().as_millis(), 600); // 5 owed + 1 for this one, at 10/s
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

use super::Step;
use super::lockout::{self, Locked};
use super::sliding_window::SlidingWindowState;
use super::token_bucket::TokenBucketState;
use crate::{Decision, Policy, Quota, Timestamp};

/// The decision reported after a charge: what a request of cost 0 gets on the charged `state` (`decide` is the
/// algorithm at cost 0) — `Limited` while in debt, with the time until it is repaid — and a lockout in force, if
/// any (a debt is no denial: it starts none).
pub fn decision<S: Copy>(
    state: Locked<S>,
    lockout_us: u64,
    decide: impl FnOnce(Option<S>) -> Step<S>,
) -> Decision {
    let mut decision = decide(Some(state.state)).decision;
    let now = decision.now.as_micros();
    if lockout_us > 0 && state.locked_until > now {
        lockout::refuse_until(&mut decision, state.locked_until, now);
    }
    decision
}

/// The token bucket's state after charging `delta` tokens at `now` (a refund if negative).
#[must_use]
pub fn token_bucket(
    state: Option<TokenBucketState>,
    quota: &Quota,
    delta: i64,
    now: Timestamp,
) -> TokenBucketState {
    let now = now.min(Timestamp::LATEST).as_micros();
    let token = quota.token_bucket_token();
    let rate = quota.token_bucket_rate();
    let floor = 2 * quota.burst() * token;
    let (full_at, remainder) = match state {
        Some(s) if s.full_at > now => (s.full_at, s.remainder),
        _ => (now, 0),
    };
    // Owed now, never more than the floor (after a clock step back it could be).
    let owed = (full_at - now)
        .checked_mul(rate)
        .map_or(floor, |owed| owed.saturating_sub(remainder).min(floor));
    let tokens = delta.unsigned_abs().min(2 * quota.burst());
    let owed = if delta >= 0 {
        (owed + tokens * token).min(floor)
    } else {
        owed.saturating_sub(tokens * token)
    };
    let wait = owed.div_ceil(rate);
    TokenBucketState {
        full_at: now + wait,
        remainder: wait * rate - owed,
    }
}

/// The sliding window's state after charging `delta` at `now` (a refund if negative) for a request decided at
/// `decided_at`. `policy` must be a sliding window policy.
#[must_use]
pub fn sliding_window(
    state: Option<SlidingWindowState>,
    policy: &Policy,
    delta: i64,
    decided_at: Timestamp,
    now: Timestamp,
) -> SlidingWindowState {
    let limit = policy.quota().limit();
    let period = policy.quota().period_micros();
    let now = now.min(Timestamp::LATEST).as_micros();
    let mut start = now - now % period;
    let (mut previous, mut current) = (0, 0);
    if let Some(s) = state {
        // As the decision does: after a clock step back, the stored window stands.
        start = start.max(s.window_start);
        if s.window_start == start {
            (previous, current) = (s.previous, s.current);
        } else if s.window_start + period == start {
            previous = s.current;
        }
    }
    let amount = delta.unsigned_abs().min(2 * limit);
    if delta >= 0 {
        current = (current + amount).min(2 * limit);
    } else {
        let decided = decided_at.min(Timestamp::LATEST).as_micros();
        let decided = decided - decided % period;
        if decided == start {
            current -= amount.min(current);
        } else if decided + period == start {
            previous -= amount.min(previous);
        }
    }
    SlidingWindowState {
        window_start: start,
        previous,
        current,
    }
}
