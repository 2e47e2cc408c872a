//! A shard's lockout ends, beside its entries.

use hashbrown::HashTable;

use crate::store::table::VISITED;

/// The keys of a shard that carry a lockout end (`Policy::with_lockout`), per algorithm: a side table, so that
/// entries of policies without a lockout carry no lockout bytes and their checks never read it. An end lives as
/// long as its key's entry (removed with it; the entry is not swept or evicted as decayed before it), as it did
/// inside the entry; only a lockout policy's checks, charges and peeks read it, and only a lockout sets it.
#[derive(Default)]
pub(super) struct Lockouts {
    /// `(key digest, locked until)`; the digest, without the bit the slabs mark visits in (they return their keys
    /// so), is its own hash.
    by_algorithm: [HashTable<(u64, u64)>; 2],
}

impl Lockouts {
    #[inline(always)]
    fn table(&self, tag: u32) -> &HashTable<(u64, u64)> {
        &self.by_algorithm[(tag >> 31) as usize]
    }

    /// The key's lockout end (0: none).
    #[inline]
    pub(super) fn get(&self, tag: u32, key: u64) -> u64 {
        let key = key & !VISITED;
        let table = self.table(tag);
        if table.is_empty() {
            return 0;
        }
        table.find(key, |e| e.0 == key).map_or(0, |e| e.1)
    }

    pub(super) fn set(&mut self, tag: u32, key: u64, until: u64) {
        let key = key & !VISITED;
        let table = &mut self.by_algorithm[(tag >> 31) as usize];
        match table.find_mut(key, |e| e.0 == key) {
            Some(e) => e.1 = until,
            None => {
                table.insert_unique(key, (key, until), |e| e.0);
            }
        }
    }

    /// Forgets the key's lockout end, if any (its entry is gone).
    #[inline]
    pub(super) fn remove(&mut self, tag: u32, key: u64) {
        let key = key & !VISITED;
        let table = &mut self.by_algorithm[(tag >> 31) as usize];
        if table.is_empty() {
            return;
        }
        if let Ok(e) = table.find_entry(key, |e| e.0 == key) {
            e.remove();
        }
    }
}
