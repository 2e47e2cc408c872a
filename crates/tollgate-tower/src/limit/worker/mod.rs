//! The worker-utilization load shedder: when this instance is busy, shed the least important traffic first.
//!
//! [`WorkerShedLayer`] counts the requests in flight through it (until each response body is finished) against
//! the instance's capacity. A controller turns utilization into a shed level per [`Priority`](crate::Priority) — the percentage
//! of that class's requests rejected with [`Shed`](crate::RejectionKind::Shed) (HTTP 503, gRPC
//! `UNAVAILABLE`):
//!
//! - each class has a threshold; defaults: `Low` at 60 %, `Normal` at 75 %, `High` at 90 %, `Critical` at 100 % of
//!   capacity, so `Low` is shed first, then `Normal`, then `High`, and `Critical` last;
//! - the controller runs at most once per interval (default 100 ms, on the request path, no timer), on the peak
//!   in-flight count since its last run, so bursts between runs count; intervals in which no request came are
//!   caught up at the next one (on what is in flight then), so a quiet spell after a burst ends its shedding as
//!   a timer would have, rather than leaving it for the next requests to meet;
//! - at or above its threshold, a class's level rises by a step (default 25 points); it falls by a step only once
//!   utilization is more than the hysteresis (default 10 points) below the threshold: shedding ramps up and back
//!   down gradually and does not flap;
//! - a level of `p` % rejects exactly `p` of every 100 consecutive requests of the class, spread evenly, with no
//!   randomness, so behaviour is reproducible.
//!
//! Metrics: `tollgate_decisions_total{limiter, outcome}` (`allowed`, `shed`, `shadow_shed`), and the gauges
//! `tollgate_worker_utilization_percent` and `tollgate_worker_shed_percent{priority}`.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_tower::WorkerShedLayer;
//! use tollgate_tower::{ClassifyFn, Priority};
//!
//! let layer = WorkerShedLayer::new(64, ClassifyFn::new(|req: &http::Request<()>| {
//!     if req.uri().path().starts_with("/batch") { Priority::Low } else { Priority::Normal }
//! }))?
//! .thresholds(50, 70, 85, 100)?
//! .interval(Duration::from_millis(50));
//! assert_eq!(layer.shed_percent(Priority::Low), 0);
//! # Ok::<(), tollgate_tower::ConfigError>(())
//! ```

mod controller;
mod layer;
mod service;

pub use controller::{
    DEFAULT_HYSTERESIS_PERCENT, DEFAULT_INTERVAL, DEFAULT_STEP_PERCENT, DEFAULT_THRESHOLDS,
};
pub use layer::{DEFAULT_WORKER_NAME, WorkerShedLayer};
pub use service::WorkerShed;
