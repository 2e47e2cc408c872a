//! One shard's entries and the hand that chooses what to evict, shared by [`MemoryStore`](super::MemoryStore)
//! (two slabs per shard, one per algorithm, under one hand) and [`BoundedTable`](super::BoundedTable) (one slab
//! per shard).
//!
//! A [`Slab`] keeps the entries densely in a `Vec` of nodes, with an [`Index`] from key digest to slot. A node
//! holds the key, the value and a *visited* bit (in the key's word), which a use sets: a hit writes its own node at
//! most and nothing else (no list to move it on, no neighbour to relink). At the bound, a new key takes the place of
//! the [`Hand::victim`]: a decayed entry found by the *scout*, which looks at [`LOOK`] entries per eviction and goes
//! round the shard over successive ones, else the choice of CLOCK (second chance), whose hand walks the slots in order
//! (the first slab's, then the second's, then round again): an entry it meets that has decayed is the victim; one
//! visited since the hand last passed it loses its bit and is passed; the first one not visited is the victim. The hand
//! then stands just after the victim, so a new key that takes the victim's slot is met again only after a whole
//! revolution: a key used once (a flood's) goes at the next pass, a key used at least once per revolution never does.

/// The top bit of a link: the second slab's slots (clear: the first's).
pub(crate) const SECOND: u32 = 1 << 31;

/// How many entries the scout looks at per eviction for a decayed one: the decayed go first, at a bounded cost
/// per eviction (in a flood, where none has decayed, each is a read of a node).
pub(crate) const LOOK: usize = 4;

/// The most entries a shard may hold: a slot plus one fits an index word's 24 bits.
pub(crate) const MAX_SHARD_KEYS: usize = (1 << SLOT_BITS) - 2;

/// The fewest keys a shard is given, when the bound is small enough to split into fewer shards than asked for:
/// the bound is kept per shard (a shard fills first when keys hash unevenly), and shards of at least this many
/// keys keep the first refusal close to the bound, where 16 shards of 4 refused at about half.
const MIN_SHARD_KEYS: usize = 256;

/// The most shards a table is split into.
const MAX_SHARDS: usize = 1 << 16;

/// How many shards hold a bound of `max_keys`: `wanted` (default: 16 × the available cores), rounded up to a power
/// of two, fewer if the shards would hold under [`MIN_SHARD_KEYS`], more if they would hold over
/// [`MAX_SHARD_KEYS`]; and how many keys each holds.
///
/// A shard's lock is held across its entry's cache misses (a few hundred nanoseconds on a large table), so two
/// cores that meet at one shard wait that long: with 16 shards per core they meet a quarter as often as with 4.
pub(crate) fn sharding(wanted: Option<usize>, max_keys: usize) -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(4, usize::from);
    let wanted = wanted.unwrap_or(cores * 16).clamp(1, MAX_SHARDS);
    let by_size = (max_keys / MIN_SHARD_KEYS).max(1);
    let fewest = max_keys.div_ceil(MAX_SHARD_KEYS).min(MAX_SHARDS);
    let count = wanted
        .next_power_of_two()
        .min(1 << by_size.ilog2())
        .max(fewest.next_power_of_two());
    (count, max_keys.div_ceil(count).min(MAX_SHARD_KEYS))
}

/// A stored value that knows when it has decayed back to "fresh" (indistinguishable from no entry at all).
pub trait Expiry {
    /// The instant, in µs since the Unix epoch, from which this value says nothing an absent one would not.
    fn expires_at(&self) -> u64;
}

/// The bit of a key digest that a [`Node`] keeps its *visited* mark in: the tables treat digests that differ only
/// there as one key (a 63-bit digest). It is none of the bits a table is indexed by: an [`Index`]'s (the low bits
/// below its size, at most 2^25 words, and the top eight, its tag) and the shards' (the bits below it).
pub(crate) const VISITED: u64 = 1 << 40;

