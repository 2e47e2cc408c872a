//! The deny cache's configuration, and the table it builds for a limiter.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use ahash::RandomState;
use tollgate_core::Clock;
use tollgate_core::store::{BoundedTable, OnFull};

use super::clock::Monotonic;
use super::table::DenyTable;
use super::{
    DEFAULT_DENY_CACHE_KEYS, DENY_CACHE_HITS_TOTAL, MARGIN_FIXED_MICROS, STEADY_FIXED_MICROS,
};
use crate::Name;

/// The deny cache's configuration, for [`RateLimitLayer::deny_cache_config`](crate::RateLimitLayer::deny_cache_config).
#[must_use]
#[derive(Clone)]
pub struct DenyCacheConfig {
    max_keys: usize,
    clock: Option<Arc<dyn Clock>>,
    /// The fixed part of the margin (µs): how far the clock may step, with the readings' rounding.
    fixed: u64,
}

impl Default for DenyCacheConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for DenyCacheConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCacheConfig")
            .field("max_keys", &self.max_keys)
            .field(
                "clock",
                &match (&self.clock, self.fixed) {
                    (None, _) => "monotonic",
                    (Some(_), STEADY_FIXED_MICROS) => "custom, steady",
                    (Some(_), _) => "custom",
                },
            )
            .finish()
    }
}

impl DenyCacheConfig {
    /// [`DEFAULT_DENY_CACHE_KEYS`] entries on the system's monotonic clock (`Instant`, which never steps).
    pub fn new() -> Self {
        Self {
            max_keys: DEFAULT_DENY_CACHE_KEYS,
            clock: None,
            fixed: STEADY_FIXED_MICROS,
        }
    }

    /// Holds at most `max_keys` denied keys (at least 1): at the bound an expired entry is replaced, else one not
    /// used since the eviction hand last passed it is evicted.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Measures local time with `clock` (tests drive a [`ManualClock`](tollgate_core::ManualClock)). It must not
    /// run slower than real time: an entry lasts its retry delay by this clock. It may be corrected (stepped
    /// either way) by some µs, as [`SystemClock`](tollgate_core::SystemClock) is: entries then expire 100 µs
    /// earlier than on a clock that never steps ([`drift_margin`](super::drift_margin)).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self.fixed = MARGIN_FIXED_MICROS;
        self
    }

    /// Measures local time with `clock`, which never steps: it runs at real time's rate (within 500 ppm) and is
    /// never set back or forward (a monotonic clock; a [`ManualClock`](tollgate_core::ManualClock) only ever
    /// advanced). Entries need no allowance for a step then, only 1 µs for rounding, as on the default clock.
    pub fn steady_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self.fixed = STEADY_FIXED_MICROS;
        self
    }

    pub(crate) fn build(&self, limiter: &Name) -> DenyTable {
        DenyTable {
            table: BoundedTable::builder()
                .max_keys(self.max_keys)
                .on_full(OnFull::Evict)
                .name(limiter.clone())
                .build(),
            seed: RandomState::new(),
            clock: self
                .clock
                .clone()
                .unwrap_or_else(|| Arc::new(Monotonic(Instant::now()))),
            fixed: self.fixed,
            hits: metrics::counter!(DENY_CACHE_HITS_TOTAL, "limiter" => limiter.to_string()),
            next_sweep: AtomicU64::new(0),
        }
    }
}
