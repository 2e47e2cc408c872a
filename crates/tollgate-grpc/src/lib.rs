//! tonic adapter for tollgate: rate limits for gRPC servers that answer in gRPC.
//!
//! A rejected call becomes a trailers-only response with `RESOURCE_EXHAUSTED` (rate and concurrency limits) or
//! `UNAVAILABLE` (load shedding, a store that failed closed), a `google.rpc.RetryInfo` detail with the exact retry
//! delay, and every rate-limit field as metadata; admitted calls carry `ratelimit` (what each limit has left, within which
//! time), or the fields [`GrpcLimitLayer::headers`] chooses. Services stay infallible.
//!
//! | concept | where |
//! |---|---|
//! | the tonic-facing layer (rejections → statuses, metadata) | [`grpc_limit`] ([`GrpcLimitLayer`]) |
//! | a policy per method or service | [`per_method`] ([`MethodLimitLayer`]) |
//! | keys: metadata (hashed), peer IP, method | [`key`] |
//! | the status, its details and metadata | [`status`] |
//!
//! ```no_run
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_grpc::{GrpcLimitLayer, MethodLimitLayer, key::PeerIp};
//! use tollgate_tower::RateLimitLayer;
//!
//! # async fn serve(router: tonic::service::Routes) -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(MemoryStore::new());
//! let say_hello = RateLimitLayer::new(
//!     "say-hello",
//!     Policy::token_bucket(Quota::per_second(10)?),
//!     store.clone(),
//!     PeerIp,
//! );
//! let layer = GrpcLimitLayer::new(MethodLimitLayer::new().method("/helloworld.Greeter/SayHello", say_hello)?);
//! tonic::transport::Server::builder()
//!     .layer(layer)
//!     .add_routes(router)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! The proto files of the examples and tests, and their generated code, live in `proto/`; the code is checked in
//! and regenerated with protox (pure Rust, no system `protoc`): see `proto/check.sh`.
#![forbid(unsafe_code)]

pub mod grpc_limit;
pub mod key;
pub mod per_method;
pub mod status;
pub mod stream;

pub use grpc_limit::{GrpcLimit, GrpcLimitLayer};
pub use per_method::{MethodLimit, MethodLimitLayer};
