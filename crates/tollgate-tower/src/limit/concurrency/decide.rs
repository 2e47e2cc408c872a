//! The slot limiters' decision, shared by every clone of a slot-limited service: the acquire (once more after a
//! refusal while this instance's own release on the key is on its way), and the conclusion the [`Judge`] draws
//! from the store's answer (mode, metrics, failure policy).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tollgate_core::slot::{Admission, MemorySlotStore, SlotId, SlotStore, block_on_ready};
use tollgate_core::{FailurePolicy, StoreError, Timestamp};

use crate::limit::core::{self, Judge};
use crate::limit::releases::Releases;
use crate::limit::slot_guard::SlotGuard;
use crate::observe::{NearLimitShare, Signals, store_name, timed_async};
use crate::{EnforcementSwitch, Mode, Name, Permit, Rejection, RejectionKind, Verdict};

/// What a slot limiter concludes: an admission grants the permit its response holds.
pub(crate) type Conclusion = core::Conclusion<Permit>;

/// Settings common to the concurrency limiter and the fleet shedder.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) name: Name,
    pub(crate) slot_ttl: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) on_error: FailurePolicy,
    pub(crate) near_limit: NearLimitShare,
}

/// What a slot layer is configured with: the settings the concurrency limiter and the fleet shedder share, the
/// rule saying which slot set a request counts against, and its store.
pub(crate) struct SlotConfig<R, L> {
    pub(crate) settings: Settings,
    pub(crate) rule: R,
    pub(crate) store: Arc<L>,
    pub(crate) fallback: Option<Arc<MemorySlotStore>>,
    pub(crate) kind: RejectionKind,
    pub(crate) switch: EnforcementSwitch,
}

impl<R: Clone, L> Clone for SlotConfig<R, L> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            rule: self.rule.clone(),
            store: self.store.clone(),
            fallback: self.fallback.clone(),
            kind: self.kind,
            switch: self.switch.clone(),
        }
    }
}

pub(crate) struct Shared<R, L> {
    /// What the state was built from, for a layer built from this one with a setting changed.
    pub(crate) config: SlotConfig<R, L>,
    pub(crate) judge: Judge,
    /// This instance's releases in flight by key, for the concurrency limiter on a shared store only: in-process
    /// releases are done at once, and the fleet shedder's one key is every client's, so no release there is a
    /// client's own, and asking again while shedding would double the load on that key when the fleet is
    /// overloaded.
    releases: Option<Arc<Releases>>,
}

impl<R, L: SlotStore> Shared<R, L> {
    /// The state every service of a layer configured with `config` shares.
    pub(crate) fn new(config: SlotConfig<R, L>) -> Self {
        let SlotConfig {
            settings,
            store,
            kind,
            switch,
            ..
        } = &config;
        let refused = if kind.is_overload() {
            "shed"
        } else {
            "limited"
        };
        let algorithm = if kind.is_overload() {
            "fleet_shed"
        } else {
            "concurrency"
        };
        let signals = Signals::new(
            &settings.name,
            refused,
            algorithm,
            store_name::<L>(),
            settings.near_limit,
        );
        Self {
            judge: Judge::new(
                settings.name.clone(),
                switch.clone(),
                Some(settings.on_error),
                refused,
                signals,
            ),
            releases: (store.slots_expire() && !kind.is_overload()).then(Arc::default),
            config,
        }
    }

    /// Decides one request against `limit` slots on `key`, in `mode` (`Enforce` or `Shadow`).
    pub(crate) async fn decide(self: Arc<Self>, key: String, limit: u64, mode: Mode) -> Conclusion {
        // The releases of this instance on the key on their way as the acquire is sent (a task sends each after
        // its response): one may reach the store after the acquire, and be answered before the acquire's refusal.
        let mark = self.releases.as_ref().and_then(|r| r.mark(&key));
        let (mut slot, mut result) = self.acquire(&key, limit).await;
        // Refused while such a release was (or still is) on its way: its slot may be what blocked this request,
        // e.g. a client's previous request at a limit of 1. Ask again once it has been answered (within the
        // store's timeout), or after one slot time: a slot never released has expired by then.
        let refused = matches!(result, Ok(admission) if !admission.granted);
        if let Some(releases) = self.releases.as_ref().filter(|_| refused)
            && releases
                .wait_for(&key, mark, self.config.settings.slot_ttl)
                .await
        {
            (slot, result) = self.acquire(&key, limit).await;
        }
        match result {
            Ok(admission) if admission.granted => {
                let remaining = limit.saturating_sub(admission.in_flight);
                self.judge.admitted(remaining, limit);
                let guard = SlotGuard::new(
                    self.config.store.clone(),
                    self.releases.clone(),
                    key,
                    slot,
                    self.config.settings.slot_ttl,
                );
                Conclusion::Admit(Some(self.permit(
                    Permit::new(guard),
                    limit,
                    remaining,
                    mode,
                )))
            }
            Ok(admission) => self.over_limit(mode, admission.in_flight, limit),
            Err(err) => self.store_failed(key, slot, limit, mode, &err),
        }
    }