/// An entry: its key, its value and what eviction needs of it, in one place (the visited mark inside the key's
/// word, so that it costs no padding beside the value).
pub(crate) struct Node<V> {
    /// The key digest, with [`VISITED`] set when the entry was used since the hand last passed it (or since it
    /// was added, if it was not yet passed).
    marked: u64,
    pub(crate) value: V,
}

impl<V> Node<V> {
    /// The key digest (without the mark).
    #[inline]
    pub(crate) fn key(&self) -> u64 {
        self.marked & !VISITED
    }

    /// Marks the entry used. Written only when not yet marked: a key's hits that change nothing (refusals) then
    /// leave its node's cache line unwritten.
    #[inline]
    pub(crate) fn visit(&mut self) {
        if self.marked & VISITED == 0 {
            self.marked |= VISITED;
        }
    }

    /// Clears the mark; whether the entry had been used since the hand last passed it.
    #[inline]
    pub(crate) fn pass(&mut self) -> bool {
        let visited = self.marked & VISITED != 0;
        self.marked &= !VISITED;
        visited
    }
}

/// Entries in a dense `Vec`, found by key through an [`Index`] of slots.
pub(crate) struct Slab<V> {
    index: Index,
    nodes: Vec<Node<V>>,
}

impl<V> Default for Slab<V> {
    fn default() -> Self {
        Self {
            index: Index::default(),
            nodes: Vec::new(),
        }
    }
}

impl<V> Slab<V> {
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The key's slot. Keys are keyed digests already: they are their own hash (without the [`VISITED`] bit).
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<u32> {
        let key = key & !VISITED;
        let nodes = &self.nodes;
        self.index
            .find(key, |slot| nodes[slot as usize].key() == key)
    }

    /// The key's value, read only (not a use).
    pub(crate) fn get(&self, key: u64) -> Option<&V> {
        self.find(key).map(|slot| &self.nodes[slot as usize].value)
    }

    #[inline]
    pub(crate) fn node_mut(&mut self, slot: u32) -> &mut Node<V> {
        &mut self.nodes[slot as usize]
    }

    pub(crate) fn node(&self, slot: u32) -> &Node<V> {
        &self.nodes[slot as usize]
    }

    /// Adds a key that has none, not visited yet; returns its slot.
    pub(crate) fn push(&mut self, key: u64, value: V) -> u32 {
        let key = key & !VISITED;
        let slot = self.nodes.len() as u32;
        self.reserve_one();
        self.nodes.push(Node { marked: key, value });
        self.index.insert(key, slot);
        slot
    }

    /// Gives `slot` to a key that has none, not visited yet; returns the key and value it held.
    pub(crate) fn replace(&mut self, slot: u32, key: u64, value: V) -> (u64, V) {
        let key = key & !VISITED;
        self.reserve_one();
        self.index.remove(self.nodes[slot as usize].key(), slot);
        let node = &mut self.nodes[slot as usize];
        let old = (
            std::mem::replace(&mut node.marked, key) & !VISITED,
            std::mem::replace(&mut node.value, value),
        );
        self.index.insert(key, slot);
        old
    }

    /// Removes the node in `slot`; the last node moves into it (keeping its visited bit).
    pub(crate) fn swap_remove(&mut self, slot: u32) -> Node<V> {
        self.index.remove(self.nodes[slot as usize].key(), slot);
        let last = self.nodes.len() as u32 - 1;
        let node = self.nodes.swap_remove(slot as usize);
        if slot != last {
            self.index
                .relink(self.nodes[slot as usize].key(), last, slot);
        }
        node
    }

    /// Makes room in the index for one more key (rebuilding it from the nodes when it is too full).
    fn reserve_one(&mut self) {
        if let Some(size) = self.index.rebuild_size(self.nodes.len()) {
            let mut index = Index::with_size(size);
            for (slot, node) in self.nodes.iter().enumerate() {
                index.insert(node.key(), slot as u32);
            }
            self.index = index;
        }
    }
}

/// How many bits of an [`Index`] word hold a slot (plus one: 0 there is an empty or removed word).
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
/// A removed key's word (a *tombstone*): a probe goes on past it, an insertion may take it.
const REMOVED: u32 = !SLOT_MASK;

