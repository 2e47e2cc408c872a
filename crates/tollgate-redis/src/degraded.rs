//! Accounting for decisions made without Redis: a metric for every one, a log line every few seconds at most.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tollgate_core::{FailurePolicy, StoreError};

/// At most one log line per this interval; the others are counted and reported with the next line.
const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Counter of decisions the failure policy made (labels `reason`, `policy`).
pub const DEGRADED_TOTAL: &str = "tollgate_store_degraded_total";
/// Histogram of Redis round-trip times in seconds (label `outcome`: `ok` or `error`).
pub const LATENCY_SECONDS: &str = "tollgate_store_latency_seconds";
/// Gauge: 1 while the circuit is open or half-open, 0 when closed.
pub const CIRCUIT_OPEN: &str = "tollgate_store_circuit_open";

#[derive(Debug)]
pub(crate) struct DegradedLog {
    inner: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl DegradedLog {
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// Counts one degraded decision and logs it unless a line went out less than [`LOG_INTERVAL`] ago.
    pub(crate) fn record(&self, error: &StoreError, policy: FailurePolicy) {
        metrics::counter!(DEGRADED_TOTAL, "reason" => error.kind(), "policy" => policy.as_str())
            .increment(1);
        let suppressed = {
            let mut state = self
                .inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match state.last {
                Some(at) if at.elapsed() < LOG_INTERVAL => {
                    state.suppressed += 1;
                    return;
                }
                _ => {
                    state.last = Some(Instant::now());
                    std::mem::take(&mut state.suppressed)
                }
            }
        };
        tracing::warn!(
            reason = error.kind(),
            failure_policy = policy.as_str(),
            suppressed,
            "rate limiter deciding without Redis ({error}); failure policy `{policy}` applies \
             ({suppressed} similar decisions since the last report)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_are_counted() {
        let log = DegradedLog::new();
        for _ in 0..10 {
            log.record(&StoreError::CircuitOpen, FailurePolicy::Open);
        }
        let state = log.inner.lock().unwrap();
        assert!(
            state.last.is_some(),
            "the first degraded decision is logged"
        );
        assert_eq!(
            state.suppressed, 9,
            "the next nine within the interval are only counted"
        );
    }
}
