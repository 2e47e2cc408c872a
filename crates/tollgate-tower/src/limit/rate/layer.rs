use std::fmt;
use std::sync::{Arc, OnceLock};

use tollgate_core::{FailurePolicy, MemoryStore, Policy, Store};
use tower_layer::Layer;

use super::RateLimit;
use super::decide::Shared;
use super::deny_cache::{DenyCache, DenyCacheHandle, DenyTable};
use super::overrides::{Overrides, Plans, policy_prefix};
use crate::limit::core::{Built, enforcement_methods};
use crate::observe::NearLimitShare;
use crate::respond::Forward;
use crate::respond::LayerWith;
use crate::{ConfigError, CostAfter, EnforcementSwitch, Name, UnitCost};

/// Applies a request-rate limit to a service: see the [module docs](super).
///
/// A request over the limit is **rejected** at once (429 through the adapters); tower's
/// `tower::limit::RateLimitLayer` of the same name makes callers wait instead.
///
/// Cheap to clone; every service it builds shares the store, the enforcement switch and the local fallback.
#[must_use]
pub struct RateLimitLayer<K, St, C = UnitCost> {
    name: Name,
    policy: Policy,
    store: Arc<St>,
    key: K,
    cost: C,
    switch: EnforcementSwitch,
    on_error: FailurePolicy,
    fallback: Option<Arc<MemoryStore>>,
    near_limit: NearLimitShare,
    /// The deny cache: `None` follows the store ([`Store::is_shared`]).
    deny_on: Option<bool>,
    deny_config: DenyCache,
    deny_table: Arc<OnceLock<Arc<DenyTable>>>,
    /// Token leases: off unless configured.
    #[cfg(feature = "leases")]
    leases: Option<super::LeaseConfig>,
    #[cfg(feature = "leases")]
    lease_table: Arc<OnceLock<Arc<dyn super::token_lease::LeaseControl>>>,
    overrides: Overrides,
    /// The limiter's own buckets are named by its policy too (`<name>#<policy>`).
    per_policy: bool,
    after: Option<CostAfter>,
    built: Built<Shared<K, St, C>>,
}

impl<K, St: Store> RateLimitLayer<K, St> {
    /// A limit named `name` (the policy name clients see in headers) enforcing `policy` on `store`, one bucket per
    /// key from `key`. Requests cost 1, enforcement is on, and a failing store rejects (fails closed).
    ///
    /// Layers with the same name on the same store share buckets (e.g. the copies axum makes per route).
    pub fn new(name: impl Into<Name>, policy: Policy, store: Arc<St>, key: K) -> Self {
        Self {
            name: name.into(),
            policy,
            store,
            key,
            cost: UnitCost,
            switch: EnforcementSwitch::default(),
            on_error: FailurePolicy::default(),
            fallback: None,
            near_limit: NearLimitShare::DEFAULT,
            deny_on: None,
            deny_config: DenyCache::new(),
            deny_table: Arc::default(),
            #[cfg(feature = "leases")]
            leases: None,
            #[cfg(feature = "leases")]
            lease_table: Arc::default(),
            overrides: Overrides::new(),
            per_policy: false,
            after: None,
            built: Built::default(),
        }
    }
}

impl<K, St: Store, C> RateLimitLayer<K, St, C> {
    /// Computes each request's cost with `cost` instead of charging 1.
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<K, St, C2> {
        RateLimitLayer {
            name: self.name,
            policy: self.policy,
            store: self.store,
            key: self.key,
            cost,
            switch: self.switch,
            on_error: self.on_error,
            fallback: self.fallback,
            near_limit: self.near_limit,
            deny_on: self.deny_on,
            deny_config: self.deny_config,
            deny_table: Arc::default(),
            #[cfg(feature = "leases")]
            leases: self.leases,
            #[cfg(feature = "leases")]
            lease_table: Arc::default(),
            overrides: self.overrides,
            per_policy: self.per_policy,
            after: self.after,
            built: Built::default(),
        }
    }

