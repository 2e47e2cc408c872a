//! Lockouts ([`Policy::with_lockout`](crate::Policy::with_lockout)) around either algorithm: after a denial the
//! key is refused until a stored instant, whatever its quota holds.
//!
//! The algorithm decides first, in every case, so that a refusal during a lockout still reports the quota's
//! `reset`; while the key is locked its new state is dropped (a refused request spends nothing). Mirrored by
//! `lua/ops_close.lua`, which wraps the algorithm scripts the same way.
//!
//! ```
//! use tollgate_core::algorithm::{lockout, token_bucket};
//! use tollgate_core::{Outcome, Quota, Timestamp};
//!
//! let quota = Quota::per_second(1)?;
//! let t = Timestamp::from_micros(1_000_000);
//! let step = |state| lockout::decide(state, 5_000_000, |s| token_bucket::decide(s, &quota, 1, t));
//! let first = step(None);
//! assert!(first.decision.is_allowed());
//! let denied = step(first.state);
//! assert_eq!(denied.decision.outcome, Outcome::Limited);
//! assert_eq!(denied.state.unwrap().locked_until, 6_000_000); // five seconds from the denial
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

use std::time::Duration;

use super::Step;
use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Decision, Outcome, Timestamp};

/// An algorithm's state with the instant its lockout ends (0, or any instant passed: not locked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Locked<S> {
    /// The algorithm's state.
    pub state: S,
    /// µs since the epoch until which the key is refused.
    pub locked_until: u64,
}

/// Decides one request with `inner` (the algorithm, called once) under a lockout of `lockout_us` (0: none).
/// `Step::state` is `None` when nothing is to be written.
// Inlined with the algorithm into the store's check: a call here would be a large part of the steady path.
#[inline(always)]
pub fn decide<S: Copy + Default>(
    state: Option<Locked<S>>,
    lockout_us: u64,
    inner: impl FnOnce(Option<S>) -> Step<S>,
) -> Step<Locked<S>> {
    let locked_until = state.map_or(0, |s| s.locked_until);
    let step = inner(state.map(|s| s.state));
    if lockout_us == 0 {
        // No lockout (most policies' steady path): the algorithm's step as it is, a stored lockout kept and
        // ignored as below, without the branches on the outcome (the token bucket's check: 407 -> 393
        // instructions).
        return Step {
            decision: step.decision,
            state: step.state.map(|s| Locked {
                state: s,
                locked_until,
            }),
        };
    }
    let mut decision = step.decision;
    let now = decision.now.as_micros();
    // A policy without a lockout ignores a stored one (the Redis store does not even read it then).
    let locked = lockout_us > 0 && locked_until > now;
    if decision.outcome == Outcome::CostExceedsCapacity {
        // Never admitted: neither starts nor reports a lockout.
    } else if locked {
        refuse_until(&mut decision, locked_until, now);
        return Step {
            decision,
            state: None,
        };
    } else if decision.outcome == Outcome::Limited && lockout_us > 0 {
        let until = now + lockout_us;
        refuse_until(&mut decision, until, now);
        let kept = step.state.or(state.map(|s| s.state)).unwrap_or_default();
        return Step {
            decision,
            state: Some(Locked {
                state: kept,
                locked_until: until,
            }),
        };
    }
    if locked {
        return Step {
            decision,
            state: None,
        };
    }
    Step {
        decision,
        state: step.state.map(|s| Locked {
            state: s,
            locked_until,
        }),
    }
}

/// Answers a token lease call with `inner` (the algorithm's lease, called once) on a key whose lockout ends at
/// `locked_until`, under a lockout of `lockout_us` (0: none, and a stored end is ignored). Mirrored by the lockout
/// lines of `lua/token_bucket_lease.lua` and `lua/sliding_window_lease.lua`.
///
/// A locked key grants nothing: the call is made with `want` 0 (a report of what is left, or a return, is still
/// applied: tokens go back, never out) and answers as a refused request would: nothing remains, the reset is no
/// earlier and the retry no sooner than the lockout's end. A lease call never starts a lockout: it refuses no
/// request (a short grant sends the instance's requests to the plain path, whose denial starts it). `ends`: the
/// call ends the lease (a token bucket's return, `request.end`; a sliding window's calls never do), and is answered
/// as it is.
pub fn lease<T>(
    ends: bool,
    locked_until: u64,
    lockout_us: u64,
    request: &TokenLeaseRequest,
    now: Timestamp,
    inner: impl FnOnce(&TokenLeaseRequest) -> (TokenLeaseGrant, T),
) -> (TokenLeaseGrant, T) {
    let at = now.min(Timestamp::LATEST).as_micros();
    if lockout_us == 0 || locked_until <= at {
        return inner(request);
    }
    let refused = TokenLeaseRequest {
        want: 0,
        ..*request
    };
    let (mut grant, state) = inner(&refused);
    if !grant.stale && !ends {
        let retry = grant.retry_after.map_or(0, |r| r.as_micros() as u64);
        grant.remaining = 0;
        grant.reset = grant.reset.max(Timestamp::from_micros(locked_until));
        grant.retry_after = Some(Duration::from_micros(retry.max(locked_until - at)));
    }
    (grant, state)
}

/// A refusal until `until` at the latest: nothing remains, the reset is no earlier, the retry no sooner.
pub(crate) fn refuse_until(decision: &mut Decision, until: u64, now: u64) {
    let retry = decision.retry_after.map_or(0, |r| r.as_micros() as u64);
    decision.outcome = Outcome::Limited;
    decision.remaining = 0;
    decision.reset = decision.reset.max(crate::Timestamp::from_micros(until));
    decision.retry_after = Some(Duration::from_micros(retry.max(until - now)));
}
