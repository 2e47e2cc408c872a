use std::fmt;
use std::sync::Arc;

use crate::observe::NearLimitShare;
use crate::{Name, Priority, RejectionKind};
use tollgate_core::FailurePolicy;
use tollgate_core::slot::SlotStore;
use tower_layer::Layer;

use super::FleetRule;
use crate::ConfigError;
use crate::limit::InFlightLimit;
use crate::limit::concurrency::{
    DEFAULT_RETRY_AFTER, DEFAULT_SLOT_TTL, Settings, SlotLayer, slot_layer_methods,
};

/// The share of fleet capacity reserved for `Critical` requests (default), in percent.
pub const DEFAULT_RESERVE_PERCENT: u8 = 20;
/// The shedder's name and fleet-wide key (default): the Redis key is `<namespace>:{fleet}:inflight`.
pub const DEFAULT_FLEET_KEY: &str = "fleet";

/// Sheds non-critical requests once they fill the fleet's unreserved capacity: see the [module docs](super).
///
/// It counts slots as the concurrency limiter does, with a fleet-wide rule, and shares its builder
/// ([`mode`](Self::mode), [`shadow`](Self::shadow), [`slot_ttl`](Self::slot_ttl),
/// [`on_store_error`](Self::on_store_error) …). Cheap to clone; its state is built with it, up front, and again by
/// each method that changes a setting.
#[must_use]
pub struct FleetShedLayer<P, L> {
    pub(super) inner: SlotLayer<FleetRule<P>, L>,
}

impl<P: Clone, L: SlotStore> FleetShedLayer<P, L> {
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
        let settings = Settings {
            name: DEFAULT_FLEET_KEY.into(),
            slot_ttl: DEFAULT_SLOT_TTL,
            retry_after: DEFAULT_RETRY_AFTER,
            on_error: FailurePolicy::Open,
            near_limit: NearLimitShare::DEFAULT,
        };
        let rule = FleetRule {
            classifier,
            capacity,
            reserve_percent: DEFAULT_RESERVE_PERCENT,
            thresholds: None,
        };
        let inner = SlotLayer::new(settings, rule, store, RejectionKind::Shed);
        Ok(Self { inner })
    }

    slot_layer_methods!();

    /// Reserves `percent` of the capacity for `Critical` requests (rounded up to whole requests); per-class
    /// [`thresholds`](Self::thresholds), when set, take its place.
    ///
    /// # Errors
    /// If `percent` is over 100.
    pub fn reserve_percent(self, percent: u8) -> Result<Self, ConfigError> {
        if percent > 100 {
            return Err(ConfigError::new(format!(
                "fleet shedder: a reserve of {percent} % is impossible (0 to 100)"
            )));
        }
        Ok(Self {
            inner: self.inner.configure(|c| c.rule.reserve_percent = percent),
        })
    }

    /// Gives each non-critical class its own line instead of the one reserve, as the worker shedder does: requests
    /// of a class are admitted while fewer than `capacity × percent / 100` (rounded down) are in flight fleet-wide;
    /// `Critical` may use the whole capacity. E.g. `thresholds(60, 75, 90)`: `Low` stops at 60 %, `Normal` at
    /// 75 %, `High` at 90 %.
    ///
    /// # Errors
    /// Unless `low ≤ normal ≤ high ≤ 100`.
    pub fn thresholds(self, low: u8, normal: u8, high: u8) -> Result<Self, ConfigError> {
        if !(low <= normal && normal <= high && high <= 100) {
            return Err(ConfigError::new(format!(
                "fleet shedder: thresholds low {low} %, normal {normal} %, high {high} % must satisfy \
                 low ≤ normal ≤ high ≤ 100"
            )));
        }
        Ok(Self {
            inner: self
                .inner
                .configure(|c| c.rule.thresholds = Some([100, high, normal, low])),
        })
    }

    /// Renames the shedder, and with it the fleet-wide key (e.g. one fleet per service sharing a Redis).
    pub fn name(self, name: impl Into<Name>) -> Self {
        let name = name.into();
        Self {
            inner: self.inner.configure(|c| c.settings.name = name),
        }
    }
}

impl<P, L> FleetShedLayer<P, L> {
    /// The fleet-wide ceiling for requests of `priority`.
    #[must_use]
    pub fn ceiling(&self, priority: Priority) -> u64 {
        self.inner.config().rule.ceiling(priority)
    }
}

impl<P, L> Clone for FleetShedLayer<P, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<P, L> fmt::Debug for FleetShedLayer<P, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FleetShedLayer").field(&self.inner).finish()
    }
}

impl<S, P, L> Layer<S> for FleetShedLayer<P, L> {
    type Service = InFlightLimit<S, Self>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit::new(inner, self.clone())
    }
}