    /// Charges each request's real cost once its response is ready, read from `source` (the response's
    /// [`FinalCost`](crate::FinalCost) extension, or a header): the difference from the cost charged up front
    /// (the layer's [`cost`](Self::cost), 1 by default; 0 charges everything after) is charged — or refunded —
    /// through [`Store::charge`], without holding the response back (a shared store's charge runs as a task).
    ///
    /// A charge is never refused: it may overdraw the key, which then waits until the debt is repaid (a token
    /// bucket's content goes down to −burst at most, a sliding window's count up to twice its limit). That
    /// appears in the headers of the next requests: refused with 429, `remaining` 0, and `Retry-After` (and the
    /// RateLimit field's `t`) the time until the debt is repaid and the request's own cost accrued. The
    /// response carrying the charge shows its admission with the charge taken, since the real cost is known
    /// before its headers are written: `remaining` (the RateLimit field's `r`) less the charge, at least 0, and for
    /// a token bucket the reset later by the time the charge takes to accrue; a refund shows nothing more (on a
    /// shared store it lands later). A refund never leaves
    /// the key better off than if the request had not happened (never above a full bucket; a window gives back
    /// only what it still counts of the request).
    ///
    /// Read through every adapter: the HTTP adapter's in-place responder (`tollgate_http::HttpLimitLayer`)
    /// and the default [`Forward`] (under `HttpLimitLayer`, `GrpcLimitLayer`, or in a
    /// [`RateLimitSet`](super::RateLimitSet)) read it through [`VerdictSink::final_cost`](crate::VerdictSink::final_cost),
    /// which `http::Response` answers from both sources (gRPC: the header is the reply's metadata). A charge that
    /// cannot reach the store is counted in `tollgate_charges_lost_total{limiter}`
    /// ([`CHARGES_LOST_TOTAL`](crate::observe::CHARGES_LOST_TOTAL)).
    ///
    /// Such a limiter's [deny cache](super::deny_cache) is off by default even on a shared store: a refund (on
    /// any instance) can admit a key before a cached denial's retry instant, so a cached denial would no longer
    /// be exact. Switched on explicitly, it refuses such a key until that instant. Such a limiter keys by the key's text (its charge needs
    /// it), also on the in-process store.
    pub fn cost_after(mut self, source: CostAfter) -> Self {
        self.after = Some(source);
        self.built = Built::default();
        self
    }

    enforcement_methods!();

    /// Counts an admission in `tollgate_near_limit_total{limiter}` when it leaves less than `share` of the limit
    /// (0.0 to 1.0; default 0.2, i.e. 20 %; 0.0 counts nothing): the alerting signal before clients see 429s.
    ///
    /// # Errors
    /// If `share` is not a number from 0.0 to 1.0.
    pub fn near_limit(mut self, share: f64) -> Result<Self, ConfigError> {
        self.near_limit = NearLimitShare::new(share)
            .map_err(|e| ConfigError::new(format!("{:?}: {e}", self.name)))?;
        self.built = Built::default();
        Ok(self)
    }

