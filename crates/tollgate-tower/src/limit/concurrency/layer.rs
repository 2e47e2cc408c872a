use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::FailurePolicy;
use tollgate_core::slot::{MemorySlotStore, SlotStore};
use tower_layer::Layer;

use super::decide::{Settings, Shared};
use super::{PerKey, SlotLimit};
use crate::limit::core::{Built, enforcement_methods};
use crate::observe::NearLimitShare;
use crate::{ConfigError, EnforcementSwitch, Name, RejectionKind};

/// How long a shared slot lives unless renewed (default): a crashed instance's requests stop counting after it.
pub const DEFAULT_SLOT_TTL: Duration = Duration::from_secs(10);
/// The longest slot time accepted: a slot is renewed while its request runs, so its time only says how long a
/// crashed holder keeps counting.
pub const MAX_SLOT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The retry delay a rejection announces (default): in-flight capacity frees up as requests finish.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A limit on requests in flight, counted as slots: what a [`SlotRule`](super::SlotRule) says is the key and
/// its ceiling. The concurrent-requests limiter ([`ConcurrencyLimitLayer`]) and the fleet-usage shedder
/// ([`FleetShedLayer`](crate::FleetShedLayer)) are this layer with two rules, so they share one builder.
///
/// A request over the limit is **rejected** at once (429 or 503 through the adapters); tower's
/// `tower::limit::ConcurrencyLimitLayer` makes callers wait instead.
///
/// Cheap to clone; every service it builds (e.g. axum's copy per route) shares the store, the enforcement switch,
/// the local fallback and the metrics: configure the layer before applying it.
#[must_use]
pub struct SlotLimitLayer<R, L> {
    pub(crate) settings: Settings,
    pub(crate) rule: R,
    store: Arc<L>,
    fallback: Option<Arc<MemorySlotStore>>,
    kind: RejectionKind,
    switch: EnforcementSwitch,
    built: Built<Shared<R, L>>,
}

/// Limits how many requests per key are in flight: see the [module docs](super).
///
/// The request over the limit is **rejected** at once (429 / `RESOURCE_EXHAUSTED` through the adapters), never
/// queued: tower's `tower::limit::ConcurrencyLimitLayer` of the same name makes callers wait for a slot instead.
pub type ConcurrencyLimitLayer<K, L> = SlotLimitLayer<PerKey<K>, L>;

impl<K, L: SlotStore> ConcurrencyLimitLayer<K, L> {
    /// At most `limit` requests in flight per key from `key`, counted in `store`, under the name `name` (which
    /// also prefixes the keys). Enforced, slots of [`DEFAULT_SLOT_TTL`], rejections announce a retry after
    /// [`DEFAULT_RETRY_AFTER`], and a failing store rejects (fails closed).
    ///
    /// # Errors
    /// If `limit` is 0 (nothing could ever run).
    pub fn new(
        name: impl Into<Name>,
        limit: u64,
        store: Arc<L>,
        key: K,
    ) -> Result<Self, ConfigError> {
        let name = name.into();
        if limit == 0 {
            return Err(ConfigError::new(format!(
                "concurrency limit {name:?}: the limit must be at least 1 request in flight"
            )));
        }
        let settings = Settings {
            name,
            slot_ttl: DEFAULT_SLOT_TTL,
            retry_after: DEFAULT_RETRY_AFTER,
            on_error: FailurePolicy::Closed,
            near_limit: NearLimitShare::DEFAULT,
        };
        let rule = PerKey { key, limit };
        Ok(Self::with_rule(
            settings,
            rule,
            store,
            RejectionKind::ConcurrencyLimited,
        ))
    }
}

impl<K, L> ConcurrencyLimitLayer<K, L> {
    /// The limiter's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The number of requests each key may have in flight.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.rule.limit
    }
}

