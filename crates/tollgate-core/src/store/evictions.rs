//! What a bounded table does at its bound, and how its evictions are counted and logged.

use std::sync::OnceLock;

use metrics::Counter;

use crate::Name;
use crate::log_gate::LogGate;

/// The counter every eviction at a bound is reported to: `tollgate_evictions_total{limiter}`, where `limiter` is
/// the name given to the store or table ([`MemoryStoreBuilder::name`](super::MemoryStoreBuilder::name)).
pub const EVICTIONS_TOTAL: &str = "tollgate_evictions_total";

/// The name a store or table reports under until it is given one.
pub const DEFAULT_NAME: &str = "memory_store";

/// What a full store or table does with a key it does not hold yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFull {
    /// Evict an entry to make room (the default): a decayed one if the eviction finds one (that loses nothing;
    /// it looks at the entries at a hand that goes round the shard over successive evictions), else one not used
    /// since the hand last passed it (CLOCK, which approximates the least recently used). Every new key gets its
    /// own state, as nginx's `limit_req` zone does; an active client, being used again before the hand comes
    /// round, keeps its own.
    #[default]
    Evict,
    /// Refuse the new key with [`StoreError::KeyCapacity`](crate::StoreError::KeyCapacity) (the limiter's failure
    /// policy answers it) and keep every tracked key, until expired ones can be swept.
    Refuse,
}

/// Evictions so far, by what they cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EvictionCounts {
    /// Entries that still held state (a deficit, a window's count): their keys start afresh if they come back.
    pub live: u64,
    /// Entries that had decayed back to fresh: evicting them lost nothing.
    pub decayed: u64,
}

impl EvictionCounts {
    pub(crate) fn add(&mut self, live: bool) {
        if live {
            self.live += 1;
        } else {
            self.decayed += 1;
        }
    }
}

impl std::ops::Add for EvictionCounts {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self {
            live: self.live + other.live,
            decayed: self.decayed + other.decayed,
        }
    }
}

/// Reports evictions: the counter (registered at the first eviction, by then the exporter is installed) and a
/// warning, at most one every 10 s, while live entries are evicted.
#[derive(Debug)]
pub(crate) struct EvictionLog {
    name: Name,
    counter: OnceLock<Counter>,
    warnings: LogGate,
}

/// One warning every 10 s: live evictions come by the thousand in a flood.
const WARNING_EVERY_MS: u64 = 10_000;

impl EvictionLog {
    pub(crate) fn new(name: Name) -> Self {
        Self {
            name,
            counter: OnceLock::new(),
            warnings: LogGate::every_ms(WARNING_EVERY_MS),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Counts an eviction; `counts` are its shard's, this one included (a shard reads the time for the warning
    /// only at its first live eviction and every 256th after it, not for each one of a flood).
    pub(crate) fn record(&self, live: bool, counts: &EvictionCounts, max_keys: usize) {
        self.counter
            .get_or_init(|| metrics::counter!(EVICTIONS_TOTAL, "limiter" => self.name.to_string()))
            .increment(1);
        if live && counts.live % 256 == 1 && self.warnings.open() {
            tracing::warn!(
                limiter = %self.name,
                max_keys,
                "bounded store full: evicting keys that still hold state (max_keys is too \
                 small for the traffic, or a flood of new keys is on); see {EVICTIONS_TOTAL}"
            );
        }
    }
}
