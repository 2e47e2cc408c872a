//! tollgate for HTTP and axum: limits as `Infallible` layers, 429/503 problem responses, the IETF and GitHub-style
//! rate-limit headers, and client keys that spoofed headers cannot move.
//!
//! Wrap any tollgate layer in an [`HttpLimitLayer`]: admitted responses get the rate-limit [`headers`] of every
//! limiter they passed; rejections become `429 Too Many Requests` (rate, concurrency) or `503 Service Unavailable`
//! (load shedding, a store that failed closed) with `Retry-After` and an `application/problem+json` body; a
//! missing key source becomes a 500 naming it. No `HandleErrorLayer` is needed.
//!
//! The crate depends on no framework; its feature `axum` adds the keys that read what axum puts in a request
//! ([`key::ClientIp`], [`key::PeerIp`], [`key::RouteKey`]).
//!
//! ```
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_http::HttpLimitLayer;
//! use tollgate_http::key::{ClientIp, RouteKey};
//! use tollgate_tower::RateLimitLayer;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(MemoryStore::new());
//! let per_client = RateLimitLayer::new(
//!     "per-client",
//!     Policy::token_bucket(Quota::per_second(10)?.with_burst(20)?),
//!     store.clone(),
//!     ClientIp::trusting(["10.0.0.0/8".parse()?]),
//! );
//! let expensive = RateLimitLayer::new(
//!     "report",
//!     Policy::sliding_window(Quota::per_minute(5)?)?,
//!     store,
//!     (ClientIp::new(), RouteKey),
//! );
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route("/report", get(|| async { "report" }).layer(HttpLimitLayer::new(expensive)))
//!     .layer(HttpLimitLayer::new(per_client))
//!     .route("/health", get(|| async { "ok" })); // added after the layer: never limited
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod future;
pub mod headers;
pub mod key;
mod layer;
pub mod priority;
pub mod problem;
mod respond;
mod service;
mod sf;
pub mod stream;

pub use future::ResponseFuture;
pub use headers::HeaderSet;
pub use layer::HttpLimitLayer;
pub use respond::HttpResponder;
pub use service::HttpLimit;
