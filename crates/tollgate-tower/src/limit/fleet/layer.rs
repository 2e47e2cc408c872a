use std::sync::Arc;

use crate::observe::NearLimitShare;
use crate::{Name, Priority, RejectionKind};
use tollgate_core::FailurePolicy;
use tollgate_core::slot::SlotStore;

use super::FleetRule;
use crate::ConfigError;
use crate::limit::concurrency::{DEFAULT_RETRY_AFTER, DEFAULT_SLOT_TTL, Settings, SlotLimitLayer};

/// The share of fleet capacity reserved for `Critical` requests (default), in percent.
pub const DEFAULT_RESERVE_PERCENT: u8 = 20;
/// The shedder's name and fleet-wide key (default): the Redis key is `<namespace>:{fleet}:inflight`.
pub const DEFAULT_FLEET_KEY: &str = "fleet";

/// Sheds non-critical requests once they fill the fleet's unreserved capacity: see the [module docs](super).
///
/// The slot layer of the concurrency limiter with a fleet-wide rule: its builder ([`mode`](SlotLimitLayer::mode),
/// [`shadow`](SlotLimitLayer::shadow), [`slot_ttl`](SlotLimitLayer::slot_ttl),
/// [`on_store_error`](SlotLimitLayer::on_store_error) …) is shared.
pub type FleetShedLayer<P, L> = SlotLimitLayer<FleetRule<P>, L>;

impl<P, L: SlotStore> FleetShedLayer<P, L> {
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
        Ok(Self::with_rule(settings, rule, store, RejectionKind::Shed))
    }
}

impl<P, L> FleetShedLayer<P, L> {
    /// Reserves `percent` of the capacity for `Critical` requests (rounded up to whole requests); per-class
    /// [`thresholds`](Self::thresholds), when set, take its place.
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
        Ok(self.rebuilt())
    }

    /// Gives each non-critical class its own line instead of the one reserve, as the worker shedder does: requests
    /// of a class are admitted while fewer than `capacity × percent / 100` (rounded down) are in flight fleet-wide;
    /// `Critical` may use the whole capacity. E.g. `thresholds(60, 75, 90)`: `Low` stops at 60 %, `Normal` at
    /// 75 %, `High` at 90 %.
    ///
    /// # Errors
    /// Unless `low ≤ normal ≤ high ≤ 100`.
    pub fn thresholds(mut self, low: u8, normal: u8, high: u8) -> Result<Self, ConfigError> {
        if !(low <= normal && normal <= high && high <= 100) {
            return Err(ConfigError::new(format!(
                "fleet shedder: thresholds low {low} %, normal {normal} %, high {high} % must satisfy \
                 low ≤ normal ≤ high ≤ 100"
            )));
        }
        self.rule.thresholds = Some([100, high, normal, low]);
        Ok(self)
    }

    /// Renames the shedder, and with it the fleet-wide key (e.g. one fleet per service sharing a Redis).
    pub fn name(mut self, name: impl Into<Name>) -> Self {
        self.settings.name = name.into();
        self.rebuilt()
    }

    /// The fleet-wide ceiling for requests of `priority`.
    #[must_use]
    pub fn ceiling(&self, priority: Priority) -> u64 {
        self.rule.ceiling(priority)
    }
}
