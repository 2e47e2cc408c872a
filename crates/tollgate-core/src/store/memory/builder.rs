//! The store's builder: its bound, what it does at the bound, its shards, name and clock.

use ahash::RandomState;

use super::MemoryStore;
use super::lease::LeaseBooks;
use super::lock::ShardLock;
use super::shard::Bound;
use crate::store::evictions::{DEFAULT_NAME, EvictionLog, OnFull};
use crate::store::table::sharding;
use crate::{Clock, Name, SystemClock};

/// Configures a [`MemoryStore`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MemoryStoreBuilder<C = SystemClock> {
    pub(super) max_keys: usize,
    pub(super) shards: Option<usize>,
    pub(super) on_full: OnFull,
    pub(super) name: Option<Name>,
    pub(super) clock: C,
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// Tracks at most `max_keys` keys (at least 1).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Uses `shards` shards, rounded up to a power of two (default: 16 × the available cores); fewer when the
    /// bound gives each under 256 keys, more when it gives each over 16 M.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// What a full store does with a new key: evict (the default) or refuse.
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = on_full;
        self
    }

    /// The `limiter` label of this store's `tollgate_evictions_total` and warnings (default
    /// [`"memory_store"`](DEFAULT_NAME)). A store only knows the name it is given: name it after the
    /// limiter it serves; a store shared by several limiters counts their evictions together.
    pub fn name(mut self, name: impl Into<Name>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Takes time from `clock` instead of the system clock.
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            max_keys: self.max_keys,
            shards: self.shards,
            on_full: self.on_full,
            name: self.name,
            clock,
        }
    }

    /// Builds the store.
    #[must_use]
    pub fn build(self) -> MemoryStore<C> {
        let (count, shard_capacity) = sharding(self.shards, self.max_keys);
        let seed = RandomState::new();
        MemoryStore {
            shards: (0..count).map(|_| ShardLock::default()).collect(),
            seed,
            shard_shift: 40 - count.trailing_zeros().min(24),
            shard_mask: count - 1,
            bound: Bound {
                shard_capacity,
                max_keys: self.max_keys,
                on_full: self.on_full,
            },
            log: EvictionLog::new(self.name.unwrap_or(Name::from(DEFAULT_NAME))),
            clock: self.clock,
            leases: LeaseBooks::default(),
        }
    }
}
