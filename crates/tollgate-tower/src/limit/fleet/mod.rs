//! The fleet-usage load shedder: keeps a share of the whole fleet's capacity for critical traffic.
//!
//! Every instance counts its in-flight requests in one fleet-wide slot set in Redis (the same slots as the
//! concurrency limiter: a key `<namespace>:{fleet}:inflight`, slots that expire if their instance dies). A
//! request's ceiling depends on its [`Priority`]: `Critical` requests may use the whole fleet capacity; every
//! other class only `capacity − reserve`, where the reserve is a share of the capacity
//! ([`DEFAULT_RESERVE_PERCENT`], 20 %, by default). Once non-critical requests fill their share, further ones are
//! shed with a [`Rejection`](crate::Rejection) of kind [`Shed`](crate::RejectionKind::Shed)
//! (HTTP 503, gRPC `UNAVAILABLE`, with a retry delay), while critical requests still pass.
//!
//! [`thresholds`](FleetShedLayer::thresholds) gives each non-critical class a line of its own instead (e.g. `Low`
//! 60 %, `Normal` 75 %, `High` 90 %), as the worker shedder's gate does per instance.
//!
//! The ceilings are checked by the acquire script itself (it gets the request's ceiling as its limit), so the
//! count and the admission are one atomic step across the fleet.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::slot::MemorySlotStore;
//! use tollgate_tower::FleetShedLayer;
//! use tollgate_tower::Priority;
//!
//! // In production the store is a RedisStore shared by every instance.
//! let layer = FleetShedLayer::new(100, Arc::new(MemorySlotStore::new()), Priority::Normal)?
//!     .reserve_percent(25)?;
//! assert_eq!(layer.ceiling(Priority::Critical), 100);
//! assert_eq!(layer.ceiling(Priority::High), 75);
//! # Ok::<(), tollgate_tower::ConfigError>(())
//! ```

mod layer;

pub use layer::{DEFAULT_FLEET_KEY, DEFAULT_RESERVE_PERCENT, FleetShedLayer};

use crate::{Classify, KeyError, Priority};

use tollgate_core::slot::SlotStore;

use crate::limit::concurrency::SlotRule;
use crate::limit::concurrency::service::decide_slot;
use crate::limit::in_flight::in_flight_service;

in_flight_service!(
    decide_slot(inner.shared) for FleetShedLayer<P, L> where P: Classify<Req>, L: SlotStore
);

/// The fleet shedder's rule: one key, a ceiling per priority.
#[derive(Debug, Clone)]
pub(crate) struct FleetRule<P> {
    classifier: P,
    capacity: u64,
    reserve_percent: u8,
    /// Per-class lines (percent of capacity, indexed like [`Priority::ALL`]) replacing the one reserve.
    thresholds: Option<[u8; 4]>,
}

impl<P> FleetRule<P> {
    /// Requests of `priority` are admitted while fewer than this many are in flight fleet-wide.
    #[must_use]
    pub(crate) fn ceiling(&self, priority: Priority) -> u64 {
        if priority == Priority::Critical {
            return self.capacity;
        }
        if let Some(thresholds) = self.thresholds {
            // Rounded down: a lower class never takes any of the share kept for the classes above it.
            let line = u128::from(self.capacity) * u128::from(thresholds[priority.index()]) / 100;
            return u64::try_from(line).unwrap_or(u64::MAX);
        }
        // Reserve rounded up: the critical share is never smaller than asked.
        let reserved = (u128::from(self.capacity) * u128::from(self.reserve_percent)).div_ceil(100);
        self.capacity
            .saturating_sub(u64::try_from(reserved).unwrap_or(u64::MAX))
    }
}

impl<Req, P: Classify<Req>> SlotRule<Req> for FleetRule<P> {
    fn rule(&self, req: &Req, _key: &mut String) -> Result<u64, KeyError> {
        Ok(self.ceiling(self.classifier.classify(req)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(capacity: u64, reserve_percent: u8) -> FleetRule<Priority> {
        FleetRule {
            classifier: Priority::Normal,
            capacity,
            reserve_percent,
            thresholds: None,
        }
    }

    #[test]
    fn ceilings_reserve_a_rounded_up_share_for_critical() {
        assert_eq!(rule(100, 20).ceiling(Priority::High), 80);
        assert_eq!(rule(100, 20).ceiling(Priority::Critical), 100);
        assert_eq!(rule(5, 40).ceiling(Priority::Low), 3);
        assert_eq!(
            rule(3, 20).ceiling(Priority::Normal),
            2,
            "0.6 reserved rounds up to 1"
        );
        assert_eq!(rule(10, 0).ceiling(Priority::Normal), 10);
        assert_eq!(
            rule(10, 100).ceiling(Priority::Normal),
            0,
            "everything reserved"
        );
        assert_eq!(
            rule(u64::MAX, 50).ceiling(Priority::Normal),
            u64::MAX / 2,
            "no overflow"
        );
    }

    #[test]
    fn per_class_lines_replace_the_one_reserve() {
        let rule = FleetRule {
            thresholds: Some([100, 90, 75, 60]),
            ..rule(10, 20)
        };
        assert_eq!(rule.ceiling(Priority::Critical), 10);
        assert_eq!(rule.ceiling(Priority::High), 9);
        assert_eq!(rule.ceiling(Priority::Normal), 7, "7.5 rounds down");
        assert_eq!(rule.ceiling(Priority::Low), 6);
    }
}
