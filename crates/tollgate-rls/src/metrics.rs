//! The service's metrics, in tollgate's families: `tollgate_decisions_total{limiter, outcome}` (outcome
//! `allowed`, `limited`, `shadow_limited`, `store_error`), `tollgate_near_limit_total{limiter}` and
//! `tollgate_store_errors_total{limiter, kind, failure_policy}`, where `limiter` is the limit's stats key as
//! envoyproxy/ratelimit names it: its configured path (`domain.key_value.key`, bounded by the configuration), the
//! request's values only where the configuration asks (`detailed_metric`, `value_to_metric`). Beside them:
//! `tollgate_rls_requests_in_flight`, `tollgate_rls_domain_not_found_total`, `tollgate_rls_global_shadow_total`
//! and `tollgate_rls_config_loads_total{result}`.

use metrics::{Counter, Gauge};
use tollgate_core::{Decision, StoreError};
use tollgate_tower::observe::STORE_ERRORS_TOTAL;

use crate::counters::LimitCounters;
use crate::plan::PlannedLimit;

/// Requests being answered.
pub const REQUESTS_IN_FLIGHT: &str = "tollgate_rls_requests_in_flight";
/// Requests for a domain no file configures.
pub const DOMAIN_NOT_FOUND_TOTAL: &str = "tollgate_rls_domain_not_found_total";
/// Requests answered `OK` by the global shadow mode although a descriptor was over its limit.
pub const GLOBAL_SHADOW_TOTAL: &str = "tollgate_rls_global_shadow_total";
/// Configuration loads, `result` `ok` or `error` (an error keeps the configuration loaded before).
pub const CONFIG_LOADS_TOTAL: &str = "tollgate_rls_config_loads_total";

/// The service's gauges and counters.
#[derive(Debug)]
pub(crate) struct Metrics {
    in_flight: Gauge,
    domain_not_found: Counter,
    global_shadow: Counter,
}

/// Decrements the in-flight gauge when the request is answered (or dropped).
pub(crate) struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1);
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            in_flight: metrics::gauge!(REQUESTS_IN_FLIGHT),
            domain_not_found: metrics::counter!(DOMAIN_NOT_FOUND_TOTAL),
            global_shadow: metrics::counter!(GLOBAL_SHADOW_TOTAL),
        }
    }

    pub(crate) fn in_flight(&self) -> InFlight {
        self.in_flight.increment(1);
        InFlight(self.in_flight.clone())
    }

    pub(crate) fn domain_not_found(&self) {
        self.domain_not_found.increment(1);
    }

    pub(crate) fn global_shadow(&self) {
        self.global_shadow.increment(1);
    }

    fn with<R>(&self, planned: &PlannedLimit<'_>, f: impl FnOnce(&LimitCounters) -> R) -> R {
        match &planned.stats_key {
            // Request values in the name: registered per decision (the configuration asked for it).
            Some(key) => f(&LimitCounters::new(key)),
            None => f(planned
                .limit
                .counters
                .get_or_init(|| LimitCounters::new(&planned.limit.full_key))),
        }
    }

    /// An unlimited descriptor.
    pub(crate) fn allowed(&self, planned: &PlannedLimit<'_>) {
        self.with(planned, |c| c.allowed.increment(1));
    }

    /// A decision (refusals in shadow mode as `shadow_limited`); near the limit if what is left after an
    /// admission is under a fifth of the limit (envoyproxy/ratelimit's `NEAR_LIMIT_RATIO` of 0.8).
    pub(crate) fn decided(&self, planned: &PlannedLimit<'_>, decision: &Decision) {
        let shadow = planned.limit.shadow_mode;
        self.with(planned, |c| {
            if decision.is_allowed() {
                c.allowed.increment(1);
                let used = decision.limit.saturating_sub(decision.remaining);
                if used > decision.limit * 4 / 5 {
                    c.near_limit.increment(1);
                }
            } else if shadow {
                c.shadow_limited.increment(1);
            } else {
                c.limited.increment(1);
            }
        });
    }

    /// A store error.
    pub(crate) fn store_error(
        &self,
        planned: &PlannedLimit<'_>,
        e: &StoreError,
        failure_policy: &'static str,
    ) {
        metrics::counter!(
            STORE_ERRORS_TOTAL,
            "limiter" => planned.stats_key().to_owned(),
            "kind" => e.kind(),
            "failure_policy" => failure_policy
        )
        .increment(1);
    }
}

/// Counts a configuration load.
pub(crate) fn config_load(ok: bool) {
    metrics::counter!(CONFIG_LOADS_TOTAL, "result" => if ok { "ok" } else { "error" }).increment(1);
}
