//! MemoryStore's lockouts, kept in a side table beside the entries, against a model of the entry that
//! carries its own lockout end (`Locked<state>`, what the store kept before): checks, peeks and charges by
//! policies with and without a lockout sharing keys, both algorithms, time advancing and sweeps, on a manual
//! clock. Every decision and the store's size must equal the model's. Then evictions and sweeps: a lockout goes with
//! its evicted or swept entry, and a locked entry is not evicted as decayed.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::algorithm::lockout::{self, Locked};
use tollgate_core::algorithm::sliding_window::{self, SlidingWindowState};
use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};
use tollgate_core::algorithm::{Step, charge};
use tollgate_core::{Clock, Decision, ManualClock, MemoryStore, Outcome, Policy, Quota, Timestamp};

const T0: u64 = 1_700_000_000_000_000;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Check(u64),
    Peek(u64),
    Charge(i64),
}

#[derive(Debug, Clone)]
enum Op {
    Use {
        key: u8,
        window: bool,
        lockout: bool,
        kind: Kind,
    },
    Advance(u64),
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        6 => (0u64..4).prop_map(Kind::Check),
        1 => (0u64..3).prop_map(Kind::Peek),
        1 => (-3i64..4).prop_map(Kind::Charge),
    ];
    prop_oneof![
        10 => (0u8..6, any::<bool>(), any::<bool>(), kind)
            .prop_map(|(key, window, lockout, kind)| Op::Use { key, window, lockout, kind }),
        3 => (1u64..900).prop_map(Op::Advance),
        1 => Just(Op::Sweep),
    ]
}

/// A token bucket of 3 a second and a sliding window of 3 a second, each with and without a 2 s lockout.
fn policy(window: bool, lockout: bool) -> Policy {
    let quota = Quota::per_second(3).unwrap();
    let policy = if window {
        Policy::sliding_window(quota).unwrap()
    } else {
        Policy::token_bucket(quota)
    };
    if lockout {
        policy.with_lockout(Duration::from_secs(2)).unwrap()
    } else {
        policy
    }
}

#[derive(Clone, Copy)]
enum State {
    Bucket(TokenBucketState),
    Window(SlidingWindowState),
}

/// An entry as the store kept it with the lockout inside: the state, its lockout end, and its own expiry (a
/// bucket's `full_at`, a window's last reset).
#[derive(Clone, Copy)]
struct Entry {
    state: State,
    locked_until: u64,
    expires_at: u64,
}

impl Entry {
    /// A lockout keeps its entry: it is swept only when both have passed.
    fn expires_at(&self) -> u64 {
        self.expires_at.max(self.locked_until)
    }
}

#[derive(Default)]
struct Model {
    entries: HashMap<(u8, bool), Entry>,
}

fn bucket(e: &Entry) -> Option<Locked<TokenBucketState>> {
    match e.state {
        State::Bucket(state) => Some(Locked {
            state,
            locked_until: e.locked_until,
        }),
        State::Window(_) => None,
    }
}

fn window(e: &Entry) -> Option<Locked<SlidingWindowState>> {
    match e.state {
        State::Window(state) => Some(Locked {
            state,
            locked_until: e.locked_until,
        }),
        State::Bucket(_) => None,
    }
}

impl Model {
    fn apply(&mut self, key: u8, policy: &Policy, kind: Kind, now: Timestamp) -> Decision {
        let is_window = policy.algorithm() == tollgate_core::Algorithm::SlidingWindowCounter;
        let held = self.entries.get(&(key, is_window)).copied();
        let lockout_us = policy.lockout_micros();
        let quota = policy.quota();
        let step: Step<(State, u64)> = if is_window {
            let held = held.as_ref().and_then(window);
            let step = match kind {
                Kind::Check(cost) | Kind::Peek(cost) => lockout::decide(held, lockout_us, |s| {
                    sliding_window::decide(s, policy, cost, now)
                }),
                Kind::Charge(delta) => {
                    let state = Locked {
                        state: charge::sliding_window(
                            held.map(|s| s.state),
                            policy,
                            delta,
                            now,
                            now,
                        ),
                        locked_until: held.map_or(0, |s| s.locked_until),
                    };
                    Step {
                        decision: charge::decision(state, lockout_us, |s| {
                            sliding_window::decide(s, policy, 0, now)
                        }),
                        state: Some(state),
                    }
                }
            };
            Step {
                decision: step.decision,
                state: step.state.map(|s| (State::Window(s.state), s.locked_until)),
            }
        } else {
            let held = held.as_ref().and_then(bucket);
            let step = match kind {
                Kind::Check(cost) | Kind::Peek(cost) => lockout::decide(held, lockout_us, |s| {
                    token_bucket::decide(s, &quota, cost, now)
                }),
                Kind::Charge(delta) => {
                    let state = Locked {
                        state: charge::token_bucket(held.map(|s| s.state), &quota, delta, now),
                        locked_until: held.map_or(0, |s| s.locked_until),
                    };
                    Step {
                        decision: charge::decision(state, lockout_us, |s| {
                            token_bucket::decide(s, &quota, 0, now)
                        }),
                        state: Some(state),
                    }
                }
            };
            Step {
                decision: step.decision,
                state: step.state.map(|s| (State::Bucket(s.state), s.locked_until)),
            }
        };
        if matches!(kind, Kind::Peek(_)) {
            return step.decision;
        }
        if let Some((state, locked_until)) = step.state {
            let expires_at = match state {
                State::Bucket(s) => s.full_at,
                State::Window(_) => step.decision.reset.as_micros(),
            };
            let entry = Entry {
                state,
                locked_until,
                expires_at,
            };
            let slot = (key, is_window);
            // A new key whose state says nothing a fresh one would not is not stored.
            if self.entries.contains_key(&slot) || entry.expires_at() > now.as_micros() {
                self.entries.insert(slot, entry);
            }
        }
        step.decision
    }

