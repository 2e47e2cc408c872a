//! Invariants over random policies and traffic (proptest).

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::algorithm::sliding_window::{self, SlidingWindowState};
use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};
use tollgate_core::{Decision, Outcome, Policy, Quota, Timestamp};

const T0: u64 = 1_700_000_000_000_000;

/// Requests as (gap since the previous one in µs, cost).
fn traffic(max_gap: u64, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((prop_oneof![Just(0u64), 0..max_gap], 1..=max_cost), 1..120)
}

fn quota() -> impl Strategy<Value = Quota> {
    (1u64..50, 1u64..3_000_000, 1u64..60).prop_filter_map(
        "valid quota",
        |(limit, period, burst)| {
            Quota::new(limit, Duration::from_micros(period))
                .and_then(|q| q.with_burst(burst))
                .ok()
        },
    )
}

/// Runs `decide` over the traffic, returning each request's time, cost and decision.
fn replay<S: Copy>(
    requests: &[(u64, u64)],
    mut decide: impl FnMut(Option<S>, u64, Timestamp) -> tollgate_core::algorithm::Step<S>,
) -> Vec<(u64, u64, Decision, Option<S>)> {
    let mut state = None;
    let mut now = T0;
    requests
        .iter()
        .map(|&(gap, cost)| {
            now += gap;
            let before = state;
            let step = decide(state, cost, Timestamp::from_micros(now));
            if step.state.is_some() {
                state = step.state;
            }
            (now, cost, step.decision, before)
        })
        .collect()
}

