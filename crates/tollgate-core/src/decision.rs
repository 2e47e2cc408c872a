//! The answer to one request: admitted or not, and the numbers clients see in headers.

use std::time::Duration;

use crate::Timestamp;

/// Whether a request was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Admitted; its cost was taken from the quota.
    Allowed,
    /// Rejected for now; `retry_after` says when the same request would be admitted.
    Limited,
    /// Rejected for good: the cost exceeds what the policy can ever admit at once (its burst).
    CostExceedsCapacity,
}

impl Outcome {
    /// A short stable name for metrics and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Limited => "limited",
            Self::CostExceedsCapacity => "cost_exceeds_capacity",
        }
    }
}

/// One decision with every number a response needs.
///
/// Headers are rendered from a `Decision` and nothing else: `now` is the decider's clock (the Redis server's,
/// for the Redis store), so "seconds until reset" never mixes two clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Admitted or not, and why not.
    pub outcome: Outcome,
    /// The most requests (of cost 1) that may be remaining at once: the quota's burst, which is its limit per
    /// period unless a token bucket's burst was set apart ([`Quota::window`](crate::Quota::window) is the time it
    /// takes to accrue).
    pub limit: u64,
    /// Whole requests (of cost 1) that would still be admitted right now.
    pub remaining: u64,
    /// When the full quota is available again, as stored with the key's state.
    pub reset: Timestamp,
    /// On `Limited`: how long until this same request would be admitted, absent other traffic. On an admission
    /// held by [`Store::check_held`](crate::Store::check_held): how long until the instant it was admitted as of.
    pub retry_after: Option<Duration>,
    /// The instant the decision was made, on the decider's clock.
    pub now: Timestamp,
}

impl Decision {
    /// Whether the request was admitted.
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed)
    }

    /// Time from the decision until `reset`.
    #[must_use]
    pub const fn reset_after(&self) -> Duration {
        self.reset.saturating_duration_since(self.now)
    }

    /// The state can be forgotten at `reset`: from then on it decides exactly like a fresh one.
    /// Stores use this as the key's time to live.
    #[must_use]
    pub const fn ttl(&self) -> Duration {
        self.reset_after()
    }
}
