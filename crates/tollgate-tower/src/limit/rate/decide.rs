//! The rate limiter's decision, shared by every clone of a limiter: the store call, and the conclusion the
//! [`Judge`] draws from the store's answer (mode, metrics, failure policy).

use std::hash::Hasher;

use std::sync::Arc;
use tollgate_core::KeyHasher;

use tollgate_core::{
    Decision, FailurePolicy, LostCharge, MemoryStore, Policy, Store, StoreError, Timestamp,
};

use super::deny_cache::{Asked, DenyTable, KeyDigests};
use super::lease_step::{LeaseTable, Leased, Waited};
use super::overrides::{Choice, Plans};
use crate::key::{hash_bytes, with_key_buffer};
use crate::limit::core::{self, Judge};
use crate::limit::future::Charger;
use crate::observe::{CHARGES_LOST_TOTAL, NearLimitShare, Signals, store_name, timed, timed_async};
use crate::{Cost, KeyError, KeyExtractor, Mode, Name, QuotaUnit, Rejection, Verdict};

/// What the rate limiter concludes: an admission grants the verdict the headers are rendered from.
pub(crate) type Conclusion = core::Conclusion<Box<Verdict>>;

/// What a limiter's leases make of a request before the plain path (without token leases, always the plain
/// path).
pub(crate) enum AtOnce {
    /// Decided from the key's batch.
    Done(Conclusion),
    /// Decided later, from the fetch under way (see [`Shared::decide`]).
    Later,
    /// The plain path.
    Plain,
}

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
    digest_prefix: Option<KeyHasher>,
    /// The deny cache, when on (a shared store's denials answered locally until their retry instant).
    deny: Option<Arc<DenyTable>>,
    /// The deny cache's key hasher with the key prefix written, when the cache is on and the key's digests are
    /// read from the request's parts. A limiter with leases or charging after the response builds the key's text
    /// anyway, and digests that.
    deny_prefix: Option<KeyHasher>,
    /// Token leases, when on (hot keys admitted from batches leased from the store).
    leases: Option<Arc<LeaseTable<St>>>,
    /// What the keys' text and digests start with: the limiter's name, or `<name>#<policy>` for a bucket family
    /// of its own (an override's policy).
    key_prefix: Name,
    /// The limiter's per-key overrides and exemptions, if any; each override policy decides in a state of its own.
    plans: Option<Box<Plans<Arc<Self>>>>,
    /// Where the real cost is read after the response, when it is charged then.
    pub(crate) after: Option<crate::CostAfter>,
    /// `tollgate_charges_lost_total{limiter}`, registered when the limiter charges after the response.
    lost: Option<metrics::Counter>,
    /// The streams in progress of a limiter that charges as the response streams.
    pools: crate::limit::charger::StreamPools,
}

impl<K: Send + Sync, St: Store, C: Send + Sync> Charger for Shared<K, St, C> {
    fn charge(&self, key: String, delta: i64, decided_at: Timestamp) {
        let lost = match &self.lost {
            Some(counter) => {
                let counter = counter.clone();
                LostCharge::new(move |_| counter.increment(1))
            }
            None => LostCharge::ignored(),
        };
        self.store
            .charge_detached(key, &self.policy, delta, decided_at, lost);
    }

    fn charge_moves_reset(&self) -> bool {
        self.policy.algorithm() == tollgate_core::Algorithm::TokenBucket
    }

    fn limiter(&self) -> &Name {
        &self.judge.name
    }

    fn enforcing(&self) -> bool {
        self.judge.mode() == Mode::Enforce
    }

    fn pools(&self) -> &crate::limit::charger::StreamPools {
        &self.pools
    }

