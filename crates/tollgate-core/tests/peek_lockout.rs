//! MemoryStore's peek and lockouts on a manual clock: a peek leaves the key's state, its visited bit (what
//! eviction goes by) and the store's size alone; a lockout outlives the quota's own state and ends exactly.

use std::time::Duration;

use tollgate_core::{ManualClock, MemoryStore, Outcome, Policy, Quota, Timestamp};

const T0: u64 = 1_700_000_000_000_000;

#[test]
fn a_peek_does_not_make_a_key_recent() {
    // Two keys fit; at the bound the first the hand meets that was not used since it was added goes.
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    let store = MemoryStore::builder()
        .max_keys(2)
        .shards(1)
        .clock(clock.clone())
        .build();
    let policy = Policy::token_bucket(Quota::per_hour(1).unwrap());
    assert!(store.check_now("a", &policy, 1).unwrap().is_allowed());
    assert!(store.check_now("b", &policy, 1).unwrap().is_allowed());
    // A peek of "a" (and of a key never seen) is no use: "a" stays unvisited, first at the hand; nothing is added.
    assert_eq!(store.peek_now("a", &policy, 1).outcome, Outcome::Limited);
    assert!(store.peek_now("c", &policy, 1).is_allowed());
    assert_eq!(store.len(), 2);
    assert!(store.check_now("c", &policy, 1).unwrap().is_allowed());
    // "a" was evicted (a fresh bucket again), "b" kept its state.
    assert!(store.peek_now("a", &policy, 1).is_allowed());
    assert_eq!(store.peek_now("b", &policy, 1).outcome, Outcome::Limited);
}

#[test]
fn a_peek_equals_the_decision_and_changes_nothing() {
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    for policy in [
        Policy::token_bucket(Quota::per_second(3).unwrap()),
        Policy::sliding_window(Quota::per_second(3).unwrap()).unwrap(),
    ] {
        for step in 0..12 {
            for cost in 0..=4 {
                let peeked = store.peek_now("k", &policy, cost);
                assert_eq!(
                    peeked,
                    store.peek_now("k", &policy, cost),
                    "peek is repeatable"
                );
            }
            // The next request gets exactly what its peek said.
            let peeked = store.peek_now("k", &policy, 1);
            let decided = store.check_now("k", &policy, 1).unwrap();
            assert_eq!(peeked, decided, "{policy:?} step {step}");
            clock.advance(Duration::from_millis(90));
        }
    }
}

#[test]
fn a_lockout_outlives_the_quota_state_and_ends_exactly() {
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let lockout = Duration::from_secs(30);
    let policy = Policy::sliding_window(Quota::per_second(2).unwrap())
        .unwrap()
        .with_lockout(lockout)
        .unwrap();
    assert!(store.check_now("k", &policy, 2).unwrap().is_allowed());
    let denied = store.check_now("k", &policy, 1).unwrap();
    assert_eq!(denied.retry_after, Some(lockout));
    assert_eq!(denied.reset, Timestamp::from_micros(T0 + 30_000_000));
    // Long after both windows decayed the key is still tracked (a sweep keeps it), and still locked.
    clock.advance(Duration::from_secs(10));
    store.sweep();
    assert_eq!(store.len(), 1);
    let locked = store.check_now("k", &policy, 1).unwrap();
    assert_eq!(locked.retry_after, Some(Duration::from_secs(20)));
    clock.advance(Duration::from_secs(20) - Duration::from_micros(1));
    assert_eq!(
        store.check_now("k", &policy, 1).unwrap().retry_after,
        Some(Duration::from_micros(1))
    );
    clock.advance(Duration::from_micros(1));
    assert!(store.check_now("k", &policy, 2).unwrap().is_allowed());
}
