//! One cached denial, the single flight of its key's next store call, and how a reply becomes an entry.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use event_listener::Event;
use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};
use tollgate_core::store::Expiry;
use tollgate_core::{Algorithm, Decision, Outcome, Policy};

use super::clock::Offset;

/// One cached denial.
#[derive(Debug, Clone)]
pub(super) struct Denial {
    /// The key's second digest, against collisions of the first.
    pub(super) check: u64,
    /// The digest of the key's text, by which an operator forgets it ([`RateLimitLayer::deny_cache_forget`](crate::RateLimitLayer::deny_cache_forget)).
    pub(super) text: u64,
    /// The cost denied: costs from here up to the burst are covered.
    pub(super) cost: u64,
    /// Local instant (µs) the request was sent at.
    pub(super) sent: u64,
    /// Local instant (µs) of the store's retry, as the headers count down to it: `sent + retry_after`, or later
    /// where the key's replies bound the clocks' offset tighter (by that bound and its drift allowance).
    pub(super) due: u64,
    /// Local instant (µs) from which the entry no longer answers: the store's retry instant by the tightest bound
    /// on the clocks' offset, less the drift since that bound and the clock's step allowance.
    pub(super) expires: u64,
    /// The tightest bound on the clocks' offset the key's replies gave.
    pub(super) offset: Offset,
    /// Local instant (µs) from which the key's next request asks the store ahead, to be held until the token
    /// accrues (`u64::MAX`: never; only a token bucket without a lockout holds).
    pub(super) ahead_at: u64,
    /// Whether the store held the key's requests asked ahead (until one of them comes back refused within its
    /// hold), carried from entry to entry.
    pub(super) holds: bool,
    /// Local instant (µs) until which the expired entry still coalesces the key's store calls (single flight).
    pub(super) coalesce_until: u64,
    /// The store call under way for the key since the entry expired, which other requests for it wait for.
    pub(super) flight: Option<Arc<Flight>>,
    /// The store's decision.
    pub(super) decision: Decision,
}

impl Denial {
    /// Starts the key's single flight: the store call the key's other requests wait for.
    pub(super) fn fly(&mut self) -> Arc<Flight> {
        let flight = Arc::new(Flight::default());
        self.flight = Some(flight.clone());
        flight
    }
}

impl Expiry for Denial {
    fn expires_at(&self) -> u64 {
        self.coalesce_until
    }
}

/// The one store call for an expired entry's key, and the requests waiting for its reply.
#[derive(Debug, Default)]
pub(super) struct Flight {
    pub(super) landed: Event,
    /// Set when the call brought the store's decision: the waiters look at the entry again (refused from the
    /// new one, or the next of them asks). Unset when it failed or was dropped: they ask on their own, so that
    /// none queues behind an outage.
    pub(super) decided: AtomicBool,
}

/// The denial the store would give the next request of `cost` after admitting one of `cost` with `decision`,
/// where the decision alone tells it: a token bucket (without a lockout, whose denial would start one) that the
/// admission left short of `cost`. The reply gives the bucket's `full_at` (its reset) but not the sub-µs remainder
/// of its state; the algorithm run on the remainder that refills soonest (one unit short of a µs) gives the earliest
/// instant the store can admit `cost` again: no later than the store's own, and at most 1 µs before it. A sliding
/// window's next admission depends on counts the decision does not give: its admissions make no entry.
pub(super) fn next_denial(policy: &Policy, cost: u64, decision: &Decision) -> Option<Decision> {
    let quota = policy.quota();
    if policy.algorithm() != Algorithm::TokenBucket
        || policy.lockout_micros() > 0
        || !decision.is_allowed()
        || decision.limit != quota.burst()
        || decision.remaining >= cost
    {
        return None;
    }
    let soonest = TokenBucketState {
        full_at: decision.reset.as_micros(),
        remainder: quota.token_bucket_rate() - 1,
    };
    // Refused there too (a cost above the burst is not, and has no retry instant): the retry is the entry's.
    let retry = token_bucket::decide(Some(soonest), &quota, cost, decision.now)
        .decision
        .retry_after
        .filter(|retry| !retry.is_zero())?;
    Some(Decision {
        outcome: Outcome::Limited,
        retry_after: Some(retry),
        ..*decision
    })
}

