//! One shard's table: keyed digests to values, each with a recency stamp, and the sampled choice of what to evict
//! at the bound. Shared by [`MemoryStore`](super::MemoryStore) (two tables per shard, one per algorithm) and
//! [`BoundedTable`](super::BoundedTable) (one per shard).
//!
//! hashbrown's `HashTable` rather than std's `HashMap` (the same table inside): it also reads a bucket by index,
//! which lets an eviction look at a run of entries from a random bucket in O(1) instead of iterating the map.

use hashbrown::HashTable;

/// How many entries an eviction compares (fewer when the table holds fewer).
pub(crate) const SAMPLES: usize = 8;

/// Buckets an eviction scans from one random start before trying another: bounds the work in a sparse table.
const SCAN: usize = 128;

/// A stored value that knows when it has decayed back to "fresh" (indistinguishable from no entry at all).
pub trait Expiry {
    /// The instant, in µs since the Unix epoch, from which this value says nothing an absent one would not.
    fn expires_at(&self) -> u64;
}

pub(crate) struct Slot<V> {
    pub(crate) key: u64,
    /// The shard's use counter when this entry was last used: larger is more recent.
    pub(crate) stamp: u64,
    pub(crate) value: V,
}

/// What an eviction would remove: a bucket and what ranks it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    pub(crate) index: usize,
    pub(crate) stamp: u64,
    pub(crate) decayed: bool,
}

impl Candidate {
    /// Whether `self` is the better one to evict: a decayed entry first (evicting it loses nothing), then the
    /// least recently used.
    pub(crate) fn beats(&self, other: &Self) -> bool {
        (self.decayed, other.stamp) > (other.decayed, self.stamp)
    }
}

pub(crate) struct Table<V> {
    map: HashTable<Slot<V>>,
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Self {
            map: HashTable::new(),
        }
    }
}

impl<V> Table<V> {
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The key's entry. Keys are SipHash digests already: they are their own hash.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut Slot<V>> {
        self.map.find_mut(key, |s| s.key == key)
    }

    /// Adds an entry for a key that has none.
    pub(crate) fn insert(&mut self, key: u64, stamp: u64, value: V) {
        self.map
            .insert_unique(key, Slot { key, stamp, value }, |s| s.key);
    }

    pub(crate) fn remove(&mut self, key: u64) -> Option<Slot<V>> {
        self.map
            .find_entry(key, |s| s.key == key)
            .ok()
            .map(|e| e.remove().0)
    }

    /// Removes the entry in bucket `index` (from a [`Candidate`] of this table, with no change in between).
    pub(crate) fn remove_at(&mut self, index: usize) -> Option<Slot<V>> {
        self.map.get_bucket_entry(index).ok().map(|e| e.remove().0)
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Slot<V>) -> bool) {
        self.map.retain(|s| keep(s));
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Slot<V>> {
        self.map.iter()
    }
}

impl<V: Expiry> Table<V> {
    /// The best entry to evict (by [`Candidate::beats`]) among [`SAMPLES`] entries drawn independently: each the
    /// first occupied bucket from a random one. (One run of consecutive buckets would be cheaper to read, but
    /// measured biased: the entries beside a recently used one are refilled holes, younger than average, so an
    /// active key was evicted far more often than an independent sample allows.) A table of at most `SAMPLES`
    /// entries in at most [`SCAN`] buckets is compared whole: exact LRU.
    pub(crate) fn candidate(&self, rng: &mut Rng, now: u64) -> Option<Candidate> {
        if self.map.is_empty() {
            return None;
        }
        let buckets = self.map.num_buckets();
        let at = |index: usize| {
            self.map.get_bucket(index).map(|slot| Candidate {
                index,
                stamp: slot.stamp,
                decayed: slot.value.expires_at() <= now,
            })
        };
        let better = |best: Option<Candidate>, c: Candidate| match best {
            Some(b) if !c.beats(&b) => Some(b),
            _ => Some(c),
        };
        let mut best = None;
        if self.map.len() <= SAMPLES && buckets <= SCAN {
            return (0..buckets).filter_map(at).fold(None, better);
        }
        for _ in 0..SAMPLES {
            let start = rng.below(buckets);
            if let Some(c) =
                (0..buckets.min(SCAN)).find_map(|step| at((start + step) & (buckets - 1)))
            {
                best = better(best, c);
            }
        }
        // Every draw met SCAN empty buckets: not reached in practice (a full table holds an entry in at least one
        // bucket of three); still correct.
        best.or_else(|| (0..buckets).find_map(at))
    }
}

/// xorshift64*: where an eviction starts looking. Not a security boundary: bucket positions come from keyed
/// digests a client cannot aim at.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        // The high half, scaled: no modulo bias worth a division.
        ((u128::from(x >> 32) * n as u128) >> 32) as usize
    }
}
