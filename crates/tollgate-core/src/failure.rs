//! What a limiter does when its store cannot decide.
//!
//! A shared store can time out, crash or be partitioned away; the limiter must then answer at once, the way
//! its owner chose. Neither answer is right for everyone: failing open protects availability, failing closed
//! protects against abuse, and a local fallback keeps a per-instance limit in force.
//!
//! ```
//! use tollgate_core::{FailurePolicy, Outcome, Policy, Quota, Timestamp};
//!
//! let policy = Policy::token_bucket(Quota::per_second(5)?);
//! let now = Timestamp::from_micros(1_000_000);
//! assert_eq!(FailurePolicy::Open.synthesize(&policy, now).unwrap().outcome, Outcome::Allowed);
//! assert_eq!(FailurePolicy::Closed.synthesize(&policy, now).unwrap().outcome, Outcome::Limited);
//! assert!(FailurePolicy::Local.synthesize(&policy, now).is_none()); // the caller asks its local store
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{Decision, Outcome, Policy, Timestamp};

/// The answer when the store fails (timeout, error, open circuit, full key table).
///
/// The default is `Local`: a limiter must not be less available than the service it protects (a closed default
/// turns a Redis outage into a service outage), nor drop its protection at the moment traffic is highest (an open
/// default lets a flood through). While the shared store cannot answer, each instance enforces the whole limit on
/// its own, so a fleet of `n` instances admits at most `n` times the limit (what it admits with no shared store at
/// all), and one instance never more than the limit. Decisions go back to the shared store as soon as it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailurePolicy {
    /// Admit the request: availability first.
    Open,
    /// Reject the request: protection first.
    Closed,
    /// Decide on an in-process store with the same policy: a per-instance limit while the shared one is down
    /// (the default).
    #[default]
    Local,
}

impl FailurePolicy {
    /// The decision for `Open` and `Closed`; `None` for `Local`, which the caller answers from its local store.
    ///
    /// A closed answer asks the client to retry after one period at most (and at least one second), when the
    /// store may be back.
    #[must_use]
    pub fn synthesize(self, policy: &Policy, now: Timestamp) -> Option<Decision> {
        let quota = policy.quota();
        match self {
            Self::Open => Some(Decision {
                outcome: Outcome::Allowed,
                limit: quota.burst(),
                remaining: quota.burst().saturating_sub(1),
                reset: now,
                retry_after: None,
                now,
            }),
            Self::Closed => {
                let retry = quota
                    .period()
                    .clamp(Duration::from_secs(1), Duration::from_secs(60));
                Some(Decision {
                    outcome: Outcome::Limited,
                    limit: quota.burst(),
                    remaining: 0,
                    reset: now.saturating_add(retry),
                    retry_after: Some(retry),
                    now,
                })
            }
            Self::Local => None,
        }
    }

    /// A short stable name (`open`, `closed`, `local`) for flags, metrics and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Local => "local",
        }
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown failure policy name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseFailurePolicyError(String);

impl fmt::Display for ParseFailurePolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown failure policy {:?}: expected open, closed or local",
            self.0
        )
    }
}

impl std::error::Error for ParseFailurePolicyError {}

impl FromStr for FailurePolicy {
    type Err = ParseFailurePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(Self::Open),
            "closed" => Ok(Self::Closed),
            "local" => Ok(Self::Local),
            other => Err(ParseFailurePolicyError(other.to_owned())),
        }
    }
}
