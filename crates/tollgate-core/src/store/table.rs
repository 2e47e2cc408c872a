//! One shard's entries and the hand that chooses what to evict, shared by [`MemoryStore`](super::MemoryStore)
//! (two slabs per shard, one per algorithm, under one hand) and [`BoundedTable`](super::BoundedTable) (one slab
//! per shard).
//!
//! A [`Slab`] keeps the entries densely in a `Vec` of nodes, with a hashbrown index from key digest to slot. A node
//! holds the key, the value and a *visited* bit (in the key's word), which a use sets: a hit writes its own node at
//! most and nothing else (no list to move it on, no neighbour to relink). At the bound, a new key takes the place of
//! the [`Hand::victim`]: a decayed entry found by the *scout*, which looks at [`LOOK`] entries per eviction and goes
//! round the shard over successive ones, else the choice of CLOCK (second chance), whose hand walks the slots in order
//! (the first slab's, then the second's, then round again): an entry it meets that has decayed is the victim; one
//! visited since the hand last passed it loses its bit and is passed; the first one not visited is the victim. The hand
//! then stands just after the victim, so a new key that takes the victim's slot is met again only after a whole
//! revolution: a key used once (a flood's) goes at the next pass, a key used at least once per revolution never does.

use hashbrown::HashTable;

/// The top bit of a link: the second slab's slots (clear: the first's).
pub(crate) const SECOND: u32 = 1 << 31;

/// How many entries the scout looks at per eviction for a decayed one: the decayed go first, at a bounded cost
/// per eviction (in a flood, where none has decayed, each is a read of a node).
pub(crate) const LOOK: usize = 4;

/// The most entries a shard may hold: links are `u32`, one bit of which tells a store's two slabs apart (and a
/// slot plus one must not reach it).
pub(crate) const MAX_SHARD_KEYS: usize = (1 << 31) - 2;

/// A stored value that knows when it has decayed back to "fresh" (indistinguishable from no entry at all).
pub trait Expiry {
    /// The instant, in µs since the Unix epoch, from which this value says nothing an absent one would not.
    fn expires_at(&self) -> u64;
}

/// The bit of a key digest that a [`Node`] keeps its *visited* mark in: the tables treat digests that differ only
/// there as one key (a 63-bit digest). It is none of the bits a table is indexed by: hashbrown's (the low bits
/// below a table's size, at most 2^31 slots here, and the top seven), `MemoryStore`'s shards' (the top bits) and
/// `BoundedTable`'s shards' (the bits below it).
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

    /// Whether the entry was used since the hand last passed it.
    #[inline]
    pub(crate) fn is_visited(&self) -> bool {
        self.marked & VISITED != 0
    }

    /// Marks the entry used. Written only when not yet marked: a hot key's hits that change nothing (refusals)
    /// then leave its node's cache line unwritten, shared between the cores that read it.
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

/// Entries in a dense `Vec`, found by key through an index of slots.
pub(crate) struct Slab<V> {
    index: HashTable<u32>,
    nodes: Vec<Node<V>>,
}

impl<V> Default for Slab<V> {
    fn default() -> Self {
        Self {
            index: HashTable::new(),
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
            .find(key, |&i| nodes[i as usize].key() == key)
            .copied()
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
        self.nodes.push(Node { marked: key, value });
        let nodes = &self.nodes;
        self.index
            .insert_unique(key, slot, |&i| nodes[i as usize].key());
        slot
    }

    /// Gives `slot` to a key that has none, not visited yet; returns the key and value it held.
    pub(crate) fn replace(&mut self, slot: u32, key: u64, value: V) -> (u64, V) {
        let key = key & !VISITED;
        self.unindex(slot);
        let node = &mut self.nodes[slot as usize];
        let old = (
            std::mem::replace(&mut node.marked, key) & !VISITED,
            std::mem::replace(&mut node.value, value),
        );
        let nodes = &self.nodes;
        self.index
            .insert_unique(key, slot, |&i| nodes[i as usize].key());
        old
    }

    /// Removes the node in `slot`; the last node moves into it (keeping its visited bit).
    pub(crate) fn swap_remove(&mut self, slot: u32) -> Node<V> {
        self.unindex(slot);
        let last = self.nodes.len() as u32 - 1;
        let node = self.nodes.swap_remove(slot as usize);
        if slot != last {
            let key = self.nodes[slot as usize].key();
            if let Some(i) = self.index.find_mut(key, |&i| i == last) {
                *i = slot;
            }
        }
        node
    }

    fn unindex(&mut self, slot: u32) {
        let key = self.nodes[slot as usize].key();
        if let Ok(entry) = self.index.find_entry(key, |&i| i == slot) {
            entry.remove();
        }
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
    use super::{Arena, Slab, VISITED};

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
}
