//! What the deny cache's docs rest on for token leases: after a plain denial of cost `c` with `retry_after` r at
//! t0, the store admits no plain request of cost ≥ `c` before t0 + r — whatever lease grants, reports (renewals)
//! and expiries happen meanwhile — unless a lease is returned (its unspent tokens go back at once: the bounded
//! under-admission the docs name). Random interleavings of two leasing instances and plain requests.

use std::time::Duration;

use proptest::prelude::*;
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn leases_delay_a_denials_instant_unless_returned(
        quota in quotas(),
        ttl_ms in 200..2_000_u64,
        events in events(),
    ) {
        let ttl = Duration::from_millis(ttl_ms);
        let mut now = 1_000_000_000_u64;
        let mut bucket: Option<TokenBucketState> = None;
        let mut book = LeaseBook::default();
        // Per instance: the call number, what it holds, until when (the store's deadline).
        let mut seq = [0_u64; 2];
        let mut held = [(0_u64, 0_u64); 2];
        // Plain denials not yet past their instant: (cost, instant).
        let mut denied: Vec<(u64, u64)> = Vec::new();
        for (i, (advance, event)) in events.into_iter().enumerate() {
            now += advance;
            for h in &mut held {
                if now >= h.1 {
                    *h = (0, 0); // past its deadline: the instance stops spending it
                }
            }
            denied.retain(|&(_, at)| now < at);
            let at = Timestamp::from_micros(now);
            match event {
                Event::Plain(cost) => {
                    let step = token_bucket_lease::decide(bucket, &mut book, &quota, cost, at);
                    if let Some(state) = step.state {
                        bucket = Some(state);
                    }
                    let d = step.decision;
                    if d.is_allowed() {
                        for &(c, until) in &denied {
                            prop_assert!(
                                cost < c,
                                "event {i}: cost {cost} admitted at {now}, before {until}, the instant a denial of \
                                 cost {c} announced"
                            );
                        }
                    } else if let Some(retry) = d.retry_after {
                        denied.push((cost, now + u64::try_from(retry.as_micros()).unwrap()));
                    }
                }
                Event::Renew(n, want) => {
                    seq[n] += 1;
                    let ask = TokenLeaseRequest::take(n as u64 + 1, seq[n], want, ttl).holding(held[n].0, 0);
                    let (grant, state) = token_bucket_lease::lease(bucket, &mut book, &quota, &ask, at);
                    bucket = Some(state);
                    if !grant.stale {
                        held[n] = (held[n].0 + grant.granted, grant.expires.as_micros());
                    }
                }
                Event::Spend(n, k) => held[n].0 = held[n].0.saturating_sub(k),
                Event::Return(n) => {
                    seq[n] += 1;
                    let ask = TokenLeaseRequest::take(n as u64 + 1, seq[n], 0, ttl).ending(held[n].0);
                    let (_, state) = token_bucket_lease::lease(bucket, &mut book, &quota, &ask, at);
                    bucket = Some(state);
                    if held[n].0 > 0 {
                        // Tokens back in the bucket at once: a denial's instant no longer holds.
                        denied.clear();
                    }
                    held[n] = (0, 0);
                }
            }
        }
    }
}
