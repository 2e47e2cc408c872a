//! At its key bound the store evicts (the default): a flood of new keys cannot take a new client's bucket away,
//! nor an active client's state, nor grow the store.

use std::time::Duration;

use tollgate_core::store::EvictionCounts;
use tollgate_core::{
    ManualClock, MemoryStore, OnFull, Outcome, Policy, Quota, StoreError, Timestamp,
};

const T0: u64 = 1_700_000_000_000_000;

fn clock() -> ManualClock {
    ManualClock::new(Timestamp::from_micros(T0))
}

/// 5 per second, burst 5 (the bucket) or 5 per window (the window): both deny the sixth request at once.
fn policies() -> [Policy; 2] {
    let quota = Quota::per_second(5).unwrap();
    [
        Policy::token_bucket(quota),
        Policy::sliding_window(quota).unwrap(),
    ]
}

fn store(max_keys: usize) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock())
        .max_keys(max_keys)
        .build()
}

#[test]
fn evicting_is_the_default() {
    assert_eq!(MemoryStore::new().on_full(), OnFull::Evict);
}

#[test]
fn in_a_flood_a_new_client_is_decided_by_its_own_bucket_never_the_failure_policy() {
    for policy in policies() {
        let store = store(1_000);
        for i in 0..20_000 {
            let d = store
                .check_now(&format!("flood-{i}"), &policy, 1)
                .unwrap_or_else(|e| panic!("{policy:?}: flood key {i}: {e}"));
            assert!(d.is_allowed(), "{policy:?}: each flood key is new");
            assert!(store.len() <= 1_000, "{policy:?}: len {}", store.len());
        }
        // A client that arrives at the full store: its own five, then limited by its own state.
        for n in 0..5 {
            let d = store.check_now("newcomer", &policy, 1).unwrap();
            assert!(d.is_allowed(), "{policy:?}: request {n}");
            assert_eq!(d.remaining, 4 - n, "{policy:?}: its own bucket");
        }
        assert_eq!(
            store.check_now("newcomer", &policy, 1).unwrap().outcome,
            Outcome::Limited,
            "{policy:?}"
        );
        let evicted = store.evictions();
        assert_eq!(
            evicted.live + evicted.decayed,
            20_001 - 1_000,
            "{policy:?}: one eviction per new key past the bound"
        );
        assert_eq!(
            evicted.decayed, 0,
            "{policy:?}: the clock stood still: nothing decayed"
        );
    }
}

#[test]
fn a_client_that_keeps_requesting_during_a_flood_keeps_its_state() {
    for policy in policies() {
        let store = store(1_000);
        // The abuser is limited; a regular client has spent two of its five.
        while store.check_now("abuser", &policy, 1).unwrap().is_allowed() {}
        for _ in 0..2 {
            store.check_now("regular", &policy, 1).unwrap();
        }
        for i in 0..20_000 {
            store.check_now(&format!("flood-{i}"), &policy, 1).unwrap();
            // Both come back every 25 new keys, so each is used again long before the hand comes round (each new
            // key moves it on by one at least; a shard holds 500): never evicted (an eviction takes a decayed
            // entry or one not used since the hand last passed it; both hold state).
            if i % 25 == 0 {
                let d = store.check_now("abuser", &policy, 1).unwrap();
                assert_eq!(
                    d.outcome,
                    Outcome::Limited,
                    "{policy:?}: flood key {i}: the abuser got a fresh bucket"
                );
                let d = store.check_now("regular", &policy, 0).unwrap();
                assert_eq!(d.remaining, 3, "{policy:?}: flood key {i}");
            }
        }
        assert!(store.len() <= 1_000);
    }
}

#[test]
fn decayed_keys_are_evicted_before_live_ones() {
    // 8 keys, one shard, in slot order (the scout looks at 4 from where the last eviction left it, then the CLOCK
    // hand takes the first not used since it last passed).
    for policy in policies() {
        let clock = clock();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(8)
            .build();
        for i in 0..8 {
            store.check_now(&format!("old-{i}"), &policy, 1).unwrap();
        }
        // Every old key decays back to fresh after at most two periods; then live ones arrive.
        clock.advance(Duration::from_secs(2));
        while store.check_now("live", &policy, 1).unwrap().is_allowed() {}
        for i in 0..3 {
            store.check_now(&format!("new-{i}"), &policy, 1).unwrap();
        }
        let e = store.evictions();
        assert_eq!((e.decayed, e.live), (4, 0), "{policy:?}");
        // "live" comes back (a check of cost 0 is a use too), then 5 more: the remaining 4 decayed keys go first,
        // then "new-0", the first the hand meets that was not used since it was added ("live" was: it is passed).
        store.check_now("live", &policy, 0).unwrap();
        for i in 3..8 {
            store.check_now(&format!("new-{i}"), &policy, 1).unwrap();
        }
        let e = store.evictions();
        assert_eq!((e.decayed, e.live), (8, 1), "{policy:?}");
        assert_eq!(
            store.check_now("live", &policy, 1).unwrap().outcome,
            Outcome::Limited,
            "{policy:?}: \"live\" was used, and passed over"
        );
        assert_eq!(
            store.check_now("new-0", &policy, 0).unwrap().remaining,
            5,
            "{policy:?}: \"new-0\" was, and starts afresh"
        );
    }
}

