//! The decision shared by every clone of a limiter: store call, failure policy, shadow mode, metrics, logs.

use std::sync::Arc;

use tollgate_core::{Decision, FailurePolicy, MemoryStore, Policy, Store, StoreError, Timestamp};

use crate::observe::{Counters, LogGate};
use crate::{BoxError, Mode, Name, Rejection, RejectionKind, Verdict};

/// What a limiter concluded about one request.
pub(crate) enum Conclusion {
    /// Pass the request on; the verdict (if any) goes onto the response.
    Admit(Option<Box<Verdict>>),
    /// Reject it: a [`Rejection`], boxed already (as it will be answered), which keeps admissions small to move.
    Reject(BoxError),
}

/// The failure policy's answer to a store error.
enum Recovery {
    /// Decided by the local fallback store.
    Decided(Decision),
    /// Admit without a decision.
    Open,
    /// Reject (or, in shadow mode, admit) as unavailable.
    Closed,
}

pub(crate) struct Shared<K, St, C> {
    pub(crate) name: Name,
    pub(crate) policy: Policy,
    pub(crate) store: Arc<St>,
    pub(crate) key: K,
    pub(crate) cost: C,
    pub(crate) switch: crate::EnforcementSwitch,
    on_error: FailurePolicy,
    fallback: Option<Arc<MemoryStore>>,
    counters: Counters,
    log_gate: LogGate,
}

impl<K, St: Store, C> Shared<K, St, C> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: Name,
        policy: Policy,
        store: Arc<St>,
        key: K,
        cost: C,
        switch: crate::EnforcementSwitch,
        on_error: FailurePolicy,
        fallback: Option<Arc<MemoryStore>>,
    ) -> Self {
        let counters = Counters::new(&name, "limited");
        Self {
            name,
            policy,
            store,
            key,
            cost,
            switch,
            on_error,
            fallback,
            counters,
            log_gate: LogGate::new(),
        }
    }

    /// Decides one request in `mode` (`Enforce` or `Shadow`; `Off` never gets here); an admission carries its
    /// verdict if `keep`.
    pub(crate) async fn decide(
        &self,
        key: String,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Conclusion {
        let result = self.store.check(&key, &self.policy, cost).await;
        self.conclude(result, &key, cost, mode, keep)
    }

    /// Decides at once if the store can without waiting (see [`Store::check_immediate`]).
    pub(crate) fn decide_now(
        &self,
        key: &str,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Option<Conclusion> {
        let result = self.store.check_immediate(key, &self.policy, cost)?;
        Some(self.conclude(result, key, cost, mode, keep))
    }

    /// Turns the store's answer into a conclusion: failure policy, shadow mode, metrics.
    fn conclude(
        &self,
        result: Result<Decision, StoreError>,
        key: &str,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Conclusion {
        let decision = match result {
            Ok(decision) => decision,
            Err(err) => match self.recover(key, cost, &err) {
                Recovery::Decided(decision) => decision,
                Recovery::Open => return Conclusion::Admit(None),
                Recovery::Closed => return self.fail_closed(mode),
            },
        };
        let verdict = || Verdict {
            limiter: self.name.clone(),
            window: self.policy.quota().period(),
            decision,
            enforced: mode == Mode::Enforce,
        };
        if decision.is_allowed() {
            self.counters.allowed.increment(1);
            return Conclusion::Admit(keep.then(|| Box::new(verdict())));
        }
        if mode == Mode::Shadow {
            self.counters.shadow_rejected.increment(1);
            if self.log_gate.open() {
                tracing::info!(
                    limiter = &*self.name,
                    outcome = decision.outcome.as_str(),
                    "shadow mode: request over the limit admitted"
                );
            }
            return Conclusion::Admit(keep.then(|| Box::new(verdict())));
        }
        self.counters.rejected.increment(1);
        Conclusion::Reject(Rejection::rate_limited(verdict()).into())
    }

    /// Applies the failure policy after a store error.
    fn recover(&self, key: &str, cost: u64, err: &StoreError) -> Recovery {
        metrics::counter!(
            "tollgate_store_errors_total",
            "limiter" => self.name.to_string(),
            "kind" => err.kind(),
            "failure_policy" => self.on_error.as_str()
        )
        .increment(1);
        if self.log_gate.open() {
            tracing::warn!(
                limiter = &*self.name,
                error = %err,
                failure_policy = self.on_error.as_str(),
                "rate-limit store failed; applying the failure policy"
            );
        }
        match (&self.fallback, self.on_error) {
            (_, FailurePolicy::Open) => {
                self.counters.failed_open.increment(1);
                Recovery::Open
            }
            (Some(fallback), FailurePolicy::Local) => {
                match fallback.check_now(key, &self.policy, cost) {
                    Ok(decision) => {
                        self.counters.failed_local.increment(1);
                        Recovery::Decided(decision)
                    }
                    // The local store is full too: nothing left to decide with.
                    Err(_) => Recovery::Closed,
                }
            }
            _ => Recovery::Closed,
        }
    }

    fn fail_closed(&self, mode: Mode) -> Conclusion {
        self.counters.failed_closed.increment(1);
        if mode == Mode::Shadow {
            return Conclusion::Admit(None);
        }
        let rejection = Rejection::new(RejectionKind::StoreUnavailable, self.name.clone());
        // The retry the core's closed policy announces (one period, within 1 s to 60 s); it does not depend on now.
        let closed = FailurePolicy::Closed.synthesize(&self.policy, Timestamp::default());
        Conclusion::Reject(
            match closed.and_then(|d| d.retry_after) {
                Some(retry) => rejection.with_retry_after(retry),
                None => rejection,
            }
            .into(),
        )
    }
}
