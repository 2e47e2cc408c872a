//! A limit's decision counters: kept with the limit in the configuration (registered at its first decision) and
//! counted by the service's metrics.

use metrics::Counter;
use tollgate_tower::observe::{DECISIONS_TOTAL, NEAR_LIMIT_TOTAL};

/// A limit's counters, registered once per limit (its configured path is its label).
#[derive(Debug, Clone)]
pub(crate) struct LimitCounters {
    pub(crate) allowed: Counter,
    pub(crate) limited: Counter,
    pub(crate) shadow_limited: Counter,
    pub(crate) near_limit: Counter,
}

impl LimitCounters {
    /// The counters of the limit whose stats key is `limiter`.
    pub(crate) fn new(limiter: &str) -> Self {
        let c = |outcome: &'static str| metrics::counter!(DECISIONS_TOTAL, "limiter" => limiter.to_owned(), "outcome" => outcome);
        Self {
            allowed: c("allowed"),
            limited: c("limited"),
            shadow_limited: c("shadow_limited"),
            near_limit: metrics::counter!(NEAR_LIMIT_TOTAL, "limiter" => limiter.to_owned()),
        }
    }
}
