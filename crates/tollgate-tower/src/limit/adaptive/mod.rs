//! The adaptive concurrency limiter: a limit on requests in flight that follows the service's latency, as
//! Netflix's concurrency-limits and Envoy's adaptive concurrency filter do, with a guaranteed share per priority.
//!
//! [`AdaptiveLimitLayer`] times every admitted request from admission to the end of its response (for HTTP, until
//! the body is done or dropped) and feeds the latency to a [`Control`]:
//!
//! - [`Control::gradient2`]: the limit grows while requests are about as fast as the long-term latency, and shrinks in
//!   proportion once they are slower than `tolerance` × that (queueing has started);
//! - [`Control::aimd`]: the limit grows by one per round trip while at least half of it is used, and is cut by a factor
//!   (at most once per round trip) when a request is slower than a timeout, or failed.
//!
//! A request is admitted while fewer than the limit are in flight — any class may use what the others leave — and,
//! once the limit is full, only if its class holds less than its guaranteed share of the limit
//! ([`DEFAULT_SHARES`]: `Critical` 50 %, `High` 20 %, `Normal` 20 %, `Low` 10 %; see
//! [`shares`](AdaptiveLimitLayer::shares)). Otherwise it is rejected at once with a
//! [`Rejection`](crate::Rejection) of kind [`Shed`](crate::RejectionKind::Shed): HTTP 503 with
//! `Retry-After` and a problem body, gRPC `UNAVAILABLE` with `RetryInfo`. Nothing queues. The slot goes back when
//! the response is finished, or on cancellation or a panicking handler (no latency sample then); a failed inner
//! call gives it back as a drop (AIMD backs off).
//!
//! Metrics: `tollgate_decisions_total{limiter, outcome}` (`allowed`, `shed`, `shadow_shed`),
//! `tollgate_shed_total{limiter, reason="limit"}`, the gauge [`ADAPTIVE_LIMIT`] (the current limit) and the
//! histogram [`ADAPTIVE_LATENCY`] (the measured latency).
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{ManualClock, Timestamp};
//! use tollgate_tower::limit::adaptive::{AdaptiveLimitLayer, Control};
//! use tollgate_tower::{BoxError, Priority, Rejection, RejectionKind};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let clock = ManualClock::new(Timestamp::from_micros(0));
//! let gradient2 = Control::gradient2().initial_limit(2).min_limit(1);
//! let layer = AdaptiveLimitLayer::new(gradient2, Priority::Low)?
//!     .shares(0, 0, 0, 100)? // everything guaranteed to Critical: Low only borrows
//!     .clock(clock.clone());
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer.clone())
//!     .service_fn(|_req: http::Request<()>| async { Ok::<_, BoxError>(http::Response::new("ok")) });
//!
//! let a = svc.ready().await?.call(http::Request::new(())).await?;
//! let b = svc.ready().await?.call(http::Request::new(())).await?;
//! // Two responses are still being sent: the limit (2) is full.
//! let err = svc.ready().await?.call(http::Request::new(())).await.unwrap_err();
//! assert_eq!(err.downcast_ref::<Rejection>().unwrap().kind(), RejectionKind::Shed);
//! clock.advance(Duration::from_millis(20));
//! drop((a, b)); // finished after 20 ms: two latency samples, two slots back
//! assert_eq!(layer.in_flight(), 0);
//! assert!(svc.ready().await?.call(http::Request::new(())).await.is_ok());
//! # Ok(())
//! # }
//! ```

mod control;
mod layer;
mod limiter;
mod service;

pub use control::Control;
pub use layer::{AdaptiveLimitLayer, DEFAULT_ADAPTIVE_NAME};
pub use limiter::{ADAPTIVE_LATENCY, ADAPTIVE_LIMIT, DEFAULT_SHARES};
pub(crate) use limiter::{AdaptivePermit, Outcome};
