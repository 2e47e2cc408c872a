//! The decision shared by every clone of a limiter: store call, failure policy, shadow mode, metrics, logs.

use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;

use tollgate_core::{Decision, FailurePolicy, MemoryStore, Policy, Store, StoreError, Timestamp};

use crate::key::{hash_bytes, with_key_buffer};
use crate::observe::{Counters, LogGate, NearLimitShare, Signals, StoreErrors};
use crate::{
    BoxError, Cost, KeyError, KeyExtractor, Mode, Name, Rejection, RejectionKind, Verdict,
};

/// What a limiter concluded about one request.
pub(crate) enum Conclusion {
    /// Pass the request on; the verdict (if any) goes onto the response.
    Admit(Option<Box<Verdict>>),
    /// Reject it: a [`Rejection`], boxed already (as it will be answered), which keeps admissions small to move.
    Reject(BoxError),
}

pub(crate) struct Shared<K, St, C> {
    pub(crate) name: Name,
    pub(crate) policy: Policy,
    /// The policy's announced window (`Quota::window`, a division): computed once, read by every verdict.
    window: std::time::Duration,
    pub(crate) store: Arc<St>,
    pub(crate) key: K,
    pub(crate) cost: C,
    pub(crate) switch: crate::EnforcementSwitch,
    on_error: FailurePolicy,
    fallback: Option<Arc<MemoryStore>>,
    /// The store's key hasher with this limiter's name written, when the store keys by digest.
    digest_prefix: Option<DefaultHasher>,
    counters: Counters,
    store_errors: StoreErrors,
    log_gate: LogGate,
    signals: Signals,
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
        near_limit: NearLimitShare,
    ) -> Self {
        let counters = Counters::new(&name, "limited");
        let store_errors = StoreErrors::new(&name, on_error);
        let signals = Signals::new(
            &name,
            "limited",
            policy.algorithm().as_str(),
            crate::observe::store_name::<St>(),
            near_limit,
        );
        // The name, length first (two limiters on one store never share a bucket, whatever their names hold),
        // then zeros up to a multiple of SipHash's 8-byte block: each request's key then starts on a block of its
        // own (an address is one block) instead of being spliced onto the name's leftover bytes.
        let digest_prefix = store.key_hasher().map(|mut state| {
            hash_bytes(&mut state, name.as_bytes());
            state.write(&[0; 8][..(8 - name.len() % 8) % 8]);
            state
        });
        Self {
            name,
            policy,
            window: policy.quota().window(),
            store,
            key,
            cost,
            switch,
            on_error,
            fallback,
            digest_prefix,
            counters,
            store_errors,
            log_gate: LogGate::new(),
            signals,
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
        let result = crate::observe::timed_async(self.store.check(&key, &self.policy, cost)).await;
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
        let result = crate::observe::timed(|| self.store.check_immediate(key, &self.policy, cost))?;
        Some(self.conclude(result, key, cost, mode, keep))
    }

    /// Writes the key's text, `<limiter name>:<key>`: what a store that needs the text keys by.
    #[inline(always)]
    pub(crate) fn write_key<Req>(&self, req: &Req, key: &mut String) -> Result<(), KeyError>
    where
        K: KeyExtractor<Req>,
    {
        key.push_str(&self.name);
        key.push(':');
        self.key.extract(req, key)
    }

    /// Decides at once by the key's digest when the store keys by digest (the in-process one), without building
    /// the key's text. `None` when the store needs the text.
    #[inline(always)]
    pub(crate) fn decide_digested<Req>(
        &self,
        req: &Req,
        mode: Mode,
        keep: bool,
    ) -> Option<Result<Conclusion, KeyError>>
    where
        K: KeyExtractor<Req>,
        C: Cost<Req>,
    {
        let mut state = self.digest_prefix.clone()?;
        if let Err(err) = self.key.hash_key(req, &mut state) {
            return Some(Err(err));
        }
        let cost = self.cost.cost(req);
        Some(
            match crate::observe::timed(|| {
                self.store.check_digest(state.finish(), &self.policy, cost)
            })? {
                Ok(decision) => Ok(self.judge(decision, mode, keep)),
                Err(err) => self.digest_failed(req, &err, cost, mode, keep),
            },
        )
    }

    /// The failure policy after a store keyed by digest failed, applied with the key's text (the local fallback
    /// store needs it); the failed store is not asked again.
    #[cold]
    #[inline(never)]
    fn digest_failed<Req>(
        &self,
        req: &Req,
        err: &StoreError,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Result<Conclusion, KeyError>
    where
        K: KeyExtractor<Req>,
    {
        with_key_buffer(|key| {
            self.write_key(req, key)?;
            Ok(match self.store_failed(err, key, cost, mode) {
                Ok(decision) => self.judge_local(decision, mode, keep),
                Err(conclusion) => conclusion,
            })
        })
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
        match result {
            Ok(decision) => self.judge(decision, mode, keep),
            Err(err) => match self.store_failed(&err, key, cost, mode) {
                Ok(decision) => self.judge_local(decision, mode, keep),
                Err(conclusion) => conclusion,
            },
        }
    }

    /// A store's decision as a conclusion: shadow mode, metrics.
    #[inline(always)]
    fn judge(&self, decision: Decision, mode: Mode, keep: bool) -> Conclusion {
        self.signals.judged(&decision, mode, "allowed");
        self.judge_counting(decision, mode, keep, &self.counters.allowed)
    }

    /// A decision of the local fallback store (the shared one failed) as a conclusion, counted once, as the
    /// concurrency limiter counts its own: `store_error_local` when admitted, as over the limit otherwise.
    #[cold]
    #[inline(never)]
    fn judge_local(&self, decision: Decision, mode: Mode, keep: bool) -> Conclusion {
        self.signals.judged(&decision, mode, "store_error_local");
        self.judge_counting(decision, mode, keep, &self.counters.failed_local)
    }

    /// A decision as a conclusion, an admission counted on `admitted`.
    #[inline(always)]
    fn judge_counting(
        &self,
        decision: Decision,
        mode: Mode,
        keep: bool,
        admitted: &metrics::Counter,
    ) -> Conclusion {
        if !decision.is_allowed() {
            return self.over_limit(decision, mode, keep);
        }
        admitted.increment(1);
        Conclusion::Admit(keep.then(|| Box::new(self.verdict(decision, mode))))
    }

    /// This limiter's verdict on `decision`.
    fn verdict(&self, decision: Decision, mode: Mode) -> Verdict {
        Verdict {
            limiter: self.name.clone(),
            window: self.window,
            decision,
            enforced: mode == Mode::Enforce,
        }
    }

    // The paths an admitted request never takes stay out of line: the admitted path through `conclude` is then a
    // few instructions in a small frame.

    /// A request over the limit: rejected, or admitted and counted in shadow mode.
    #[cold]
    #[inline(never)]
    fn over_limit(&self, decision: Decision, mode: Mode, keep: bool) -> Conclusion {
        if mode == Mode::Shadow {
            self.counters.shadow_rejected.increment(1);
            if self.log_gate.open() {
                tracing::info!(
                    limiter = &*self.name,
                    outcome = decision.outcome.as_str(),
                    "shadow mode: request over the limit admitted"
                );
            }
            return Conclusion::Admit(keep.then(|| Box::new(self.verdict(decision, mode))));
        }
        self.counters.rejected.increment(1);
        Conclusion::Reject(Rejection::rate_limited(self.verdict(decision, mode)).into())
    }

    /// Applies the failure policy after a store error: a decision of the local fallback store, or the conclusion.
    #[cold]
    #[inline(never)]
    fn store_failed(
        &self,
        err: &StoreError,
        key: &str,
        cost: u64,
        mode: Mode,
    ) -> Result<Decision, Conclusion> {
        self.store_errors.count(err);
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
                self.signals.decided("store_error_open", None);
                Err(Conclusion::Admit(None))
            }
            (Some(fallback), FailurePolicy::Local) => {
                match fallback.check_now(key, &self.policy, cost) {
                    // Counted by `judge_local`, once.
                    Ok(decision) => Ok(decision),
                    // The local store is full too: nothing left to decide with.
                    Err(_) => Err(self.fail_closed(mode)),
                }
            }
            _ => Err(self.fail_closed(mode)),
        }
    }

    fn fail_closed(&self, mode: Mode) -> Conclusion {
        if mode == Mode::Shadow {
            // Rejected by the closed policy, admitted by shadow mode: counted apart, or a dark launch's
            // dashboards would show 503s no client got.
            self.counters.shadow_failed_closed.increment(1);
            self.signals.decided("shadow_store_error_closed", None);
            return Conclusion::Admit(None);
        }
        self.counters.failed_closed.increment(1);
        self.signals.decided("store_error_closed", None);
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
