//! One shard's entries and their exact recency order, shared by [`MemoryStore`](super::MemoryStore) (two slabs
//! per shard, one per algorithm, on one list) and [`BoundedTable`](super::BoundedTable) (one slab per shard).
//!
//! A [`Slab`] keeps the entries densely in a `Vec` of nodes, with a hashbrown index from key digest to slot; a
//! [`List`] threads a doubly linked recency list through the nodes (head: most recently used). A use moves its
//! node to the head; a new key at the bound takes the place of the [`List::victim`]: the first decayed entry
//! among the [`LOOK`] at the list's *hand*, else the tail (the least recently used). The hand walks from the
//! tail towards the head over successive evictions and starts again at the tail when it passes the head, so
//! decayed entries anywhere in the list are found without a scan. (Links through hashbrown's own buckets would
//! save the index, but hashbrown rehashes in place after enough removals, which would move them.)

use hashbrown::HashTable;

/// No node: the end of a list, an empty list's head and tail, a hand that starts at the tail.
pub(crate) const NIL: u32 = u32::MAX;

/// How many entries an eviction checks at the hand for a decayed one: the cost of an eviction in a flood, where
/// none has decayed (each is a read of a node at a random slot).
pub(crate) const LOOK: usize = 4;

/// The most entries a shard may hold: links are `u32`, one bit of which tells a store's two slabs apart.
pub(crate) const MAX_SHARD_KEYS: usize = (1 << 31) - 2;

/// A stored value that knows when it has decayed back to "fresh" (indistinguishable from no entry at all).
pub trait Expiry {
    /// The instant, in µs since the Unix epoch, from which this value says nothing an absent one would not.
    fn expires_at(&self) -> u64;
}

/// A node's neighbours in its list: `prev` towards the head (more recent), `next` towards the tail.
#[derive(Clone, Copy)]
pub(crate) struct Links {
    prev: u32,
    next: u32,
}

const UNLINKED: Links = Links {
    prev: NIL,
    next: NIL,
};

pub(crate) struct Node<V> {
    pub(crate) key: u64,
    links: Links,
    pub(crate) value: V,
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

    /// The key's slot. Keys are SipHash digests already: they are their own hash.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<u32> {
        let nodes = &self.nodes;
        self.index
            .find(key, |&i| nodes[i as usize].key == key)
            .copied()
    }

    /// The key's value, read only.
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

    /// Adds a key that has none, unlinked; returns its slot.
    pub(crate) fn push(&mut self, key: u64, value: V) -> u32 {
        let slot = self.nodes.len() as u32;
        self.nodes.push(Node {
            key,
            links: UNLINKED,
            value,
        });
        let nodes = &self.nodes;
        self.index
            .insert_unique(key, slot, |&i| nodes[i as usize].key);
        slot
    }

    /// Gives `slot` (unlinked) to a key that has none; returns the key and value it held.
    pub(crate) fn replace(&mut self, slot: u32, key: u64, value: V) -> (u64, V) {
        self.unindex(slot);
        let node = &mut self.nodes[slot as usize];
        let old = (
            std::mem::replace(&mut node.key, key),
            std::mem::replace(&mut node.value, value),
        );
        let nodes = &self.nodes;
        self.index
            .insert_unique(key, slot, |&i| nodes[i as usize].key);
        old
    }

    /// Removes the (unlinked) node in `slot`; the last node moves into it, and its old slot is returned (the
    /// list must then [`relink`](List::relink) it).
    pub(crate) fn swap_remove(&mut self, slot: u32) -> (Node<V>, Option<u32>) {
        self.unindex(slot);
        let last = self.nodes.len() as u32 - 1;
        let node = self.nodes.swap_remove(slot as usize);
        if slot == last {
            return (node, None);
        }
        let key = self.nodes[slot as usize].key;
        if let Some(i) = self.index.find_mut(key, |&i| i == last) {
            *i = slot;
        }
        (node, Some(last))
    }

    fn unindex(&mut self, slot: u32) {
        let key = self.nodes[slot as usize].key;
        if let Ok(entry) = self.index.find_entry(key, |&i| i == slot) {
            entry.remove();
        }
    }
}

/// What a [`List`] runs through: one slab, or a store's two.
pub(crate) trait Arena {
    fn links(&mut self, link: u32) -> &mut Links;
    fn expires_at(&self, link: u32) -> u64;
}

