//! tollgate as an Envoy rate limit service: `envoy.service.ratelimit.v3.RateLimitService` on tonic, reading
//! envoyproxy/ratelimit's YAML unchanged and deciding on tollgate's algorithms and stores, so that a gateway
//! (Envoy, Istio, Envoy Gateway, Gloo, Contour, Emissary) and the Rust services behind it share one set of limits.
//!
//! The binary `tollgate-rls` is what most users run (`tollgate-rls --help`; `docs/rls.md` says how to put it in
//! front of Envoy and what changes from envoyproxy/ratelimit). The library is the same server, to embed:
//!
//! ```
//! use std::sync::Arc;
//! use arc_swap::ArcSwap;
//! use tollgate_core::MemoryStore;
//! use tollgate_rls::config::Loader;
//! use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
//! use tollgate_rls::proto::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
//! use tollgate_rls::{Options, RateLimitService};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let yaml = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";
//! let config = Arc::new(ArcSwap::from_pointee(Loader::new().load([("edge.yaml", yaml)])?));
//! let service = RateLimitService::new(MemoryStore::new(), config, Options::new());
//! let entry = Entry { key: "user".into(), value: "ann".into() };
//! let request = RateLimitRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RateLimitDescriptor { entries: vec![entry], ..Default::default() }],
//!     hits_addend: 0,
//! };
//! assert_eq!(service.should_rate_limit(&request).await?.overall_code(), Code::Ok);
//! assert_eq!(service.should_rate_limit(&request).await?.overall_code(), Code::OverLimit);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod config;
mod counters;
mod engine;
pub mod metrics;
mod plan;
pub mod proto;
mod server;
mod service;

pub use server::{Reloader, serve};
pub use service::{OnStoreError, Options, RateLimitService};
