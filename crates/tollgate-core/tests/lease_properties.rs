//! The token lease algorithms' own invariants, on random interleavings of plain requests and three instances that
//! fetch (reporting what they hold), spend locally, return, and now and then send a late duplicate call — and of
//! the store forgetting the key (a restart without persistence) while they hold batches:
//!
//! - token bucket: the bucket's content plus the leased tokens never exceed the burst, every instance holds no
//!   more than its record, and over every interval [a, b] the fleet — plain admissions and tokens spent from
//!   batches, at the instants they were spent — admits at most `burst + rate × (b − a)`;
//! - sliding window: every admission, plain or spent from a batch, keeps the estimate of what was really admitted
//!   (counted at the instants it was spent) within the limit, and the records never count more than the windows.
//!
//! Across a loss the bounds start again (as the plain path's do, from a full bucket or an empty window), and what
//! an instance spends of the batch it held then, until its next grant lands, is the stated exception (it is not
//! counted). The instances keep what the grants say they hold ([`TokenLeaseGrant::held`]) and stop spending at the
//! store's deadline, as the tower layer does (it stops earlier still).

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::algorithm::sliding_window::{self, SlidingWindowState};
use tollgate_core::algorithm::sliding_window_lease::{self, WindowBook};
use tollgate_core::algorithm::token_bucket::TokenBucketState;
use tollgate_core::algorithm::token_bucket_lease::{self, LeaseBook};
use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{Policy, Quota, Timestamp};

const INSTANCES: usize = 3;

#[derive(Debug, Clone)]
enum Event {
    /// A plain request of this cost.
    Plain(u64),
    /// Instance i fetches: reports (or gives back) what it holds and asks for `want` more.
    Fetch(usize, u64),
    /// Instance i spends up to this many of its batch locally (no store call).
    Spend(usize, u64),
    /// Instance i ends its lease, returning what it holds.
    Return(usize),
    /// A late duplicate of instance i's last call, claiming to hold this many.
    Stale(usize, u64),
    /// The store loses the key.
    Forget,
}

fn events() -> impl Strategy<Value = Vec<(u64, Event)>> {
    let i = 0..INSTANCES;
    let event = prop_oneof![
        3 => (1..=3_u64).prop_map(Event::Plain),
        3 => (i.clone(), 0..=8_u64).prop_map(|(i, w)| Event::Fetch(i, w)),
        4 => (i.clone(), 1..=4_u64).prop_map(|(i, n)| Event::Spend(i, n)),
        1 => i.clone().prop_map(Event::Return),
        1 => (i, 0..=20_u64).prop_map(|(i, u)| Event::Stale(i, u)),
        1 => Just(Event::Forget),
    ];
    prop::collection::vec(
        (
            prop_oneof![Just(0_u64), 0..20_000_u64, 0..300_000_u64, 0..1_500_000_u64],
            event,
        ),
        1..150,
    )
}

fn quotas() -> impl Strategy<Value = Quota> {
    prop_oneof![
        Just(Quota::per_second(10).unwrap()),
        Just(Quota::per_second(5).unwrap().with_burst(12).unwrap()),
        Just(Quota::per_minute(30).unwrap()),
        Just(Quota::new(20, Duration::from_millis(700)).unwrap()),
    ]
}

/// What an instance holds: tokens or slots, spendable before `deadline` (the store's), and for a sliding window
/// the window they count in and an earlier batch's leftovers to give back.
#[derive(Debug, Clone, Copy, Default)]
struct Holder {
    seq: u64,
    tokens: u64,
    deadline: u64,
    window: u64,
    leftover: u64,
    leftover_window: u64,
    /// What it held when the store last lost the key, until its next grant.
    old: u64,
}

impl Holder {
    /// A grant landed: the batch grows by it, never beyond what the store says the instance holds.
    fn apply(&mut self, grant: &TokenLeaseGrant) {
        if grant.stale {
            return;
        }
        if grant.window_start != self.window && self.tokens > 0 {
            self.leftover += self.tokens;
            self.leftover_window = self.window;
            self.tokens = 0;
        }
        self.tokens = (self.tokens + grant.granted).min(grant.held);
        self.deadline = grant.expires.as_micros();
        self.window = grant.window_start;
        self.old = 0;
    }

    /// Spends up to `n`: returns what was spent beyond the batch held when the store last lost the key.
    fn spend(&mut self, n: u64) -> u64 {
        let spent = n.min(self.tokens);
        self.tokens -= spent;
        let old = spent.min(self.old);
        self.old -= old;
        spent - old
    }

