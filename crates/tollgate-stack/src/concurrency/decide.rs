//! The decision shared by every clone of a lease-limited service: acquire, failure policy, shadow mode, metrics.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::lease::{LeaseId, LeaseStore, MemoryLeaseStore, block_on_ready};
use tollgate_core::{FailurePolicy, StoreError};
use tollgate_tower::observe::{Counters, LogGate, NearLimitShare, Signals, StoreErrors};
use tollgate_tower::{EnforcementSwitch, Mode, Name, Rejection, RejectionKind};

use crate::Permit;
use crate::lease_guard::LeaseGuard;

/// What the limiter concluded about one request.
pub(crate) enum Conclusion {
    /// Pass the request on, holding the permit (if any) until the response is finished.
    Admit(Option<Permit>),
    /// Reject it.
    Reject(Rejection),
}

/// Settings common to the concurrency limiter and the fleet shedder.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) name: Name,
    pub(crate) switch: EnforcementSwitch,
    pub(crate) lease_ttl: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) on_error: FailurePolicy,
    pub(crate) near_limit: NearLimitShare,
}

pub(crate) struct Shared<R, L> {
    pub(crate) settings: Settings,
    pub(crate) rule: R,
    store: Arc<L>,
    kind: RejectionKind,
    fallback: Option<Arc<MemoryLeaseStore>>,
    counters: Counters,
    store_errors: StoreErrors,
    log_gate: LogGate,
    signals: Signals,
}

impl<R, L: LeaseStore> Shared<R, L> {
    pub(crate) fn new(
        settings: Settings,
        rule: R,
        store: Arc<L>,
        kind: RejectionKind,
        fallback: Option<Arc<MemoryLeaseStore>>,
    ) -> Self {
        let outcome = if kind.is_overload() {
            "shed"
        } else {
            "limited"
        };
        let counters = Counters::new(&settings.name, outcome);
        let store_errors = StoreErrors::new(&settings.name, settings.on_error);
        let algorithm = if kind.is_overload() {
            "fleet_shed"
        } else {
            "concurrency"
        };
        let signals = Signals::new(
            &settings.name,
            outcome,
            algorithm,
            tollgate_tower::observe::store_name::<L>(),
            settings.near_limit,
        );
        Self {
            settings,
            rule,
            store,
            kind,
            fallback,
            counters,
            store_errors,
            log_gate: LogGate::new(),
            signals,
        }
    }

    /// Decides one request against `limit` leases on `key`, in `mode` (`Enforce` or `Shadow`).
    pub(crate) async fn decide(self: Arc<Self>, key: String, limit: u64, mode: Mode) -> Conclusion {
        let lease = LeaseId::new();
        let ttl = self.settings.lease_ttl;
        // A shared store's acquire may land even if this future is dropped while waiting for the reply (the
        // client went away): this guard then gives the lease back instead of letting it count until it expires.
        let in_doubt = self
            .store
            .leases_expire()
            .then(|| LeaseGuard::unrenewed(self.store.clone(), key.clone(), lease));
        let result =
            tollgate_tower::observe::timed_async(self.store.acquire(&key, lease, limit, ttl)).await;
        match (&result, in_doubt) {
            // The reply was lost (a timeout, a dropped connection), not necessarily the request: the lease may be
            // held, or be granted once a stalled server wakes, so release it (the store refuses a lease released
            // before it was acquired). Only a skipped call (an open circuit) surely sent nothing.
            (Err(StoreError::CircuitOpen), Some(guard)) => guard.disarm(),
            (Err(_), Some(guard)) => drop(guard),
            (_, Some(guard)) => guard.disarm(),
            (_, None) => {}
        }
        match result {
            Ok(admission) if admission.granted => {
                self.counters.allowed.increment(1);
                self.signals
                    .admitted("allowed", limit.saturating_sub(admission.in_flight), limit);
                let guard = LeaseGuard::new(self.store.clone(), key, lease, ttl);
                Conclusion::Admit(Some(Permit::new(guard)))
            }
            Ok(admission) => self.over_limit(mode, admission.in_flight, limit),
            Err(err) => self.recover(key, lease, limit, mode, &err),
        }
    }

    fn over_limit(&self, mode: Mode, in_flight: u64, limit: u64) -> Conclusion {
        if mode == Mode::Shadow {
            self.counters.shadow_rejected.increment(1);
            self.signals.over_limit(mode, 0);
            if self.log_gate.open() {
                tracing::info!(
                    limiter = &*self.settings.name,
                    in_flight,
                    limit,
                    "shadow mode: request over the in-flight limit admitted"
                );
            }
            return Conclusion::Admit(None);
        }
        self.counters.rejected.increment(1);
        self.signals.over_limit(mode, 0);
        tracing::debug!(
            limiter = &*self.settings.name,
            in_flight,
            limit,
            "request rejected: {}",
            self.kind
        );
        Conclusion::Reject(
            Rejection::new(self.kind, self.settings.name.clone())
                .with_retry_after(self.settings.retry_after),
        )
    }

    /// Applies the failure policy after a store error.
    fn recover(
        &self,
        key: String,
        lease: LeaseId,
        limit: u64,
        mode: Mode,
        err: &StoreError,
    ) -> Conclusion {
        let policy = self.settings.on_error;
        self.store_errors.count(err);
        if self.log_gate.open() {
            tracing::warn!(
                limiter = &*self.settings.name,
                error = %err,
                failure_policy = policy.as_str(),
                "lease store failed; applying the failure policy"
            );
        }
        match (policy, &self.fallback) {
            (FailurePolicy::Open, _) => {
                self.counters.failed_open.increment(1);
                self.signals.decided("store_error_open", None);
                Conclusion::Admit(None)
            }
            (FailurePolicy::Local, Some(local)) => {
                match block_on_ready(local.acquire(&key, lease, limit, self.settings.lease_ttl)) {
                    Ok(admission) if admission.granted => {
                        self.counters.failed_local.increment(1);
                        self.signals.admitted(
                            "store_error_local",
                            limit.saturating_sub(admission.in_flight),
                            limit,
                        );
                        let guard =
                            LeaseGuard::new(local.clone(), key, lease, self.settings.lease_ttl);
                        Conclusion::Admit(Some(Permit::new(guard)))
                    }
                    Ok(admission) => self.over_limit(mode, admission.in_flight, limit),
                    Err(_) => self.fail_closed(mode),
                }
            }
            _ => self.fail_closed(mode),
        }
    }

    fn fail_closed(&self, mode: Mode) -> Conclusion {
        if mode == Mode::Shadow {
            // Rejected by the closed policy, admitted by shadow mode: counted apart.
            self.counters.shadow_failed_closed.increment(1);
            self.signals.decided("shadow_store_error_closed", None);
            return Conclusion::Admit(None);
        }
        self.counters.failed_closed.increment(1);
        self.signals.decided("store_error_closed", None);
        Conclusion::Reject(
            Rejection::new(RejectionKind::StoreUnavailable, self.settings.name.clone())
                .with_retry_after(self.settings.retry_after),
        )
    }
}
