//! The Redis store: one limit for a whole fleet.
//!
//! [`RedisStore`] implements [`tollgate_core::Store`] with the same algorithms as the in-process
//! [`MemoryStore`](tollgate_core::MemoryStore), ported line for line to Lua (`lua/token_bucket.lua`,
//! `lua/sliding_window.lua`), and returns bit-identical decisions for the same inputs and times. What it adds is
//! that every instance shares the state, so "100 per second" holds for the fleet, not per instance.
//!
//! - **One round trip per decision**: `EVALSHA` of a script that reads, decides, writes and sets the TTL
//!   atomically; `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover) is answered by one `EVAL`.
//! - **Server time**: the script reads Redis's `TIME`, so instances with skewed clocks cannot mint tokens.
//! - **TTL from the policy**: a key lives exactly until its state is indistinguishable from a fresh one.
//! - **Keys**: `<namespace>:{<client key>}:tb` (token bucket) or `:sw` (sliding window); the braces are a hash
//!   tag, so Redis Cluster works. Client keys over 64 bytes or with bytes outside printable ASCII (or with `{`,
//!   `}`, `#`, `"`, `\`) are stored as `#` + their SHA-1, never raw.
//! - **Concurrency leases**: [`RedisStore`] is also a [`LeaseStore`](tollgate_core::lease::LeaseStore): each key's
//!   in-flight requests are a sorted set `<namespace>:{<key>}:inflight` of lease ids scored by expiry (server
//!   time); `lua/concurrency_acquire.lua` removes expired leases, counts, admits and sets the key's TTL to its
//!   longest lease in one script, so a crashed instance's leases expire and idle keys vanish.
//! - **Primaries only**: pointed at a replica, Redis answers `READONLY`, reported as
//!   [`BackendError::ReadOnly`] and handled by the failure policy.
//! - **Start-up check**: `maxmemory-policy` other than `noeviction` (or unreadable) is logged loudly, and the result
//!   is kept in [`RedisStore::eviction_check`].
//! - **Failure policy**: every call is bounded by a timeout (default 50 ms); 5 consecutive failures open a circuit
//!   that skips Redis for 1 s, then one probe may close it. Meanwhile [`Store::check`](tollgate_core::Store::check)
//!   answers with the configured [`FailurePolicy`](tollgate_core::FailurePolicy): open, closed, or a local
//!   in-process limit with the same policy. Each such decision increments the counter
//!   `tollgate_store_degraded_total{reason, policy}` and is logged (one line per 5 s at most, with a count of the
//!   rest). [`RedisStore::try_check`] returns the error instead. Round trips are recorded in the histogram
//!   `tollgate_store_latency_seconds{outcome}`.
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate_core::{FailurePolicy, Policy, Quota, Store};
//! use tollgate_redis::RedisStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .namespace("myapp")
//!     .timeout(Duration::from_millis(50))
//!     .failure_policy(FailurePolicy::Local)
//!     .build()
//!     .await?;
//! let policy = Policy::token_bucket(Quota::per_second(100)?.with_burst(20)?);
//! let decision = store.check("client-42", &policy, 1).await?;
//! println!("allowed: {}, remaining: {}", decision.is_allowed(), decision.remaining);
//!
//! // The same against a Redis Cluster:
//! let cluster = RedisStore::cluster_builder(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]).build().await?;
//! cluster.check("client-42", &policy, 1).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod backend;
mod builder;
mod circuit;
mod degraded;
mod error;
mod eviction;
mod keys;
mod lease;
mod script;
mod store;

pub use builder::{
    DEFAULT_COOL_DOWN, DEFAULT_FAILURE_THRESHOLD, DEFAULT_NAMESPACE, DEFAULT_POOL_SIZE,
    DEFAULT_TIMEOUT, RedisStoreBuilder,
};
pub use circuit::CircuitState;
pub use degraded::{CIRCUIT_OPEN, DEGRADED_TOTAL, LATENCY_SECONDS};
pub use error::{BackendError, BuildError};
pub use eviction::EvictionCheck;
pub use lease::{CONCURRENCY_ACQUIRE_LUA, CONCURRENCY_RELEASE_LUA, CONCURRENCY_RENEW_LUA};
pub use script::{SLIDING_WINDOW_LUA, TOKEN_BUCKET_LUA};
pub use store::RedisStore;
