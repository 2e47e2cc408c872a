//! What the deny cache's docs rest on for token leases: after a plain denial of cost `c` with `retry_after` r at
//! t0, the store admits no plain request of cost ≥ `c` before t0 + r — whatever lease grants, reports (renewals)
//! and expiries happen meanwhile — except by what leases returned since (their unspent tokens go back at once:
//! the bounded under-admission the docs name). Precisely: before t0 + r the bucket holds less than
//! `c + returned − admitted − granted` (all counted since t0), so a request of cost k is admitted then only if
//! k is below that. Every pending denial is checked at every admission, returns or not. Random interleavings of
//! two leasing instances and plain requests.

use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use tollgate_core::algorithm::token_bucket::TokenBucketState;
use tollgate_core::algorithm::token_bucket_lease::{self, LeaseBook};
use tollgate_core::token_lease::TokenLeaseRequest;
use tollgate_core::{Quota, Timestamp};

#[derive(Debug, Clone)]
enum Event {
    /// A plain request of this cost.
    Plain(u64),
    /// Instance i renews: reports what it holds and asks for `want` more.
    Renew(usize, u64),
    /// Instance i spends this many of its batch locally (no store call).
    Spend(usize, u64),
    /// Instance i ends its lease, returning what it holds.
    Return(usize),
}

fn events() -> impl Strategy<Value = Vec<(u64, Event)>> {
    let event = prop_oneof![
        4 => (1..=4_u64).prop_map(Event::Plain),
        2 => (0..2_usize, 0..=6_u64).prop_map(|(i, w)| Event::Renew(i, w)),
        2 => (0..2_usize, 1..=3_u64).prop_map(|(i, n)| Event::Spend(i, n)),
        1 => (0..2_usize).prop_map(Event::Return),
    ];
    prop::collection::vec(
        (
            prop_oneof![Just(0_u64), 0..5_000_u64, 0..300_000_u64, 0..1_500_000_u64],
            event,
        ),
        1..120,
    )
}

fn quotas() -> impl Strategy<Value = Quota> {
    prop_oneof![
        Just(Quota::per_second(10).unwrap()),
        Just(Quota::per_second(5).unwrap().with_burst(8).unwrap()),
        Just(Quota::per_minute(30).unwrap()),
    ]
}

/// Adds what the bucket gained (returns) or lost (admissions, grants) to every pending denial.
fn credit(denied: &mut [(u64, u64, i64, bool)], tokens: i64, returned: bool) {
    for d in denied {
        d.2 += tokens;
        d.3 |= returned;
    }
}

/// Runs `events`, checking every admission against every pending denial; returns how many of those checks
/// were against a denial some lease return had followed.
fn run(quota: Quota, ttl_ms: u64, events: Vec<(u64, Event)>) -> Result<u32, TestCaseError> {
    let ttl = Duration::from_millis(ttl_ms);
    let mut now = 1_000_000_000_u64;
    let mut bucket: Option<TokenBucketState> = None;
    let mut book = LeaseBook::default();
    // Per instance: the call number, what it holds, until when (the store's deadline).
    let mut seq = [0_u64; 2];
    let mut held = [(0_u64, 0_u64); 2];
    // Plain denials not yet past their instant: (cost, instant, what the bucket gained or lost since, beside
    // the refill: tokens returned, less tokens admitted and granted; whether a return came since).
    let mut denied: Vec<(u64, u64, i64, bool)> = Vec::new();
    let mut after_returns = 0_u32;
    for (i, (advance, event)) in events.into_iter().enumerate() {
        now += advance;
        for h in &mut held {
            if now >= h.1 {
                *h = (0, 0); // past its deadline: the instance stops spending it
            }
        }
        denied.retain(|&(_, at, _, _)| now < at);
        let at = Timestamp::from_micros(now);
        match event {
            Event::Plain(cost) => {
                let step = token_bucket_lease::decide(bucket, &mut book, &quota, cost, at);
                if let Some(state) = step.state {
                    bucket = Some(state);
                }
                let d = step.decision;
                if d.is_allowed() {
                    for &(c, until, since, returned) in &denied {
                        after_returns += u32::from(returned);
                        prop_assert!(
                            (cost as i64) < c as i64 + since,
                            "event {i}: cost {cost} admitted at {now}, before {until}, the instant a denial of \
                                 cost {c} announced (the bucket gained {since} since, beside the refill)"
                        );
                    }
                    credit(&mut denied, -(cost as i64), false);
                } else if let Some(retry) = d.retry_after {
                    denied.push((
                        cost,
                        now + u64::try_from(retry.as_micros()).unwrap(),
                        0,
                        false,
                    ));
                }
            }
            Event::Renew(n, want) => {
                seq[n] += 1;
                let ask =
                    TokenLeaseRequest::take(n as u64 + 1, seq[n], want, ttl).holding(held[n].0, 0);
                let (grant, state) = token_bucket_lease::lease(bucket, &mut book, &quota, &ask, at);
                bucket = Some(state);
                if !grant.stale {
                    prop_assert_eq!(grant.held, held[n].0 + grant.granted);
                    held[n] = (grant.held, grant.expires.as_micros());
                    credit(&mut denied, -(grant.granted as i64), false);
                }
            }
            Event::Spend(n, k) => held[n].0 = held[n].0.saturating_sub(k),
            Event::Return(n) => {
                seq[n] += 1;
                let ask = TokenLeaseRequest::take(n as u64 + 1, seq[n], 0, ttl).ending(held[n].0);
                let (_, state) = token_bucket_lease::lease(bucket, &mut book, &quota, &ask, at);
                bucket = Some(state);
                // Tokens back in the bucket at once: a pending denial's instant holds for that many less.
                credit(&mut denied, held[n].0 as i64, true);
                held[n] = (0, 0);
            }
        }
    }
    Ok(after_returns)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn leases_delay_a_denials_instant_but_for_what_was_returned(
        quota in quotas(),
        ttl_ms in 200..2_000_u64,
        events in events(),
    ) {
        run(quota, ttl_ms, events)?;
    }
}

/// The property is not vacuous after a return: over 256 random cases, admissions are checked against denials
/// that a return followed (they were not checked at all once any lease had been returned).
#[test]
fn admissions_are_checked_against_denials_a_return_followed() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut total = 0;
    for _ in 0..256 {
        let case = (quotas(), 200..2_000_u64, events())
            .new_tree(&mut runner)
            .unwrap()
            .current();
        total += run(case.0, case.1, case.2).unwrap();
    }
    assert!(total > 100, "only {total} checks after a return");
}
