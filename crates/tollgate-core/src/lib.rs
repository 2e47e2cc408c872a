//! The core of tollgate: policies, algorithms, clocks, decisions and the in-process store.
//!
//! No I/O and no async runtime: the Redis store, the tower layers and the HTTP/gRPC adapters build on this
//! crate. The algorithm decides who is rejected; the [`Store`] decides where state lives, and with it whether a
//! limit holds per instance ([`MemoryStore`]) or for the whole fleet (the Redis store).
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{ManualClock, MemoryStore, Outcome, Policy, Quota, Timestamp};
//!
//! let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
//! let store = MemoryStore::builder().clock(clock.clone()).build();
//! let policy = Policy::token_bucket(Quota::per_second(10)?.with_burst(2)?);
//!
//! assert!(store.check_now("alice", &policy, 1)?.is_allowed());
//! assert!(store.check_now("alice", &policy, 1)?.is_allowed());
//! let denied = store.check_now("alice", &policy, 1)?;
//! assert_eq!(denied.outcome, Outcome::Limited);
//! assert_eq!(denied.retry_after, Some(Duration::from_millis(100)));
//!
//! clock.advance(Duration::from_millis(100));
//! assert!(store.check_now("alice", &policy, 1)?.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod algorithm;
mod clock;
mod decision;
mod divisor;
mod failure;
mod log_gate;
mod name;
mod policy;
pub mod slot;
pub mod store;
mod time;
pub mod token_lease;

pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, Outcome};
pub use failure::{FailurePolicy, ParseFailurePolicyError};
pub use name::Name;
pub use policy::{Algorithm, MAX_SCALED, Policy, PolicyError, Quota};
pub use store::{
    Check, DEFAULT_MAX_KEYS, KeyHasher, LostCharge, MemoryStore, MemoryStoreBuilder, OnFull, Store,
    StoreError,
};
pub use time::Timestamp;

/// Plumbing the tollgate crates share; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::log_gate::LogGate;
}
