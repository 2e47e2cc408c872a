//! How a step on a shard decides: a plain check, a closure, or a step with the key's lockout.

use super::entry::Entry;
use crate::algorithm::Step;
use crate::algorithm::lockout::Locked;
use crate::{Policy, Timestamp};

/// How a shard's `apply` decides: a request without a lockout ([`Check`]), any step on the algorithm's state (a
/// closure), or a step on the state with its lockout ([`WithLockout`]: a lockout policy, a charge, a lease).
pub(super) trait Decide<S> {
    /// Whether the step reads and may set the key's lockout (in the shard's lockout table).
    const LOCKOUT: bool;
    /// The step on the key's state (`None`: not held) under the lockout ending at `locked_until` (0: none, or not
    /// read), and the lockout end to keep with the new state.
    fn decide<E: Entry<State = S>>(self, state: Option<S>, locked_until: u64) -> (Step<S>, u64);
}

impl<S, F: FnOnce(Option<S>) -> Step<S>> Decide<S> for F {
    const LOCKOUT: bool = false;
    #[inline]
    fn decide<E: Entry<State = S>>(self, state: Option<S>, _: u64) -> (Step<S>, u64) {
        (self(state), 0)
    }
}

/// A request's check without a lockout: [`Entry::check`], a direct call the compiler inlines (a closure measured
/// called out of line, ~50 instructions more per check).
#[derive(Clone, Copy)]
pub(super) struct Check<'a> {
    pub(super) policy: &'a Policy,
    pub(super) cost: u64,
    pub(super) now: Timestamp,
}

impl<S> Decide<S> for Check<'_> {
    const LOCKOUT: bool = false;
    #[inline(always)]
    fn decide<E: Entry<State = S>>(self, state: Option<S>, _: u64) -> (Step<S>, u64) {
        (E::check(state, self.policy, self.cost, self.now), 0)
    }
}

/// A step on the state and its lockout ([`lockout::decide`](crate::algorithm::lockout::decide), a charge), for the
/// policies that have one.
pub(super) struct WithLockout<F>(pub(super) F);

impl<S: Copy, F: FnOnce(Option<Locked<S>>) -> Step<Locked<S>>> Decide<S> for WithLockout<F> {
    const LOCKOUT: bool = true;
    #[inline(always)]
    fn decide<E: Entry<State = S>>(self, state: Option<S>, locked_until: u64) -> (Step<S>, u64) {
        let step = (self.0)(state.map(|state| Locked {
            state,
            locked_until,
        }));
        let kept = step.state.map_or(locked_until, |s| s.locked_until);
        let step = Step {
            decision: step.decision,
            state: step.state.map(|s| s.state),
        };
        (step, kept)
    }
}