    fn debit(
        &self,
        key: String,
        delta: i64,
        decided_at: Timestamp,
        done: Box<dyn FnOnce(Option<Decision>) + Send>,
    ) {
        let store = self.store.clone();
        let policy = self.policy;
        let lost = self.lost.clone();
        let charge = async move {
            let answer = store.charge(&key, &policy, delta, decided_at).await;
            if let Err(e) = &answer {
                tracing::warn!(error = %e, "a streamed response's charge failed; it is lost");
                if let Some(lost) = lost {
                    lost.increment(1);
                }
            }
            done(answer.ok());
        };
        let mut charge = Box::pin(charge);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if charge.as_mut().poll(&mut cx).is_pending() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(charge);
                }
                Err(_) => tracing::warn!(
                    "a streamed response's charge needs I/O outside a tokio runtime: it is lost"
                ),
            }
        }
    }
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
        after: Option<crate::CostAfter>,
        leases: Option<Arc<LeaseTable<St>>>,
    ) -> Self {
        let algorithm = policy.algorithm().as_str();
        let signals = Signals::new(&name, "limited", algorithm, store_name::<St>(), near_limit);
        let digest_prefix = digest_prefix(&*store, &name, after.is_some());
        let lost = after
            .as_ref()
            .map(|_| metrics::counter!(CHARGES_LOST_TOTAL, "limiter" => name.to_string()));
        // A limiter with leases decides by the key's text (the lease table keys by it), whatever the store.
        let digest_prefix = if leases.is_some() {
            None
        } else {
            digest_prefix
        };
        let deny_prefix = deny_prefix(deny.as_deref(), &name, after.is_some() || leases.is_some());
        Self {
            key_prefix: name.clone(),
            plans: None,
            judge: Judge::new(name, switch, Some(on_error), "limited", signals),
            policy,
            window: policy.quota().window(),
            store,
            key,
            cost,
            fallback,
            digest_prefix,
            deny,
            deny_prefix,
            leases,
            after,
            lost,
            pools: crate::limit::charger::StreamPools::default(),
        }
    }

    /// The deny cache's table, when the cache is on.
    pub(crate) fn deny_table(&self) -> Option<&Arc<DenyTable>> {
        self.deny.as_ref()
    }

    /// Names this state's keys by `prefix` instead of the limiter's name (a bucket family of its own).
    pub(crate) fn with_key_prefix(mut self, prefix: Name) -> Self {
        self.digest_prefix = digest_prefix(&*self.store, &prefix, self.after.is_some());
        let by_text = self.after.is_some() || self.leases.is_some();
        self.deny_prefix = deny_prefix(self.deny.as_deref(), &prefix, by_text);
        self.key_prefix = prefix;
        self
    }

    /// Looks each request's key up in `plans` first.
    pub(crate) fn with_plans(mut self, plans: Plans<Arc<Self>>) -> Self {
        self.plans = Some(Box::new(plans));
        self
    }

    /// The state that decides `req`: this one, an override's, or `None` for an exempt key (counted here).
    #[inline]
    pub(crate) fn select<'a, Req>(this: &'a Arc<Self>, req: &Req) -> Option<&'a Arc<Self>>
    where
        K: KeyExtractor<Req>,
    {
        match &this.plans {
            None => Some(this),
            Some(plans) => Self::select_plan(this, plans, req),
        }
    }

    /// The state that decides `req`, counting nothing (for a peek): an exempt key is peeked under the limiter's own
    /// policy.
    pub(crate) fn plan_of<'a, Req>(this: &'a Arc<Self>, req: &Req) -> &'a Arc<Self>
    where
        K: KeyExtractor<Req>,
    {
        match this
            .plans
            .as_deref()
            .and_then(|plans| plans.find(&this.key, req))
        {
            Some(Choice::Use(state)) => state,
            _ => this,
        }
    }

    /// The state that decides `req`, counting nothing: `None` for an exempt key.
    pub(crate) fn plan_for<'a, Req>(this: &'a Arc<Self>, req: &Req) -> Option<&'a Arc<Self>>
    where
        K: KeyExtractor<Req>,
    {
        match &this.plans {
            None => Some(this),
            Some(plans) => Self::planned(this, plans, req),
        }
    }

    fn select_plan<'a, Req>(
        this: &'a Arc<Self>,
        plans: &'a Plans<Arc<Self>>,
        req: &Req,
    ) -> Option<&'a Arc<Self>>
    where
        K: KeyExtractor<Req>,
    {
        let plan = Self::planned(this, plans, req);
        if plan.is_none() {
            plans.count_exempt();
            this.judge.exempted();
        }
        plan
    }

    /// The state `plans` choose for `req` (`None`: exempt).
    #[inline]
    fn planned<'a, Req>(
        this: &'a Arc<Self>,
        plans: &'a Plans<Arc<Self>>,
        req: &Req,
    ) -> Option<&'a Arc<Self>>
    where
        K: KeyExtractor<Req>,
    {
        match plans.find(&this.key, req) {
            None => Some(this),
            Some(Choice::Use(state)) => Some(state),
            Some(Choice::Exempt) => None,
        }
    }

    /// Answers from the key's leased batch (admitted, or refused while the store said it is short), or says to
    /// wait for the key's fetch under way, or leaves it to the plain path. Starts a fetch when one is due.
    #[inline]
    pub(crate) fn decide_leased(&self, key: &str, cost: u64, mode: Mode, keep: bool) -> AtOnce {
        let Some(leases) = &self.leases else {
            return AtOnce::Plain;
        };
        match leases.take(key, cost) {
            Leased::Decided(decision) => AtOnce::Done(self.judge(decision, mode, keep)),
            Leased::Wait => AtOnce::Later,
            Leased::Plain => AtOnce::Plain,
        }
    }

    /// The store's own answer to a request on the plain path, as this instance shows it: for a leasing limiter,
    /// its view (the unspent batch included, never rising but by refill: see the token lease docs).
    #[inline]
    fn shown(&self, key: &str, cost: u64, mut decision: Decision) -> Decision {
        if let Some(leases) = &self.leases {
            leases.show_plain(key, cost, &mut decision);
        }
        decision
    }

    /// Decides one request in `mode` (`Enforce` or `Shadow`; `Off` never gets here); an admission carries its
    /// verdict if `keep`. `deny`: the key's digests in the deny cache by its parts ([`deny_key`](Self::deny_key)),
    /// or `None` where the cache digests its text.
    pub(crate) async fn decide(
        &self,
        key: String,
        deny: Option<KeyDigests>,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Conclusion {
        // A leasing key whose batch is empty while a fetch is under way is decided from that fetch's batch.
        if let Some(leases) = &self.leases {
            match leases.wait(&key, cost).await {
                Waited::Decided(decision) => return self.judge(decision, mode, keep),
                Waited::Failed(err) => return self.store_failed(&err, &key, cost, mode, keep),
                Waited::Plain => {}
            }
        }
        let Some(table) = &self.deny else {
            let result = timed_async(self.store.check(&key, &self.policy, cost)).await;
            return self.conclude(result, &key, cost, mode, keep);
        };
        let digests = deny.unwrap_or_else(|| table.key(&key));
        // A key whose cached denial has just expired is asked once; the others wait for that reply.
        let ask = |hold| timed_async(self.store.check_held(&key, &self.policy, cost, hold));
        let result = match table.decide(digests, &key, &self.policy, cost, ask).await {
            Asked::Cached(decision) => {
                return self.over_limit(self.shown(&key, cost, decision), mode, keep);
            }
            Asked::Store(result) => result,
        };
        self.conclude(result, &key, cost, mode, keep)
    }

    /// Whether this limiter's request on `key` can be decided in one store call with other limiters' requests
    /// ([`Store::check_all`]): not while it leases tokens, nor has a lockout, nor while its deny cache holds an
    /// entry for the key (whose single flight the key's requests share). Returns the deny cache's clock then
    /// (0 without a cache), from before the call, as [`decide`](Self::decide) measures it.
    pub(crate) fn joins(&self, key: &str, deny: Option<KeyDigests>, cost: u64) -> Option<u64> {
        if self.leases.is_some() || self.policy.lockout_micros() > 0 {
            return None;
        }
        let Some(table) = &self.deny else {
            return Some(0);
        };
        let digests = deny.unwrap_or_else(|| table.key(key));
        (!table.holds_entry(digests, cost)).then(|| table.now())
    }

    /// Concludes this limiter's request from the answer of a store call shared with other limiters (see
    /// [`joins`](Self::joins); `sent` is what it returned) as [`decide`](Self::decide) concludes from its own:
    /// the deny cache records a denial, and an admission if the call `committed` it (an admission the call did
    /// not write is no state of the store's).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn conclude_joint(
        &self,
        result: Result<Decision, &StoreError>,
        committed: bool,
        key: &str,
        deny: Option<KeyDigests>,
        cost: u64,
        mode: Mode,
        keep: bool,
        sent: u64,
    ) -> Conclusion {
        match result {
            Ok(decision) => {
                if let Some(table) = &self.deny
                    && (committed || !decision.is_allowed())
                {
                    let digests = deny.unwrap_or_else(|| table.key(key));
                    table.record(
                        digests,
                        key,
                        &self.policy,
                        cost,
                        sent,
                        std::time::Duration::ZERO,
                        &decision,
                    );
                }
                self.judge(decision, mode, keep)
            }
            Err(err) => self.store_failed(err, key, cost, mode, keep),
        }
    }

    /// Ends the key's cached denial, if the cache is on (see [`DenyTable::expire`]).
    fn forget_denial(&self, key: &str, deny: Option<KeyDigests>) {
        if let Some(table) = &self.deny {
            table.expire(deny.unwrap_or_else(|| table.key(key)));
        }
    }

    /// The key's digests in the deny cache, read from the request's parts with no text built; `None` when the
    /// cache is off or digests the key's text (a limiter with leases or charging after the response).
    #[inline]
    pub(crate) fn deny_key<Req>(&self, req: &Req) -> Result<Option<KeyDigests>, KeyError>
    where
        K: KeyExtractor<Req>,
    {
        let Some(mut state) = self.deny_prefix.clone() else {
            return Ok(None);
        };
        self.key.hash_key(req, &mut state)?;
        Ok(Some(DenyTable::finish(state)))
    }

    /// Refuses at once, before the key's text is built, a request the deny cache holds a denial for by the
    /// digests of its parts ([`deny_key`](Self::deny_key); counted as an ordinary `limited` decision). `None` when
    /// the store must be asked.
    #[inline]
    pub(crate) fn decide_denied(
        &self,
        deny: Option<KeyDigests>,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Option<Conclusion> {
        let decision = self.deny.as_ref()?.lookup(deny?, cost)?;
        Some(self.over_limit(decision, mode, keep))
    }

    /// Refuses at once a request the deny cache holds a denial for by the digests of its key's text, for a
    /// limiter whose cache digests the text; `None` when the store must be asked.
    #[inline]
    fn decide_cached(&self, key: &str, cost: u64, mode: Mode, keep: bool) -> Option<Conclusion> {
        if self.deny_prefix.is_some() {
            return None; // looked up by the key's parts already
        }
        let table = self.deny.as_ref()?;
        let decision = table.lookup(table.key(key), cost)?;
        Some(self.over_limit(self.shown(key, cost, decision), mode, keep))
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

    /// Decides without a future or a key copy where anything can: a hot key's leased batch first (any store),
    /// then a store that answers at once, then a shared store's cached denial (by the key's text, where the cache
    /// digests it; [`decide_denied`](Self::decide_denied) looked by its parts before). `None`: the store must be
    /// awaited.
    #[inline]
    pub(crate) fn decide_at_once(
        &self,
        key: &str,
        cost: u64,
        mode: Mode,
        keep: bool,
    ) -> Option<Conclusion> {
        match self.decide_leased(key, cost, mode, keep) {
            AtOnce::Done(conclusion) => Some(conclusion),
            AtOnce::Later => None,
            AtOnce::Plain => self
                .decide_now(key, cost, mode, keep)
                .or_else(|| self.decide_cached(key, cost, mode, keep)),
        }
    }

    /// What `req` would get from the store now, without consuming (see [`Store::peek`]): by the key's digest
    /// where the store keys by digest, as [`decide_digested`](Self::decide_digested) does, else by its text.
    pub(crate) async fn peek<Req>(&self, req: &Req) -> Result<Decision, crate::BoxError>
    where
        K: KeyExtractor<Req>,
        C: Cost<Req>,
    {
        let cost = self.cost.cost(req);
        if let Some(mut state) = self.digest_prefix.clone() {
            self.key.hash_key(req, &mut state)?;
            if let Some(decision) = self.store.peek_digest(state.finish(), &self.policy, cost) {
                return Ok(decision);
            }
        }
        let mut key = String::new();
        self.write_key(req, &mut key)?;
        Ok(self.store.peek(&key, &self.policy, cost).await?)
    }

    /// Writes the key's text, `<limiter name>:<key>`: what a store that needs the text keys by.
    #[inline]
    pub(crate) fn write_key<Req>(&self, req: &Req, key: &mut String) -> Result<(), KeyError>
    where
        K: KeyExtractor<Req>,
    {
        key.push_str(&self.key_prefix);
        key.push(':');
        self.key.extract(req, key)
    }

    /// Decides at once by the key's digest when the store keys by digest (the in-process one), without building
    /// the key's text. `None` when the store needs the text.
    #[inline]
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
        let decided = self.decide_digested_as(req, mode, keep)?;
        Some(decided.map(|(conclusion, ..)| conclusion))
    }

    /// [`decide_digested`](Self::decide_digested), with the key's digest and the request's cost: what a set gives
    /// back by ([`give_back_digest`](Self::give_back_digest)) when another of its limiters refuses the request.
    #[inline]
    pub(crate) fn decide_digested_as<Req>(
        &self,
        req: &Req,
        mode: Mode,
        keep: bool,
    ) -> Option<Result<(Conclusion, u64, u64), KeyError>>
    where
        K: KeyExtractor<Req>,
        C: Cost<Req>,
    {
        let mut state = self.digest_prefix.clone()?;
        if let Err(err) = self.key.hash_key(req, &mut state) {
            return Some(Err(err));
        }
        let cost = self.cost.cost(req);
        let digest = state.finish();
        Some(
            match timed(
                #[inline]
                || self.store.check_digest(digest, &self.policy, cost),
            )? {
                Ok(decision) => Ok((self.judge(decision, mode, keep), digest, cost)),
                Err(err) => self
                    .digest_failed(req, &err, cost, mode, keep)
                    .map(|conclusion| (conclusion, digest, cost)),
            },
        )
    }

    /// Gives back what an admitted request spent on the key whose digest is `digest` (a refund of `cost` as of
    /// `decided_at`), when another limiter of its set refused it; the key's decision right after, when the store
    /// answered.
    pub(crate) fn give_back_digest(
        &self,
        digest: u64,
        cost: u64,
        decided_at: Timestamp,
    ) -> Option<Decision> {
        let refunded = self
            .store
            .charge_digest(digest, &self.policy, refund(cost), decided_at)?;
        self.given_back(refunded)
    }

    /// A give-back's answer: the key's decision after it, or `None` (logged) when the store failed.
    fn given_back(&self, refunded: Result<Decision, StoreError>) -> Option<Decision> {
        refunded
            .inspect_err(|err| {
                tracing::warn!(limiter = &*self.judge.name, error = %err, "a give-back failed; the request stays counted");
            })
            .ok()
    }

    /// [`give_back_digest`](Self::give_back_digest) by the key's text, awaited; `deny`: the key's digests in the
    /// deny cache by its parts (`None`: by its text), whose denial — made by the admission, if it emptied the
    /// bucket — the give-back ends.
    pub(crate) async fn give_back(
        &self,
        key: &str,
        deny: Option<KeyDigests>,
        cost: u64,
        decided_at: Timestamp,
    ) -> Option<Decision> {
        let refunded = self
            .store
            .charge(key, &self.policy, refund(cost), decided_at)
            .await;
        self.forget_denial(key, deny);
        self.given_back(refunded)
    }

    /// The failure policy after a store keyed by digest failed, applied with the key's text (the local fallback
    /// store needs it); the failed store is not asked again.
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
            Ok(decision) => self.judge(self.shown(key, cost, decision), mode, keep),
            Err(err) => self.store_failed(&err, key, cost, mode, keep),
        }
    }

    /// A store's decision as a conclusion: shadow mode, metrics.
    #[inline]
    fn judge(&self, decision: Decision, mode: Mode, keep: bool) -> Conclusion {
        if !decision.is_allowed() {
            return self.over_limit(decision, mode, keep);
        }
        self.judge.admitted(decision.remaining, decision.limit);
        Conclusion::Admit(keep.then(|| Box::new(self.verdict(decision, mode))))
    }

    /// A decision of the local fallback store (the shared one failed) as a conclusion, counted once, as the
    /// lease limiters count their own: `store_error_local` when admitted, as over the limit otherwise.
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
            unit: QuotaUnit::Requests,
        }
    }

    /// A request over the limit: the judge refuses it with the verdict, or admits it in shadow mode.
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

