//! The eviction order against a model: a store of at most 20 keys (one shard) decides every request exactly as an
//! unbounded store that forgets, at each insertion past the bound, the key the rule of `support/clock_model.rs`
//! names: CLOCK over the slots (token buckets' then sliding windows'), a decayed key at the hand first, else the
//! first unvisited one unless one of the 3 after it is decayed. A new key of the victim's algorithm takes its
//! slot; one of the other algorithm is added after its own slab's last, the victim's slot going to its slab's
//! last key. (This spec replaced exact recency order with a hand that looked at 4 entries for a decayed one,
//! else took the least recently used.) Manual clock; token bucket and sliding window alike, alone and sharing
//! the store.

#[path = "support/clock_model.rs"]
mod clock_model;

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::algorithm::{sliding_window, token_bucket};
use tollgate_core::{
    Algorithm, Clock, Decision, ManualClock, MemoryStore, Policy, Quota, Timestamp,
};

const T0: u64 = 1_700_000_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Check { key: u8, window: bool, cost: u64 },
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..28, any::<bool>(), 0u64..3).prop_map(|(key, window, cost)| Op::Check { key, window, cost }),
        1 => (1u64..400).prop_map(Op::Advance),
    ]
}

/// One algorithm's state in the model, with its last use.
#[derive(Clone, Copy)]
enum State {
    Bucket(token_bucket::TokenBucketState),
    Window(sliding_window::SlidingWindowState, u64),
}

impl State {
    fn expires_at(&self) -> u64 {
        match self {
            Self::Bucket(s) => s.full_at,
            Self::Window(_, e) => *e,
        }
    }
}

struct Model {
    max_keys: usize,
    entries: HashMap<(u8, bool), State>,
    clock: clock_model::Clock<(u8, bool)>,
}

impl Model {
    fn check(&mut self, key: u8, policy: &Policy, cost: u64, now: Timestamp) -> Decision {
        let window = policy.algorithm() == Algorithm::SlidingWindowCounter;
        let held = self.entries.get(&(key, window)).copied();
        let (decision, state) = if window {
            let held = match held {
                Some(State::Window(s, _)) => Some(s),
                _ => None,
            };
            let step = sliding_window::decide(held, policy, cost, now);
            let reset = step.decision.reset.as_micros();
            (step.decision, step.state.map(|s| State::Window(s, reset)))
        } else {
            let held = match held {
                Some(State::Bucket(s)) => Some(s),
                _ => None,
            };
            let step = token_bucket::decide(held, &policy.quota(), cost, now);
            (step.decision, step.state.map(State::Bucket))
        };
        if let Some(entry) = self.entries.get_mut(&(key, window)) {
            if let Some(state) = state {
                *entry = state;
            }
            self.clock.touch((key, window));
            return decision;
        }
        let Some(state) = state else {
            return decision;
        };
        let now = now.as_micros();
        if state.expires_at() <= now {
            return decision;
        }
        if self.entries.len() >= self.max_keys {
            let entries = &self.entries;
            let (victim, _) = self
                .clock
                .victim(|k| entries[&k].expires_at() <= now)
                .unwrap();
            self.entries.remove(&victim);
            self.entries.insert((key, window), state);
            if victim.1 == window {
                self.clock.replace(victim, (key, window));
            } else {
                self.clock.remove(victim);
                self.clock.push(usize::from(window), (key, window));
            }
            return decision;
        }
        self.entries.insert((key, window), state);
        self.clock.push(usize::from(window), (key, window));
        decision
    }
}

fn policy(window: bool) -> Policy {
    let quota = Quota::new(3, Duration::from_secs(1)).unwrap();
    if window {
        Policy::sliding_window(quota).unwrap()
    } else {
        Policy::token_bucket(quota)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn evictions_follow_the_model(
        max_keys in 1usize..=20,
        only in prop_oneof![Just(None), Just(Some(false)), Just(Some(true))],
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let clock = ManualClock::new(Timestamp::from_micros(T0));
        let store = MemoryStore::builder().clock(clock.clone()).max_keys(max_keys).build();
        let mut model = Model { max_keys, entries: HashMap::new(), clock: clock_model::Clock::new() };
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                Op::Check { key, window, cost } => {
                    let window = only.unwrap_or(window);
                    let policy = policy(window);
                    let got = store.check_now(&format!("k{key}"), &policy, cost).unwrap();
                    let want = model.check(key, &policy, cost, clock.now());
                    prop_assert_eq!(got, want, "op {} {:?}", i, op);
                    prop_assert_eq!(store.len(), model.entries.len(), "op {} {:?}", i, op);
                }
            }
        }
    }
}
