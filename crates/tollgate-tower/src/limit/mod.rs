//! Every tollgate limiter, on one decision core.
//!
//! | limiter | state | rejects with | where |
//! |---|---|---|---|
//! | request rate per key | a [`Store`](tollgate_core::Store): in process or Redis | 429 / `RESOURCE_EXHAUSTED` | [`rate`] |
//! | concurrent requests per key (`stack`) | a [`SlotStore`](tollgate_core::slot::SlotStore): in process or Redis | 429 / `RESOURCE_EXHAUSTED` | `concurrency` |
//! | fleet usage, capacity reserved for `Critical` (`stack`) | Redis slots on one fleet-wide key | 503 / `UNAVAILABLE` | `fleet` |
//! | worker utilization, lowest priority first (`stack`) | this instance's in-flight count | 503 / `UNAVAILABLE` | `worker` |
//! | adaptive concurrency: a limit that follows latency, a share per priority (`stack`) | this instance's in-flight count | 503 / `UNAVAILABLE` | `adaptive` |
//! | all of them, in order (`stack`) | | | `stack` (`StackLayer`) |
//!
//! Each limiter's `call` decides (its store, its rule); everything around the decision is shared, so every
//! limiter behaves alike:
//!
//! - one response future ([`ResponseFuture`]): deciding (a store that has to wait), calling the inner service with
//!   what the admission grants (a verdict, a permit), or answering a refusal — and the inner service's readiness is
//!   given back whenever a request is not passed on;
//! - one judge (`core`): the enforcement [`Mode`](crate::Mode) (shadow mode and the kill switch), the decision
//!   metrics, the rate-limited logs, and the one place where a store error meets the layer's
//!   [`FailurePolicy`](tollgate_core::FailurePolicy) (admit, refuse with 503, or decide on an in-process fallback);
//! - one way to share state across the copies axum makes of a layer (one per route): the state is shared by every
//!   service a layer and its clones build, so every copy counts against the same state, built with its layer, up
//!   front (and again by a method that changes a setting);
//! - one service for the limiters whose requests hold a permit while in flight ([`InFlightLimit`], with `stack`):
//!   the concurrency limiter, the fleet and worker shedders and the adaptive limiter.
//!
//! The layers **reject** at once; tower's `tower::limit` layers of similar names make callers wait instead.
//!
#![cfg_attr(feature = "stack", doc = "```")]
#![cfg_attr(not(feature = "stack"), doc = "```ignore")]
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use tollgate_core::slot::MemorySlotStore;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_http::HttpLimitLayer;
//! use tollgate_http::key::PeerIp;
//! use tollgate_http::priority::MethodPriority;
//! use tollgate_tower::{ConcurrencyLimitLayer, FleetShedLayer, RateLimitLayer, StackLayer, WorkerShedLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In production the slot store of the fleet shedder (and usually the others) is one RedisStore.
//! let slots = Arc::new(MemorySlotStore::new());
//! let stack = StackLayer::new()
//!     .worker_shedder(WorkerShedLayer::new(256, MethodPriority::new())?)
//!     .rate_limit(RateLimitLayer::new(
//!         "per-client",
//!         Policy::token_bucket(Quota::per_second(100)?),
//!         Arc::new(MemoryStore::new()),
//!         PeerIp,
//!     ))
//!     .concurrency_limit(ConcurrencyLimitLayer::new("in-flight", 20, slots.clone(), PeerIp)?)
//!     .fleet_shedder(FleetShedLayer::new(10_000, slots, MethodPriority::new())?);
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(HttpLimitLayer::new(stack));
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "stack")]
pub mod adaptive;
pub(crate) mod charger;
#[cfg(feature = "stack")]
pub mod concurrency;
mod core;
#[cfg(feature = "stack")]
pub mod fleet;
mod future;
#[cfg(feature = "stack")]
mod in_flight;
pub mod rate;
#[cfg(feature = "stack")]
mod releases;
#[cfg(feature = "stack")]
mod slot_guard;
#[cfg(feature = "stack")]
pub mod stack;
#[cfg(feature = "stack")]
pub mod worker;

pub use future::ResponseFuture;
pub(crate) use future::{Machine, Machinery};
#[cfg(feature = "stack")]
pub use in_flight::InFlightLimit;
// For the permits of the stack's limiters.
#[cfg(feature = "stack")]
pub(crate) use future::{Answer, Grants};
