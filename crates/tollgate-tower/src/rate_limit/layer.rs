use std::fmt;
use std::sync::{Arc, OnceLock};

use tollgate_core::{FailurePolicy, MemoryStore, Policy, Store};
use tower_layer::Layer;

use super::RateLimit;
use super::decide::Shared;
use crate::Name;
use crate::respond::Forward;
use crate::{EnforcementSwitch, Mode, UnitCost};

/// Applies a request-rate limit to a service: see the [module docs](crate::rate_limit).
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
    /// Built on the first `layer` call and shared by every service from then on: axum calls `layer` for every
    /// route (and again per connection for routers with handlers), which must not re-register metrics each time.
    /// Every builder method starts a fresh one.
    built: Arc<OnceLock<Arc<Shared<K, St, C>>>>,
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
            built: Arc::default(),
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
            built: Arc::default(),
        }
    }

    /// Sets the mode the layer starts in. The mode lives in the layer's switch: after [`switch`](Self::switch)
    /// this sets the mode of every layer sharing that switch (dark-launch one limiter with a switch of its own),
    /// and a `switch` given afterwards brings its own mode instead.
    pub fn mode(self, mode: Mode) -> Self {
        self.switch.set(mode);
        self
    }

    /// Starts in shadow mode: decide, count and log, never reject.
    pub fn shadow(self) -> Self {
        self.mode(Mode::Shadow)
    }

    /// Uses `switch` (e.g. one shared by several layers) for the enforcement mode, in the mode the switch is in:
    /// a mode set on this layer before is the old switch's, and is not carried over.
    pub fn switch(mut self, switch: EnforcementSwitch) -> Self {
        self.switch = switch;
        self.built = Arc::default();
        self
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
        self.built = Arc::default();
        self
    }

    /// A handle on the enforcement mode, to flip it at run time (the kill switch).
    #[must_use]
    pub fn enforcement(&self) -> EnforcementSwitch {
        self.switch.clone()
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
            .finish_non_exhaustive()
    }
}

impl<K: Clone, St: Store, C: Clone> RateLimitLayer<K, St, C> {
    /// Wraps `inner`, answering every request through `respond` instead of [`Forward`]: how protocol adapters
    /// (`tollgate-http`) answer in place, without a service layer of their own.
    pub fn layer_with<S, R>(&self, inner: S, respond: R) -> RateLimit<S, K, St, C, R> {
        let shared = self.built.get_or_init(|| {
            Arc::new(Shared::new(
                self.name.clone(),
                self.policy,
                self.store.clone(),
                self.key.clone(),
                self.cost.clone(),
                self.switch.clone(),
                self.on_error,
                self.fallback.clone(),
            ))
        });
        RateLimit::from_shared(inner, shared.clone(), respond)
    }
}

impl<S, K: Clone, St: Store, C: Clone> Layer<S> for RateLimitLayer<K, St, C> {
    type Service = RateLimit<S, K, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        self.layer_with(inner, Forward)
    }
}