    /// What to do when the store fails: admit (`Open`), reject with 503 (`Closed`, the default), or decide on an
    /// in-process store with the same policy (`Local`: a per-instance limit while the shared one is down).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.on_error = policy;
        self.fallback = match policy {
            // The fallback's evictions at its key bound count under this limiter's name.
            FailurePolicy::Local => Some(self.fallback.unwrap_or_else(|| {
                Arc::new(MemoryStore::builder().name(self.name.to_string()).build())
            })),
            _ => None,
        };
        self.built = Built::default();
        self
    }

    /// Switches the [deny cache](super::deny_cache) on or off: a shared store's denials answered locally until
    /// the store's retry instant, exactly. On by default for a store whose [`Store::is_shared`] is true (Redis),
    /// off otherwise (an in-process store answers at once anyway).
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_on = Some(on);
        self.deny_table = Arc::default();
        self.built = Built::default();
        self
    }

    /// Switches the deny cache on with `config` (its bound, its clock).
    pub fn deny_cache_config(mut self, config: DenyCache) -> Self {
        self.deny_config = config;
        self.deny_cache(true)
    }

    /// A handle on this layer's deny cache, to forget denials (an operator reset a key in the store). Take it
    /// after configuring the cache: it follows the cache this layer (and its clones) builds.
    #[must_use]
    pub fn deny_cache_handle(&self) -> DenyCacheHandle {
        DenyCacheHandle::new(self.name.clone(), self.deny_table.clone())
    }

    /// Admits hot keys from batches of tokens leased from the store ([token leases](super::token_lease)), with
    /// `config`; the store must support them ([`Store::supports_token_leases`]: Redis and the in-process store
    /// do; for another store this logs a warning and keeps the plain path). Off by default. Not combined, for now,
    /// with [`cost_after`](Self::cost_after): that logs a warning and keeps the plain path, which stays exact. A
    /// policy with a lockout is leased (see "Lockouts" in the [token lease docs](super::token_lease)).
    #[cfg(feature = "leases")]
    pub fn leases(mut self, config: super::LeaseConfig) -> Self {
        self.leases = Some(config);
        self.lease_table = Arc::default();
        self.built = Built::default();
        self
    }

    /// Per-key overrides and exemptions (see [`Overrides`]): a key's own policy, in a bucket of its own, or no
    /// limit at all (counted as `outcome="exempt"`).
    pub fn overrides(mut self, overrides: Overrides) -> Self {
        self.overrides = overrides;
        self.built = Built::default();
        self
    }

    /// A handle on this layer's token leases: shut them down (return unspent batches), read their figures. Take
    /// it after [`leases`](Self::leases): it follows the leases this layer (and its clones) builds.
    #[cfg(feature = "leases")]
    #[must_use]
    pub fn lease_handle(&self) -> super::LeaseHandle {
        super::LeaseHandle::new(self.name.clone(), self.lease_table.clone())
    }

    /// Names this limiter's own buckets by its policy too, `<name>#<policy>:<key>` as overrides' buckets are:
    /// a changed policy then starts every key afresh instead of carrying state made under another policy (another
    /// algorithm's state would mean nothing), and an unchanged one keeps it. What a policy file builds, for hot
    /// reload; off by default (the buckets are `<name>:<key>`).
    pub fn state_per_policy(mut self, on: bool) -> Self {
        self.per_policy = on;
        self.built = Built::default();
        self
    }

    /// The limit's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limit's policy.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl<K: Clone, St, C: Clone> Clone for RateLimitLayer<K, St, C> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            policy: self.policy,
            store: self.store.clone(),
            key: self.key.clone(),
            cost: self.cost.clone(),
            switch: self.switch.clone(),
            on_error: self.on_error,
            fallback: self.fallback.clone(),
            near_limit: self.near_limit,
            deny_on: self.deny_on,
            deny_config: self.deny_config.clone(),
            deny_table: self.deny_table.clone(),
            #[cfg(feature = "leases")]
            leases: self.leases.clone(),
            #[cfg(feature = "leases")]
            lease_table: self.lease_table.clone(),
            overrides: self.overrides.clone(),
            per_policy: self.per_policy,
            after: self.after.clone(),
            built: self.built.clone(),
        }
    }
}

impl<K, St, C> fmt::Debug for RateLimitLayer<K, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("name", &self.name)
            .field("policy", &self.policy)
            .field("mode", &self.switch.mode())
            .field("on_store_error", &self.on_error)
            .field("near_limit", &self.near_limit.get())
            .field("deny_cache", &self.deny_on)
            .field("leases", &{
                #[cfg(feature = "leases")]
                let on = self.leases.is_some();
                #[cfg(not(feature = "leases"))]
                let on = false;
                on
            })
            .finish_non_exhaustive()
    }
}

