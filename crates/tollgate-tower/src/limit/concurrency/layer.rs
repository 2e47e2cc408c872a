use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::FailurePolicy;
use tollgate_core::slot::SlotStore;
use tower_layer::Layer;

use super::PerKey;
use super::decide::{Settings, Shared, SlotConfig};
use crate::limit::InFlightLimit;
use crate::observe::NearLimitShare;
use crate::{ConfigError, EnforcementSwitch, Name, RejectionKind};

/// How long a shared slot lives unless renewed (default): a crashed instance's requests stop counting after it.
pub const DEFAULT_SLOT_TTL: Duration = Duration::from_secs(10);
/// The longest slot time accepted: a slot is renewed while its request runs, so its time only says how long a
/// crashed holder keeps counting.
pub const MAX_SLOT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The retry delay a rejection announces (default): in-flight capacity frees up as requests finish.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A limit on requests in flight, counted as slots: the layer under [`ConcurrencyLimitLayer`] and
/// [`FleetShedLayer`](crate::FleetShedLayer), which differ in their rule. Its state is built with it, up front,
/// and again by each setting changed ([`configure`](Self::configure)); every service it (or a clone) builds shares
/// that state.
pub(crate) struct SlotLayer<R, L> {
    pub(crate) shared: Arc<Shared<R, L>>,
}

impl<R: Clone, L: SlotStore> SlotLayer<R, L> {
    /// A layer with `settings` over `rule`, rejecting with `kind`.
    pub(crate) fn new(settings: Settings, rule: R, store: Arc<L>, kind: RejectionKind) -> Self {
        // Built with the layer, as `on_store_error(Local)` builds it.
        let fallback = (settings.on_error == FailurePolicy::Local).then(Default::default);
        Self::build(SlotConfig {
            settings,
            rule,
            store,
            fallback,
            kind,
            switch: EnforcementSwitch::default(),
        })
    }

    fn build(config: SlotConfig<R, L>) -> Self {
        Self {
            shared: Arc::new(Shared::new(config)),
        }
    }

    /// This layer with its configuration changed by `change`, and a state of its own built from it.
    pub(crate) fn configure(self, change: impl FnOnce(&mut SlotConfig<R, L>)) -> Self {
        let mut config = self.shared.config.clone();
        change(&mut config);
        Self::build(config)
    }

    pub(crate) fn slot_ttl(self, ttl: Duration) -> Result<Self, ConfigError> {
        let name = &self.config().settings.name;
        if ttl < Duration::from_millis(3) {
            return Err(ConfigError::new(format!(
                "{name:?}: a slot time of {ttl:?} is too short (at least 3 ms)"
            )));
        }
        if ttl > MAX_SLOT_TTL {
            return Err(ConfigError::new(format!(
                "{name:?}: a slot time of {ttl:?} is too long (at most {MAX_SLOT_TTL:?}: a crashed holder would \
                 count that long)"
            )));
        }
        Ok(self.configure(|c| c.settings.slot_ttl = ttl))
    }

    pub(crate) fn near_limit(self, share: f64) -> Result<Self, ConfigError> {
        let share = NearLimitShare::new(share)
            .map_err(|e| ConfigError::new(format!("{:?}: {e}", self.config().settings.name)))?;
        Ok(self.configure(|c| c.settings.near_limit = share))
    }

    pub(crate) fn on_store_error(self, policy: FailurePolicy) -> Self {
        self.configure(|c| {
            c.settings.on_error = policy;
            c.fallback = match policy {
                FailurePolicy::Local => Some(c.fallback.take().unwrap_or_default()),
                _ => None,
            };
        })
    }

    pub(crate) fn switch(self, switch: EnforcementSwitch) -> Self {
        self.configure(|c| c.switch = switch)
    }
}

impl<R, L> SlotLayer<R, L> {
    /// The configuration the layer was built from.
    pub(crate) fn config(&self) -> &SlotConfig<R, L> {
        &self.shared.config
    }
}

impl<R, L> Clone for SlotLayer<R, L> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<R, L> fmt::Debug for SlotLayer<R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.shared.config;
        f.debug_struct("SlotLayer")
            .field("name", &c.settings.name)
            .field("rejects_as", &c.kind)
            .field("mode", &c.switch.mode())
            .field("slot_ttl", &c.settings.slot_ttl)
            .field("on_store_error", &c.settings.on_error)
            .finish_non_exhaustive()
    }
}

