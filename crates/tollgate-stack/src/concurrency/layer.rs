use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::FailurePolicy;
use tollgate_core::lease::{LeaseStore, MemoryLeaseStore};
use tollgate_tower::{EnforcementSwitch, Mode, RejectionKind};
use tower_layer::Layer;

use super::decide::{Settings, Shared};
use super::{ConcurrencyLimit, PerKey};
use crate::ConfigError;

/// How long a shared lease lives unless renewed (default): a crashed instance's requests stop counting after it.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// The retry delay a rejection announces (default): in-flight capacity frees up as requests finish.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Limits how many requests per key are in flight: see the [module docs](super).
///
/// Cheap to clone; every service it builds shares the store, the enforcement switch and the local fallback.
#[must_use]
pub struct ConcurrencyLimitLayer<K, L> {
    pub(crate) settings: Settings,
    rule: PerKey<K>,
    store: Arc<L>,
    fallback: Option<Arc<MemoryLeaseStore>>,
}

impl<K, L: LeaseStore> ConcurrencyLimitLayer<K, L> {
    /// At most `limit` requests in flight per key from `key`, counted in `store`, under the name `name` (which
    /// also prefixes the keys). Enforced, leases of [`DEFAULT_LEASE_TTL`], rejections announce a retry after
    /// [`DEFAULT_RETRY_AFTER`], and a failing store rejects (fails closed).
    ///
    /// # Errors
    /// If `limit` is 0 (nothing could ever run).
    pub fn new(
        name: impl Into<Arc<str>>,
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
        Ok(Self {
            settings: Settings {
                name,
                switch: EnforcementSwitch::default(),
                lease_ttl: DEFAULT_LEASE_TTL,
                retry_after: DEFAULT_RETRY_AFTER,
                on_error: FailurePolicy::Closed,
            },
            rule: PerKey { key, limit },
            store,
            fallback: None,
        })
    }
}

impl<K, L> ConcurrencyLimitLayer<K, L> {
    /// Sets the mode the layer starts in (on its current switch, which every clone shares).
    pub fn mode(self, mode: Mode) -> Self {
        self.settings.switch.set(mode);
        self
    }

    /// Starts in shadow mode: count and log requests over the limit, never reject.
    pub fn shadow(self) -> Self {
        self.mode(Mode::Shadow)
    }

    /// Uses `switch` (e.g. one shared by several layers) for the enforcement mode.
    pub fn switch(mut self, switch: EnforcementSwitch) -> Self {
        self.settings.switch = switch;
        self
    }

    /// A handle on the enforcement mode, to flip it at run time (the kill switch).
    #[must_use]
    pub fn enforcement(&self) -> EnforcementSwitch {
        self.settings.switch.clone()
    }

    /// How long a shared lease lives unless renewed (renewed every third of it while the request runs).
    ///
    /// # Errors
    /// If `ttl` is shorter than 3 ms (renewals could not keep up).
    pub fn lease_ttl(mut self, ttl: Duration) -> Result<Self, ConfigError> {
        if ttl < Duration::from_millis(3) {
            return Err(ConfigError::new(format!(
                "limiter {:?}: a lease time of {ttl:?} is too short (at least 3 ms)",
                self.settings.name
            )));
        }
        self.settings.lease_ttl = ttl;
        Ok(self)
    }

    /// The retry delay rejections announce (`Retry-After`, gRPC `RetryInfo`).
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.settings.retry_after = retry_after;
        self
    }

    /// What to do when the store fails: admit (`Open`), reject with 503 (`Closed`, the default), or count in
    /// process with the same limit (`Local`: a per-instance limit while the shared one is down).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.settings.on_error = policy;
        self.fallback = match policy {
            FailurePolicy::Local => Some(self.fallback.unwrap_or_default()),
            _ => None,
        };
        self
    }

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

impl<K: Clone, L> Clone for ConcurrencyLimitLayer<K, L> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            rule: self.rule.clone(),
            store: self.store.clone(),
            fallback: self.fallback.clone(),
        }
    }
}

impl<K, L> fmt::Debug for ConcurrencyLimitLayer<K, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("name", &self.settings.name)
            .field("limit", &self.rule.limit)
            .field("mode", &self.settings.switch.mode())
            .field("lease_ttl", &self.settings.lease_ttl)
            .field("on_store_error", &self.settings.on_error)
            .finish_non_exhaustive()
    }
}

impl<S, K: Clone, L: LeaseStore> Layer<S> for ConcurrencyLimitLayer<K, L> {
    type Service = ConcurrencyLimit<S, PerKey<K>, L>;

    fn layer(&self, inner: S) -> Self::Service {
        let shared = Shared::new(
            self.settings.clone(),
            self.rule.clone(),
            self.store.clone(),
            RejectionKind::ConcurrencyLimited,
            self.fallback.clone(),
        );
        ConcurrencyLimit::from_shared(inner, Arc::new(shared))
    }
}
