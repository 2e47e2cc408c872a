use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::FailurePolicy;
use tollgate_core::lease::{LeaseStore, MemoryLeaseStore};
use tollgate_tower::{EnforcementSwitch, Mode, Priority, RejectionKind};
use tower_layer::Layer;

use super::FleetRule;
use crate::ConfigError;
use crate::concurrency::{
    ConcurrencyLimit, DEFAULT_LEASE_TTL, DEFAULT_RETRY_AFTER, Settings, Shared,
};

/// The share of fleet capacity reserved for `Critical` requests (default), in percent.
pub const DEFAULT_RESERVE_PERCENT: u8 = 20;
/// The shedder's name and fleet-wide key (default): the Redis key is `<namespace>:{fleet}:inflight`.
pub const DEFAULT_FLEET_KEY: &str = "fleet";

/// Sheds non-critical requests once they fill the fleet's unreserved capacity: see the [module docs](super).
#[must_use]
pub struct FleetShedLayer<P, L> {
    settings: Settings,
    rule: FleetRule<P>,
    store: Arc<L>,
    fallback: Option<Arc<MemoryLeaseStore>>,
}

impl<P, L: LeaseStore> FleetShedLayer<P, L> {
    /// Fleet-wide, at most `capacity` requests in flight, counted in `store` (shared by every instance), with
    /// [`DEFAULT_RESERVE_PERCENT`] of it reserved for requests that `classifier` calls `Critical`. Named
    /// [`DEFAULT_FLEET_KEY`]; enforced; a failing store admits (fails open: shedding protects the service, and
    /// rejecting everything because Redis is down would be the outage it is meant to prevent).
    ///
    /// # Errors
    /// If `capacity` is 0.
    pub fn new(capacity: u64, store: Arc<L>, classifier: P) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new(
                "fleet shedder: the fleet capacity must be at least 1 request in flight",
            ));
        }
        Ok(Self {
            settings: Settings {
                name: DEFAULT_FLEET_KEY.into(),
                switch: EnforcementSwitch::default(),
                lease_ttl: DEFAULT_LEASE_TTL,
                retry_after: DEFAULT_RETRY_AFTER,
                on_error: FailurePolicy::Open,
            },
            rule: FleetRule {
                classifier,
                capacity,
                reserve_percent: DEFAULT_RESERVE_PERCENT,
            },
            store,
            fallback: None,
        })
    }
}

impl<P, L> FleetShedLayer<P, L> {
    /// Reserves `percent` of the capacity for `Critical` requests (rounded up to whole requests).
    ///
    /// # Errors
    /// If `percent` is over 100.
    pub fn reserve_percent(mut self, percent: u8) -> Result<Self, ConfigError> {
        if percent > 100 {
            return Err(ConfigError::new(format!(
                "fleet shedder: a reserve of {percent} % is impossible (0 to 100)"
            )));
        }
        self.rule.reserve_percent = percent;
        Ok(self)
    }

    /// Renames the shedder, and with it the fleet-wide key (e.g. one fleet per service sharing a Redis).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.settings.name = name.into();
        self
    }

    /// Sets the mode the layer starts in (on its current switch, which every clone shares).
    pub fn mode(self, mode: Mode) -> Self {
        self.settings.switch.set(mode);
        self
    }

    /// Starts in shadow mode: count and log what would be shed, shed nothing.
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

    /// How long a lease lives unless renewed (renewed every third of it while the request runs).
    ///
    /// # Errors
    /// If `ttl` is shorter than 3 ms.
    pub fn lease_ttl(mut self, ttl: Duration) -> Result<Self, ConfigError> {
        if ttl < Duration::from_millis(3) {
            return Err(ConfigError::new(format!(
                "fleet shedder: a lease time of {ttl:?} is too short (at least 3 ms)"
            )));
        }
        self.settings.lease_ttl = ttl;
        Ok(self)
    }

    /// The retry delay a shed request announces (`Retry-After`, gRPC `RetryInfo`).
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.settings.retry_after = retry_after;
        self
    }

    /// What to do when the store fails: admit (`Open`, the default), reject with 503 (`Closed`), or count this
    /// instance's requests against the same ceilings (`Local`; a per-instance count, so it only sheds when one
    /// instance alone fills the fleet's share).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.settings.on_error = policy;
        self.fallback = match policy {
            FailurePolicy::Local => Some(self.fallback.unwrap_or_default()),
            _ => None,
        };
        self
    }

    /// The fleet-wide ceiling for requests of `priority`.
    #[must_use]
    pub fn ceiling(&self, priority: Priority) -> u64 {
        self.rule.ceiling(priority)
    }
}

impl<P: Clone, L> Clone for FleetShedLayer<P, L> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            rule: self.rule.clone(),
            store: self.store.clone(),
            fallback: self.fallback.clone(),
        }
    }
}

impl<P, L> fmt::Debug for FleetShedLayer<P, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetShedLayer")
            .field("name", &self.settings.name)
            .field("capacity", &self.rule.capacity)
            .field("reserve_percent", &self.rule.reserve_percent)
            .field("mode", &self.settings.switch.mode())
            .field("on_store_error", &self.settings.on_error)
            .finish_non_exhaustive()
    }
}

impl<S, P: Clone, L: LeaseStore> Layer<S> for FleetShedLayer<P, L> {
    type Service = ConcurrencyLimit<S, FleetRule<P>, L>;

    fn layer(&self, inner: S) -> Self::Service {
        let shared = Shared::new(
            self.settings.clone(),
            self.rule.clone(),
            self.store.clone(),
            RejectionKind::Shed,
            self.fallback.clone(),
        );
        ConcurrencyLimit::from_shared(inner, Arc::new(shared))
    }
}
