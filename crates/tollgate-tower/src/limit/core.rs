//! The judge every limiter decides through: the enforcement mode, the decision metrics, the rate-limited logs,
//! and the one place where a store error meets the layer's failure policy. A limiter's own code only says what
//! its store or rule answered; what happens next is decided here, alike for every limiter.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::{FailurePolicy, StoreError};

use crate::observe::{Counters, LogGate, Signals, StoreErrors};
use crate::{BoxError, EnforcementSwitch, Mode, Name, Rejection, RejectionKind};

/// What a limiter concluded about one request.
pub(crate) enum Conclusion<G> {
    /// Pass the request on with what the admission grants (a verdict for the headers, a permit to hold), if any.
    Admit(Option<G>),
    /// Refuse it: a [`Rejection`] (or a configuration error), boxed already, as it will be answered.
    Reject(BoxError),
}

/// A limiter's identity and everything around its decisions; one per layer, shared by every service it builds.
pub(crate) struct Judge {
    pub(crate) name: Name,
    pub(crate) switch: EnforcementSwitch,
    on_error: FailurePolicy,
    counters: Counters,
    /// `None` for a limiter without a store (the worker shedder): no store-error series to register.
    store_errors: Option<StoreErrors>,
    /// The near-limit counter and the per-decision `tracing` events.
    signals: Signals,
    log_gate: LogGate,
    /// The store-failure line's own gate, so that shadow-mode lines never hide a degraded decision.
    degraded_gate: LogGate,
    /// Degraded decisions since the last store-failure line.
    degraded: AtomicU64,
}

impl Judge {
    /// The judge of the limiter `name`, whose refusals count as `refused` (`limited` or `shed`), whose store
    /// errors (if it has a store) meet `on_error`, and whose decisions `signals` reports.
    pub(crate) fn new(
        name: Name,
        switch: EnforcementSwitch,
        on_error: Option<FailurePolicy>,
        refused: &'static str,
        signals: Signals,
    ) -> Self {
        Self {
            counters: Counters::new(&name, refused),
            store_errors: on_error.map(|policy| StoreErrors::new(&name, policy)),
            name,
            switch,
            on_error: on_error.unwrap_or_default(),
            signals,
            log_gate: LogGate::new(),
            degraded_gate: LogGate::new(),
            degraded: AtomicU64::new(0),
        }
    }

    /// The mode to decide the next request in.
    #[inline]
    pub(crate) fn mode(&self) -> Mode {
        self.switch.mode()
    }

    /// Counts an admission by the limiter's own store or rule, which left `remaining` of `limit`.
    #[inline]
    pub(crate) fn admitted(&self, remaining: u64, limit: u64) {
        self.counters.allowed.increment(1);
        self.signals.admitted("allowed", remaining, limit);
    }

    /// Counts an admission of a limiter without a quota to report (the worker shedder).
    #[inline]
    #[cfg(feature = "stack")]
    pub(crate) fn admitted_unmetered(&self) {
        self.counters.allowed.increment(1);
        self.signals.decided("allowed", None);
    }

    /// Reports an exempt request (its counter belongs to the limiter's overrides).
    pub(crate) fn exempted(&self) {
        self.signals.decided("exempt", None);
    }

    /// Counts an admission by the local fallback (the shared store failed), which left `remaining` of `limit`.
    pub(crate) fn admitted_locally(&self, remaining: u64, limit: u64) {
        self.counters.failed_local.increment(1);
        self.signals.admitted("store_error_local", remaining, limit);
    }

    /// A request over the limit (`remaining` left): refused with `rejection`, or in shadow mode admitted with
    /// `shadow_grant` and counted apart. `detail` says why, for the logs.
    pub(crate) fn over_limit<G>(
        &self,
        mode: Mode,
        remaining: u64,
        detail: &dyn fmt::Display,
        shadow_grant: impl FnOnce() -> Option<G>,
        rejection: impl FnOnce() -> Rejection,
    ) -> Conclusion<G> {
        self.signals.over_limit(mode, remaining);
        if mode == Mode::Shadow {
            self.counters.shadow_rejected.increment(1);
            if self.log_gate.open() {
                tracing::info!(
                    limiter = &*self.name,
                    detail = %detail,
                    "shadow mode: request over the limit admitted"
                );
            }
            return Conclusion::Admit(shadow_grant());
        }
        self.counters.rejected.increment(1);
        tracing::debug!(limiter = &*self.name, detail = %detail, "request refused");
        Conclusion::Reject(rejection().into())
    }