impl<K: Clone, St: Store, C: Clone> RateLimitLayer<K, St, C> {
    /// What `req` would get from this limiter's store right now — its [`Decision`](tollgate_core::Decision)'s `remaining`, `reset`,
    /// `retry_after` and outcome, for the key and cost this layer would give it — without consuming or writing
    /// anything (see [`Store::peek`]): for dashboards and "N attempts left" pages. The mode (shadow, off) does
    /// not apply: the answer is the store's.
    ///
    /// # Errors
    /// A [`KeyError`](crate::KeyError) when the request has no key, or the store's
    /// [`StoreError`](tollgate_core::StoreError) (a timeout, an open circuit, a store without peek); downcast the
    /// `BoxError`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate_core::{MemoryStore, Policy, Quota};
    /// use tollgate_tower::{ConstKey, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate_tower::BoxError> {
    /// let layer = RateLimitLayer::new(
    ///     "login",
    ///     Policy::token_bucket(Quota::per_minute(5)?),
    ///     Arc::new(MemoryStore::new()),
    ///     ConstKey::new("ann"),
    /// );
    /// // A login would be admitted and leave 4: "5 attempts left" (this one included) — and a peek spends none.
    /// for _ in 0..2 {
    ///     let d = layer.peek(&()).await?;
    ///     assert!(d.is_allowed());
    ///     assert_eq!(d.remaining + 1, 5);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek<Req>(&self, req: &Req) -> Result<tollgate_core::Decision, crate::BoxError>
    where
        K: crate::KeyExtractor<Req>,
        C: crate::Cost<Req>,
    {
        // A key with an override is peeked under its own policy (an exempt one under the limiter's).
        let shared = self.shared();
        Shared::plan_of(&shared, req).peek(req).await
    }

    /// The state every service of this layer (and its clones) shares, built on the first call.
    pub(crate) fn shared(&self) -> Arc<Shared<K, St, C>> {
        self.built.get_or_init(|| {
            // A refund after the response (another instance's included) may admit a key before a cached denial's
            // instant: a limiter charging after the response caches no denials unless told to.
            let deny = self
                .deny_on
                .unwrap_or_else(|| self.store.is_shared() && self.after.is_none())
                .then(|| {
                    self.deny_table
                        .get_or_init(|| Arc::new(self.deny_config.build(&self.name)))
                        .clone()
                });
            // Overrides' states decide on the plain path: leases are the limiter's own policy's.
            #[cfg(feature = "leases")]
            let mut own_leases = self.leases.as_ref().and_then(|config| {
                if !self.store.supports_token_leases() {
                    tracing::warn!(
                        limiter = &*self.name,
                        "token leases asked for on a store that does not support them: plain path"
                    );
                    return None;
                }
                if self.after.is_some() {
                    // A refund after the response would put tokens back under leased ones (the charge script does
                    // not floor at the leased tokens): the two are exclusive for now.
                    tracing::warn!(
                        limiter = &*self.name,
                        "token leases are not combined with a cost charged after the response: plain path"
                    );
                    return None;
                }
                let table = config.build(&self.name, &self.policy, self.store.clone());
                let _ = self.lease_table.set(table.handle());
                Some(table)
            });
            #[cfg(not(feature = "leases"))]
            let mut own_leases = None;
            let mut state = |policy: Policy| {
                Shared::new(
                    self.name.clone(),
                    policy,
                    self.store.clone(),
                    self.key.clone(),
                    self.cost.clone(),
                    self.switch.clone(),
                    self.on_error,
                    self.fallback.clone(),
                    self.near_limit,
                    deny.clone(),
                    self.after.clone(),
                    own_leases.take(),
                )
            };
            let mut shared = state(self.policy);
            if self.per_policy {
                shared = shared.with_key_prefix(policy_prefix(&self.name, &self.policy));
            }
            if !self.overrides.is_empty() {
                let plans = Plans::new(&self.name, &self.overrides, |policy| {
                    Arc::new(state(policy).with_key_prefix(policy_prefix(&self.name, &policy)))
                });
                shared = shared.with_plans(plans);
            }
            shared
        })
    }
}

/// In place: the limiter itself answers through the responder.
impl<S, R, K: Clone, St: Store, C: Clone> crate::respond::LayerWith<S, R>
    for RateLimitLayer<K, St, C>
{
    type Service = RateLimit<S, K, St, C, R>;

    fn layer_with(&self, inner: S, respond: R) -> Self::Service {
        RateLimit::from_shared(inner, self.shared(), respond)
    }
}

impl<S, K: Clone, St: Store, C: Clone> Layer<S> for RateLimitLayer<K, St, C> {
    type Service = RateLimit<S, K, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        LayerWith::layer_with(self, inner, Forward)
    }
}