/// How long the store held an admission back ([`Store::check_held`](tollgate_core::Store::check_held)): the wait
/// from its `now` to the instant it was admitted as of; `None` for any other decision.
pub(super) fn held(decision: &Decision) -> Option<Duration> {
    decision
        .retry_after
        .filter(|wait| decision.is_allowed() && !wait.is_zero())
}

/// Whether `entry` answers a request of `cost`: costs from the one denied up to the limit.
pub(super) fn covers(entry: &Denial, cost: u64) -> bool {
    entry.cost <= cost && cost <= entry.decision.limit
}

/// The cached decision as the store would give it at local instant `now` (before the entry expires).
pub(super) fn answer(entry: &Denial, now: u64) -> Decision {
    Decision {
        retry_after: Some(Duration::from_micros(entry.due - now)),
        // The local clock may have been set back a little since: never before the store's instant.
        now: tollgate_core::Timestamp::from_micros(
            entry.decision.now.as_micros() + now.saturating_sub(entry.sent),
        ),
        ..entry.decision
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};
    use tollgate_core::{Policy, Quota, Timestamp};

    use super::next_denial;

    /// Quotas whose refill is not a whole number of µs per token (`rate` > 1) as well as ones where it is.
    fn quotas() -> impl Strategy<Value = Quota> {
        (1..40_u64, 1..5_000_000_u64, 0..3_u64).prop_map(|(limit, period, extra)| {
            let quota = Quota::new(limit, std::time::Duration::from_micros(period)).unwrap();
            quota.with_burst(limit + extra * limit).unwrap()
        })
    }

    proptest! {
        /// After any admission that leaves a token bucket short of the cost, the entry's retry instant is when the
        /// bucket holds the cost again, to the µs: the store refuses the cost 1 µs before it and admits it 1 µs
        /// after (an instant the entry no longer covers). With room left, no entry.
        #[test]
        fn an_admissions_entry_ends_when_the_bucket_can_admit_again(
            quota in quotas(),
            history in prop::collection::vec((0..3_000_000_u64, 1..6_u64), 1..30),
        ) {
            let policy = Policy::token_bucket(quota);
            let mut state: Option<TokenBucketState> = None;
            let mut now = 1_000_000_000_u64;
            for (advance, cost) in history {
                now += advance;
                let cost = cost.min(quota.burst());
                let step = token_bucket::decide(state, &quota, cost, Timestamp::from_micros(now));
                if step.state.is_some() {
                    state = step.state;
                }
                let decision = step.decision;
                let next = next_denial(&policy, cost, &decision);
                if !decision.is_allowed() || decision.remaining >= cost {
                    prop_assert!(next.is_none(), "{decision:?} made {next:?}");
                    continue;
                }
                let at = |t: u64| token_bucket::decide(state, &quota, cost, Timestamp::from_micros(t)).decision;
                match next {
                    Some(denial) => {
                        let retry = u64::try_from(denial.retry_after.unwrap().as_micros()).unwrap();
                        let admit_at = now + retry;
                        prop_assert!(!at(admit_at - 1).is_allowed(), "admitted before {admit_at}: {decision:?}");
                        prop_assert!(at(admit_at + 1).is_allowed(), "refused after {admit_at}: {decision:?}");
                        prop_assert_eq!(
                            (denial.limit, denial.remaining, denial.reset, denial.now),
                            (decision.limit, decision.remaining, decision.reset, decision.now)
                        );
                    }
                    // The bucket holds the cost again within a µs.
                    None => prop_assert!(at(now + 1).is_allowed(), "{decision:?}"),
                }
            }
        }
    }

    /// A sliding window's admission, or a token bucket's under a lockout, makes no entry.
    #[test]
    fn no_entry_where_the_decision_does_not_tell_the_next_denial() {
        let quota = Quota::per_second(1).unwrap();
        let decision = token_bucket::decide(None, &quota, 1, Timestamp::from_micros(1)).decision;
        assert!(next_denial(&Policy::token_bucket(quota), 1, &decision).is_some());
        let locking = Policy::token_bucket(quota)
            .with_lockout(std::time::Duration::from_secs(5))
            .unwrap();
        assert!(next_denial(&locking, 1, &decision).is_none());
        let window = Policy::sliding_window(quota).unwrap();
        assert!(next_denial(&window, 1, &decision).is_none());
    }
}
