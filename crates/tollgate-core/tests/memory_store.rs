//! The in-process store: isolation, self-cleaning, the key bound, concurrency and hostile input.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{
    ManualClock, MemoryStore, OnFull, Outcome, Policy, Quota, Store, StoreError, Timestamp,
};

const T0: u64 = 1_700_000_000_000_000;

fn clock() -> ManualClock {
    ManualClock::new(Timestamp::from_micros(T0))
}

fn bucket(limit: u64) -> Policy {
    Policy::token_bucket(Quota::per_second(limit).unwrap())
}

fn window(limit: u64) -> Policy {
    Policy::sliding_window(Quota::per_second(limit).unwrap()).unwrap()
}

#[test]
fn algorithms_keep_separate_state_for_the_same_key() {
    let store = MemoryStore::builder().clock(clock()).build();
    assert!(store.check_now("k", &bucket(1), 1).unwrap().is_allowed());
    assert!(!store.check_now("k", &bucket(1), 1).unwrap().is_allowed());
    assert!(store.check_now("k", &window(1), 1).unwrap().is_allowed());
    assert_eq!(store.len(), 2);
}

#[test]
fn idle_keys_are_dropped_once_they_equal_fresh_state() {
    let clock = clock();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .build();
    for i in 0..1_000 {
        store
            .check_now(&format!("client-{i}"), &bucket(10), 1)
            .unwrap();
    }
    assert_eq!(store.len(), 1_000);
    // One token refills in 100 ms: after that every bucket is full, i.e. fresh.
    clock.advance(Duration::from_millis(100));
    for i in 0..1_000 {
        store
            .check_now(&format!("late-{i}"), &bucket(10), 1)
            .unwrap();
    }
    assert!(
        store.len() <= 1_000 + 64,
        "expired keys were not swept: {}",
        store.len()
    );
    clock.advance(Duration::from_millis(100));
    store.sweep();
    assert!(store.is_empty());
}

#[test]
fn a_peek_on_a_fresh_key_stores_nothing() {
    let store = MemoryStore::builder().clock(clock()).build();
    let d = store.check_now("k", &bucket(3), 0).unwrap();
    assert_eq!((d.outcome, d.remaining), (Outcome::Allowed, 3));
    assert!(store.is_empty());
}

#[test]
fn at_the_key_bound_of_a_refusing_store_new_keys_get_an_error_and_tracked_keys_keep_working() {
    let clock = clock();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .on_full(OnFull::Refuse)
        .max_keys(8)
        .shards(1)
        .build();
    let policy = bucket(2);
    for i in 0..8 {
        assert!(
            store
                .check_now(&format!("k{i}"), &policy, 1)
                .unwrap()
                .is_allowed()
        );
    }
    let err = store.check_now("intruder", &policy, 1).unwrap_err();
    assert!(
        matches!(err, StoreError::KeyCapacity { max_keys: 8 }),
        "{err:?}"
    );
    assert!(err.to_string().contains("maximum of 8 keys"));
    // Tracked keys still decide with their state intact: one token left, then limited.
    assert!(store.check_now("k0", &policy, 1).unwrap().is_allowed());
    assert_eq!(
        store.check_now("k0", &policy, 1).unwrap().outcome,
        Outcome::Limited
    );
    assert_eq!(store.len(), 8);
    // Once tracked keys decay back to fresh, new keys are admitted again.
    clock.advance(Duration::from_secs(1));
    assert!(
        store
            .check_now("intruder", &policy, 1)
            .unwrap()
            .is_allowed()
    );
    assert!(store.len() <= 8);
}