/// The builder methods the concurrency limiter and the fleet shedder share, for a layer with a field
/// `inner: SlotLayer<_, _>`: written once, documented once.
macro_rules! slot_layer_methods {
    () => {
        $crate::limit::core::enforcement_methods!(
            inner.shared.config.switch,
            |this: Self, switch| Self {
                inner: this.inner.switch(switch)
            }
        );

        /// How long a shared slot lives unless renewed (renewed every third of it while the request runs).
        ///
        /// # Errors
        /// If `ttl` is shorter than 3 ms (renewals could not keep up) or longer than
        /// [`MAX_SLOT_TTL`]($crate::limit::concurrency::MAX_SLOT_TTL).
        pub fn slot_ttl(self, ttl: std::time::Duration) -> Result<Self, $crate::ConfigError> {
            Ok(Self {
                inner: self.inner.slot_ttl(ttl)?,
            })
        }

        /// The retry delay rejections announce (`Retry-After`, gRPC `RetryInfo`; default
        /// [`DEFAULT_RETRY_AFTER`]($crate::limit::concurrency::DEFAULT_RETRY_AFTER)).
        pub fn retry_after(self, retry_after: std::time::Duration) -> Self {
            Self {
                inner: self
                    .inner
                    .configure(|c| c.settings.retry_after = retry_after),
            }
        }

        /// Counts an admission in `tollgate_near_limit_total{limiter}` when it leaves fewer than `share` of the
        /// ceiling's slots free (0.0 to 1.0; default 0.2, i.e. 20 %; 0.0 counts nothing).
        ///
        /// # Errors
        /// If `share` is not a number from 0.0 to 1.0.
        pub fn near_limit(self, share: f64) -> Result<Self, $crate::ConfigError> {
            Ok(Self {
                inner: self.inner.near_limit(share)?,
            })
        }

        /// What to do when the store fails: admit (`Open`, the fleet shedder's default), reject with 503
        /// (`Closed`), or count in process with the same ceilings (`Local`, the concurrency limiter's default: a
        /// per-instance count while the shared one is down).
        pub fn on_store_error(self, policy: tollgate_core::FailurePolicy) -> Self {
            Self {
                inner: self.inner.on_store_error(policy),
            }
        }
    };
}
pub(crate) use slot_layer_methods;

/// Limits how many requests per key are in flight: see the [module docs](super).
///
/// The request over the limit is **rejected** at once (429 / `RESOURCE_EXHAUSTED` through the adapters), never
/// queued: tower's `tower::limit::ConcurrencyLimitLayer` of the same name makes callers wait for a slot instead.
///
/// Cheap to clone. Its state is built with it, up front, and again by each method that changes a setting; every
/// service it (or a clone) builds (e.g. axum's copy per route) shares that state: the store, the enforcement
/// switch, the local fallback and the metrics.
#[must_use]
pub struct ConcurrencyLimitLayer<K, L> {
    pub(super) inner: SlotLayer<PerKey<K>, L>,
}

impl<K: Clone, L: SlotStore> ConcurrencyLimitLayer<K, L> {
    /// At most `limit` requests in flight per key from `key`, counted in `store`, under the name `name` (which
    /// also prefixes the keys). Enforced, slots of [`DEFAULT_SLOT_TTL`], rejections announce a retry after
    /// [`DEFAULT_RETRY_AFTER`], and while a shared store fails the limit holds per instance
    /// ([`FailurePolicy::Local`](tollgate_core::FailurePolicy::Local)).
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
            on_error: FailurePolicy::Local,
            near_limit: NearLimitShare::DEFAULT,
        };
        let rule = PerKey { key, limit };
        let inner = SlotLayer::new(settings, rule, store, RejectionKind::ConcurrencyLimited);
        Ok(Self { inner })
    }

    slot_layer_methods!();
}

impl<K, L> ConcurrencyLimitLayer<K, L> {
    /// The limiter's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.config().settings.name
    }

    /// The number of requests each key may have in flight.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.inner.config().rule.limit
    }
}

impl<K, L> Clone for ConcurrencyLimitLayer<K, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K, L> fmt::Debug for ConcurrencyLimitLayer<K, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConcurrencyLimitLayer")
            .field(&self.inner)
            .finish()
    }
}

impl<S, K, L> Layer<S> for ConcurrencyLimitLayer<K, L> {
    type Service = InFlightLimit<S, Self>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit::new(inner, self.clone())
    }
}