    /// Past its deadline a batch is not spent (a sliding window's is given back with the next call).
    fn expire(&mut self, now: u64) {
        if now >= self.deadline && self.tokens > 0 {
            if self.window > 0 {
                self.leftover += self.tokens;
                self.leftover_window = self.window;
            }
            self.tokens = 0;
        }
        self.old = self.old.min(self.tokens);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn token_bucket_leases_keep_leased_plus_content_within_the_burst_and_the_fleet_within_its_bound(
        quota in quotas(),
        ttl_ms in 100..2_000_u64,
        events in events(),
    ) {
        let ttl = Duration::from_millis(ttl_ms);
        let mut now = 1_000_000_000_u64;
        let mut bucket: Option<TokenBucketState> = None;
        let mut book = LeaseBook::default();
        let mut holders = [Holder::default(); INSTANCES];
        // Admissions (instant, cost), and how many losses came before each.
        let mut admitted: Vec<(u64, u64, usize)> = Vec::new();
        let mut losses = 0;
        for (k, (advance, event)) in events.into_iter().enumerate() {
            now += advance;
            let at = Timestamp::from_micros(now);
            for h in &mut holders {
                h.expire(now);
            }
            // What the store's answer says the bucket holds (tokens no instance holds), when it was asked.
            let mut content = None;
            match event {
                Event::Plain(cost) => {
                    let step = token_bucket_lease::decide(bucket, &mut book, &quota, cost, at);
                    if let Some(state) = step.state {
                        bucket = Some(state);
                    }
                    content = Some(step.decision.remaining);
                    if step.decision.is_allowed() {
                        admitted.push((now, cost, losses));
                    }
                }
                Event::Fetch(i, want) => {
                    let h = &mut holders[i];
                    h.seq += 1;
                    let ask = TokenLeaseRequest::take(i as u64 + 1, h.seq, want, ttl).holding(h.tokens, 0);
                    let (grant, state) = token_bucket_lease::lease(bucket, &mut book, &quota, &ask, at);
                    bucket = Some(state);
                    prop_assert!(!grant.stale);
                    // What it held before a loss is the store's no longer: the grant says so, and it is dropped.
                    prop_assert!(h.tokens - h.old + grant.granted <= grant.held, "event {k}: {h:?} beyond {grant:?}");
                    content = Some(grant.remaining);
                    h.apply(&grant);
                }
                Event::Spend(i, n) => {
                    let spent = holders[i].spend(n);
                    if spent > 0 {
                        admitted.push((now, spent, losses));
                    }
                }
                Event::Forget => {
                    (bucket, book) = (None, LeaseBook::default());
                    losses += 1;
                    for h in &mut holders {
                        h.old = h.tokens;
                    }
                }
                Event::Return(i) => {
                    let h = &mut holders[i];
                    h.seq += 1;
                    let ask = TokenLeaseRequest::take(i as u64 + 1, h.seq, 0, ttl).ending(h.tokens);
                    let (grant, state) = token_bucket_lease::lease(bucket, &mut book, &quota, &ask, at);
                    bucket = Some(state);
                    prop_assert_eq!(grant.held, 0);
                    content = Some(grant.remaining);
                    (h.tokens, h.old) = (0, 0);
                }
                Event::Stale(i, unspent) => {
                    // Its last call again, landing late and claiming to hold more.
                    let h = &holders[i];
                    let id = i as u64 + 1;
                    let before = book.records.iter().find(|r| r.instance == id).copied();
                    let ask = TokenLeaseRequest::take(id, h.seq, 8, ttl).holding(unspent, 0);
                    let (grant, state) = token_bucket_lease::lease(bucket, &mut book, &quota, &ask, at);
                    bucket = Some(state);
                    content = Some(grant.remaining);
                    if let Some(record) = before.filter(|r| r.deadline > now) {
                        prop_assert!(grant.stale && grant.granted == 0, "event {k}: {grant:?}");
                        let after = book.records.iter().find(|r| r.instance == id).copied();
                        prop_assert_eq!(after, Some(record), "event {}: a stale call changed the record", k);
                    }
                    // Without a record to be stale against the store takes it for a call: its grant never reaches
                    // the instance (lost tokens, as the layer's timed-out fetch loses them).
                }
            }
            // What the bucket holds plus what is leased stays within the burst (as each answer says), and each
            // holder within its record.
            let leased: u64 = book.records.iter().map(|r| r.amount).sum();
            prop_assert_eq!(leased, book.leased);
            if let Some(content) = content {
                prop_assert!(
                    content + leased <= quota.burst(),
                    "event {k}: {content} in the bucket + {leased} leased, above the burst {}",
                    quota.burst()
                );
            }
            for (i, h) in holders.iter().enumerate() {
                let record = book.records.iter().find(|r| r.instance == i as u64 + 1).map_or(0, |r| r.amount);
                prop_assert!(
                    h.tokens - h.old <= record,
                    "event {k}: instance {i} holds {} ({} from before the loss) of a record of {record}",
                    h.tokens,
                    h.old
                );
            }
        }
        // Over every interval [a, b] between two losses: at most burst + rate × (b − a).
        let period = quota.period_micros();
        for (i, &(a, _, epoch)) in admitted.iter().enumerate() {
            let mut total = 0;
            for &(b, cost, _) in admitted[i..].iter().take_while(|&&(_, _, e)| e == epoch) {
                total += cost;
                prop_assert!(
                    total * period <= quota.burst() * period + quota.limit() * (b - a),
                    "{total} admitted in [{a}, {b}]: more than {} + {} × {} µs / {period} µs",
                    quota.burst(),
                    quota.limit(),
                    b - a
                );
            }
        }
    }

    #[test]
    fn sliding_window_leases_keep_every_admission_within_the_estimate_of_what_was_admitted(
        quota in quotas().prop_filter("a sliding window has no burst", |q| q.burst() == q.limit()),
        events in events(),
    ) {
        let policy = Policy::sliding_window(quota).unwrap();
        let period = quota.period_micros();
        let tick = policy.tick_micros();
        let ticks = period / tick;
        let mut now = 1_000_000_000_u64;
        let mut state: Option<SlidingWindowState> = None;
        let mut book = WindowBook::default();
        let mut holders = [Holder::default(); INSTANCES];
        // What was really admitted, per window start: plain requests and slots spent from batches.
        let mut admitted = std::collections::BTreeMap::<u64, u64>::new();
        let admit = |admitted: &mut std::collections::BTreeMap<u64, u64>, now: u64, cost: u64| -> Result<(), TestCaseError> {
            let start = now - now % period;
            *admitted.entry(start).or_default() += cost;
            let current = admitted[&start];
            let previous = start.checked_sub(period).and_then(|p| admitted.get(&p)).copied().unwrap_or(0);
            let elapsed = (now - start) / tick;
            prop_assert!(
                current * ticks + previous * (ticks - elapsed) <= quota.limit() * ticks,
                "at {now}: {current} admitted in this window and {previous} in the last, {elapsed} of {ticks} \
                 ticks in: above the limit {}",
                quota.limit()
            );
            Ok(())
        };
        for (k, (advance, event)) in events.into_iter().enumerate() {
            now += advance;
            let at = Timestamp::from_micros(now);
            for h in &mut holders {
                h.expire(now);
            }
            match event {
                Event::Plain(cost) => {
                    let step = sliding_window::decide(state, &policy, cost, at);
                    if let Some(s) = step.state {
                        state = Some(s);
                    }
                    if step.decision.is_allowed() {
                        admit(&mut admitted, now, cost)?;
                    }
                }
                Event::Fetch(i, want) | Event::Stale(i, want) => {
                    // A sliding window keeps no call numbers: a late call is an ordinary one.
                    let h = &mut holders[i];
                    h.seq += 1;
                    let ask = TokenLeaseRequest::take(i as u64 + 1, h.seq, want, Duration::ZERO)
                        .holding(h.leftover, h.leftover_window);
                    h.leftover = 0;
                    let (grant, s) = sliding_window_lease::lease(state, &mut book, &policy, &ask, at);
                    if s.is_some() {
                        state = s;
                    }
                    h.apply(&grant);
                }
                Event::Spend(i, n) => {
                    let spent = holders[i].spend(n);
                    if spent > 0 {
                        admit(&mut admitted, now, spent)?;
                    }
                }
                Event::Forget => {
                    (state, book) = (None, WindowBook::default());
                    admitted.clear();
                    for h in &mut holders {
                        h.old = h.tokens;
                    }
                }
                Event::Return(i) => {
                    let h = &mut holders[i];
                    h.seq += 1;
                    let (back, from) = if h.tokens > 0 { (h.tokens, h.window) } else { (h.leftover, h.leftover_window) };
                    let ask = TokenLeaseRequest::take(i as u64 + 1, h.seq, 0, Duration::ZERO)
                        .ending(back)
                        .holding(back, from);
                    let (_, s) = sliding_window_lease::lease(state, &mut book, &policy, &ask, at);
                    if s.is_some() {
                        state = s;
                    }
                    (h.tokens, h.leftover, h.old) = (0, 0, 0);
                }
            }
            // The records never count more than the windows, and each holder within its record.
            if let Some(s) = state {
                let start = s.window_start;
                let counted: Vec<(u64, (u64, u64))> =
                    book.records.iter().map(|r| (r.instance, r.at(start, period))).collect();
                prop_assert!(counted.iter().map(|(_, c)| c.0).sum::<u64>() <= s.current, "event {k}: {book:?} {s:?}");
                prop_assert!(counted.iter().map(|(_, c)| c.1).sum::<u64>() <= s.previous, "event {k}: {book:?} {s:?}");
                for (i, h) in holders.iter().enumerate() {
                    if h.tokens > 0 && h.window == start {
                        let mine = counted.iter().find(|(id, _)| *id == i as u64 + 1).map_or(0, |(_, c)| c.0);
                        prop_assert!(h.tokens - h.old <= mine, "event {k}: instance {i} holds {} of {mine}", h.tokens);
                    }
                }
            }
        }
    }
}
