//! [`BoundedTable`]: the store's bounded table, for other per-key state.

use std::fmt;
use std::hash::{BuildHasher, Hasher};

use ahash::RandomState;

use parking_lot::Mutex;

use super::evictions::{DEFAULT_NAME, EvictionCounts, EvictionLog, OnFull};
use super::table::{Expiry, Hand, Slab, VISITED, sharding};
use crate::{Name, StoreError};

/// An entry an insertion evicted to make room, handed back whole: its value is moved out of the table, not
/// dropped, so a value that owns something outside the table (a lease's batch of tokens) can be ended by the
/// caller as it would end any entry, outside the shard's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Evicted<V> {
    /// Its key digest, as the table keeps it: bit 40 clear (the table takes digests that differ only there for one
    /// key), as [`BoundedTable::digest`] gives it.
    pub key: u64,
    /// Its value.
    pub value: V,
    /// Whether it still held state (it had not decayed).
    pub live: bool,
}

/// A sharded, bounded map from key digests to values that decay, with [`MemoryStore`](super::MemoryStore)'s
/// policy at the bound: evict a decayed entry, else one not used since the eviction hand last passed it (CLOCK,
/// see the store's docs), or refuse, if asked.
///
/// It is the table behind every bounded per-key state in tollgate beyond the store's own (whose shards keep one
/// such table per algorithm under one bound). The two planned users:
///
/// - **the deny cache** (a shared store's local memory of denied keys) keeps `BoundedTable<Denial>`, where a
///   denial's [`expires_at`](Expiry::expires_at) is its retry instant. Evicting a live denial only costs a store
///   call (the next request for that key asks Redis again), so it uses [`OnFull::Evict`] and never refuses.
/// - **the lease table** (token batches leased from Redis for hot keys) keeps `BoundedTable<Lease>`, where a
///   lease expires with its batch. [`insert`](BoundedTable::insert) hands back the entry it evicted, so the
///   caller can return the batch's unused tokens to Redis, or abandon them (under-admission bounded by the
///   batch), exactly as when a lease ends — outside the shard's lock.
///
/// ```
/// use tollgate_core::store::{BoundedTable, Expiry, OnFull};
///
/// #[derive(Debug, PartialEq)]
/// struct Denial { until: u64 }
/// impl Expiry for Denial {
///     fn expires_at(&self) -> u64 { self.until }
/// }
///
/// let table = BoundedTable::builder().max_keys(2).name("deny-cache").build();
/// let key = |k: &str| table.digest(k.as_bytes());
/// assert!(table.insert(key("a"), Denial { until: 100 }, 0)?.is_none());
/// assert!(table.insert(key("b"), Denial { until: 100 }, 0)?.is_none());
/// assert_eq!(table.get(key("a"), |d| d.until), Some(100)); // "a" is used: the hand passes it once
/// // Full: "b", not used since it was added, makes room for "c".
/// let evicted = table.insert(key("c"), Denial { until: 100 }, 0)?.expect("evicted");
/// assert_eq!((evicted.key, evicted.live), (key("b"), true));
/// assert_eq!(table.get(key("b"), |d| d.until), None);
/// // At instant 100 every entry has decayed: the next eviction loses nothing.
/// assert!(!table.insert(key("d"), Denial { until: 200 }, 100)?.expect("evicted").live);
/// # Ok::<(), tollgate_core::StoreError>(())
/// ```
///
/// Keys are digests (by [`digest`](Self::digest), a [`KeyHasher`](super::KeyHasher) keyed at random per table), never raw. Times are µs
/// since the Unix epoch, as [`Timestamp::as_micros`](crate::Timestamp::as_micros) gives them.
pub struct BoundedTable<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    seed: RandomState,
    shard_bits: u32,
    shard_capacity: usize,
    max_keys: usize,
    on_full: OnFull,
    log: EvictionLog,
}

struct Shard<V> {
    slab: Slab<V>,
    hand: Hand,
    evictions: EvictionCounts,
}

impl<V> fmt::Debug for BoundedTable<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedTable")
            .field("shards", &self.shards.len())
            .field("max_keys", &self.max_keys)
            .field("on_full", &self.on_full)
            .field("name", &self.log.name())
            .finish_non_exhaustive()
    }
}

/// Configures a [`BoundedTable`].
#[derive(Debug, Clone)]
#[must_use]
pub struct BoundedTableBuilder {
    max_keys: usize,
    shards: Option<usize>,
    on_full: OnFull,
    name: Option<Name>,
}

impl BoundedTableBuilder {
    /// Holds at most `max_keys` keys (at least 1; default [`DEFAULT_MAX_KEYS`](super::DEFAULT_MAX_KEYS)).
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

    /// What a full table does with a new key: evict (the default) or refuse.
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = on_full;
        self
    }

    /// The `limiter` label of this table's `tollgate_evictions_total` and warnings.
    pub fn name(mut self, name: impl Into<Name>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Builds the table.
    #[must_use]
    pub fn build<V>(self) -> BoundedTable<V> {
        let (count, shard_capacity) = sharding(self.shards, self.max_keys);
        let seed = RandomState::new();
        BoundedTable {
            shards: (0..count)
                .map(|_| {
                    Mutex::new(Shard {
                        slab: Slab::default(),
                        hand: Hand::default(),
                        evictions: EvictionCounts::default(),
                    })
                })
                .collect(),
            seed,
            shard_bits: count.trailing_zeros(),
            shard_capacity,
            max_keys: self.max_keys,
            on_full: self.on_full,
            log: EvictionLog::new(self.name.unwrap_or(Name::from(DEFAULT_NAME))),
        }
    }
}

