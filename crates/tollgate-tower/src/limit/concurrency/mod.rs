//! The concurrent-requests limiter: at most N requests in flight per key, the next rejected at once.
//!
//! [`ConcurrencyLimitLayer`] asks a [`SlotStore`] for a slot in `call`:
//!
//! - granted: the inner service runs, and the response holds the slot ([`HoldPermit`](crate::HoldPermit)) — for
//!   HTTP in its body, so the slot is held until the body is done or dropped (a stream until it ends), and given
//!   back on client disconnect, cancellation (the future dropped) and a panicking handler alike;
//! - over the limit: the call fails at once with a [`Rejection`](crate::Rejection) of kind
//!   [`ConcurrencyLimited`](crate::RejectionKind::ConcurrencyLimited) (HTTP 429, gRPC
//!   `RESOURCE_EXHAUSTED`); nothing is queued, and the inner service's readiness is released;
//! - the store fails: the layer's failure policy answers (admit, reject with
//!   [`StoreUnavailable`](crate::RejectionKind::StoreUnavailable), or count in process).
//!
//! Both answers carry the limiter's [`Verdict`](crate::Verdict) (unit
//! [`ConcurrentRequests`](crate::QuotaUnit::ConcurrentRequests): the ceiling, and the slots left after this
//! request), an admission's in its response (through the permit, [`HoldPermit`](crate::HoldPermit)) and a
//! rejection's in the [`Rejection`](crate::Rejection), for the adapters' RateLimit fields
//! (`qu="concurrent-requests"`). The fleet shedder's answers carry none: its ceiling is the fleet's capacity, not a
//! quota the client could pace itself to.
//!
//! With [`MemorySlotStore`](tollgate_core::slot::MemorySlotStore) the limit holds per instance; with the Redis
//! store for the whole fleet. Shared slots expire after the slot time unless renewed, which the holder does
//! every third of it while the request runs, so a crashed instance's requests stop counting after one slot time.
//! A slot is released from `Drop` by a spawned task (best effort; the expiry is the backstop). The next request
//! can reach the store before that release: refused while a release of this instance on its key is on its way,
//! it waits for that release's answer (or one slot time, when the slot has expired anyway) and asks once more, so
//! a client sending requests one after another never meets its own previous slot.
//!
//! There is no deny cache here, unlike the rate limiter's ([`deny_cache`](crate::limit::rate::deny_cache)): a
//! refusal at capacity would not stay exact, since any holder (on any instance) may release its slot the next
//! moment, and there is no instant before which the store would surely refuse again.
//!
//! Metrics: `tollgate_decisions_total{limiter, outcome}` with outcome `allowed`, `limited`, `shadow_limited`,
//! `store_error_open`, `store_error_closed`, `shadow_store_error_closed` or `store_error_local` (one outcome per
//! decision); `tollgate_store_errors_total{limiter, kind,
//! failure_policy}`; `tollgate_near_limit_total{limiter}` for admissions that leave fewer than
//! [`near_limit`](ConcurrencyLimitLayer::near_limit)'s share of the ceiling free (20 % by default). Each decision is a
//! `tracing` event at `DEBUG` on the target `tollgate::decision`.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::slot::MemorySlotStore;
//! use tollgate_tower::ConcurrencyLimitLayer;
//! use tollgate_tower::{BoxError, Rejection, RejectionKind};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let by_user = |req: &http::Request<&'static str>, key: &mut String| {
//!     key.push_str(req.body());
//!     Ok(())
//! };
//! let layer = ConcurrencyLimitLayer::new("per-user", 1, Arc::new(MemorySlotStore::new()), by_user)?;
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_| async { Ok::<_, BoxError>(http::Response::new("streaming…")) });
//!
//! let first = svc.ready().await?.call(http::Request::new("ann")).await?;
//! // ann's first response is still being sent: her next request is rejected at once.
//! let err = svc.ready().await?.call(http::Request::new("ann")).await.unwrap_err();
//! let rejection = err.downcast_ref::<Rejection>().expect("a tollgate rejection");
//! assert_eq!(rejection.kind(), RejectionKind::ConcurrencyLimited);
//! assert!(svc.ready().await?.call(http::Request::new("bob")).await.is_ok()); // another key
//!
//! drop(first); // the body is dropped: the permit goes back
//! assert!(svc.ready().await?.call(http::Request::new("ann")).await.is_ok());
//! # Ok(())
//! # }
//! ```

mod decide;
mod layer;
pub(crate) mod service;

pub use layer::{ConcurrencyLimitLayer, DEFAULT_RETRY_AFTER, DEFAULT_SLOT_TTL, MAX_SLOT_TTL};
pub(crate) use layer::{SlotLayer, slot_layer_methods};

pub(crate) use decide::Settings;

use tollgate_core::slot::SlotStore;

use crate::limit::in_flight::in_flight_service;
use crate::{KeyError, KeyExtractor};
use service::decide_slot;

in_flight_service!(
    decide_slot(inner.shared) for ConcurrencyLimitLayer<K, L> where K: KeyExtractor<Req>, L: SlotStore
);

/// Which slot set a request counts against, and its ceiling there: one set per key ([`PerKey`], the concurrency
/// limiter), or one fleet-wide set with a ceiling per priority (the fleet shedder's rule).
pub(crate) trait SlotRule<Req>: Send + Sync + 'static {
    /// Appends the request's key (after the limiter's name) to `key` and returns its ceiling.
    ///
    /// # Errors
    /// When the key's source is missing from the request (a configuration error).
    fn rule(&self, req: &Req, key: &mut String) -> Result<u64, KeyError>;
}

/// One slot set per key from a [`KeyExtractor`], the same limit for all.
#[derive(Debug, Clone)]
pub(crate) struct PerKey<K> {
    pub(crate) key: K,
    pub(crate) limit: u64,
}

impl<Req, K: KeyExtractor<Req>> SlotRule<Req> for PerKey<K> {
    fn rule(&self, req: &Req, key: &mut String) -> Result<u64, KeyError> {
        key.push(':');
        self.key.extract(req, key)?;
        Ok(self.limit)
    }
}