impl<R, L> SlotLimitLayer<R, L> {
    /// A layer with `settings` over `rule`, rejecting with `kind`.
    pub(crate) fn with_rule(
        settings: Settings,
        rule: R,
        store: Arc<L>,
        kind: RejectionKind,
    ) -> Self {
        Self {
            settings,
            rule,
            store,
            fallback: None,
            kind,
            switch: EnforcementSwitch::default(),
            built: Built::default(),
        }
    }

    enforcement_methods!();

    /// How long a shared slot lives unless renewed (renewed every third of it while the request runs).
    ///
    /// # Errors
    /// If `ttl` is shorter than 3 ms (renewals could not keep up) or longer than [`MAX_SLOT_TTL`].
    pub fn slot_ttl(mut self, ttl: Duration) -> Result<Self, ConfigError> {
        if ttl < Duration::from_millis(3) {
            return Err(ConfigError::new(format!(
                "{:?}: a slot time of {ttl:?} is too short (at least 3 ms)",
                self.settings.name
            )));
        }
        if ttl > MAX_SLOT_TTL {
            return Err(ConfigError::new(format!(
                "{:?}: a slot time of {ttl:?} is too long (at most {MAX_SLOT_TTL:?}: a crashed holder would \
                 count that long)",
                self.settings.name
            )));
        }
        self.settings.slot_ttl = ttl;
        Ok(self.rebuilt())
    }

    /// The retry delay rejections announce (`Retry-After`, gRPC `RetryInfo`; default [`DEFAULT_RETRY_AFTER`]).
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.settings.retry_after = retry_after;
        self.rebuilt()
    }

    /// Counts an admission in `tollgate_near_limit_total{limiter}` when it leaves fewer than `share` of the
    /// ceiling's slots free (0.0 to 1.0; default 0.2, i.e. 20 %; 0.0 counts nothing).
    ///
    /// # Errors
    /// If `share` is not a number from 0.0 to 1.0.
    pub fn near_limit(mut self, share: f64) -> Result<Self, ConfigError> {
        self.settings.near_limit = NearLimitShare::new(share)
            .map_err(|e| ConfigError::new(format!("{:?}: {e}", self.settings.name)))?;
        Ok(self.rebuilt())
    }

    /// What to do when the store fails: admit (`Open`, the fleet shedder's default), reject with 503 (`Closed`, the
    /// concurrency limiter's default), or count in process with the same ceilings (`Local`: a per-instance count
    /// while the shared one is down).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.settings.on_error = policy;
        self.fallback = match policy {
            FailurePolicy::Local => Some(self.fallback.unwrap_or_default()),
            _ => None,
        };
        self.rebuilt()
    }

    /// After a setting changed: the services built from now on share a new state.
    pub(crate) fn rebuilt(mut self) -> Self {
        self.built = Built::default();
        self
    }
}

impl<R: Clone, L> Clone for SlotLimitLayer<R, L> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            rule: self.rule.clone(),
            store: self.store.clone(),
            fallback: self.fallback.clone(),
            kind: self.kind,
            switch: self.switch.clone(),
            built: self.built.clone(),
        }
    }
}

impl<R, L> fmt::Debug for SlotLimitLayer<R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotLimitLayer")
            .field("name", &self.settings.name)
            .field("rejects_as", &self.kind)
            .field("mode", &self.switch.mode())
            .field("slot_ttl", &self.settings.slot_ttl)
            .field("on_store_error", &self.settings.on_error)
            .finish_non_exhaustive()
    }
}

impl<S, R: Clone, L: SlotStore> Layer<S> for SlotLimitLayer<R, L> {
    type Service = SlotLimit<S, R, L>;

    fn layer(&self, inner: S) -> Self::Service {
        let shared = self.built.get_or_init(|| {
            Shared::new(
                self.settings.clone(),
                self.switch.clone(),
                self.rule.clone(),
                self.store.clone(),
                self.kind,
                self.fallback.clone(),
            )
        });
        SlotLimit::from_shared(inner, shared)
    }
}
