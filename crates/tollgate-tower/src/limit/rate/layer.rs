use std::fmt;
use std::sync::Arc;

use tollgate_core::{FailurePolicy, MemoryStore, Policy, Store};
use tower_layer::Layer;

use super::RateLimit;
use super::decide::Shared;
use super::deny_cache::{DenyCacheConfig, DenyTable};
use super::lease_step::LeaseTable;
use super::overrides::{Overrides, Plans, policy_prefix};
use crate::limit::core::enforcement_methods;
use crate::observe::NearLimitShare;
use crate::respond::LayerWith;
use crate::{ConfigError, CostAfter, EnforcementSwitch, Name};

/// Applies a request-rate limit to a service: see the [module docs](super).
///
/// A request over the limit is **rejected** at once (429 through the adapters); tower's
/// `tower::limit::RateLimitLayer` of the same name makes callers wait instead.
///
/// Cheap to clone. Its state is built with it, up front, and again by each method that changes a setting; every
/// service it (or a clone) builds shares that state: the store, the enforcement switch, the local fallback, the
/// deny cache and the token leases.
#[must_use]
pub struct RateLimitLayer<K, St, C = u64> {
    settings: Settings<K, St, C>,
    /// The state every service of this layer and its clones shares, built from `settings`.
    shared: Arc<Shared<K, St, C>>,
}

/// What a layer was configured with: its state is built from these.
struct Settings<K, St, C> {
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
    deny_config: DenyCacheConfig,
    /// The deny cache's table, made the first time the cache is on and kept while other settings change (a handle
    /// taken earlier still reaches it); a new configuration makes a new one.
    deny_table: Option<Arc<DenyTable>>,
    /// The token leases' table, made by [`RateLimitLayer::leases`] and kept likewise.
    lease_table: Option<Arc<LeaseTable<St>>>,
    overrides: Overrides,
    /// The limiter's own buckets are named by its policy too (`<name>#<policy>`).
    per_policy: bool,
    after: Option<CostAfter>,
}

impl<K: Clone, St, C: Clone> Clone for Settings<K, St, C> {
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
            lease_table: self.lease_table.clone(),
            overrides: self.overrides.clone(),
            per_policy: self.per_policy,
            after: self.after.clone(),
        }
    }
}

impl<K: Clone, St: Store> RateLimitLayer<K, St> {
    /// A limit named `name` (the policy name clients see in headers) enforcing `policy` on `store`, one bucket per
    /// key from `key`. Requests cost 1, enforcement is on, and while a shared store fails the limit holds per
    /// instance ([`FailurePolicy::Local`]).
    ///
    /// Layers with the same name on the same store share buckets (e.g. the copies axum makes per route).
    pub fn new(name: impl Into<Name>, policy: Policy, store: Arc<St>, key: K) -> Self {
        let name = name.into();
        // Only a shared store fails for want of an answer; an in-process store's one failure (its key table
        // full) would meet a fallback as full as itself.
        let fallback = store
            .is_shared()
            .then(|| Arc::new(MemoryStore::builder().name(name.clone()).build()));
        Self::build(Settings {
            name,
            policy,
            store,
            key,
            cost: 1,
            switch: EnforcementSwitch::default(),
            on_error: FailurePolicy::Local,
            fallback,
            near_limit: NearLimitShare::DEFAULT,
            deny_on: None,
            deny_config: DenyCacheConfig::new(),
            deny_table: None,
            lease_table: None,
            overrides: Overrides::new(),
            per_policy: false,
            after: None,
        })
    }
}