/// A slab's index: an open-addressed table (linear probing) of 32-bit words, each a key's slot plus one and its
/// *tag*, the key digest's top 8 bits. A hit reads the words from the key's home position to its own (mostly one
/// cache line: at most 7/8 of the words are used), then the node: two places per key, where a table of slots behind
/// a separate control array reads three. A word whose tag differs is passed without reading its node; one whose tag
/// matches is confirmed by the node's key (1 in 256 words of other keys does, costing a node's read). Removal
/// leaves a tombstone, which insertions reuse; the table is rebuilt from the nodes when live words and tombstones
/// together would fill more than 7/8 of it ([`rebuild_size`](Self::rebuild_size)).
#[derive(Default)]
struct Index {
    words: Vec<u32>,
    /// Live words and tombstones.
    used: usize,
}

impl Index {
    fn with_size(size: usize) -> Self {
        Self {
            words: vec![0; size],
            used: 0,
        }
    }

    #[inline(always)]
    fn tag(key: u64) -> u32 {
        ((key >> 56) as u32) << SLOT_BITS
    }

    /// The slot of the key that `is_key` accepts, among the words tagged as `key`.
    #[inline]
    fn find(&self, key: u64, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let mask = self.words.len().checked_sub(1)?;
        let tag = Self::tag(key);
        let mut at = key as usize & mask;
        loop {
            let word = self.words[at];
            if word == 0 {
                return None;
            }
            if word & !SLOT_MASK == tag && word & SLOT_MASK != 0 {
                let slot = (word & SLOT_MASK) - 1;
                if is_key(slot) {
                    return Some(slot);
                }
            }
            at = (at + 1) & mask;
        }
    }

    /// The position of `key`'s word for `slot` (`None` only if the slabs lost track of it, a bug: the caller
    /// then leaves the index as it is rather than loop or panic).
    fn position(&self, key: u64, slot: u32) -> Option<usize> {
        let mask = self.words.len().checked_sub(1)?;
        let word = Self::tag(key) | (slot + 1);
        let mut at = key as usize & mask;
        loop {
            match self.words[at] {
                w if w == word => return Some(at),
                0 => {
                    debug_assert!(false, "a key's word is in the index");
                    return None;
                }
                _ => at = (at + 1) & mask,
            }
        }
    }

    /// Adds `key` at `slot` (the key has no word yet; [`rebuild_size`](Self::rebuild_size) left room).
    fn insert(&mut self, key: u64, slot: u32) {
        let mask = self.words.len() - 1;
        let mut at = key as usize & mask;
        while self.words[at] & SLOT_MASK != 0 {
            at = (at + 1) & mask;
        }
        if self.words[at] == 0 {
            self.used += 1;
        }
        self.words[at] = Self::tag(key) | (slot + 1);
    }

    /// Removes `key`'s word for `slot`, leaving a tombstone.
    fn remove(&mut self, key: u64, slot: u32) {
        if let Some(at) = self.position(key, slot) {
            self.words[at] = REMOVED;
        }
    }

    /// Points `key`'s word at slot `to` instead of `from`.
    fn relink(&mut self, key: u64, from: u32, to: u32) {
        if let Some(at) = self.position(key, from) {
            self.words[at] = Self::tag(key) | (to + 1);
        }
    }

    /// The size to rebuild at before one more key is added beside `live` ones, if the table has no room for it:
    /// the same size while the live words would fill at most 3/4 of what it may hold (so a rebuild leaves room for
    /// at least 7/32 of its size in insertions, whatever the tombstones), else twice it, or more.
    fn rebuild_size(&self, live: usize) -> Option<usize> {
        let size = self.words.len();
        if (self.used + 1) * 8 <= size * 7 {
            return None;
        }
        let mut size = size.max(16);
        while (live + 1) * 32 > size * 21 {
            size *= 2;
        }
        Some(size)
    }
}