    /// The failure policy after a store error: admit (`Open`), decide on the local fallback (`Local`: `local`
    /// answers, `None` when it cannot decide either), or refuse with 503 (`Closed`), announcing `retry_after`.
    pub(crate) fn store_failed<G>(
        &self,
        err: &StoreError,
        mode: Mode,
        retry_after: Option<Duration>,
        local: impl FnOnce() -> Option<Conclusion<G>>,
    ) -> Conclusion<G> {
        if let Some(errors) = &self.store_errors {
            errors.count(err);
        }
        let degraded = self.degraded.fetch_add(1, Ordering::Relaxed) + 1;
        if self.degraded_gate.open() {
            // The count covers the interval's decisions, whatever their cause; the line names the latest.
            self.degraded.fetch_sub(degraded, Ordering::Relaxed);
            tracing::warn!(
                limiter = &*self.name,
                cause = err.kind(),
                error = %err,
                failure_policy = self.on_error.as_str(),
                decisions = degraded,
                "limiter store failed; the failure policy decided {degraded} request(s) since the last such line"
            );
        }
        match self.on_error {
            FailurePolicy::Open => {
                self.counters.failed_open.increment(1);
                self.signals.decided("store_error_open", None);
                Conclusion::Admit(None)
            }
            // The local store is full or failing too: nothing left to decide with.
            FailurePolicy::Local => local().unwrap_or_else(|| self.fail_closed(mode, retry_after)),
            FailurePolicy::Closed => self.fail_closed(mode, retry_after),
        }
    }

    fn fail_closed<G>(&self, mode: Mode, retry_after: Option<Duration>) -> Conclusion<G> {
        if mode == Mode::Shadow {
            // Refused by the closed policy, admitted by shadow mode: counted apart, or a dark launch's dashboards
            // would show 503s no client got.
            self.counters.shadow_failed_closed.increment(1);
            self.signals.decided("shadow_store_error_closed", None);
            return Conclusion::Admit(None);
        }
        self.counters.failed_closed.increment(1);
        self.signals.decided("store_error_closed", None);
        let rejection = Rejection::new(RejectionKind::StoreUnavailable, self.name.clone());
        Conclusion::Reject(
            match retry_after {
                Some(retry) => rejection.with_retry_after(retry),
                None => rejection,
            }
            .into(),
        )
    }
}

/// The enforcement builder methods every limiter layer shares, written once: `mode`, `shadow`, `switch` and
/// `enforcement`, given the path to the layer's switch and how the layer takes a new one (`|layer, switch| layer`,
/// which builds the layer's state anew around it).
macro_rules! enforcement_methods {
    ($($switch:ident).+, $switched:expr) => {
        /// Sets the mode the layer starts in. The mode lives in the layer's switch: after
        /// [`switch`](Self::switch) this sets the mode of every layer sharing that switch (dark-launch one limiter
        /// with a switch of its own), and a `switch` given afterwards brings its own mode instead.
        pub fn mode(self, mode: $crate::Mode) -> Self {
            self.$($switch).+.set(mode);
            self
        }

        /// Starts in shadow mode: decide, count and log what would be refused, refuse nothing.
        pub fn shadow(self) -> Self {
            self.mode($crate::Mode::Shadow)
        }

        /// Uses `switch` (e.g. one shared by several layers) for the enforcement mode, in the mode the switch is
        /// in: a mode set on this layer before is the old switch's, and is not carried over.
        pub fn switch(self, switch: $crate::EnforcementSwitch) -> Self {
            ($switched)(self, switch)
        }

        /// A handle on the enforcement mode, to flip it at run time (the kill switch).
        #[must_use]
        pub fn enforcement(&self) -> $crate::EnforcementSwitch {
            self.$($switch).+.clone()
        }
    };
}
pub(crate) use enforcement_methods;