impl<K: Clone, St: Store, C: Clone> RateLimitLayer<K, St, C> {
    /// Computes each request's cost with `cost` instead of charging 1.
    pub fn cost<C2: Clone>(self, cost: C2) -> RateLimitLayer<K, St, C2> {
        let s = self.settings;
        RateLimitLayer::build(Settings {
            name: s.name,
            policy: s.policy,
            store: s.store,
            key: s.key,
            cost,
            switch: s.switch,
            on_error: s.on_error,
            fallback: s.fallback,
            near_limit: s.near_limit,
            deny_on: s.deny_on,
            deny_config: s.deny_config,
            deny_table: s.deny_table,
            lease_table: s.lease_table,
            overrides: s.overrides,
            per_policy: s.per_policy,
            after: s.after,
        })
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
    /// and the default responder `()` (under `HttpLimitLayer`, `GrpcLimitLayer`, or in a
    /// [`RateLimitSet`](super::RateLimitSet)) read it through
    /// [`VerdictSink::final_cost`](crate::VerdictSink::final_cost), which `http::Response` answers from both sources (gRPC: the header is the reply's metadata). A charge that
    /// cannot reach the store is counted in `tollgate_charges_lost_total{limiter}`
    /// ([`CHARGES_LOST_TOTAL`](crate::observe::CHARGES_LOST_TOTAL)).
    ///
    /// Such a limiter's [deny cache](super::deny_cache) is off by default even on a shared store: a refund (on
    /// any instance) can admit a key before a cached denial's retry instant, so a cached denial would no longer
    /// be exact. Switched on explicitly, it refuses such a key until that instant. Such a limiter keys by the key's text (its charge needs
    /// it), also on the in-process store.
    pub fn cost_after(self, source: CostAfter) -> Self {
        if self.settings.lease_table.is_some() {
            warn_leases_and_charges(&self.settings.name);
        }
        self.configure(|s| s.after = Some(source))
    }

    enforcement_methods!(settings.switch, |this: Self, switch| this
        .configure(|s| s.switch = switch));

    /// Counts an admission in `tollgate_near_limit_total{limiter}` when it leaves less than `share` of the limit
    /// (0.0 to 1.0; default 0.2, i.e. 20 %; 0.0 counts nothing): the alerting signal before clients see 429s.
    ///
    /// # Errors
    /// If `share` is not a number from 0.0 to 1.0.
    pub fn near_limit(self, share: f64) -> Result<Self, ConfigError> {
        let share = NearLimitShare::new(share)
            .map_err(|e| ConfigError::new(format!("{:?}: {e}", self.settings.name)))?;
        Ok(self.configure(|s| s.near_limit = share))
    }

    /// What to do when the store fails: admit (`Open`), reject with 503 (`Closed`), or decide on an in-process
    /// store with the same policy (`Local`, the default: a per-instance limit while the shared one is down; see
    /// [`FailurePolicy`] for what a fleet admits then).
    pub fn on_store_error(self, policy: FailurePolicy) -> Self {
        self.configure(|s| {
            s.on_error = policy;
            s.fallback = match policy {
                // The fallback's evictions at its key bound count under this limiter's name.
                FailurePolicy::Local => Some(s.fallback.take().unwrap_or_else(|| {
                    Arc::new(MemoryStore::builder().name(s.name.clone()).build())
                })),
                _ => None,
            };
        })
    }

    /// Switches the [deny cache](super::deny_cache) on or off: a shared store's denials answered locally until
    /// the store's retry instant, exactly. On by default for a store whose [`Store::is_shared`] is true (Redis),
    /// off otherwise (an in-process store answers at once anyway).
    pub fn deny_cache(self, on: bool) -> Self {
        self.configure(|s| s.deny_on = Some(on))
    }

    /// Switches the deny cache on with `config` (its bound, its clock).
    pub fn deny_cache_config(self, config: DenyCacheConfig) -> Self {
        self.configure(|s| {
            s.deny_config = config;
            s.deny_table = None;
            s.deny_on = Some(true);
        })
    }

    /// Forgets the cached denial of the client key `key` (as the layer's key extractor writes it): the next
    /// request for it asks the store. For an operator who reset the key in the store; call it on a clone of the
    /// layer kept for it (the clones share the cache), on each instance. The cache is the one every service of
    /// this layer decides with: later settings keep it, except a new
    /// [`deny_cache_config`](Self::deny_cache_config), which makes a new one for the layer it returns.
    pub fn deny_cache_forget(&self, key: &str) {
        if let Some(table) = self.shared.deny_table() {
            table.forget(&format!("{}:{key}", self.settings.name));
        }
    }

    /// Forgets every cached denial (see [`deny_cache_forget`](Self::deny_cache_forget)).
    pub fn deny_cache_clear(&self) {
        if let Some(table) = self.shared.deny_table() {
            table.clear();
        }
    }

    /// Denied keys the deny cache holds now (expired ones included until replaced or swept).
    #[must_use]
    pub fn deny_cache_len(&self) -> usize {
        self.shared.deny_table().map_or(0, |t| t.len())
    }

    /// Whether the deny cache holds no denial.
    #[must_use]
    pub fn deny_cache_is_empty(&self) -> bool {
        self.deny_cache_len() == 0
    }

    /// Whether the layer has a deny cache (it is on).
    #[must_use]
    pub fn deny_cache_is_active(&self) -> bool {
        self.shared.deny_table().is_some()
    }

    /// Admits hot keys from batches of tokens leased from the store ([token leases](super::token_lease)), with
    /// `config`; the store must support them ([`Store::supports_token_leases`]: Redis and the in-process store
    /// do; for another store this logs a warning and keeps the plain path). Off by default. Not combined, for now,
    /// with [`cost_after`](Self::cost_after): that logs a warning and keeps the plain path, which stays exact. A
    /// policy with a lockout is leased (see "Lockouts" in the [token lease docs](super::token_lease)).
    #[cfg(feature = "leases")]
    pub fn leases(self, config: super::LeaseConfig) -> Self {
        let s = &self.settings;
        let table = if s.store.supports_token_leases() {
            if s.after.is_some() {
                warn_leases_and_charges(&s.name);
            }
            Some(config.build(&s.name, &s.policy, s.store.clone()))
        } else {
            tracing::warn!(
                limiter = &*s.name,
                "token leases asked for on a store that does not support them: plain path"
            );
            None
        };
        self.configure(|s| s.lease_table = table)
    }

    /// Per-key overrides and exemptions (see [`Overrides`]): a key's own policy, in a bucket of its own, or no
    /// limit at all (counted as `outcome="exempt"`).
    pub fn overrides(self, overrides: Overrides) -> Self {
        self.configure(|s| s.overrides = overrides)
    }

    /// This layer's token leases (those of the last [`leases`](Self::leases), which later settings keep), if it
    /// leases.
    #[cfg(feature = "leases")]
    fn lease_reach(&self) -> super::token_lease::Leases {
        super::token_lease::Leases(
            self.settings
                .lease_table
                .as_ref()
                .filter(|_| self.settings.after.is_none())
                .map(|table| table.handle()),
        )
    }

    /// Stops leasing (later requests take the plain path), waits for fetches under way, and returns every
    /// unspent batch to the store. Call it before the process exits, on a clone of the layer kept for it (the
    /// clones share the leases). Nothing to do for a layer without [`leases`](Self::leases).
    #[cfg(feature = "leases")]
    pub async fn leases_shutdown(&self) {
        self.lease_reach().shutdown().await;
    }

    /// Returns the batches of keys idle for the configured time now, rather than at the next sweep.
    #[cfg(feature = "leases")]
    pub async fn leases_return_idle(&self) {
        self.lease_reach().return_idle().await;
    }

    /// Requests admitted from a leased batch so far.
    #[cfg(feature = "leases")]
    #[must_use]
    pub fn leases_local_admissions(&self) -> u64 {
        self.lease_reach().local_admissions()
    }

    /// Requests refused locally (a batch spent while the store said it was short) so far.
    #[cfg(feature = "leases")]
    #[must_use]
    pub fn leases_local_denials(&self) -> u64 {
        self.lease_reach().local_denials()
    }

    /// Store calls leases made so far (fetches and returns; the plain path's calls are not counted here).
    #[cfg(feature = "leases")]
    #[must_use]
    pub fn leases_store_calls(&self) -> u64 {
        self.lease_reach().store_calls()
    }

    /// Lease fetches under way now.
    #[cfg(feature = "leases")]
    #[must_use]
    pub fn leases_fetches_in_flight(&self) -> usize {
        self.lease_reach().fetches_in_flight()
    }

    /// Waits until no lease fetch is under way (tests and benchmarks that step a manual clock).
    #[cfg(feature = "leases")]
    pub async fn leases_settled(&self) {
        self.lease_reach().settled().await;
    }

    /// Names this limiter's own buckets by its policy too, `<name>#<policy>:<key>` as overrides' buckets are:
    /// a changed policy then starts every key afresh instead of carrying state made under another policy (another
    /// algorithm's state would mean nothing), and an unchanged one keeps it. What a policy file builds, for hot
    /// reload; off by default (the buckets are `<name>:<key>`).
    pub fn state_per_policy(self, on: bool) -> Self {
        self.configure(|s| s.per_policy = on)
    }

    /// The limit's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The limit's policy.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.settings.policy
    }

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
    /// use tollgate_tower::RateLimitLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate_tower::BoxError> {
    /// let layer = RateLimitLayer::new(
    ///     "login",
    ///     Policy::token_bucket(Quota::per_minute(5)?),
    ///     Arc::new(MemoryStore::new()),
    ///     "ann",
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
        Shared::plan_of(&self.shared, req).peek(req).await
    }

    /// The state every service of this layer (and its clones) shares.
    pub(crate) fn shared(&self) -> Arc<Shared<K, St, C>> {
        self.shared.clone()
    }

    /// The layer with `change` made to its settings, its state built again from them.
    fn configure(self, change: impl FnOnce(&mut Settings<K, St, C>)) -> Self {
        let mut settings = self.settings;
        change(&mut settings);
        Self::build(settings)
    }

    /// Builds the state `settings` describe, once: every service of the layer shares it.
    fn build(mut settings: Settings<K, St, C>) -> Self {
        let s = &mut settings;
        // A refund after the response (another instance's included) may admit a key before a cached denial's
        // instant: a limiter charging after the response caches no denials unless told to.
        let deny_on = s
            .deny_on
            .unwrap_or_else(|| s.store.is_shared() && s.after.is_none());
        let deny = if deny_on {
            let (config, name) = (&s.deny_config, &s.name);
            Some(
                s.deny_table
                    .get_or_insert_with(|| Arc::new(config.build(name)))
                    .clone(),
            )
        } else {
            None
        };
        // A refund after the response would put tokens back under leased ones (the charge script does not floor
        // at the leased tokens): the two are exclusive for now. Overrides' states decide on the plain path: leases
        // are the limiter's own policy's.
        let mut own_leases = s.lease_table.clone().filter(|_| s.after.is_none());
        let s = &settings;
        let mut state = |policy: Policy| {
            Shared::new(
                s.name.clone(),
                policy,
                s.store.clone(),
                s.key.clone(),
                s.cost.clone(),
                s.switch.clone(),
                s.on_error,
                s.fallback.clone(),
                s.near_limit,
                deny.clone(),
                s.after.clone(),
                own_leases.take(),
            )
        };
        let mut shared = state(s.policy);
        if s.per_policy {
            shared = shared.with_key_prefix(policy_prefix(&s.name, &s.policy));
        }
        if !s.overrides.is_empty() {
            let plans = Plans::new(&s.name, &s.overrides, |policy| {
                Arc::new(state(policy).with_key_prefix(policy_prefix(&s.name, &policy)))
            });
            shared = shared.with_plans(plans);
        }
        Self {
            shared: Arc::new(shared),
            settings,
        }
    }
}

