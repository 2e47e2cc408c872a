//! The metrics every tollgate limiter reports, under the same names and labels whichever limiter it is:
//!
//! - `tollgate_decisions_total{limiter, outcome}` ([`DECISIONS_TOTAL`]): one count per decision, with outcome
//!   `allowed`, `limited` or `shed` (the limiter's refusal), `shadow_limited` / `shadow_shed` (over the limit,
//!   admitted by shadow mode), `store_error_open`, `store_error_closed`, `shadow_store_error_closed` or
//!   `store_error_local` (the store failed and the failure policy decided);
//! - `tollgate_store_errors_total{limiter, kind, failure_policy}` ([`STORE_ERRORS_TOTAL`]): every store error, by
//!   [`StoreError::kind`](tollgate_core::StoreError::kind);
//! - `tollgate_near_limit_total{limiter}` ([`NEAR_LIMIT_TOTAL`]): admissions that left less than the limiter's
//!   near-limit share of its limit (`.near_limit(share)`, default 20 %), the alerting signal before clients see 429s;
//! - `tollgate_charges_lost_total{limiter}` ([`CHARGES_LOST_TOTAL`]): charges after the response
//!   ([`RateLimitLayer::cost_after`](crate::RateLimitLayer::cost_after)) that could not reach the store (it
//!   failed, or could not be reached): the request was served, its real cost never counted;
//! - `tollgate_streams_cut_total{limiter}` ([`STREAMS_CUT_TOTAL`]) and `tollgate_streams_in_debt_total{limiter}`
//!   ([`STREAMS_IN_DEBT_TOTAL`]): streamed responses ([`stream_cost`](crate::stream_cost)) cut at a budget, and
//!   those that ended with their key's budget spent (the key owes the overdraft).
//!
//! Every decision is also one `tracing` span, with one event inside it, at DEBUG on the target
//! [`DECISION_TARGET`] (`tollgate::decision`), both with the fields `limiter`, `algorithm`, `store`, `outcome`, `remaining` and `store_latency_us`; with no
//! subscriber listening at DEBUG nothing is timed, evaluated or formatted.
//!
//! Each limiter registers its series once, when its layer is first applied, so that deciding does no label work;
//! install the `metrics` recorder before building layers. Logs about every request (a failing store, shadow
//! refusals, a misconfiguration) go through a gate that lets one line through per second.
//!
//! ```
//! use tollgate_tower::observe::{DECISIONS_TOTAL, STORE_ERRORS_TOTAL};
//! assert_eq!(DECISIONS_TOTAL, "tollgate_decisions_total");
//! assert_eq!(STORE_ERRORS_TOTAL, "tollgate_store_errors_total");
//! ```

use metrics::Counter;
use tollgate_core::{FailurePolicy, StoreError};

use crate::Name;
pub(crate) use tollgate_core::__private::LogGate;

mod signal;
pub(crate) use signal::NearLimitShare;
pub use signal::{DECISION_TARGET, NEAR_LIMIT_TOTAL};
pub(crate) use signal::{Signals, store_name, timed, timed_async};

/// The counter every limiter reports its decisions to: `tollgate_decisions_total{limiter, outcome}`.
pub const DECISIONS_TOTAL: &str = "tollgate_decisions_total";

/// The counter of charges after the response that never reached the store: `tollgate_charges_lost_total{limiter}`.
pub const CHARGES_LOST_TOTAL: &str = "tollgate_charges_lost_total";

/// The counter of streamed responses a limiter cut at its budget: `tollgate_streams_cut_total{limiter}`.
pub const STREAMS_CUT_TOTAL: &str = "tollgate_streams_cut_total";

/// The counter of streamed responses that ended while their key's budget was spent (a limiter that lets streams
/// finish: the key owes the overdraft): `tollgate_streams_in_debt_total{limiter}`.
pub const STREAMS_IN_DEBT_TOTAL: &str = "tollgate_streams_in_debt_total";

/// A limiter's decision counters, registered once (per layer) so that deciding does no label work.
#[derive(Debug)]
pub(crate) struct Counters {
    /// `outcome="allowed"`.
    pub(crate) allowed: Counter,
    /// The rejection outcome given to [`new`](Self::new) (`limited`, `shed`).
    pub(crate) rejected: Counter,
    /// The same in shadow mode (`shadow_limited`, `shadow_shed`): over the limit, admitted anyway.
    pub(crate) shadow_rejected: Counter,
    /// `store_error_open`: the store failed and the request was admitted.
    pub(crate) failed_open: Counter,
    /// `store_error_closed`: the store failed and the request was rejected.
    pub(crate) failed_closed: Counter,
    /// `shadow_store_error_closed`: the store failed, the closed policy would have rejected the request, and shadow
    /// mode admitted it.
    pub(crate) shadow_failed_closed: Counter,
    /// `store_error_local`: the store failed and the local fallback admitted the request (a request the fallback
    /// refuses counts as the limiter's rejection outcome, so that each decision counts once).
    pub(crate) failed_local: Counter,
}

impl Counters {
    /// The counters of the limiter `name`, whose rejections count as `rejected` (`limited` or `shed`).
    #[must_use]
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
pub(crate) struct StoreErrors {
    limiter: Name,
    failure_policy: &'static str,
    by_kind: [Counter; STORE_ERROR_KINDS.len()],
}

impl StoreErrors {
    /// The store-error counters of the limiter `name`, whose failure policy is `policy`.
    #[must_use]
    pub(crate) fn new(name: &Name, policy: FailurePolicy) -> Self {
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
    pub(crate) fn count(&self, err: &StoreError) {
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