/// No interval of `admitted` (time-ordered instants and costs) holds more than the bucket's burst plus what accrues
/// over it.
fn within_bucket_bound(q: &Quota, admitted: &[(u64, u64)]) -> Result<(), TestCaseError> {
    for i in 0..admitted.len() {
        let mut sum = 0u128;
        for &(t, cost) in &admitted[i..] {
            sum += u128::from(cost);
            let span = u128::from(t - admitted[i].0);
            let bound = u128::from(q.burst())
                + u128::from(q.limit()) * span / u128::from(q.period_micros());
            prop_assert!(sum <= bound, "{sum} admitted in {span} µs, bound {bound}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn token_bucket_announces_its_burst_and_never_more_remaining(q in quota(), reqs in traffic(400_000, 5)) {
        // The limit a client is told is the most it can ever have remaining, whatever the burst, and the reset is
        // when all of it is remaining again.
        let (mut state, mut now) = (None, T0);
        for &(gap, cost) in &reqs {
            now += gap;
            let step = token_bucket::decide(state, &q, cost, Timestamp::from_micros(now));
            state = step.state.or(state);
            let d = step.decision;
            prop_assert_eq!(d.limit, q.burst());
            prop_assert!(d.remaining <= d.limit, "{} remaining of {}", d.remaining, d.limit);
            // A request of cost 0 asks without taking anything.
            let at_reset = token_bucket::decide(state, &q, 0, d.reset).decision;
            prop_assert_eq!(at_reset.remaining, d.limit);
        }
    }

    #[test]
    fn token_bucket_never_admits_more_than_burst_plus_rate_times_t(q in quota(), reqs in traffic(400_000, 5)) {
        let log = replay(&reqs, |s, c, t| token_bucket::decide(s, &q, c, t));
        let admitted: Vec<(u64, u64)> = log.iter().filter(|r| r.2.is_allowed()).map(|r| (r.0, r.1)).collect();
        within_bucket_bound(&q, &admitted)?;
    }

    #[test]
    fn token_bucket_held_admissions_are_decisions_at_their_instant(
        q in quota(), reqs in traffic(400_000, 5), holds in prop::collection::vec(0u64..600_000, 120),
    ) {
        // Each request may be held up to its own hold: one admitted within it is the plain decision at the
        // instant it is held to, as if it came then; any other is the plain decision now. Counted at the instants
        // they proceed at, the bucket never admits more than burst + rate × T.
        let (mut state, mut now) = (None, T0);
        let mut admitted = Vec::new();
        for (&(gap, cost), &hold) in reqs.iter().zip(&holds) {
            now += gap;
            let at = Timestamp::from_micros(now);
            let held = token_bucket::decide_held(state, &q, cost, at, Duration::from_micros(hold));
            let plain = token_bucket::decide(state, &q, cost, at);
            match held.decision.retry_after.filter(|_| held.decision.is_allowed()) {
                Some(wait) => {
                    prop_assert_eq!(plain.decision.outcome, Outcome::Limited);
                    prop_assert_eq!(plain.decision.retry_after, Some(wait));
                    prop_assert!(wait <= Duration::from_micros(hold));
                    let then = Timestamp::from_micros(now + u64::try_from(wait.as_micros()).unwrap());
                    let direct = token_bucket::decide(state, &q, cost, then);
                    prop_assert_eq!(held.state, direct.state);
                    prop_assert_eq!(held.decision, Decision { now: at, retry_after: Some(wait), ..direct.decision });
                    admitted.push((then.as_micros(), cost));
                }
                None => {
                    prop_assert_eq!(held.decision, plain.decision);
                    prop_assert_eq!(held.state, plain.state);
                    if plain.decision.is_allowed() {
                        admitted.push((now, cost));
                    }
                }
            }
            state = held.state.or(state);
        }
        admitted.sort_unstable();
        within_bucket_bound(&q, &admitted)?;
    }

    #[test]
    fn sliding_window_never_admits_beyond_its_estimate(limit in 1u64..40, period in 1_000u64..2_000_000, reqs in traffic(300_000, 4)) {
        let policy = Policy::sliding_window(Quota::new(limit, Duration::from_micros(period)).unwrap()).unwrap();
        let log = replay(&reqs, |s, c, t| sliding_window::decide(s, &policy, c, t));
        // Recount from the admitted log alone, in exact rational terms, after each admission.
        for (i, r) in log.iter().enumerate().filter(|(_, r)| r.2.is_allowed()) {
            let start = r.0 - r.0 % period;
            let count = |from: u64, to: u64| -> u64 {
                log[..=i].iter().filter(|x| x.2.is_allowed() && x.0 >= from && x.0 < to).map(|x| x.1).sum()
            };
            let current = count(start, start + period);
            let previous = if start >= period { count(start - period, start) } else { 0 };
            let elapsed = r.0 - start;
            // current + previous × (period − elapsed) / period ≤ limit
            prop_assert!(u128::from(current) * u128::from(period) + u128::from(previous) * u128::from(period - elapsed)
                <= u128::from(limit) * u128::from(period));
            prop_assert!(current <= limit);
        }
    }

    #[test]
    fn remaining_never_exceeds_capacity_nor_underflows(q in quota(), reqs in traffic(500_000, 70)) {
        let tb = replay(&reqs, |s, c, t| token_bucket::decide(s, &q, c, t));
        prop_assert!(tb.iter().all(|r| r.2.remaining <= q.burst()));
        let policy = Policy::sliding_window(Quota::new(q.limit(), q.period()).unwrap()).unwrap();
        let sw = replay(&reqs, |s, c, t| sliding_window::decide(s, &policy, c, t));
        prop_assert!(sw.iter().all(|r| r.2.remaining <= q.limit()));
        // An over-sized cost is refused for good, never told to retry.
        for d in tb.iter().map(|r| r.2).chain(sw.iter().map(|r| r.2)) {
            prop_assert_eq!(d.outcome == Outcome::CostExceedsCapacity, d.retry_after.is_none() && !d.is_allowed());
        }
    }

    #[test]
    fn a_denied_request_retried_at_retry_after_is_admitted_and_not_a_microsecond_sooner(q in quota(), reqs in traffic(300_000, 4)) {
        let policy = Policy::sliding_window(Quota::new(q.limit(), q.period()).unwrap()).unwrap();
        let tb = replay(&reqs, |s, c, t| token_bucket::decide(s, &q, c, t));
        for (now, cost, d, state) in tb.into_iter().filter(|r| r.2.outcome == Outcome::Limited) {
            let at = now + d.retry_after.unwrap().as_micros() as u64;
            prop_assert!(token_bucket::decide(state, &q, cost, Timestamp::from_micros(at)).decision.is_allowed());
            prop_assert!(!token_bucket::decide(state, &q, cost, Timestamp::from_micros(at - 1)).decision.is_allowed());
        }
        let sw = replay(&reqs, |s, c, t| sliding_window::decide(s, &policy, c, t));
        for (now, cost, d, state) in sw.into_iter().filter(|r| r.2.outcome == Outcome::Limited) {
            let at = now + d.retry_after.unwrap().as_micros() as u64;
            prop_assert!(sliding_window::decide(state, &policy, cost, Timestamp::from_micros(at)).decision.is_allowed());
            prop_assert!(!sliding_window::decide(state, &policy, cost, Timestamp::from_micros(at - 1)).decision.is_allowed());
        }
    }

    #[test]
    fn reset_never_moves_backwards_between_consecutive_decisions(q in quota(), reqs in traffic(2_000_000, 4)) {
        let policy = Policy::sliding_window(Quota::new(q.limit(), q.period()).unwrap()).unwrap();
        let tb = replay(&reqs, |s, c, t| token_bucket::decide(s, &q, c, t));
        let sw = replay(&reqs, |s, c, t| sliding_window::decide(s, &policy, c, t));
        let tb: Vec<Decision> = tb.iter().map(|r| r.2).collect();
        let sw: Vec<Decision> = sw.iter().map(|r| r.2).collect();
        for log in [tb, sw] {
            for pair in log.windows(2) {
                prop_assert!(pair[1].reset >= pair[0].reset, "{:?} then {:?}", pair[0], pair[1]);
            }
        }
    }

    #[test]
    fn state_that_reached_its_reset_decides_like_a_fresh_key(q in quota(), reqs in traffic(300_000, 4), cost in 0u64..6) {
        let policy = Policy::sliding_window(Quota::new(q.limit(), q.period()).unwrap()).unwrap();
        let mut tb: Option<TokenBucketState> = None;
        let mut sw: Option<SlidingWindowState> = None;
        let mut now = T0;
        let (mut tb_reset, mut sw_reset) = (now, now);
        for &(gap, c) in &reqs {
            now += gap;
            let step = token_bucket::decide(tb, &q, c, Timestamp::from_micros(now));
            tb = step.state.or(tb);
            tb_reset = step.decision.reset.as_micros();
            let step = sliding_window::decide(sw, &policy, c, Timestamp::from_micros(now));
            sw = step.state.or(sw);
            sw_reset = step.decision.reset.as_micros();
        }
        let at = Timestamp::from_micros(tb_reset.max(now));
        prop_assert_eq!(token_bucket::decide(tb, &q, cost, at).decision, token_bucket::decide(None, &q, cost, at).decision);
        let at = Timestamp::from_micros(sw_reset.max(now));
        prop_assert_eq!(sliding_window::decide(sw, &policy, cost, at).decision, sliding_window::decide(None, &policy, cost, at).decision);
    }
}