/// The deny cache's key hasher with `prefix` written as [`digest_prefix`] writes it, when the cache is on and the
/// key's digests are read from the request's parts (not `by_text`).
fn deny_prefix(deny: Option<&DenyTable>, prefix: &str, by_text: bool) -> Option<KeyHasher> {
    let table = deny.filter(|_| !by_text)?;
    Some(prefixed(table.hasher(), prefix))
}

/// `state` with `prefix` written, length first.
fn prefixed(mut state: KeyHasher, prefix: &str) -> KeyHasher {
    hash_bytes(&mut state, prefix.as_bytes());
    state
}

/// The store's key hasher with `prefix` written, when the store keys by digest: the prefix, length first (two
/// limiters on one store never share a bucket, whatever their names hold), written once when the limiter is built
/// and carried to each request's key parts by a copy of the hasher. A limiter charging after the response
/// (`by_text`) keys by text throughout: the charge needs the key's text.
fn digest_prefix<St: Store>(store: &St, prefix: &str, by_text: bool) -> Option<KeyHasher> {
    let hasher = if by_text { None } else { store.key_hasher() };
    hasher.map(|state| prefixed(state, prefix))
}

impl<K: Send + Sync, St: Store, C: Send + Sync> Shared<K, St, C> {
    /// [`give_back`](Self::give_back) without waiting for the store's answer.
    pub(crate) fn give_back_detached(
        &self,
        key: String,
        deny: Option<KeyDigests>,
        cost: u64,
        decided_at: Timestamp,
    ) {
        self.forget_denial(&key, deny);
        Charger::charge(self, key, refund(cost), decided_at);
    }
}

/// The charge that gives `cost` back.
fn refund(cost: u64) -> i64 {
    i64::try_from(cost).map_or(i64::MIN + 1, |cost| -cost)
}
