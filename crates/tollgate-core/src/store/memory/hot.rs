//! A shard's copy of its hot refused key's entry, read without the shard's lock.
//!
//! A key over its limit is usually asked about again and again, and each refusal leaves its state as it was. The
//! shard keeps a copy of the entry of the key it refused twice in a row under its shared lock; a check on that key
//! first decides on the copy, without taking the lock: when the copy refuses, that is the answer (what the shard
//! would answer, since its entry is the copy), and no cache line is written, so cores refusing one key share
//! the copy's line instead of taking turns at the lock's. Every exclusive lock of the shard drops the copy before
//! it writes anything, so the copy is always the entry as the shard holds it; the copy is filled again, under the
//! shared lock, by the next refusals. The copy is guarded by a sequence number (a seqlock): a reader that sees it
//! change while reading drops what it read and takes the lock.
//!
//! A refusal decided on the copy does not mark its entry used. The copy exists only after a refusal under the lock
//! marked it, and the eviction hand clears marks under the exclusive lock, which drops the copy: the key's next
//! refusal takes the lock and marks it again, so the hand sees a refused key as used exactly as before.

use std::cell::Cell;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU64, fence};

use super::Entry;
use crate::Decision;
use crate::store::table::VISITED;

/// The copy, on cache lines of its own (the lock's word beside it is written by every locker).
#[derive(Default)]
#[repr(align(128))]
pub(super) struct HotRefusal {
    /// Odd while the copy is written.
    seq: AtomicU64,
    /// The copied entry's key: its digest, with the entry's algorithm in the [`VISITED`] bit (0: no copy).
    key: AtomicU64,
    words: [AtomicU64; 3],
}

thread_local! {
    /// The key of this thread's last refusal under a shard's shared lock (any shard's, any store's): a refusal of
    /// the same key next is copied. Kept per thread, so that refusals of many keys write no shared line (a key
    /// of another store that happens to have the same word only copies an entry that is not hot, once).
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// The copy's key word for `hash` in `E`'s slab.
#[inline(always)]
pub(super) fn key_word<E: Entry>(hash: u64) -> u64 {
    (hash & !VISITED) | if E::TAG == 0 { 0 } else { VISITED }
}

impl HotRefusal {
    /// The refusal the copy gives `key` (from [`key_word`]) under `decide`, if the copy is `key`'s and refuses;
    /// `None` otherwise, for the shard to decide under its lock.
    #[inline]
    pub(super) fn refusal<E: Entry>(
        &self,
        key: u64,
        decide: impl FnOnce(E) -> Option<Decision>,
    ) -> Option<Decision> {
        let seq = self.seq.load(Acquire);
        if self.key.load(Relaxed) != key || seq & 1 != 0 {
            return None;
        }
        let words = [
            self.words[0].load(Relaxed),
            self.words[1].load(Relaxed),
            self.words[2].load(Relaxed),
        ];
        fence(Acquire);
        if self.seq.load(Relaxed) != seq {
            return None;
        }
        decide(E::from_words(words))
    }

    /// Offers the entry of a key just refused under the shard's shared lock: copied if this thread's last such
    /// refusal was of the same key and the copy is not that key's already.
    #[inline]
    pub(super) fn offer<E: Entry>(&self, key: u64, entry: &E) {
        if LAST.with(|last| last.replace(key)) != key {
            return;
        }
        let seq = self.seq.load(Relaxed);
        // The copy is the key's already (no exclusive lock since, or it would be gone), or another holder of the
        // shared lock is copying.
        if self.key.load(Relaxed) == key || seq & 1 != 0 {
            return;
        }
        if self
            .seq
            .compare_exchange(seq, seq + 1, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        fence(Release);
        for (word, value) in self.words.iter().zip(entry.to_words()) {
            word.store(value, Relaxed);
        }
        self.key.store(key, Relaxed);
        self.seq.store(seq + 2, Release);
    }

    /// Drops the copy; called under the shard's exclusive lock before anything is written (no copy is being made:
    /// that takes the shared lock).
    #[inline]
    pub(super) fn clear(&self) {
        if self.key.load(Relaxed) != 0 {
            self.key.store(0, Relaxed);
        }
    }
}
