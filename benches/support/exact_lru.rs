//! The exact-LRU alternative to `MemoryStore`'s sampled eviction, built as the store would build it, to measure
//! what exactness costs (docs/BENCHMARKS.md, "MemoryStore at its key bound"): the same shards, parking_lot locks,
//! keyed SipHash digests, clock and token-bucket decision, with the classic exact LRU: a hashbrown index from
//! digest to a slot of a slab, and a doubly linked recency list through the slab's slots (as the `lru` crate
//! and nginx's `limit_req` do). A use moves the key to the head of the list (touching its two neighbours and the
//! old head); a new key at the bound takes the tail's slot. (Links through the hash table's own buckets would
//! save the slab's indirection, but hashbrown rehashes in place after enough removals, which would move them.)
//! It does not prefer decayed entries: that would need an expiry index besides the list.

use std::hash::{BuildHasher, Hasher, RandomState};

use hashbrown::HashTable;
use parking_lot::Mutex;
use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};
use tollgate_core::{Clock, Decision, Quota, SystemClock};

const NIL: u32 = u32::MAX;

struct Node {
    key: u64,
    prev: u32,
    next: u32,
    state: TokenBucketState,
}

struct Shard {
    index: HashTable<u32>,
    slab: Vec<Node>,
    head: u32,
    tail: u32,
}

impl Shard {
    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.slab[i as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.slab[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slab[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        let head = self.head;
        let n = &mut self.slab[i as usize];
        n.prev = NIL;
        n.next = head;
        if head == NIL {
            self.tail = i;
        } else {
            self.slab[head as usize].prev = i;
        }
        self.head = i;
    }
}

/// Token buckets with exact LRU eviction at `max_keys`.
pub(crate) struct ExactLruStore {
    shards: Box<[Mutex<Shard>]>,
    seed: RandomState,
    shard_bits: u32,
    shard_capacity: usize,
    clock: SystemClock,
}

impl ExactLruStore {
    pub(crate) fn new(max_keys: usize) -> Self {
        // The store's own shard count (4 × the cores, at least 256 keys a shard).
        let cores = std::thread::available_parallelism().map_or(4, usize::from);
        let by_size = (max_keys / 256).max(1);
        let count = (cores * 4).next_power_of_two().min(1 << by_size.ilog2());
        let shard_capacity = max_keys.div_ceil(count);
        Self {
            shards: (0..count)
                .map(|_| {
                    Mutex::new(Shard {
                        index: HashTable::new(),
                        slab: Vec::new(),
                        head: NIL,
                        tail: NIL,
                    })
                })
                .collect(),
            seed: RandomState::new(),
            shard_bits: count.trailing_zeros(),
            shard_capacity,
            clock: SystemClock::new(),
        }
    }

    pub(crate) fn check_now(&self, key: &str, quota: &Quota, cost: u64) -> Decision {
        let mut hasher = self.seed.build_hasher();
        hasher.write(key.as_bytes());
        let hash = hasher.finish();
        let now = self.clock.now();
        let index = if self.shard_bits == 0 {
            0
        } else {
            (hash >> (40 - self.shard_bits.min(24))) as usize
        };
        let mut guard = self.shards[index & (self.shards.len() - 1)].lock();
        let shard = &mut *guard;
        let slab = &shard.slab;
        if let Some(&i) = shard.index.find(hash, |&i| slab[i as usize].key == hash) {
            let node = &mut shard.slab[i as usize];
            let step = token_bucket::decide(Some(node.state), quota, cost, now);
            if let Some(state) = step.state {
                node.state = state;
            }
            if shard.head != i {
                shard.unlink(i);
                shard.push_front(i);
            }
            return step.decision;
        }
        let step = token_bucket::decide(None, quota, cost, now);
        if let Some(state) = step.state {
            let node = Node {
                key: hash,
                prev: NIL,
                next: NIL,
                state,
            };
            let i = if shard.slab.len() >= self.shard_capacity {
                // Full: the least recently used key's slot is the new key's.
                let tail = shard.tail;
                shard.unlink(tail);
                let old = shard.slab[tail as usize].key;
                let slab = &shard.slab;
                if let Ok(entry) = shard
                    .index
                    .find_entry(old, |&i| slab[i as usize].key == old)
                {
                    entry.remove();
                }
                shard.slab[tail as usize] = node;
                tail
            } else {
                shard.slab.push(node);
                (shard.slab.len() - 1) as u32
            };
            let slab = &shard.slab;
            shard
                .index
                .insert_unique(hash, i, |&j| slab[j as usize].key);
            shard.push_front(i);
        }
        step.decision
    }
}