impl BoundedTable<()> {
    /// A builder (the value type is chosen at [`build`](BoundedTableBuilder::build)).
    pub fn builder() -> BoundedTableBuilder {
        BoundedTableBuilder {
            max_keys: super::DEFAULT_MAX_KEYS,
            shards: None,
            on_full: OnFull::default(),
            name: None,
        }
    }
}

impl<V: Expiry> BoundedTable<V> {
    /// The digest of `key`, keyed by this table's random seed: 63 bits (bit 40 clear), as the table keeps its keys
    /// and hands them back in [`Evicted::key`].
    #[must_use]
    pub fn digest(&self, key: &[u8]) -> u64 {
        let mut hasher = self.seed.build_hasher();
        hasher.write(key);
        hasher.finish() & !VISITED
    }

    fn shard(&self, key: u64) -> &Mutex<Shard<V>> {
        // The digest's middle bits pick the shard; the slab's index uses its low and top bits inside it.
        let index = if self.shard_bits == 0 {
            0
        } else {
            (key >> (40 - self.shard_bits.min(24))) as usize
        };
        &self.shards[index & (self.shards.len() - 1)]
    }

    /// Runs `f` on `key`'s value, under its shard's lock, and marks it used; `None` if there is none. A decayed
    /// value is passed like any other: the caller's value says what decayed means for it.
    pub fn get<R>(&self, key: u64, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut guard = self.shard(key).lock();
        let slot = guard.slab.find(key)?;
        let node = guard.slab.node_mut(slot);
        node.visit();
        Some(f(&mut node.value))
    }

    /// Sets `key`'s value (replacing any), as used at `now`. At the bound, a new key takes the place of the entry
    /// [`OnFull::Evict`] chooses (a decayed one found at the hand, else one not used since the hand passed it), which
    /// is returned as [`Evicted`], its value moved out, so that the caller can end it as it would any entry (a
    /// lease table returns or abandons the evicted lease's batch). A table that refuses makes room only with a
    /// decayed entry and otherwise answers [`StoreError::KeyCapacity`]. A replaced value (same key) is dropped.
    pub fn insert(&self, key: u64, value: V, now: u64) -> Result<Option<Evicted<V>>, StoreError> {
        let mut guard = self.shard(key).lock();
        let Shard {
            slab,
            hand,
            evictions,
        } = &mut *guard;
        if let Some(slot) = slab.find(key) {
            let node = slab.node_mut(slot);
            node.value = value;
            node.visit();
            return Ok(None);
        }
        if slab.len() >= self.shard_capacity
            && let Some((victim, decayed)) = hand.victim(slab, now)
        {
            if self.on_full == OnFull::Refuse && !decayed {
                return Err(StoreError::KeyCapacity {
                    max_keys: self.max_keys,
                });
            }
            // The new key takes the victim's slot: no allocation, no move.
            let (old_key, old_value) = slab.replace(victim, key, value);
            evictions.add(!decayed);
            self.log.record(!decayed, evictions, self.max_keys);
            return Ok(Some(Evicted {
                key: old_key,
                value: old_value,
                live: !decayed,
            }));
        }
        slab.push(key, value);
        Ok(None)
    }

    /// Removes `key`'s value.
    pub fn remove(&self, key: u64) -> Option<V> {
        let mut guard = self.shard(key).lock();
        let slot = guard.slab.find(key)?;
        Some(guard.slab.swap_remove(slot).value)
    }

    /// Drops every value that has decayed at `now` (a whole-table scan: for a chore, never a request).
    pub fn sweep(&self, now: u64) {
        for shard in &*self.shards {
            let mut guard = shard.lock();
            let slab = &mut guard.slab;
            // From the last slot down: the node a removal moves into a slot was already looked at.
            for slot in (0..slab.len() as u32).rev() {
                if slab.node(slot).value.expires_at() <= now {
                    slab.swap_remove(slot);
                }
            }
        }
    }
}

impl<V> BoundedTable<V> {
    /// Removes every value `remove` picks, and says how many (a whole-table scan: for an operator's action,
    /// never a request).
    pub fn remove_where(&self, mut remove: impl FnMut(&V) -> bool) -> usize {
        let mut removed = 0;
        for shard in &*self.shards {
            let mut guard = shard.lock();
            let slab = &mut guard.slab;
            // From the last slot down: the node a removal moves into a slot was already looked at.
            for slot in (0..slab.len() as u32).rev() {
                if remove(&slab.node(slot).value) {
                    slab.swap_remove(slot);
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Keys held now (decayed ones included until evicted, removed or swept).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slab.len()).sum()
    }

    /// Whether no key is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured bound.
    #[must_use]
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Entries evicted at the bound so far (also counted in `tollgate_evictions_total`).
    #[must_use]
    pub fn evictions(&self) -> EvictionCounts {
        self.shards
            .iter()
            .map(|s| s.lock().evictions)
            .fold(EvictionCounts::default(), |a, b| a + b)
    }
}