#[test]
fn at_the_bound_a_refusing_store_sweeps_once_an_eighth_can_go_not_for_every_key() {
    // 64 keys, one expiring every millisecond (a token of "1 per ms" bought at 1 ms intervals). Sweeping whenever
    // one has expired would scan the whole shard under its lock for every new key while a client sprays keys;
    // the store waits until an eighth of it (8 keys) can go, refusing new keys meanwhile.
    let clock = clock();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .on_full(OnFull::Refuse)
        .max_keys(64)
        .shards(1)
        .build();
    let policy = Policy::token_bucket(Quota::new(1, Duration::from_millis(1)).unwrap());
    for i in 0..64 {
        assert!(
            store
                .check_now(&format!("k{i}"), &policy, 1)
                .unwrap()
                .is_allowed()
        );
        clock.advance(Duration::from_millis(1));
    }
    // k0..k63 expire at 1..64 ms after T0. Back at 0.5 ms, nothing has: a new key is refused, and the sweep that
    // found nothing waits for eight keys to expire (k7, at 8 ms).
    let fresh = |i: usize| store.check_now(&format!("new{i}"), &policy, 1);
    clock.set(Timestamp::from_micros(T0 + 500));
    assert!(matches!(fresh(0), Err(StoreError::KeyCapacity { .. })));
    clock.set(Timestamp::from_micros(T0 + 1_500));
    assert!(
        matches!(fresh(1), Err(StoreError::KeyCapacity { .. })),
        "k0 alone has expired: no sweep of the whole shard for one key"
    );
    clock.set(Timestamp::from_micros(T0 + 8_000));
    for i in 2..10 {
        assert!(
            fresh(i).unwrap().is_allowed(),
            "k0..k7 swept at once: room for eight"
        );
    }
    assert!(matches!(fresh(10), Err(StoreError::KeyCapacity { .. })));
    assert_eq!(store.len(), 64);
}

#[test]
fn a_small_bound_is_met_exactly_however_many_shards_are_asked_for() {
    // The bound is kept per shard: 16 shards of 4 keys refused the 35th of 64 keys. Small bounds get fewer shards.
    for max_keys in [3, 64, 300] {
        let store = MemoryStore::builder()
            .clock(clock())
            .on_full(OnFull::Refuse)
            .max_keys(max_keys)
            .shards(16)
            .build();
        let admitted = (0..max_keys * 2)
            .filter(|i| store.check_now(&format!("k{i}"), &bucket(5), 1).is_ok())
            .count();
        assert_eq!(admitted, max_keys, "max_keys {max_keys}");
    }
}

