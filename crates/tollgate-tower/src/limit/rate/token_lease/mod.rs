//! Token leases: a hot key's tokens spent from a local batch leased from the shared store, exactly.
//!
//! With [`RateLimitLayer::leases`](crate::RateLimitLayer::leases) (opt-in; stores whose
//! [`supports_token_leases`](tollgate_core::Store::supports_token_leases) is true), the layer watches each key's
//! local demand. A key that asks for at least two tokens within a batch's time is **hot**: the layer leases a batch
//! of k tokens (token bucket) or window slots (sliding window) for it in **one** store call
//! ([`Store::lease_tokens`], one Lua script on Redis: the store debits them at
//! once, as if k requests had been admitted) and admits locally from it, with no round trip. Cold keys keep the
//! plain path (one store call each, the deny cache included).
//!
//! How a batch's size adapts, when the next is fetched, how requests wait on a fetch under way, short grants,
//! deadlines (before the store's own: less [`drift_margin`]), returns, what happens when the store forgets
//! ([`TokenLeaseGrant::held`] cuts the batch), failures, lockouts, why the fleet stays exact, and what a response's
//! `remaining` shows under leases (this instance's view: never above it, never rising but by refill):
//! `docs/design/token-leases.md`. Configured by [`LeaseConfig`]; stopped by
//! [`RateLimitLayer::leases_shutdown`](crate::RateLimitLayer::leases_shutdown).
//!
//! [`Store::lease_tokens`]: tollgate_core::Store::lease_tokens
//! [`drift_margin`]: super::deny_cache::drift_margin
//! [`TokenLeaseGrant::held`]: tollgate_core::token_lease::TokenLeaseGrant::held
//!
//! # Metrics
//!
//! `tollgate_token_lease_calls_total{limiter, call}` with `call` = `fetch` or `return` (store calls made by
//! leases), `tollgate_token_lease_local_total{limiter, outcome}` with `allowed` or `limited` (decisions answered
//! from a batch, also counted as ordinary decisions in `tollgate_decisions_total`).
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_tower::{BoxError, LeaseConfig, RateLimitLayer, Verdicts, VerdictSink};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! #[derive(Debug, Default)]
//! struct Reply(Verdicts);
//! impl VerdictSink for Reply {
//!     fn verdicts_mut(&mut self) -> &mut Verdicts { &mut self.0 }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! // Any store that leases tokens: Redis in production, the in-process store here.
//! let store = Arc::new(MemoryStore::new());
//! let layer = RateLimitLayer::new("api", Policy::token_bucket(Quota::per_second(1_000)?), store, "k")
//!     .leases(LeaseConfig::new().share_percent(5)?);
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer.clone()) // the clones share the leases
//!     .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) });
//! for _ in 0..200 {
//!     svc.ready().await?.call(()).await?;
//!     tokio::task::yield_now().await; // lets a fetch land
//! }
//! assert!(layer.leases_local_admissions() > 100); // most were admitted from a batch
//! layer.leases_shutdown().await; // unspent tokens go back to the store
//! # Ok(())
//! # }
//! ```

mod config;
mod control;
mod entry;
mod fetch;
mod lookup;
mod table;

pub use config::{DEFAULT_LEASE_KEYS, LeaseConfig};
pub(crate) use control::{LeaseControl, LeaseFigures, Leases, Pending};
pub(crate) use table::{LeaseTable, Leased, Waited};

/// Store calls made by token leases, by limiter and `call` (`fetch`, `return`).
pub const TOKEN_LEASE_CALLS_TOTAL: &str = "tollgate_token_lease_calls_total";
/// Decisions answered from a leased batch, by limiter and `outcome` (`allowed`, `limited`).
pub const TOKEN_LEASE_LOCAL_TOTAL: &str = "tollgate_token_lease_local_total";
