//! Metrics and rate-limited logs, shared by every tollgate limiter (this crate's rate limiter and the
//! `tollgate-stack` limiters) and adapter, so that they count and log alike; [`Signals`] adds the near-limit
//! counter and the per-decision `tracing` events.
//!
//! ```
//! use tollgate_tower::Name;
//! use tollgate_tower::observe::{Counters, LogGate};
//!
//! static GATE: LogGate = LogGate::new();
//! let counters = Counters::new(&Name::from("per-client"), "limited");
//! counters.allowed.increment(1);
//!
//! use tollgate_core::{FailurePolicy, StoreError};
//! use tollgate_tower::observe::StoreErrors;
//! let errors = StoreErrors::new(&Name::from("per-client"), FailurePolicy::Open);
//! errors.count(&StoreError::CircuitOpen); // tollgate_store_errors_total{kind="circuit_open", ..} + 1
//! assert!(GATE.open()); // the first line goes through
//! assert!(!GATE.open()); // the next one within a second does not
//! ```

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use metrics::Counter;
use tollgate_core::{FailurePolicy, StoreError};

use crate::Name;

mod signal;
pub use signal::{
    DECISION_TARGET, NEAR_LIMIT_TOTAL, NearLimitShare, ShareError, Signals, store_name, timed,
    timed_async,
};

/// The counter every limiter reports its decisions to: `tollgate_decisions_total{limiter, outcome}`.
pub const DECISIONS_TOTAL: &str = "tollgate_decisions_total";

/// A limiter's decision counters, registered once (per layer) so that deciding does no label work.
#[derive(Debug)]
pub struct Counters {
    /// `outcome="allowed"`.
    pub allowed: Counter,
    /// The rejection outcome given to [`new`](Self::new) (`limited`, `shed`).
    pub rejected: Counter,
    /// The same in shadow mode (`shadow_limited`, `shadow_shed`): over the limit, admitted anyway.
    pub shadow_rejected: Counter,
    /// `store_error_open`: the store failed and the request was admitted.
    pub failed_open: Counter,
    /// `store_error_closed`: the store failed and the request was rejected.
    pub failed_closed: Counter,
    /// `shadow_store_error_closed`: the store failed, the closed policy would have rejected the request, and shadow
    /// mode admitted it.
    pub shadow_failed_closed: Counter,
    /// `store_error_local`: the store failed and the local fallback admitted the request (a request the fallback
    /// refuses counts as the limiter's rejection outcome, so that each decision counts once).
    pub failed_local: Counter,
}

impl Counters {
    /// The counters of the limiter `name`, whose rejections count as `rejected` (`limited` or `shed`).
    #[must_use]
    pub fn new(name: &Name, rejected: &'static str) -> Self {
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
            shadow_failed_closed: c("shadow_store_error_closed"),
            failed_local: c("store_error_local"),
        }
    }
}

/// The counter every store error is reported to: `tollgate_store_errors_total{limiter, kind, failure_policy}`.
pub const STORE_ERRORS_TOTAL: &str = "tollgate_store_errors_total";

/// The store-error kinds [`StoreErrors`] registers up front (every [`StoreError::kind`] known today).
const STORE_ERROR_KINDS: [&str; 4] = ["key_capacity", "timeout", "circuit_open", "backend"];

/// A limiter's store-error counters, registered once (per layer): while a store is down every request fails
/// through them, so counting one does no label work and allocates nothing.
#[derive(Debug)]
pub struct StoreErrors {
    limiter: Name,
    failure_policy: &'static str,
    by_kind: [Counter; STORE_ERROR_KINDS.len()],
}

impl StoreErrors {
    /// The store-error counters of the limiter `name`, whose failure policy is `policy`.
    #[must_use]
    pub fn new(name: &Name, policy: FailurePolicy) -> Self {
        let failure_policy = policy.as_str();
        Self {
            limiter: name.clone(),
            failure_policy,
            by_kind: STORE_ERROR_KINDS.map(|kind| {
                metrics::counter!(STORE_ERRORS_TOTAL, "limiter" => name.to_string(), "kind" => kind, "failure_policy" => failure_policy)
            }),
        }
    }

    /// Counts `err`.
    pub fn count(&self, err: &StoreError) {
        match STORE_ERROR_KINDS
            .iter()
            .position(|&kind| kind == err.kind())
        {
            Some(i) => self.by_kind[i].increment(1),
            // A kind added to the core after this list: counted all the same, with the label work.
            None => metrics::counter!(
                STORE_ERRORS_TOTAL,
                "limiter" => self.limiter.to_string(),
                "kind" => err.kind(),
                "failure_policy" => self.failure_policy
            )
            .increment(1),
        }
    }
}

/// Lets one log line through per second, so that a failing store, a shadow limit or a misconfiguration — each of
/// which concerns every request — cannot flood the logs.
#[derive(Debug)]
pub struct LogGate {
    /// Milliseconds since [`epoch`] before which the gate stays shut.
    next_ms: AtomicU64,
}

impl Default for LogGate {
    fn default() -> Self {
        Self::new()
    }
}

impl LogGate {
    /// An open gate; `const`, so it can be a `static`.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            next_ms: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now; if so, the gate shuts for a second.
    pub fn open(&self) -> bool {
        let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_ms
                .compare_exchange(next, now + 1_000, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// The instant every gate measures from (the first use of any).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}