    /// One acquire of a fresh slot, given back if its reply is lost.
    async fn acquire(&self, key: &str, limit: u64) -> (SlotId, Result<Admission, StoreError>) {
        let slot = SlotId::new();
        // A shared store's acquire may land even if this future is dropped while waiting for the reply (the
        // client went away): this guard then gives the slot back instead of letting it count until it expires.
        let in_doubt = self.config.store.slots_expire().then(|| {
            SlotGuard::unrenewed(
                self.config.store.clone(),
                self.releases.clone(),
                key.to_owned(),
                slot,
                self.config.settings.slot_ttl,
            )
        });
        let result = timed_async(self.config.store.acquire(
            key,
            slot,
            limit,
            self.config.settings.slot_ttl,
        ))
        .await;
        match (&result, in_doubt) {
            // The reply was lost (a timeout, a dropped connection), not necessarily the request: the slot may be
            // held, or be granted once a stalled server wakes, so release it (the store refuses a slot released
            // before it was acquired). Only a skipped call (an open circuit) surely sent nothing.
            (Err(StoreError::CircuitOpen), Some(guard)) => guard.disarm(),
            (Err(_), Some(guard)) => drop(guard),
            (_, Some(guard)) => guard.disarm(),
            (_, None) => {}
        }
        (slot, result)
    }

    /// `permit` of an admission that left `remaining` of `limit` slots, carrying the concurrency limiter's verdict
    /// for the response's RateLimit fields. The fleet shedder's carries none: its ceiling is the fleet's capacity,
    /// not a quota the client could pace itself to.
    fn permit(&self, permit: Permit, limit: u64, remaining: u64, mode: Mode) -> Permit {
        if self.config.kind.is_overload() {
            return permit;
        }
        let mut verdict =
            Verdict::in_flight(self.judge.name.clone(), limit, remaining, None, now());
        verdict.enforced = mode == Mode::Enforce;
        permit.with_verdict(verdict)
    }

    fn over_limit(&self, mode: Mode, in_flight: u64, limit: u64) -> Conclusion {
        let remaining = limit.saturating_sub(in_flight);
        self.judge.over_limit(
            mode,
            remaining,
            &format_args!("{in_flight} in flight, limit {limit}: {}", self.config.kind),
            || None,
            || {
                let rejection = Rejection::new(self.config.kind, self.judge.name.clone())
                    .with_retry_after(self.config.settings.retry_after);
                if self.config.kind.is_overload() {
                    return rejection;
                }
                let verdict = Verdict::in_flight(
                    self.judge.name.clone(),
                    limit,
                    remaining,
                    Some(self.config.settings.retry_after),
                    now(),
                );
                rejection.with_verdict(verdict)
            },
        )
    }

    /// The failure policy after a store error, applied by the judge; the local fallback counts in process with
    /// the same ceilings.
    fn store_failed(
        &self,
        key: String,
        slot: SlotId,
        limit: u64,
        mode: Mode,
        err: &StoreError,
    ) -> Conclusion {
        self.judge
            .store_failed(err, mode, Some(self.config.settings.retry_after), || {
                let local = self.config.fallback.as_ref()?;
                let admission =
                    block_on_ready(local.acquire(&key, slot, limit, self.config.settings.slot_ttl))
                        .ok()?;
                if !admission.granted {
                    return Some(self.over_limit(mode, admission.in_flight, limit));
                }
                let remaining = limit.saturating_sub(admission.in_flight);
                self.judge.admitted_locally(remaining, limit);
                let guard = SlotGuard::new(
                    local.clone(),
                    None,
                    key,
                    slot,
                    self.config.settings.slot_ttl,
                );
                let permit = self.permit(Permit::new(guard), limit, remaining, mode);
                Some(Conclusion::Admit(Some(permit)))
            })
    }
}

/// The instant a slot decision is made, for its verdict: a slot store answers without a clock, and the verdict
/// states no time (a quota of requests in flight has no window), so the local clock serves.
fn now() -> Timestamp {
    Timestamp::from(SystemTime::now())
}