/// What a [`Hand`] walks: one slab, or a store's two (the second's links carry [`SECOND`]).
pub(crate) trait Arena {
    /// How many entries each slab holds (a single slab's second is 0).
    fn lens(&self) -> [u32; 2];
    /// Clears the entry's visited mark; whether it was set.
    fn pass(&mut self, link: u32) -> bool;
    fn expires_at(&self, link: u32) -> u64;
}

impl<V: Expiry> Arena for Slab<V> {
    fn lens(&self) -> [u32; 2] {
        [self.nodes.len() as u32, 0]
    }

    fn pass(&mut self, link: u32) -> bool {
        self.nodes[link as usize].pass()
    }

    fn expires_at(&self, link: u32) -> u64 {
        self.nodes[link as usize].value.expires_at()
    }
}

/// The two positions an eviction starts from: the *scout*, which looks for decayed entries, and the CLOCK hand.
/// Each is a link, which may have fallen past its slab's end since (a removal moved that slab's last entry down,
/// or the slab was emptied); it then stands at the next slab's first entry.
#[derive(Default)]
pub(crate) struct Hand {
    scout: u32,
    clock: u32,
}

impl Hand {
    /// What to evict at `now`, and whether it has decayed; `None` for an empty arena. First the scout looks at
    /// [`LOOK`] entries from where it stopped last: the first decayed one is the victim (it loses nothing). Else
    /// the CLOCK hand walks from where it stopped last: an entry that has decayed is the victim; one visited since
    /// the hand last passed it loses its bit and is passed; the first one not visited is the victim. Each is left
    /// just after the entry it chose, or the last it looked at; the bits it cleared stay cleared whether or not the
    /// caller then evicts the victim (a refusing table does not evict a live one).
    ///
    /// The scout moves `LOOK` entries per eviction that finds no decayed one, so it passes every entry of a shard
    /// of `n` within `n / LOOK` such evictions: a decayed entry is evicted before a live one unless it decayed
    /// after the scout passed it (it is then found on the next pass, or by the hand). A shard of at most `LOOK`
    /// entries is looked at whole. Each visited entry the hand passes costs a read and a write, and was set by a
    /// use since the hand last passed it: an eviction costs O(1) amortised over the uses (`LOOK` reads, and at
    /// most one revolution of the hand, when every entry was used since its last).
    pub(crate) fn victim(&mut self, arena: &mut impl Arena, now: u64) -> Option<(u32, bool)> {
        let lens = arena.lens();
        let total = lens[0] as usize + lens[1] as usize;
        if total == 0 {
            return None;
        }
        let mut at = settle(lens, self.scout);
        for _ in 0..LOOK.min(total) {
            if arena.expires_at(at) <= now {
                self.scout = at + 1;
                return Some((at, true));
            }
            at = settle(lens, at + 1);
        }
        self.scout = at;
        let mut at = settle(lens, self.clock);
        loop {
            if arena.expires_at(at) <= now {
                self.clock = at + 1;
                return Some((at, true));
            }
            if !arena.pass(at) {
                break;
            }
            at = settle(lens, at + 1);
        }
        self.clock = at + 1;
        Some((at, false))
    }
}

/// The first entry at or after `link`, in walking order, of a non-empty arena whose slabs hold `lens`.
#[inline]
fn settle(lens: [u32; 2], link: u32) -> u32 {
    let (half, slot) = ((link >> 31) as usize, link & !SECOND);
    if slot < lens[half] {
        return link;
    }
    let other = 1 - half;
    if lens[other] > 0 {
        (other as u32) << 31
    } else {
        (half as u32) << 31
    }
}

#[cfg(test)]
mod tests {
    use super::{Arena, MAX_SHARD_KEYS, Slab, VISITED, sharding};
    use std::collections::HashMap;

    #[derive(Clone, Copy)]
    struct Never;

    impl super::Expiry for Never {
        fn expires_at(&self) -> u64 {
            u64::MAX
        }
    }

