//! Metrics and rate-limited logs shared by the layers of this crate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use metrics::Counter;
use tollgate_tower::Name;

/// `tollgate_decisions_total{limiter, outcome}`: the same counter as the rate limiter's.
pub(crate) const DECISIONS_TOTAL: &str = "tollgate_decisions_total";

/// Decision counters, registered once per layer so the hot path does no label work.
pub(crate) struct Counters {
    pub(crate) allowed: Counter,
    pub(crate) rejected: Counter,
    pub(crate) shadow_rejected: Counter,
    pub(crate) failed_open: Counter,
    pub(crate) failed_closed: Counter,
    pub(crate) failed_local: Counter,
}

impl Counters {
    /// `rejected` names the outcome of a rejection (`limited` for a concurrency limit, `shed` for a shedder).
    pub(crate) fn new(name: &Name, rejected: &'static str) -> Self {
        let c = |outcome: &'static str| metrics::counter!(DECISIONS_TOTAL, "limiter" => name.to_string(), "outcome" => outcome);
        Self {
            allowed: c("allowed"),
            rejected: c(rejected),
            shadow_rejected: c(if rejected == "shed" {
                "shadow_shed"
            } else {
                "shadow_limited"
            }),
            failed_open: c("store_error_open"),
            failed_closed: c("store_error_closed"),
            failed_local: c("store_error_local"),
        }
    }
}

/// Lets one log line through per second, so a failing store or a shadow limit cannot flood the logs.
pub(crate) struct LogGate {
    start: Instant,
    next_ms: AtomicU64,
}

impl LogGate {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            next_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn open(&self) -> bool {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_ms
                .compare_exchange(next, now + 1_000, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}
