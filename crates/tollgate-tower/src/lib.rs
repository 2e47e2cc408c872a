//! Tower middleware for tollgate: the request-rate limiter and (feature `stack`) Stripe's stack — the
//! concurrent-requests limiter and the fleet-usage and worker-utilization load shedders — all on one decision core,
//! with key extraction, costs, enforcement modes and the typed rejections every tollgate limiter shares.
//!
//! The layers are generic over the request type; the `tollgate-http` and `tollgate-grpc` adapters turn
//! [`Rejection`]s into HTTP and gRPC responses and render each [`Verdict`] as headers or metadata.
//!
//! | concept | where |
//! |---|---|
//! | every limiter and the core they share | [`limit`]: [`limit::rate`], and with `stack` `limit::concurrency`, `limit::fleet`, `limit::worker`, `limit::stack` |
//! | what an admitted request holds until its response is finished (`stack`) | `permit` (`Permit`, `HoldPermit`, `PermitBody`) |
//! | which bucket a request belongs to | [`key`] ([`KeyExtractor`]), [`digest`] for secret keys |
//! | how many tokens it takes | [`cost`] ([`Cost`]), and as a response streams [`stream_cost`] |
//! | request classes for load shedding | [`priority`] ([`Priority`], [`Classify`]) |
//! | shadow mode and the kill switch | [`mode`] ([`Mode`], [`EnforcementSwitch`]) |
//! | decision counters and rate-limited logs | [`observe`] |
//! | what a rejection says | [`rejection`] ([`Rejection`], [`RejectionKind`]) |
//! | what an admitted response carries | [`verdict`] ([`Verdict`], [`Verdicts`], [`VerdictSink`]) |
//! | how a limiter answers (the adapters' seam) | [`respond`] ([`Respond`](respond::Respond)) |
//!
//! These layers **reject** a request over the limit at once (an error the adapters answer with 429/503); tower's own
//! `tower::limit::RateLimitLayer` and `ConcurrencyLimitLayer` of the same names instead make callers *wait* for
//! capacity. See [`limit::rate`] for a complete example.
#![forbid(unsafe_code)]
// On docs.rs (nightly, `--cfg docsrs`), items behind a feature say which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cost;
pub mod digest;
mod error;
pub mod key;
pub mod limit;
pub mod mode;
pub mod observe;
#[cfg(feature = "stack")]
pub mod permit;
#[cfg(feature = "stack")]
mod permit_body;
pub mod priority;
mod readiness;
pub mod rejection;
pub mod respond;
pub mod stream_cost;
pub mod verdict;

pub use cost::{Cost, CostAfter, FinalCost};
pub use error::ConfigError;
pub use key::{KeyError, KeyExtractor};
pub use limit::rate::{DenyCacheConfig, DenyCachedStore, RateLimit, RateLimitLayer};
#[cfg(feature = "leases")]
pub use limit::rate::{LeaseConfig, LeasedStore};
#[cfg(feature = "stack")]
pub use limit::{
    InFlightLimit, adaptive::AdaptiveLimitLayer, concurrency::ConcurrencyLimitLayer,
    fleet::FleetShedLayer, stack::StackLayer, worker::WorkerShedLayer,
};
pub use mode::{EnforcementSwitch, Mode};
#[cfg(feature = "stack")]
pub use permit::{HoldPermit, Permit};
#[cfg(feature = "stack")]
pub use permit_body::PermitBody;
pub use priority::{Classify, Priority};
pub use rejection::{Rejection, RejectionKind};
pub use tollgate_core::Name;
pub use verdict::{QuotaUnit, Verdict, VerdictSink, Verdicts};

/// Not public API: what the tollgate adapter crates (`tollgate-http`, `tollgate-grpc`) share with the limiters.
/// Exempt from semver; may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::readiness::DeferredReadiness;
}

/// The boxed error type of tower services (tower's own), from which [`Rejection`] and [`KeyError`] are downcast.
pub use tower::BoxError;
