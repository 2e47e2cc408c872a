//! The fixed window on the in-process store: its state kept in the sliding window's slab (a window start and a
//! count, `previous` unused), under the key's digest mixed with a constant so that the same key under a sliding
//! window and a fixed window has two states, as it has under two algorithms on the Redis store.

use crate::algorithm::Step;
use crate::algorithm::fixed_window::{self, FixedWindowState};
use crate::algorithm::lockout;
use crate::algorithm::sliding_window::SlidingWindowState;
use crate::{Decision, Policy, StoreError, Timestamp};

use super::MemoryStore;
use super::decide::WithLockout;
use super::entry::{Window, WindowEntry};
use super::lock::lock;

/// Mixed into a key's digest for its fixed-window state (any odd constant: distinct keys stay distinct).
const FIXED_WINDOW_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

fn to_fixed(state: SlidingWindowState) -> FixedWindowState {
    FixedWindowState {
        window_start: state.window_start,
        count: state.current,
    }
}

fn to_window(state: FixedWindowState) -> SlidingWindowState {
    SlidingWindowState {
        window_start: state.window_start,
        previous: 0,
        current: state.count,
    }
}

impl<C: crate::Clock> MemoryStore<C> {
    /// A fixed window's decision for the key whose digest is `hash` (lockout or not: one path, it is not the
    /// default algorithm's hot path).
    pub(super) fn check_fixed_at(
        &self,
        hash: u64,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        let hash = hash ^ FIXED_WINDOW_SALT;
        let (bound, log) = self.bound_and_log();
        let lockout = policy.lockout_micros();
        lock(self.shard(hash)).apply::<WindowEntry, _>(
            hash,
            now,
            bound,
            log,
            Window::fixed(policy),
            WithLockout(|s: Option<lockout::Locked<SlidingWindowState>>| {
                let s = s.map(|s| lockout::Locked {
                    state: to_fixed(s.state),
                    locked_until: s.locked_until,
                });
                let step =
                    lockout::decide(s, lockout, |s| fixed_window::decide(s, policy, cost, now));
                Step {
                    decision: step.decision,
                    state: step.state.map(|s| lockout::Locked {
                        state: to_window(s.state),
                        locked_until: s.locked_until,
                    }),
                }
            }),
        )
    }

    /// What a fixed window's request would get, changing nothing.
    pub(super) fn peek_fixed_at(
        &self,
        hash: u64,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Decision {
        let hash = hash ^ FIXED_WINDOW_SALT;
        let lockout = policy.lockout_micros();
        let state = self
            .locked_window(hash, lockout, Window::fixed(policy))
            .map(|s| lockout::Locked {
                state: to_fixed(s.state),
                locked_until: s.locked_until,
            });
        lockout::decide(state, lockout, |s| {
            fixed_window::decide(s, policy, cost, now)
        })
        .decision
    }
}
