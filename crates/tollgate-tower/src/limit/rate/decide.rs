//! The rate limiter's decision, shared by every clone of a limiter: the store call, and the conclusion the
//! [`Judge`] draws from the store's answer (mode, metrics, failure policy).

use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;

use tollgate_core::{Decision, FailurePolicy, MemoryStore, Policy, Store, StoreError, Timestamp};

use super::deny_cache::DenyTable;
use crate::key::{hash_bytes, with_key_buffer};
use crate::limit::core::{self, Judge};
use crate::observe::{NearLimitShare, Signals, store_name, timed, timed_async};
use crate::{Cost, KeyError, KeyExtractor, Mode, Name, Rejection, Verdict};

/// What the rate limiter concludes: an admission grants the verdict the headers are rendered from.
pub(crate) type Conclusion = core::Conclusion<Box<Verdict>>;

pub(crate) struct Shared<K, St, C> {
    pub(crate) judge: Judge,
    pub(crate) policy: Policy,
    /// The policy's announced window (`Quota::window`, a division): computed once, read by every verdict.
    window: std::time::Duration,
    pub(crate) store: Arc<St>,
    pub(crate) key: K,
    pub(crate) cost: C,
    fallback: Option<Arc<MemoryStore>>,
    /// The store's key hasher with this limiter's name written, when the store keys by digest.
    digest_prefix: Option<DefaultHasher>,
    /// The deny cache, when on (a shared store's denials answered locally until their retry instant).
    deny: Option<Arc<DenyTable>>,
    /// Token leases, when on (hot keys admitted from batches leased from the store).
    #[cfg(feature = "leases")]
    leases: Option<Arc<super::token_lease::LeaseTable<St>>>,
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
        deny: Option<Arc<DenyTable>>,
        #[cfg(feature = "leases")] leases: Option<Arc<super::token_lease::LeaseTable<St>>>,
    ) -> Self {
        let algorithm = policy.algorithm().as_str();
        let signals = Signals::new(&name, "limited", algorithm, store_name::<St>(), near_limit);
        // The name, length first (two limiters on one store never share a bucket, whatever their names hold),
        // then zeros up to a multiple of SipHash's 8-byte block: each request's key then starts on a block of its
        // own (an address is one block) instead of being spliced onto the name's leftover bytes.
        let digest_prefix = store.key_hasher().map(|mut state| {
            hash_bytes(&mut state, name.as_bytes());
            state.write(&[0; 8][..(8 - name.len() % 8) % 8]);
            state
        });
        Self {
            judge: Judge::new(name, switch, Some(on_error), "limited", signals),
            policy,
            window: policy.quota().window(),
            store,
            key,
            cost,
            fallback,
            digest_prefix,
            deny,
            #[cfg(feature = "leases")]
            leases,
        }
    }

    /// Answers from the key's leased batch (admitted, or refused while the store said it is short); `None` for
    /// the plain path. Starts a fetch when one is due.
    #[cfg(feature = "leases")]
    #[inline]
    pub(crate) fn decide_leased(
        &self,
        key: &str,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Option<Conclusion> {
        let decision = self.leases.as_ref()?.take(key, cost)?;
        Some(self.judge(decision, mode, keep))
    }

    /// Without the `leases` feature every request takes the plain path.
    #[cfg(not(feature = "leases"))]
    #[inline(always)]
    pub(crate) fn decide_leased(
        &self,
        _key: &str,
        _cost: u64,
        _mode: Mode,
        _keep: bool,
    ) -> Option<Conclusion> {
        None
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
        // The deny cache measures from before the request is sent: the store decides no earlier.
        let sent = self.deny.as_ref().map(|deny| deny.now());
        let result = timed_async(self.store.check(&key, &self.policy, cost)).await;
        if let (Some(deny), Some(sent), Ok(decision)) = (&self.deny, sent, &result) {
            deny.record(&key, cost, sent, decision);
        }
        self.conclude(result, &key, cost, mode, keep)
    }

    /// Refuses at once a request the deny cache holds a denial for (counted as an ordinary `limited` decision);
    /// `None` when the store must be asked.
    #[inline]
    pub(crate) fn decide_cached(
        &self,
        key: &str,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Option<Conclusion> {
        let decision = self.deny.as_ref()?.lookup(key, cost)?;
        Some(self.over_limit(decision, mode, keep))
    }

    /// Decides at once if the store can without waiting (see [`Store::check_immediate`]).
    pub(crate) fn decide_now(
        &self,
        key: &str,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Option<Conclusion> {
        let result = timed(|| self.store.check_immediate(key, &self.policy, cost))?;
        Some(self.conclude(result, key, cost, mode, keep))
    }

    /// Writes the key's text, `<limiter name>:<key>`: what a store that needs the text keys by.
    #[inline(always)]
    pub(crate) fn write_key<Req>(&self, req: &Req, key: &mut String) -> Result<(), KeyError>
    where
        K: KeyExtractor<Req>,
    {
        key.push_str(&self.judge.name);
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
            match timed(|| self.store.check_digest(state.finish(), &self.policy, cost))? {
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
            Ok(self.store_failed(err, key, cost, mode, keep))
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
            Err(err) => self.store_failed(&err, key, cost, mode, keep),
        }
    }

    /// A store's decision as a conclusion: shadow mode, metrics.
    #[inline(always)]
    fn judge(&self, decision: Decision, mode: Mode, keep: bool) -> Conclusion {
        if !decision.is_allowed() {
            return self.over_limit(decision, mode, keep);
        }
        self.judge.admitted(decision.remaining, decision.limit);
        Conclusion::Admit(keep.then(|| Box::new(self.verdict(decision, mode))))
    }

    /// A decision of the local fallback store (the shared one failed) as a conclusion, counted once, as the
    /// lease limiters count their own: `store_error_local` when admitted, as over the limit otherwise.
    #[cold]
    #[inline(never)]
    fn judge_local(&self, decision: Decision, mode: Mode, keep: bool) -> Conclusion {
        if !decision.is_allowed() {
            return self.over_limit(decision, mode, keep);
        }
        self.judge
            .admitted_locally(decision.remaining, decision.limit);
        Conclusion::Admit(keep.then(|| Box::new(self.verdict(decision, mode))))
    }

    /// This limiter's verdict on `decision`.
    fn verdict(&self, decision: Decision, mode: Mode) -> Verdict {
        Verdict {
            limiter: self.judge.name.clone(),
            window: self.window,
            decision,
            enforced: mode == Mode::Enforce,
        }
    }

    /// A request over the limit: the judge refuses it with the verdict, or admits it in shadow mode.
    #[cold]
    #[inline(never)]
    fn over_limit(&self, decision: Decision, mode: Mode, keep: bool) -> Conclusion {
        self.judge.over_limit(
            mode,
            decision.remaining,
            &decision.outcome.as_str(),
            || keep.then(|| Box::new(self.verdict(decision, mode))),
            || Rejection::rate_limited(self.verdict(decision, mode)),
        )
    }

    /// The failure policy after a store error, applied by the judge; the local fallback decides with the same
    /// policy.
    #[cold]
    #[inline(never)]
    fn store_failed(
        &self,
        err: &StoreError,
        key: &str,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Conclusion {
        // The retry the core's closed policy announces (one period, within 1 s to 60 s); it does not depend on now.
        let retry = FailurePolicy::Closed
            .synthesize(&self.policy, Timestamp::default())
            .and_then(|closed| closed.retry_after);
        self.judge.store_failed(err, mode, retry, || {
            let fallback = self.fallback.as_ref()?;
            let decision = fallback.check_now(key, &self.policy, cost).ok()?;
            Some(self.judge_local(decision, mode, keep))
        })
    }
}