/// Says that token leases and a cost charged after the response are not combined: the limiter keeps the plain
/// path, which stays exact.
fn warn_leases_and_charges(name: &str) {
    tracing::warn!(
        limiter = name,
        "token leases are not combined with a cost charged after the response: plain path"
    );
}

impl<K: Clone, St, C: Clone> Clone for RateLimitLayer<K, St, C> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<K, St, C> fmt::Debug for RateLimitLayer<K, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("RateLimitLayer")
            .field("name", &s.name)
            .field("policy", &s.policy)
            .field("mode", &s.switch.mode())
            .field("on_store_error", &s.on_error)
            .field("near_limit", &s.near_limit.get())
            .field("deny_cache", &s.deny_on)
            .field("leases", &s.lease_table.is_some())
            .finish_non_exhaustive()
    }
}

/// In place: the limiter itself answers through the responder.
impl<S, R, K, St, C> LayerWith<S, R> for RateLimitLayer<K, St, C> {
    type Service = RateLimit<S, K, St, C, R>;

    fn layer_with(&self, inner: S, respond: R) -> Self::Service {
        RateLimit::from_shared(inner, self.shared.clone(), respond)
    }
}

impl<S, K, St, C> Layer<S> for RateLimitLayer<K, St, C> {
    type Service = RateLimit<S, K, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        LayerWith::layer_with(self, inner, ())
    }
}