#[test]
fn in_a_large_shard_decayed_keys_are_found_first() {
    // Short-lived keys (decayed 100 ms on) and long-lived ones, interleaved, fill one shard of 1000 at one instant
    // (so no sweep while it grows finds any decayed); then the short-lived ones decay.
    let short = Quota::new(5, Duration::from_millis(50)).unwrap();
    let long = Quota::per_hour(5).unwrap();
    for (short, long) in [
        (Policy::token_bucket(short), Policy::token_bucket(long)),
        (
            Policy::sliding_window(short).unwrap(),
            Policy::sliding_window(long).unwrap(),
        ),
    ] {
        let clock = clock();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(1_000)
            .shards(1)
            .build();
        for i in 0..500 {
            store.check_now(&format!("short-{i}"), &short, 1).unwrap();
            store.check_now(&format!("long-{i}"), &long, 1).unwrap();
        }
        assert_eq!(store.len(), 1_000);
        clock.advance(Duration::from_millis(100));
        // Full: half decayed, half live, alternating in slot order. 250 new keys: the scout, which looks at 4
        // entries from where the last eviction left it, meets a decayed one within 2 every time (none is live-
        // evicted; a sampled eviction, as the store once had, expected about 12, hence the bound of 60).
        for i in 0..250 {
            store.check_now(&format!("new-{i}"), &long, 1).unwrap();
        }
        let e = store.evictions();
        assert_eq!(e.live + e.decayed, 250, "{long:?}");
        assert!(e.live <= 60, "{long:?}: {e:?}");
    }
}

#[test]
fn a_decayed_key_deep_in_a_full_shard_is_found_by_the_hand() {
    // One short-lived key in the middle of a shard of 1000 long-lived ones, filled at one instant; then it decays
    // and new keys arrive. Each eviction's scout looks at 4 entries from where the last left off, starting at
    // the first slot, while the CLOCK hand moves 1: it passes the whole shard within 1000 / 4 evictions, so the
    // decayed key is evicted by then (the 126th; the evictions before it take the oldest live keys, none of which
    // was used since it was added, in slot order: as an exact LRU would).
    let short = Quota::new(5, Duration::from_millis(50)).unwrap();
    let long = Quota::per_hour(5).unwrap();
    for (short, long) in [
        (Policy::token_bucket(short), Policy::token_bucket(long)),
        (
            Policy::sliding_window(short).unwrap(),
            Policy::sliding_window(long).unwrap(),
        ),
    ] {
        let clock = clock();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(1_000)
            .shards(1)
            .build();
        for i in 0..999 {
            if i == 500 {
                store.check_now("short", &short, 1).unwrap();
            }
            store.check_now(&format!("long-{i}"), &long, 1).unwrap();
        }
        assert_eq!(store.len(), 1_000);
        clock.advance(Duration::from_millis(100));
        let mut found = None;
        for i in 0..1_000 / 3 {
            store.check_now(&format!("new-{i}"), &long, 1).unwrap();
            if found.is_none() && store.evictions().decayed == 1 {
                found = Some(i);
            }
        }
        let e = store.evictions();
        assert_eq!((e.live + e.decayed, e.decayed), (333, 1), "{long:?}");
        // Found on the scout's first pass; the most recent keys keep their state.
        assert!(
            found.is_some_and(|i| i < 200),
            "{long:?}: found at {found:?}"
        );
        assert_eq!(store.check_now("long-998", &long, 0).unwrap().remaining, 4);
    }
}

