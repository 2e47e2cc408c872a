//! The worker-utilization load shedder: when this instance is busy, shed the least important traffic first.
//!
//! [`WorkerShedLayer`] counts the requests in flight through it (until each response body is finished) against
//! the instance's capacity, and sheds with a [`Shed`](crate::RejectionKind::Shed) rejection (HTTP 503, gRPC
//! `UNAVAILABLE`). Two decisions, in this order, each counted apart:
//!
//! 1. **The gate, at arrival** (`reason="gate"`): each [`Priority`](crate::Priority) has a threshold, a share of
//!    capacity — defaults `Low` 60 %, `Normal` 75 %, `High` 90 %, `Critical` 100 % — and a request is admitted
//!    only while in-flight is below its class's line (`capacity × threshold`, rounded down). The check and the
//!    count are one atomic step, so a sudden burst of `Low` fills 60 % of the instance and no more: the lower
//!    classes can never take the capacity reserved for the classes above them, and a `Critical` request is
//!    admitted whenever any capacity is left.
//! 2. **The controller, below the lines** (`reason="controller"`): Stripe's gradual shedder, which keeps shedding
//!    from flapping while utilization stays high. It turns utilization into a shed level per class — the
//!    percentage of that class's requests rejected even below its line:
//!    - it runs at most once per interval (default 100 ms, on the request path, no timer), on the peak in-flight
//!      count since its last run, so bursts between runs count; intervals in which no request came are caught up
//!      at the next one (on what is in flight then), so a quiet spell after a burst ends its shedding as a timer
//!      would have, rather than leaving it for the next requests to meet;
//!    - at or above its threshold, a class's level rises by a step (default 25 points); it falls by a step only
//!      once utilization is more than the hysteresis (default 10 points) below the threshold: shedding ramps up
//!      and back down gradually;
//!    - a level of `p` % rejects exactly `p` of every 100 consecutive requests of the class, spread evenly, with no
//!      randomness, so behaviour is reproducible;
//!    - `Critical` is never shed by the controller: the capacity is kept for it, and at 100 % utilization the
//!      requests filling the instance are the lower classes' (its only limit is the gate).
//!
//! Metrics: `tollgate_decisions_total{limiter, outcome}` (`allowed`, `shed`, `shadow_shed`),
//! `tollgate_shed_total{limiter, reason}` (`gate` or `controller`: which of the two shed an enforced request), and
//! the gauges `tollgate_worker_utilization_percent` and `tollgate_worker_shed_percent{priority}`.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_tower::WorkerShedLayer;
//! use tollgate_tower::Priority;
//!
//! let layer = WorkerShedLayer::new(64, |req: &http::Request<()>| {
//!     if req.uri().path().starts_with("/batch") { Priority::Low } else { Priority::Normal }
//! })?
//! .thresholds(50, 70, 85, 100)?
//! .interval(Duration::from_millis(50));
//! assert_eq!(layer.shed_percent(Priority::Low), 0);
//! assert_eq!(layer.line(Priority::Low), 32); // 50 % of 64: Low is admitted while fewer are in flight
//! # Ok::<(), tollgate_tower::ConfigError>(())
//! ```

mod controller;
mod layer;
mod service;

pub use controller::{
    DEFAULT_HYSTERESIS_PERCENT, DEFAULT_INTERVAL, DEFAULT_STEP_PERCENT, DEFAULT_THRESHOLDS,
};
pub use layer::{DEFAULT_WORKER_NAME, SHED_TOTAL, WorkerShedLayer};
