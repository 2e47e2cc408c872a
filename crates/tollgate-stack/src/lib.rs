//! Stripe's production stack for tower, axum and tonic: the concurrent-requests limiter, the fleet-usage and
//! worker-utilization load shedders, and one layer that stacks them with the request-rate limiter.
//!
//! | limiter | state | rejects with | where |
//! |---|---|---|---|
//! | concurrent requests per key | [`LeaseStore`](tollgate_core::lease::LeaseStore): in process or Redis leases | 429 / `RESOURCE_EXHAUSTED` | [`concurrency`] |
//! | fleet usage (capacity reserved for `Critical`) | Redis leases on one fleet-wide key | 503 / `UNAVAILABLE` | [`fleet`] |
//! | worker utilization (lowest priority first) | this instance's in-flight count | 503 / `UNAVAILABLE` | [`worker`] |
//! | adaptive concurrency (a limit that follows latency, a share per priority) | this instance's in-flight count | 503 / `UNAVAILABLE` | [`adaptive`] |
//! | all of them, in order | | | [`stack`] ([`StackLayer`]) |
//! | holding a permit until the response is finished | | | [`permit`], [`PermitBody`] |
//!
//! Priorities ([`Priority`](tollgate_tower::Priority), [`Classify`](tollgate_tower::Classify)) and the typed
//! rejections live in `tollgate-tower`; the HTTP adapter (`tollgate-http`) ships a method-based classifier and an
//! `x-priority` header classifier.
//!
//! This crate is separate from `tollgate-tower` because its layers need a runtime (lease renewal and release run
//! as tokio tasks) and an HTTP body type (permits live in response bodies), which the rate limiter does not.
//!
//! ```
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use tollgate_core::lease::MemoryLeaseStore;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_http::HttpLimitLayer;
//! use tollgate_http::key::PeerIp;
//! use tollgate_http::priority::MethodPriority;
//! use tollgate_stack::{ConcurrencyLimitLayer, FleetShedLayer, StackLayer, WorkerShedLayer};
//! use tollgate_tower::RateLimitLayer;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In production the lease store of the fleet shedder (and usually the others) is one RedisStore.
//! let leases = Arc::new(MemoryLeaseStore::new());
//! let stack = StackLayer::new()
//!     .worker_shedder(WorkerShedLayer::new(256, MethodPriority::new())?)
//!     .rate_limit(RateLimitLayer::new(
//!         "per-client",
//!         Policy::token_bucket(Quota::per_second(100)?),
//!         Arc::new(MemoryStore::new()),
//!         PeerIp,
//!     ))
//!     .concurrency_limit(ConcurrencyLimitLayer::new("in-flight", 20, leases.clone(), PeerIp)?)
//!     .fleet_shedder(FleetShedLayer::new(10_000, leases, MethodPriority::new())?);
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(HttpLimitLayer::new(stack));
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod adaptive;
mod body;
pub mod concurrency;
mod error;
pub mod fleet;
mod lease_guard;
pub mod permit;
pub mod stack;
pub mod worker;

pub use adaptive::{AdaptiveLimit, AdaptiveLimitLayer};
pub use body::PermitBody;
pub use concurrency::{
    ConcurrencyLimit, ConcurrencyLimitLayer, LeaseLimitLayer, LeaseRule, PerKey,
};
pub use error::ConfigError;
pub use fleet::{FleetRule, FleetShedLayer};
pub use permit::{HoldPermit, Permit};
pub use stack::StackLayer;
pub use worker::{WorkerShed, WorkerShedLayer};