#[test]
fn a_flood_of_distinct_keys_cannot_grow_a_refusing_store_past_its_bound() {
    let store = MemoryStore::builder()
        .clock(clock())
        .on_full(OnFull::Refuse)
        .max_keys(1_000)
        .build();
    let mut refused = 0;
    for i in 0..20_000 {
        match store.check_now(&format!("flood-{i}"), &window(5), 1) {
            Ok(d) => assert!(d.is_allowed()),
            Err(StoreError::KeyCapacity { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(store.len() <= 1_000 + 64, "len {}", store.len());
    assert!(refused >= 18_000, "refused {refused}");
}

#[test]
fn long_and_binary_keys_are_fine() {
    let store = MemoryStore::builder().clock(clock()).build();
    let long = "x".repeat(1 << 20);
    assert!(store.check_now(&long, &bucket(1), 1).unwrap().is_allowed());
    assert!(!store.check_now(&long, &bucket(1), 1).unwrap().is_allowed());
    assert!(
        store
            .check_now("\0\u{1}{}\u{ffff}", &bucket(1), 1)
            .unwrap()
            .is_allowed()
    );
    assert!(store.check_now("", &bucket(1), 1).unwrap().is_allowed());
}

#[test]
fn a_clock_that_steps_back_never_panics_or_mints_tokens() {
    let clock = clock();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    for policy in [bucket(5), window(5)] {
        for _ in 0..5 {
            assert!(store.check_now("k", &policy, 1).unwrap().is_allowed());
        }
        clock.set(Timestamp::from_micros(T0 - 3_600_000_000));
        for _ in 0..3 {
            assert!(!store.check_now("k", &policy, 1).unwrap().is_allowed());
        }
        clock.set(Timestamp::from_micros(0));
        assert!(!store.check_now("k", &policy, 1).unwrap().is_allowed());
        clock.set(Timestamp::from_micros(T0));
    }
}

#[test]
fn after_a_long_clock_step_back_a_bucket_refills_from_empty_not_from_the_old_instant() {
    // Ten per second, spent; then the clock reads an hour earlier. The bucket is treated as empty (no token is
    // minted), refilling from now: the retry delay is one token's tenth of a second, not the hour, and it holds.
    // A probe of cost 0 changes nothing that follows.
    for probe in [false, true] {
        let clock = clock();
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let policy = bucket(10);
        for _ in 0..10 {
            assert!(store.check_now("k", &policy, 1).unwrap().is_allowed());
        }
        let back = T0 - 3_600_000_000;
        clock.set(Timestamp::from_micros(back));
        if probe {
            assert!(store.check_now("k", &policy, 0).unwrap().is_allowed());
        }
        let denied = store.check_now("k", &policy, 1).unwrap();
        assert_eq!(denied.outcome, Outcome::Limited);
        assert_eq!(denied.remaining, 0);
        assert_eq!(
            denied.retry_after,
            Some(Duration::from_millis(100)),
            "probe {probe}"
        );
        assert_eq!(denied.reset, Timestamp::from_micros(back + 1_000_000));
        clock.set(Timestamp::from_micros(back + 99_999));
        assert!(!store.check_now("k", &policy, 1).unwrap().is_allowed());
        clock.set(Timestamp::from_micros(back + 100_000));
        assert!(
            store.check_now("k", &policy, 1).unwrap().is_allowed(),
            "probe {probe}"
        );
    }
}

#[test]
fn after_a_clock_step_back_a_window_retry_after_counts_from_the_clock() {
    // Two admitted at T0 + 0.9 s fill "2 per second"; the clock then reads 10 s earlier. The window still decides
    // as of its own start, but the delay it announces is from the clock's reading, and retrying then succeeds.
    let clock = clock();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let policy = window(2);
    clock.set(Timestamp::from_micros(T0 + 900_000));
    for _ in 0..2 {
        assert!(store.check_now("k", &policy, 1).unwrap().is_allowed());
    }
    let back = T0 - 9_100_000;
    clock.set(Timestamp::from_micros(back));
    let denied = store.check_now("k", &policy, 1).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(
        denied.now,
        Timestamp::from_micros(back),
        "the decision's instant is the clock's"
    );
    let retry = denied.retry_after.expect("a retry delay");
    assert_eq!(retry, Duration::from_micros(T0 + 1_500_000 - back));
    assert_eq!(denied.reset, Timestamp::from_micros(T0 + 2_000_000));
    clock.set(Timestamp::from_micros(back + retry.as_micros() as u64 - 1));
    assert!(!store.check_now("k", &policy, 1).unwrap().is_allowed());
    clock.set(Timestamp::from_micros(back + retry.as_micros() as u64));
    assert!(store.check_now("k", &policy, 1).unwrap().is_allowed());
}

/// Threads admitting on one key at once (its shard's hot entry, written by compare-and-swap, or the lock when
/// another thread wrote first) take exactly the burst between them.
#[test]
fn concurrent_threads_admit_exactly_the_burst() {
    let store = Arc::new(MemoryStore::builder().clock(clock()).build());
    let policy = Policy::token_bucket(Quota::per_hour(1).unwrap().with_burst(20_000).unwrap());
    let start = std::sync::Barrier::new(8);
    let admitted: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (store, start) = (&store, &start);
                s.spawn(move || {
                    start.wait();
                    (0..5_000)
                        .filter(|_| store.check_now("hot", &policy, 1).unwrap().is_allowed())
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 20_000);
}

/// Threads refusing one key (its shard's hot entry, decided on without the lock) while the clock moves on: every
/// token that accrues is admitted exactly once, whichever thread comes first, and each refusal is the one a
/// lone check of that state gives.
#[test]
fn threads_refusing_one_key_admit_exactly_what_accrues() {
    let clock = clock();
    let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    for policy in [bucket(10), window(10)] {
        let key = policy.algorithm().as_str();
        let step = Duration::from_millis(7);
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let (store, policy) = (&store, &policy);
                    s.spawn(move || {
                        let mut admitted = 0;
                        for _ in 0..2_000 {
                            let d = store.check_now(key, policy, 1).unwrap();
                            if d.is_allowed() {
                                admitted += 1;
                            } else {
                                assert_eq!(d.remaining, 0, "{d:?}");
                                assert!(d.retry_after.is_some_and(|r| r > Duration::ZERO), "{d:?}");
                            }
                        }
                        admitted
                    })
                })
                .collect();
            // The clock moves while the threads check: 100 steps of 7 ms, 0.7 s in all.
            for _ in 0..100 {
                clock.advance(step);
                std::thread::yield_now();
            }
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        // What is left now, read without consuming, tells what the threads took: the burst plus what accrued
        // over 0.7 s, less what is still there.
        let left = store.peek_now(key, &policy, 1).remaining as usize;
        let most = 10 + 7;
        assert!(
            admitted + left <= most,
            "{key}: {admitted} admitted, {left} left"
        );
        assert!(
            admitted >= 10,
            "{key}: {admitted} admitted: the burst at least"
        );
    }
}

#[test]
fn the_store_trait_answers_like_the_sync_api() {
    let store = Arc::new(MemoryStore::builder().clock(clock()).build());
    let policy = bucket(1);
    let fut = Store::check(&store, "k", &policy, 1);
    // MemoryStore's future is ready at once; poll it without a runtime.
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(d)) => assert!(d.is_allowed()),
        other => panic!("{other:?}"),
    }
    assert!(!store.check_now("k", &bucket(1), 1).unwrap().is_allowed());
    // It also answers without a future, through an `Arc` too; the decision takes effect like any other.
    let immediate = Store::check_immediate(&store, "other", &policy, 1);
    assert!(immediate.unwrap().unwrap().is_allowed());
    assert!(
        !store
            .check_now("other", &bucket(1), 1)
            .unwrap()
            .is_allowed()
    );
}

#[test]
fn instants_beyond_the_year_2255_decide_without_overflow() {
    let clock = ManualClock::new(Timestamp::from_micros(u64::MAX));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    for policy in [bucket(2), window(2)] {
        assert!(store.check_now("k", &policy, 1).unwrap().is_allowed());
        assert!(store.check_now("k", &policy, 1).unwrap().is_allowed());
        let denied = store.check_now("k", &policy, 1).unwrap();
        assert_eq!(denied.outcome, Outcome::Limited);
        assert_eq!(denied.now, Timestamp::LATEST);
    }
}

#[test]
fn a_key_decided_by_its_digest_shares_state_with_its_text() {
    use std::hash::Hasher;
    let store = MemoryStore::builder().clock(clock()).build();
    let digest = |parts: &[&[u8]]| {
        let mut hasher = Store::key_hasher(&store).expect("the in-process store keys by digest");
        for part in parts {
            hasher.write(part);
        }
        hasher.finish()
    };
    let policy = bucket(3);
    // The text's bytes in one write: the digest `check_now` takes of the text.
    let first = Store::check_digest(&store, digest(&[b"limiter:client"]), &policy, 1).unwrap();
    assert_eq!(first.unwrap().remaining, 2);
    assert_eq!(
        store
            .check_now("limiter:client", &policy, 1)
            .unwrap()
            .remaining,
        1
    );
    let third = store.check_digest_at(
        digest(&[b"limiter:client"]),
        &policy,
        1,
        Timestamp::from_micros(T0),
    );
    assert_eq!(third.unwrap().remaining, 0);
    // Another key's digest is another bucket.
    let other = Store::check_digest(&store, digest(&[b"limiter:other"]), &policy, 1).unwrap();
    assert_eq!(other.unwrap().remaining, 2);
    assert_eq!(store.len(), 2);
}

/// A key checked again and again is its shard's hot entry, decided on without the lock (refusals and admissions):
/// every decision is still the algorithm's on the key's state, through refunds and peeks (which put the entry back
/// into its node), other keys and the clock moving on, against a model kept with the algorithms' own functions.
#[test]
fn a_hot_key_is_decided_on_its_state_through_refunds_and_time() {
    use std::collections::HashMap;
    use tollgate_core::Clock;
    use tollgate_core::algorithm::lockout::Locked;
    use tollgate_core::algorithm::{charge, sliding_window, token_bucket};

    let clock = clock();
    let store = MemoryStore::builder()
        .shards(1)
        .clock(clock.clone())
        .build();
    let policies = [bucket(3), window(3)];
    let mut buckets: HashMap<&str, token_bucket::TokenBucketState> = HashMap::new();
    let mut windows: HashMap<&str, sliding_window::SlidingWindowState> = HashMap::new();
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    let (mut refused, mut refunds) = (0, 0);
    for step in 0..20_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Mostly one hot key, so that its refusals come in runs (the copy is made on the second of a run).
        let key = ["hot", "hot", "hot", "other"][(rng & 3) as usize];
        let algorithm = ((rng >> 2) & 1) as usize;
        let policy = &policies[algorithm];
        let now = clock.now();
        let (got, want) = match (rng >> 8) % 64 {
            0 => {
                clock.advance(Duration::from_millis((rng >> 16) % 400));
                continue;
            }
            1 | 2 => {
                refunds += 1;
                let got = store.charge_at(key, policy, -1, now, now).unwrap();
                let want = if algorithm == 0 {
                    let state =
                        charge::token_bucket(buckets.get(key).copied(), &policy.quota(), -1, now);
                    buckets.insert(key, state);
                    let locked = Locked {
                        state,
                        locked_until: 0,
                    };
                    charge::decision(locked, 0, |s| {
                        token_bucket::decide(s, &policy.quota(), 0, now)
                    })
                } else {
                    let state =
                        charge::sliding_window(windows.get(key).copied(), policy, -1, now, now);
                    windows.insert(key, state);
                    let locked = Locked {
                        state,
                        locked_until: 0,
                    };
                    charge::decision(locked, 0, |s| sliding_window::decide(s, policy, 0, now))
                };
                (got, want)
            }
            3 => {
                let got = store.peek_at(key, policy, 1, now);
                let want = if algorithm == 0 {
                    token_bucket::decide(buckets.get(key).copied(), &policy.quota(), 1, now)
                        .decision
                } else {
                    sliding_window::decide(windows.get(key).copied(), policy, 1, now).decision
                };
                (got, want)
            }
            _ => {
                let cost = 1 + (rng >> 20) % 2;
                let got = store.check_at(key, policy, cost, now).unwrap();
                let want = if algorithm == 0 {
                    let s =
                        token_bucket::decide(buckets.get(key).copied(), &policy.quota(), cost, now);
                    if let Some(state) = s.state {
                        buckets.insert(key, state);
                    }
                    s.decision
                } else {
                    let s = sliding_window::decide(windows.get(key).copied(), policy, cost, now);
                    if let Some(state) = s.state {
                        windows.insert(key, state);
                    }
                    s.decision
                };
                refused += usize::from(!got.is_allowed());
                (got, want)
            }
        };
        assert_eq!(got, want, "step {step}: {key}, algorithm {algorithm}");
    }
    // The run was mostly refusals on the hot key, with refunds among them.
    assert!(
        refused > 10_000 && refunds > 300,
        "{refused} refused, {refunds} refunds"
    );
}

/// A hot key evicted by a new one starts afresh: the eviction puts the hot entry back into its node, and evicts
/// that.
#[test]
fn an_evicted_hot_key_starts_afresh() {
    let store = MemoryStore::builder().max_keys(1).clock(clock()).build();
    for policy in [bucket(1), window(1)] {
        let now = tollgate_core::Clock::now(store.clock());
        assert!(store.check_at("hot", &policy, 1, now).unwrap().is_allowed());
        for _ in 0..3 {
            assert!(!store.check_at("hot", &policy, 1, now).unwrap().is_allowed());
        }
        // The one slot goes to "new"; "hot" is then a new key with a full bucket or an empty window.
        let evicted = store.evictions().live;
        assert!(store.check_at("new", &policy, 1, now).unwrap().is_allowed());
        assert_eq!(store.evictions().live, evicted + 1);
        assert!(store.check_at("hot", &policy, 1, now).unwrap().is_allowed());
    }
}
