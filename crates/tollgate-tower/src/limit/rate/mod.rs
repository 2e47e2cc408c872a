//! The request-rate limiter: [`RateLimitLayer`] and its [`RateLimit`] service.
//!
//! Generic over the request type: a [`KeyExtractor`](crate::KeyExtractor) names each request's bucket, a
//! [`Cost`](crate::Cost) says how many tokens it takes, and any [`Store`](tollgate_core::Store) decides with any
//! algorithm. The decision happens in `call`:
//!
//! - admitted: the inner service runs, and its response carries the limiter's [`Verdict`](crate::Verdict)
//!   (through [`VerdictSink`](crate::VerdictSink)) for adapters to render as headers;
//! - over the limit: the call fails with a [`Rejection`](crate::Rejection) (downcast it from the `BoxError`), and
//!   the inner service's readiness is released, not leaked;
//! - the key's source is missing: the call fails with a [`KeyError`](crate::KeyError);
//! - the store fails: the layer's [`FailurePolicy`](tollgate_core::FailurePolicy) answers (admit, reject with
//!   [`RejectionKind::StoreUnavailable`](crate::RejectionKind), or decide on a local in-process store);
//! - the inner service fails to become ready: `poll_ready` still succeeds and the next call fails with that error,
//!   without being decided (no quota spent).
//!
//! That is the default responder, `()`;
//! [`LayerWith::layer_with`](crate::respond::LayerWith::layer_with) takes another
//! [`Respond`](crate::respond::Respond)er, which is how `tollgate-http` answers in place.
//!
//! On a shared store (Redis) the layer answers denied keys locally until the store's retry instant, exactly:
//! see [`deny_cache`].
//!
//! With the `leases` feature, [`RateLimitLayer::leases`] admits hot keys from batches of tokens leased from the
//! store, exactly: see [`token_lease`]; [`LeaseConfig::around`] does the same for a caller that decides on a store
//! itself.
//!
//! Shadow mode and the kill switch ([`Mode`](crate::Mode)) can be changed at run time through
//! [`RateLimitLayer::enforcement`].
//!
//! Metrics (through the `metrics` facade; install the recorder before building layers, whose counters are
//! registered once): `tollgate_decisions_total{limiter, outcome}` with outcome `allowed`, `limited`,
//! `shadow_limited`, `store_error_open`, `store_error_closed`, `shadow_store_error_closed` or `store_error_local`
//! (a request the local fallback refuses counts as `limited`: one outcome per decision), and
//! `tollgate_store_errors_total{limiter, kind, failure_policy}`, `tollgate_near_limit_total{limiter}` for
//! admissions that leave less than [`RateLimitLayer::near_limit`]'s share of the limit (20 % by default), and with
//! the deny cache `tollgate_deny_cache_hits_total{limiter}` (denials answered locally, counted as `limited` too).
//! Each decision is also a `tracing` span and event at `DEBUG` on the target `tollgate::decision` (see
//! [`observe`](crate::observe)), which costs one atomic load when no subscriber lets it through.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_tower::{BoxError, KeyError, Mode, RateLimitLayer, Rejection, Verdicts, VerdictSink};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! // A toy protocol: requests name their user, responses carry the verdicts.
//! #[derive(Debug, Default)]
//! struct Reply(Verdicts);
//! impl VerdictSink for Reply {
//!     fn verdicts_mut(&mut self) -> &mut Verdicts { &mut self.0 }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let by_user = |user: &&str, key: &mut String| {
//!     key.push_str(user);
//!     Ok::<_, KeyError>(())
//! };
//! let layer = RateLimitLayer::new(
//!     "per-user",
//!     Policy::token_bucket(Quota::per_minute(2)?),
//!     Arc::new(MemoryStore::new()),
//!     by_user,
//! );
//! let switch = layer.enforcement();
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_: &str| async { Ok::<_, BoxError>(Reply::default()) });
//!
//! for _ in 0..2 {
//!     let reply = svc.ready().await?.call("ann").await?;
//!     assert_eq!(reply.0.iter().next().unwrap().decision.limit, 2);
//! }
//! let err = svc.ready().await?.call("ann").await.unwrap_err();
//! let rejection = err.downcast_ref::<Rejection>().expect("rate limited");
//! assert_eq!(rejection.limiter(), "per-user");
//! assert!(svc.ready().await?.call("bob").await.is_ok()); // another bucket
//!
//! switch.set(Mode::Off); // the kill switch
//! assert!(svc.ready().await?.call("ann").await.is_ok());
//! # Ok(())
//! # }
//! ```

mod composed;
mod decide;
pub mod deny_cache;
mod deny_cached;
mod layer;
#[cfg(feature = "leases")]
mod leased_store;
pub mod overrides;
mod service;
pub mod set;
#[cfg(feature = "leases")]
pub mod token_lease;
// The decision consults token leases through `lease_step`: the leases themselves with the `leases` feature, a
// table that cannot exist without it (a limiter's leases are then always `None`).
#[cfg(not(feature = "leases"))]
#[path = "no_leases.rs"]
mod lease_step;
#[cfg(feature = "leases")]
use token_lease as lease_step;

pub use deny_cache::DenyCacheConfig;
pub use deny_cached::DenyCachedStore;
pub use layer::RateLimitLayer;
#[cfg(feature = "leases")]
pub use leased_store::LeasedStore;
pub use overrides::Overrides;
pub use service::RateLimit;
pub use set::{Applies, RateLimitSet, RateLimitSetLayer};
#[cfg(feature = "leases")]
pub use token_lease::LeaseConfig;
