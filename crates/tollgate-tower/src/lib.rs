//! Tower middleware for tollgate: the request-rate limiter, key extraction, costs, enforcement modes and the
//! typed rejections every tollgate limiter shares.
//!
//! The layers are generic over the request type; the `tollgate-http` and `tollgate-grpc` adapters turn
//! [`Rejection`]s into HTTP and gRPC responses and render each [`Verdict`] as headers or metadata.
//!
//! | concept | where |
//! |---|---|
//! | the rate limiter (layer, service, future) | [`rate_limit`] |
//! | which bucket a request belongs to | [`key`] ([`KeyExtractor`]), [`digest`] for secret keys |
//! | how many tokens it takes | [`cost`] ([`Cost`]) |
//! | request classes for load shedding | [`priority`] ([`Priority`], [`Classify`]) |
//! | shadow mode and the kill switch | [`mode`] ([`Mode`], [`EnforcementSwitch`]) |
//! | decision counters and rate-limited logs | [`observe`] |
//! | what a rejection says | [`rejection`] ([`Rejection`], [`RejectionKind`]) |
//! | what an admitted response carries | [`verdict`] ([`Verdict`], [`Verdicts`], [`VerdictSink`]) |
//! | the rate-limit header fields (`http` feature), shared by the HTTP and gRPC adapters | `headers` (`HeaderSet`) |
//! | how a limiter answers (the adapters' seam) | [`respond`] ([`Respond`](respond::Respond), [`Forward`](respond::Forward)) |
//!
//! See [`rate_limit`] for a complete example.
#![forbid(unsafe_code)]
// On docs.rs (nightly, `--cfg docsrs`), items behind a feature say which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cost;
pub mod digest;
#[cfg(feature = "http")]
pub mod headers;
pub mod key;
pub mod mode;
mod name;
pub mod observe;
pub mod priority;
pub mod rate_limit;
pub mod rejection;
pub mod respond;
pub mod verdict;

pub use cost::{Cost, CostFn, UnitCost};
pub use key::{ConstKey, KeyError, KeyExtractor, KeyFn};
pub use mode::{EnforcementSwitch, Mode};
pub use name::Name;
pub use priority::{Classify, ClassifyFn, ConstPriority, Priority};
pub use rate_limit::{RateLimit, RateLimitLayer};
pub use rejection::{Rejection, RejectionKind};
pub use verdict::{Verdict, VerdictSink, Verdicts};

/// The boxed error type of tower services, from which [`Rejection`] and [`KeyError`] are downcast.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
