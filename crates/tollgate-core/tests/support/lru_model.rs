//! The eviction rule of the store and of `BoundedTable`, stated over a plain `Vec` (no links, no slots): exact
//! recency order, and a hand, held by identity, where an eviction starts looking for a decayed entry.

// Shared by two test crates, each of which uses part of it.
#![allow(dead_code)]

/// How many entries an eviction looks at from the hand (the store's `LOOK`).
pub(crate) const LOOK: usize = 4;

/// Keys in recency order (index 0 the least recently used) and the hand (`None`: at the least recently used).
pub(crate) struct Lru<K> {
    order: Vec<K>,
    hand: Option<K>,
}

impl<K: PartialEq + Copy> Lru<K> {
    pub(crate) fn new() -> Self {
        Self {
            order: Vec::new(),
            hand: None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    fn position(&self, key: K) -> Option<usize> {
        self.order.iter().position(|&k| k == key)
    }

    /// A new key, the most recently used.
    pub(crate) fn push(&mut self, key: K) {
        self.order.push(key);
    }

    /// `key` (held) was used: it becomes the most recently used.
    pub(crate) fn touch(&mut self, key: K) {
        let at = self.position(key).expect("a held key");
        if at + 1 < self.order.len() {
            self.take(at);
            self.order.push(key);
        }
    }

    /// Forgets `key` if held.
    pub(crate) fn remove(&mut self, key: K) {
        if let Some(at) = self.position(key) {
            self.take(at);
        }
    }

    /// A hand on the key taken moves to the next more recent one (or back to the start after the most recent).
    fn take(&mut self, at: usize) -> K {
        let key = self.order.remove(at);
        if self.hand == Some(key) {
            self.hand = self.order.get(at).copied();
        }
        key
    }

    /// The rule: from the hand, look at `LOOK` keys towards the more recent end (going on from the least recent
    /// past the most recent); the first decayed one is the victim; if none is, the least recently used is, and the
    /// hand stays where the look ended. Returns the victim and whether it decayed; the caller then
    /// [`remove`](Self::remove)s it (or not: a refusing table refuses a live victim, and the hand has moved).
    pub(crate) fn victim(&mut self, decayed: impl Fn(K) -> bool) -> Option<(K, bool)> {
        if self.order.is_empty() {
            return None;
        }
        let mut at = self.hand.and_then(|h| self.position(h)).unwrap_or(0);
        for _ in 0..LOOK {
            if decayed(self.order[at]) {
                self.hand = Some(self.order[at]);
                return Some((self.order[at], true));
            }
            at = (at + 1) % self.order.len();
        }
        self.hand = Some(self.order[at]);
        Some((self.order[0], decayed(self.order[0])))
    }
}
