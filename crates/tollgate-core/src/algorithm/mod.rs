//! The algorithms as pure functions: `(state, policy, cost, now) → (decision, new state)`.
//!
//! Integer arithmetic only, written so that `lua/*.lua` can port each line: every product and sum stays
//! below 2^53 for any policy that [`Quota`](crate::Quota) accepts.
//!
//! ```
//! use tollgate_core::algorithm::token_bucket;
//! use tollgate_core::{Quota, Timestamp};
//!
//! let quota = Quota::per_second(2)?;
//! let now = Timestamp::from_micros(1_000_000);
//! let first = token_bucket::decide(None, &quota, 1, now);
//! assert!(first.decision.is_allowed());
//! assert_eq!(first.decision.remaining, 1);
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

pub mod charge;
pub mod fixed_window;
pub mod lockout;
pub mod sliding_window;
pub mod sliding_window_lease;
pub mod token_bucket;
pub mod token_bucket_lease;

use crate::Decision;

/// A decision and the state to persist (`None`: leave the stored state as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step<S> {
    /// The decision.
    pub decision: Decision,
    /// The new state, if it changed.
    pub state: Option<S>,
}

/// `a / b` rounded up; `b > 0`.
pub(crate) const fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}
