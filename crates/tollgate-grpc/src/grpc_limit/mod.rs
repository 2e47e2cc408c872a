//! The tonic-facing layer: tollgate's limiters inside, an infallible gRPC service outside.
//!
//! [`GrpcLimitLayer`] wraps any tollgate layer (a [`RateLimitLayer`](tollgate_tower::RateLimitLayer), a
//! [`MethodLimitLayer`](crate::MethodLimitLayer), a stack of several) and answers for them in gRPC:
//!
//! - a [`Rejection`](tollgate_tower::Rejection) becomes a trailers-only response (HTTP 200, `grpc-status` in the
//!   headers, no body) built by [`rejection_status`](crate::status::rejection_status);
//! - a [`KeyError`](tollgate_tower::KeyError) becomes `INTERNAL` naming the missing key source;
//! - any other error becomes the status tonic would have made of it;
//! - an admitted call's response carries `ratelimit` for every enforced verdict (or the fields
//!   [`GrpcLimitLayer::headers`] chooses; a refusal carries every field), and its body is passed through untouched, so a
//!   guard living in the body (a concurrency permit) is held until a stream ends or is dropped. A guard must ride
//!   in the body, as the stack's permits do: hyper drops the response's extensions once the headers are
//!   written, long before a stream ends.
//!
//! - a refused call's request body, which the limiters drop unread, is read to its end first (bounded; see
//!   `grpc_limit/body.rs`), so that the stream ends cleanly instead of being reset under a client still sending.
//!
//! The service's error type is [`Infallible`](std::convert::Infallible): no `HandleErrorLayer` is needed.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_grpc::{GrpcLimitLayer, key::MetadataKey};
//! use tollgate_tower::RateLimitLayer;
//!
//! let per_api_key = RateLimitLayer::new(
//!     "per-api-key",
//!     Policy::sliding_window(Quota::per_minute(600)?)?,
//!     Arc::new(MemoryStore::new()),
//!     MetadataKey::metadata("x-api-key")?,
//! );
//! let layer = GrpcLimitLayer::new(per_api_key);
//! // tonic::transport::Server::builder().layer(layer).add_service(GreeterServer::new(greeter))
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod body;
mod future;
mod layer;
mod service;

pub(crate) use body::RequestBody;
pub use future::ResponseFuture;
pub use layer::GrpcLimitLayer;
pub use service::GrpcLimit;
