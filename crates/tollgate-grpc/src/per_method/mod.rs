//! Per-method policies: each call is limited by the policy of its method (`/package.Service/Method`), else of its
//! service (`package.Service`), else by a default policy, else not at all.
//!
//! Every policy is an ordinary [`tollgate_tower::RateLimitLayer`] with its own name, so its buckets, headers and
//! metrics are its own; the routing happens once per call on the request path, before any store is asked. Wrap
//! the result in a [`GrpcLimitLayer`](crate::GrpcLimitLayer) so rejections become gRPC statuses.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_grpc::{GrpcLimitLayer, MethodLimitLayer, key::PeerIp};
//! use tollgate_tower::RateLimitLayer;
//!
//! let store = Arc::new(MemoryStore::new());
//! let limit = |name: &'static str, per_second| -> Result<_, Box<dyn std::error::Error>> {
//!     Ok(RateLimitLayer::new(name, Policy::token_bucket(Quota::per_second(per_second)?), store.clone(), PeerIp))
//! };
//! let layer = GrpcLimitLayer::new(
//!     MethodLimitLayer::new()
//!         .method("/helloworld.Greeter/SayHello", limit("say-hello", 5)?)?
//!         .service("countdown.Countdown", limit("countdown", 50)?)?
//!         .default_limit(limit("default", 100)?),
//! );
//! // tonic::transport::Server::builder().layer(layer).add_service(...)
//! # let _ = layer;
//!
//! // A path that no gRPC call can have is an error, not a rule that never matches.
//! assert!(MethodLimitLayer::new().method("helloworld.Greeter/SayHello", limit("x", 1)?).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::{InvalidMethod, MethodLimitLayer};
pub use service::MethodLimit;