#[test]
fn the_bound_is_met_exactly_however_many_shards_are_asked_for() {
    for max_keys in [1, 3, 64, 300, 4_096] {
        let store = MemoryStore::builder()
            .clock(clock())
            .max_keys(max_keys)
            .shards(16)
            .build();
        for i in 0..max_keys * 3 {
            store
                .check_now(&format!("k{i}"), &policies()[0], 1)
                .unwrap();
            assert!(store.len() <= max_keys);
        }
        // Each shard holds at most its share (4096 is 16 shards of 256), and fills up to it.
        assert!(
            store.len() * 10 >= max_keys * 9,
            "max_keys {max_keys}: only {} held",
            store.len()
        );
    }
}

#[test]
fn a_bucket_and_a_window_share_the_bound() {
    let store = store(300);
    let [bucket, window] = policies();
    for i in 0..1_000 {
        store.check_now(&format!("b{i}"), &bucket, 1).unwrap();
        store.check_now(&format!("w{i}"), &window, 1).unwrap();
        assert!(store.len() <= 300);
    }
    // The most recent keys of both algorithms are still there (the last 25 of each, spent one of five: one hand
    // walks both algorithms' slots, a new key takes the slot just behind it, and 50 are far fewer than the 300
    // it goes round before it meets them again).
    for i in 975..1_000 {
        assert_eq!(
            store
                .check_now(&format!("b{i}"), &bucket, 0)
                .unwrap()
                .remaining,
            4
        );
        assert_eq!(
            store
                .check_now(&format!("w{i}"), &window, 0)
                .unwrap()
                .remaining,
            4
        );
    }
}

#[test]
fn concurrent_floods_from_threads_stay_bounded_and_keep_the_active_client() {
    for policy in policies() {
        let store = store(2_000);
        while store.check_now("abuser", &policy, 1).unwrap().is_allowed() {}
        let threads = 4;
        let per_thread = 10_000;
        std::thread::scope(|s| {
            for t in 0..threads {
                let (store, policy) = (&store, &policy);
                s.spawn(move || {
                    for i in 0..per_thread {
                        let d = store
                            .check_now(&format!("t{t}-{i}"), policy, 1)
                            .expect("a flood key is decided, never refused");
                        assert!(d.is_allowed());
                        assert!(store.len() <= 2_000);
                        // The abuser keeps requesting, from every thread: whichever threads run, it is used again
                        // within 16 or so new keys of its 500-key shard, far fewer than the hand's revolution, and
                        // only a key not used since the hand passed it (or a decayed key) is evicted.
                        if i % 4 == 0 {
                            let d = store.check_now("abuser", policy, 1).unwrap();
                            assert_eq!(d.outcome, Outcome::Limited, "t{t} key {i}");
                        }
                    }
                });
            }
        });
        let e = store.evictions();
        assert_eq!(
            e.live + e.decayed,
            (threads * per_thread + 1 - store.len()) as u64,
            "{policy:?}"
        );
    }
}

#[test]
fn a_refusing_store_still_refuses() {
    let store = MemoryStore::builder()
        .clock(clock())
        .on_full(OnFull::Refuse)
        .max_keys(4)
        .build();
    for i in 0..4 {
        store
            .check_now(&format!("k{i}"), &policies()[0], 1)
            .unwrap();
    }
    assert!(matches!(
        store.check_now("k4", &policies()[0], 1),
        Err(StoreError::KeyCapacity { max_keys: 4 })
    ));
    assert_eq!(store.evictions(), EvictionCounts::default());
}

/// Counts the warnings logged on this thread.
#[derive(Default, Clone)]
struct Warnings(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Warnings {
    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn evicting_live_keys_is_warned_about_rate_limited_and_evicting_decayed_ones_is_not() {
    let warnings = Warnings::default();
    let started = std::time::Instant::now();
    tracing::subscriber::with_default(warnings.clone(), || {
        let clock = clock();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(4)
            .name("per-client")
            .build();
        let policy = &policies()[0];
        for i in 0..4 {
            store.check_now(&format!("old-{i}"), policy, 1).unwrap();
        }
        clock.advance(Duration::from_secs(2));
        for i in 0..4 {
            store.check_now(&format!("new-{i}"), policy, 1).unwrap();
        }
        assert_eq!(store.evictions().decayed, 4);
        assert_eq!(warnings.count(), 0, "evicting decayed keys loses nothing");
        for i in 0..10_000 {
            store.check_now(&format!("flood-{i}"), policy, 1).unwrap();
        }
        assert_eq!(store.evictions().live, 10_000);
    });
    // One warning at the first live eviction, then at most one every 10 s (real time: allow for a slow run).
    let windows = 1 + started.elapsed().as_secs() as usize / 10;
    assert!(
        (1..=windows).contains(&warnings.count()),
        "{} warnings in {windows} windows of 10 s",
        warnings.count()
    );
}