    fn sweep(&mut self, now: u64) {
        self.entries.retain(|_, e| e.expires_at() > now);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn lockouts_beside_the_entries_decide_as_lockouts_inside_them(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let clock = ManualClock::new(Timestamp::from_micros(T0));
        // One shard, far from its bound and below the size that sweeps by itself: only `Sweep` removes keys.
        let store = MemoryStore::builder().max_keys(1 << 12).shards(1).clock(clock.clone()).build();
        let mut model = Model::default();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Use { key, window, lockout, kind } => {
                    let policy = policy(window, lockout);
                    let now = clock.now();
                    let name = format!("k{key}");
                    let got = match kind {
                        Kind::Check(cost) => store.check_now(&name, &policy, cost).unwrap(),
                        Kind::Peek(cost) => store.peek_now(&name, &policy, cost),
                        Kind::Charge(delta) => store.charge_at(&name, &policy, delta, now, now).unwrap(),
                    };
                    let want = model.apply(key, &policy, kind, now);
                    prop_assert_eq!(got, want, "op {} {:?}", i, op);
                }
                Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                Op::Sweep => {
                    store.sweep();
                    model.sweep(clock.now().as_micros());
                }
            }
            prop_assert_eq!(store.len(), model.entries.len(), "op {} {:?}", i, op);
        }
    }
}

/// A store of `max_keys` keys in one shard, on a manual clock.
fn small_store(max_keys: usize) -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    let store = MemoryStore::builder()
        .max_keys(max_keys)
        .shards(1)
        .clock(clock.clone())
        .build();
    (store, clock)
}

#[test]
fn an_evicted_entry_takes_its_lockout_with_it() {
    for window in [false, true] {
        let (store, clock) = small_store(2);
        let locking = policy(window, true);
        // "a" denied, so locked for 2 s.
        for _ in 0..3 {
            assert!(store.check_now("a", &locking, 1).unwrap().is_allowed());
        }
        assert_eq!(
            store.check_now("a", &locking, 1).unwrap().outcome,
            Outcome::Limited
        );
        clock.advance(Duration::from_millis(10));
        // Three new keys in a store of two: "b" is added; "c" evicts "b" (the hand passes "a", used since it was
        // added, and clears its bit); "d" evicts "a" (live: it is locked).
        assert!(store.check_now("b", &locking, 1).unwrap().is_allowed());
        assert!(store.check_now("c", &locking, 1).unwrap().is_allowed());
        assert_eq!(store.peek_now("a", &locking, 0).outcome, Outcome::Limited); // held (a peek is no use)
        assert!(store.check_now("d", &locking, 1).unwrap().is_allowed());
        assert_eq!((store.len(), store.evictions().live), (2, 2), "{window}");
        // "a" again: a new key, and its next request is decided by its own fresh state, not the old lockout.
        assert!(store.check_now("a", &locking, 1).unwrap().is_allowed());
        let next = store.check_now("a", &locking, 1).unwrap();
        assert!(next.is_allowed(), "{window}: {next:?}");
        assert_eq!(next.remaining, 1, "{window}");
    }
}

/// (A token bucket: a sliding window's own expiry, its reset, is never before a lockout that its policy set.)
#[test]
fn a_locked_entry_whose_state_decayed_is_not_evicted_as_decayed() {
    let (store, clock) = small_store(2);
    let (locking, plain) = (policy(false, true), policy(false, false));
    for _ in 0..3 {
        assert!(store.check_now("locked", &locking, 1).unwrap().is_allowed());
    }
    assert!(!store.check_now("locked", &locking, 1).unwrap().is_allowed()); // locked for 2 s
    // "idle" after it, so "locked" is in the first slot, where the hands start.
    assert!(store.check_now("idle", &plain, 1).unwrap().is_allowed());
    // 1.9 s on, both buckets (3 a second) are full again, but "locked" is locked for 0.1 s more: of the two, only
    // "idle" has decayed, and it is the one a new key evicts.
    clock.advance(Duration::from_millis(1_900));
    assert!(store.check_now("new", &plain, 1).unwrap().is_allowed());
    assert_eq!((store.len(), store.evictions().live), (2, 0));
    let locked = store.check_now("locked", &locking, 0).unwrap();
    assert_eq!(locked.outcome, Outcome::Limited);
    assert_eq!(locked.retry_after, Some(Duration::from_millis(100)));
    // And "idle" is a fresh key again.
    assert_eq!(store.peek_now("idle", &plain, 1).remaining, 2);
}

/// A sweep drops a lockout with its entry: after a clock step back to within the old lockout, the key is new (a
/// lockout left behind in the side table would lock it again).
#[test]
fn a_swept_entry_takes_its_lockout_with_it() {
    for window in [false, true] {
        let (store, clock) = small_store(64);
        let locking = policy(window, true);
        for _ in 0..3 {
            assert!(store.check_now("a", &locking, 1).unwrap().is_allowed());
        }
        assert!(!store.check_now("a", &locking, 1).unwrap().is_allowed()); // locked for 2 s
        clock.advance(Duration::from_secs(5));
        store.sweep();
        assert_eq!(store.len(), 0, "{window}");
        // Back to 1 s after the lockout began: "a" is a new key, decided by its own fresh state.
        let back = Timestamp::from_micros(T0 + 1_000_000);
        assert!(store.check_at("a", &locking, 1, back).unwrap().is_allowed());
        let next = store.check_at("a", &locking, 1, back).unwrap();
        assert!(next.is_allowed(), "{window}: {next:?}");
        assert_eq!(next.remaining, 1, "{window}");
    }
}