impl<V: Expiry> Arena for Slab<V> {
    #[inline]
    fn links(&mut self, link: u32) -> &mut Links {
        &mut self.nodes[link as usize].links
    }

    fn expires_at(&self, link: u32) -> u64 {
        self.nodes[link as usize].value.expires_at()
    }
}

/// A recency list and its hand.
pub(crate) struct List {
    head: u32,
    tail: u32,
    /// Where the next eviction starts looking for a decayed entry ([`NIL`]: at the tail).
    hand: u32,
}

impl Default for List {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            hand: NIL,
        }
    }
}

impl List {
    /// Marks `link` (in the list) as the most recently used.
    // The test inlined into the store's check (a call measured 6 instructions on the single-key path).
    #[inline(always)]
    pub(crate) fn touch(&mut self, arena: &mut impl Arena, link: u32) {
        if self.head != link {
            self.move_to_front(arena, link);
        }
    }

    /// `unlink` and `push_front` in one, for a node that is not the head (so it has a `prev`, and the list a
    /// head): its own links read and written in one place, no test for ends it cannot be at (the move a hit pays
    /// on many keys).
    #[inline]
    fn move_to_front(&mut self, arena: &mut impl Arena, link: u32) {
        let head = self.head;
        let own = arena.links(link);
        let Links { prev, next } = *own;
        *own = Links {
            prev: NIL,
            next: head,
        };
        if self.hand == link {
            self.hand = prev;
        }
        arena.links(prev).next = next;
        if next == NIL {
            self.tail = prev;
        } else {
            arena.links(next).prev = prev;
        }
        arena.links(head).prev = link;
        self.head = link;
    }

    /// Takes `link` out of the list. A hand on it moves on towards the head (where it would have gone next).
    pub(crate) fn unlink(&mut self, arena: &mut impl Arena, link: u32) {
        let Links { prev, next } = *arena.links(link);
        if self.hand == link {
            self.hand = prev;
        }
        if prev == NIL {
            self.head = next;
        } else {
            arena.links(prev).next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            arena.links(next).prev = prev;
        }
    }

    /// Puts the unlinked `link` at the head.
    pub(crate) fn push_front(&mut self, arena: &mut impl Arena, link: u32) {
        let head = self.head;
        *arena.links(link) = Links {
            prev: NIL,
            next: head,
        };
        if head == NIL {
            self.tail = link;
        } else {
            arena.links(head).prev = link;
        }
        self.head = link;
    }

    /// The node that was at `from` is now at `to` (a slab moved it): points its neighbours, and the ends and the
    /// hand, at `to`.
    pub(crate) fn relink(&mut self, arena: &mut impl Arena, from: u32, to: u32) {
        let Links { prev, next } = *arena.links(to);
        if prev == NIL {
            self.head = to;
        } else {
            arena.links(prev).next = to;
        }
        if next == NIL {
            self.tail = to;
        } else {
            arena.links(next).prev = to;
        }
        if self.hand == from {
            self.hand = to;
        }
    }

    /// What to evict at `now`, and whether it has decayed: the first decayed entry of the [`LOOK`] from the hand
    /// towards the head (passing the head, the look goes on from the tail), else the tail, the least recently
    /// used. The hand stays where the look ended. `None` for an empty list.
    ///
    /// So a live entry is only evicted when the `LOOK` entries at the hand are all live, and each such eviction
    /// moves the hand `LOOK` entries on: while at most `LOOK − 1` entries are used or added per eviction, the hand
    /// passes every entry of a list of `n` within `n / (LOOK − 1)` evictions, and a decayed entry is evicted before
    /// the tail unless it decayed after the hand passed it (it is then found on the next pass, or evicted as the
    /// tail). A list of at most `LOOK` entries is looked at whole: a decayed entry, if any, is always evicted
    /// first.
    pub(crate) fn victim(&mut self, arena: &mut impl Arena, now: u64) -> Option<(u32, bool)> {
        if self.tail == NIL {
            return None;
        }
        let mut at = if self.hand == NIL {
            self.tail
        } else {
            self.hand
        };
        for _ in 0..LOOK {
            if arena.expires_at(at) <= now {
                self.hand = at; // the unlink moves it on
                return Some((at, true));
            }
            at = match arena.links(at).prev {
                NIL => self.tail,
                prev => prev,
            };
        }
        self.hand = at;
        Some((self.tail, arena.expires_at(self.tail) <= now))
    }
}
