//! The eviction rule of the store and of `BoundedTable`, stated over plain `Vec`s of keys in slot order (no
//! index, no digests): a scout that looks for decayed keys, then CLOCK, with a visited bit per key and a hand.

// Shared by two test crates, each of which uses part of it.
#![allow(dead_code)]

/// How many entries the scout looks at per eviction for a decayed one (the store's `LOOK`).
pub(crate) const LOOK: usize = 4;

/// Keys in slot order in up to two slabs (a store's token buckets and sliding windows; a table has one), each with
/// its visited bit, and the scout and the hand: each a slab and a slot, which may be past that slab's end.
pub(crate) struct Clock<K> {
    slabs: [Vec<(K, bool)>; 2],
    scout: (usize, usize),
    hand: (usize, usize),
}

impl<K: PartialEq + Copy> Clock<K> {
    pub(crate) fn new() -> Self {
        Self {
            slabs: [Vec::new(), Vec::new()],
            scout: (0, 0),
            hand: (0, 0),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slabs[0].len() + self.slabs[1].len()
    }

    fn position(&self, key: K) -> Option<(usize, usize)> {
        (0..2).find_map(|s| {
            let slot = self.slabs[s].iter().position(|&(k, _)| k == key)?;
            Some((s, slot))
        })
    }

    /// A new key, not visited, after the last of slab `slab`.
    pub(crate) fn push(&mut self, slab: usize, key: K) {
        self.slabs[slab].push((key, false));
    }

    /// `key` (held) was used.
    pub(crate) fn touch(&mut self, key: K) {
        let (s, slot) = self.position(key).expect("a held key");
        self.slabs[s][slot].1 = true;
    }

    /// Forgets `key` if held: the last key of its slab takes its slot, bit and all (the scout and the hand stay put).
    pub(crate) fn remove(&mut self, key: K) {
        if let Some((s, slot)) = self.position(key) {
            self.slabs[s].swap_remove(slot);
        }
    }

    /// Forgets every decayed key, as a sweep does: each slab from its last slot down (so the key a removal moves
    /// into a slot was already looked at).
    pub(crate) fn sweep(&mut self, decayed: impl Fn(K) -> bool) {
        for slab in &mut self.slabs {
            for slot in (0..slab.len()).rev() {
                if decayed(slab[slot].0) {
                    slab.swap_remove(slot);
                }
            }
        }
    }

    /// `new` takes the slot of `old` (held), not visited.
    pub(crate) fn replace(&mut self, old: K, new: K) {
        let (s, slot) = self.position(old).expect("a held key");
        self.slabs[s][slot] = (new, false);
    }

    /// The first position at or after `(s, slot)`: past a slab's end, the other slab's first key (or this one's,
    /// if the other is empty).
    fn settle(&self, (s, slot): (usize, usize)) -> (usize, usize) {
        if slot < self.slabs[s].len() {
            (s, slot)
        } else if !self.slabs[1 - s].is_empty() {
            (1 - s, 0)
        } else {
            (s, 0)
        }
    }

    fn key(&self, (s, slot): (usize, usize)) -> K {
        self.slabs[s][slot].0
    }

    /// The rule: the scout looks at `LOOK` keys from where it stopped (the first decayed one is the victim, the
    /// scout left after it), else stops after them; then the hand goes from where it stopped: a decayed key is the
    /// victim; a visited one loses its bit and is passed; the first unvisited one is the victim. The hand is left
    /// just after the victim. Returns the victim and whether it decayed; the caller then
    /// [`remove`](Self::remove)s or [`replace`](Self::replace)s it (or not: a refusing table refuses a live
    /// victim, and the hands have moved and the bits are cleared all the same).
    pub(crate) fn victim(&mut self, decayed: impl Fn(K) -> bool) -> Option<(K, bool)> {
        if self.len() == 0 {
            return None;
        }
        let mut at = self.settle(self.scout);
        for _ in 0..LOOK.min(self.len()) {
            if decayed(self.key(at)) {
                self.scout = (at.0, at.1 + 1);
                return Some((self.key(at), true));
            }
            at = self.settle((at.0, at.1 + 1));
        }
        self.scout = at;
        let mut at = self.settle(self.hand);
        loop {
            let key = self.key(at);
            if decayed(key) {
                self.hand = (at.0, at.1 + 1);
                return Some((key, true));
            }
            if !self.slabs[at.0][at.1].1 {
                break;
            }
            self.slabs[at.0][at.1].1 = false;
            at = self.settle((at.0, at.1 + 1));
        }
        self.hand = (at.0, at.1 + 1);
        Some((self.key(at), false))
    }
}