    #[test]
    fn the_visited_mark_is_never_part_of_a_key() {
        let mut slab = Slab::default();
        let (a, b) = (
            0x1234_5678_9abc_def0 | VISITED,
            0x0fed_cba9_8765_4321 & !VISITED,
        );
        let (sa, sb) = (slab.push(a, Never), slab.push(b, Never));
        // Found with the bit or without it; a key reads back without it, marked or not.
        assert_eq!(slab.find(a), Some(sa));
        assert_eq!(slab.find(a & !VISITED), Some(sa));
        assert_eq!(slab.find(b | VISITED), Some(sb));
        slab.node_mut(sa).visit();
        assert_eq!(slab.node(sa).key(), a & !VISITED);
        assert_eq!(slab.find(a), Some(sa));
        // Passing clears the mark once.
        assert!(slab.pass(sa));
        assert!(!slab.pass(sa));
        assert!(!slab.pass(sb));
        // A replaced key is handed back without the mark; removal keeps the index whole.
        slab.node_mut(sb).visit();
        let (old, _) = slab.replace(sb, 7 | VISITED, Never);
        assert_eq!(old, b);
        assert!(!slab.pass(sb), "a new key starts unvisited");
        assert_eq!(slab.find(7), Some(sb));
        assert_eq!(slab.swap_remove(sa).key(), a & !VISITED);
        assert_eq!(slab.find(7), Some(0));
        assert_eq!(slab.find(a), None);
    }

    /// A small xorshift generator: the test's operations are the same on every run.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn the_index_finds_what_a_map_does_through_removals_replacements_and_rebuilds() {
        let mut slab = Slab::default();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15;
        // Keys crowd few home positions and share tags (few distinct low and top bits), so probes run long, pass
        // words tagged as the key that are not its own, and cross tombstones.
        let key =
            |r: u64| ((r & 0x3ff) | ((r >> 8) & 0x3) << 56 | (r & 0xffff_ff00) << 8) & !VISITED;
        for step in 0..40_000u32 {
            let r = next(&mut rng);
            let k = key(r);
            match (r >> 40) % 4 {
                0 | 1 if model.len() < 3_000 && !model.contains_key(&k) => {
                    slab.push(k, step);
                    model.insert(k, step);
                }
                2 if slab.len() > 0 && !model.contains_key(&k) => {
                    let slot = (r >> 20) as u32 % slab.len() as u32;
                    let (old, value) = slab.replace(slot, k, step);
                    assert_eq!(model.remove(&old), Some(value));
                    model.insert(k, step);
                }
                3 if slab.len() > 0 => {
                    let slot = (r >> 20) as u32 % slab.len() as u32;
                    let node = slab.swap_remove(slot);
                    assert_eq!(model.remove(&node.key()), Some(node.value));
                }
                _ => {}
            }
            assert_eq!(slab.len(), model.len());
            // The key just used, and one drawn at random, read as the model has them.
            for probe in [k, key(next(&mut rng))] {
                assert_eq!(slab.get(probe), model.get(&probe), "step {step}");
            }
        }
        for (k, v) in &model {
            assert_eq!(slab.get(*k), Some(v));
        }
        // The index stays within its load bound however many tombstones the run left.
        assert!(slab.index.used * 8 <= slab.index.words.len() * 7);
    }

    #[test]
    fn shards_hold_at_most_what_an_index_word_can_point_at() {
        // Default shard counts at the default bound, small bounds and bounds past 16 M keys per shard.
        for (wanted, max_keys, count) in [
            (Some(8), 1 << 20, 8),
            (Some(8), 1_000, 2),
            (Some(8), 1, 1),
            (Some(8), 1 << 30, 128),
            (Some(1), MAX_SHARD_KEYS + 1, 2),
            (Some(1 << 20), usize::MAX, 1 << 16),
        ] {
            let (shards, per_shard) = sharding(wanted, max_keys);
            assert_eq!(shards, count, "{max_keys}");
            assert!(per_shard <= MAX_SHARD_KEYS);
            assert!(per_shard * shards >= max_keys.min(MAX_SHARD_KEYS << 16));
        }
    }
}
