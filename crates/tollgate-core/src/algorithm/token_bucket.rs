//! Token bucket with lazy refill, in exact fixed point.
//!
//! One token is `token = period / gcd(limit, period)` units and `rate = limit / gcd(limit, period)` units accrue
//! per microsecond, so refill is exact with no rounding. The state is the instant the bucket is full again
//! (`full_at`, which is also the reset clients are told) plus the sub-microsecond `remainder`: the deficit at
//! `now` is `(full_at − now) × rate − remainder` units. A key whose `full_at` has passed is a full bucket, the same
//! as a fresh one, which is why `full_at` doubles as its time to live. Mirrored line for line by
//! `lua/token_bucket.lua`.

use std::time::Duration;

use super::Step;
use crate::{Decision, Outcome, Quota, Timestamp};

/// Persisted state of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TokenBucketState {
    /// When the bucket is full again, in µs since the epoch.
    pub full_at: u64,
    /// Units (< `rate`) by which the deficit falls short of `(full_at − now) × rate`.
    pub remainder: u64,
}

/// Decides one request of `cost` tokens at `now`.
#[must_use]
// Inlined into the store's check, which is generic over the clock and so compiled in the caller's crate: a plain
// `#[inline]` is not always taken, and a call costs this hot path its copies.
#[inline(always)]
pub fn decide(
    state: Option<TokenBucketState>,
    quota: &Quota,
    cost: u64,
    now: Timestamp,
) -> Step<TokenBucketState> {
    let now = now.min(Timestamp::LATEST).as_micros();
    let (per_token, per_rate) = (quota.token_divisor(), quota.rate_divisor());
    let (token, rate) = (per_token.get(), per_rate.get());
    let capacity = quota.burst() * token;
    let (mut full_at, mut remainder) = match state {
        Some(s) if s.full_at > now => (s.full_at, s.remainder),
        _ => (now, 0),
    };
    // A remainder above what is owed is state from another quota (a limit changed under a running key): it owes
    // nothing, rather than underflowing.
    let owed = (full_at - now)
        .checked_mul(rate)
        .map(|owed| owed.saturating_sub(remainder));
    // More than the debt floor owed (two buckets: a charge after the response may overdraw one, see
    // `super::charge`, and a debt is kept): the clock stepped back (or the quota shrank), and the stored refill
    // instant is that much too late. The state is rebased to an empty bucket, refilling from now, and kept — or
    // every request would be refused until the old instant, however far. (Lua's doubles cannot overflow; past 2^53
    // they only lose precision, and any such product exceeds the floor anyway.)
    let rebased = !matches!(owed, Some(owed) if owed <= 2 * capacity);
    let deficit = if rebased {
        let wait = per_rate.div_ceil(capacity);
        (full_at, remainder) = (now + wait, wait * rate - capacity);
        capacity
    } else {
        owed.unwrap_or(capacity)
    };
    let kept = rebased.then_some(TokenBucketState { full_at, remainder });
    let decision = |outcome, remaining, reset, retry_after| Decision {
        outcome,
        limit: quota.burst(),
        remaining,
        reset: Timestamp::from_micros(reset),
        retry_after,
        now: Timestamp::from_micros(now),
    };

    if cost > quota.burst() {
        let remaining = per_token.div(capacity.saturating_sub(deficit)); // 0 in debt
        return Step {
            decision: decision(Outcome::CostExceedsCapacity, remaining, full_at, None),
            state: kept,
        };
    }
    let need = cost * token;
    if deficit + need <= capacity {
        let deficit = deficit + need;
        let wait = per_rate.div_ceil(deficit);
        let state = TokenBucketState {
            full_at: now + wait,
            remainder: wait * rate - deficit,
        };
        let remaining = per_token.div(capacity - deficit);
        return Step {
            decision: decision(Outcome::Allowed, remaining, state.full_at, None),
            state: Some(state),
        };
    }
    // Earliest t with (full_at − t) × rate − remainder ≤ capacity − need.
    let admit_at = full_at - per_rate.div(capacity - need + remainder);
    let remaining = per_token.div(capacity.saturating_sub(deficit)); // 0 in debt
    Step {
        decision: decision(
            Outcome::Limited,
            remaining,
            full_at,
            Some(Duration::from_micros(admit_at - now)),
        ),
        state: kept,
    }
}

/// Decides one request of `cost` tokens at `now` that its caller may hold back for up to `hold`: a request the
/// bucket admits no later than `now + hold` is admitted as of that instant — the state as if it came then, its
/// decision [`Allowed`](Outcome::Allowed) with `retry_after` the time to hold it (zero when admitted at once).
/// Any other request is decided as by [`decide`], as is one held longer than the burst takes to accrue (the state
/// it leaves would owe more than [`decide`] takes for a clock stepped back, and be rebased) or one on a state
/// [`decide`] rebases. Mirrored by `lua/token_bucket.lua`'s hold argument.
///
/// The request must not proceed before the hold has passed: it is counted at the instant it was admitted as of,
/// and the bucket's guarantee (at most `burst + rate × T` tokens spent in any interval `T`) holds for the instants
/// requests proceed at.
#[must_use]
pub fn decide_held(
    state: Option<TokenBucketState>,
    quota: &Quota,
    cost: u64,
    now: Timestamp,
    hold: Duration,
) -> Step<TokenBucketState> {
    let step = decide(state, quota, cost, now);
    // No longer than the burst takes to accrue, in whole µs.
    let accrual = quota
        .rate_divisor()
        .div(quota.burst() * quota.token_divisor().get());
    match (step.decision.outcome, step.decision.retry_after, step.state) {
        (Outcome::Limited, Some(wait), None)
            if wait <= hold.min(Duration::from_micros(accrual)) =>
        {
            let mut held = decide(state, quota, cost, step.decision.now.saturating_add(wait));
            // Admitted there by the instant's definition; anything else is answered as at `now`.
            if !held.decision.is_allowed() {
                return step;
            }
            held.decision.now = step.decision.now;
            held.decision.retry_after = Some(wait);
            held
        }
        _ => step,
    }
}
