//! A shard's hot key: the entry of the key its checks keep coming back to, decided on without the shard's lock.
//!
//! A thread that checks one key twice in a row through the shard's lock makes that key's entry the shard's *hot
//! entry*, moved out of its node into a copy guarded by a sequence number (a seqlock). While it is there the copy
//! is the key's state (the node keeps its place, key and visited mark): a check of the key decides on the copy
//! without the shard's lock — a refusal reads it and writes nothing, an admission writes the new state with one
//! compare-and-swap on the sequence — so cores checking one key share the copy's line instead of taking turns at
//! the lock's. Every taking of the shard's lock puts the copy back into its node first ([`HotEntry::take`]), so
//! whatever the holder reads or writes (an eviction, a sweep, a charge, a peek, another key's check) sees the
//! key's state.
//! `docs/design/memory-store.md` has the rules and why they keep every decision the algorithm's.

use std::cell::Cell;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU64, fence};

use super::entry::Entry;
use crate::Decision;
use crate::store::table::VISITED;

/// The hot entry, on cache lines of its own (the lock's word beside it is written by every locker).
#[derive(Default)]
#[repr(align(128))]
pub(super) struct HotEntry {
    /// Odd while the copy is written.
    seq: AtomicU64,
    /// The copied entry's key: its digest, with the entry's algorithm in the [`VISITED`] bit (0: no copy).
    key: AtomicU64,
    /// The key's state as its algorithm decides on it, then what else its node's entry holds
    /// ([`Entry::to_words`]): a check on the copy converts nothing.
    words: [AtomicU64; 4],
}

/// How many times a check tries the copy while other threads write it before it takes the lock (which puts the copy
/// back into its node: a last resort, the key is hot again only when a thread checks it twice in a row there).
pub(super) const TRIES: usize = 32;

thread_local! {
    /// The key this thread last checked through a shard's lock (any shard's, any store's): checking the same key
    /// next makes it the hot entry. Kept per thread, so that checks of many keys write no line other threads read.
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// The copy's key word for `hash` in `E`'s slab.
#[inline(always)]
pub(super) fn key_word<E: Entry>(hash: u64) -> u64 {
    (hash & !VISITED) | if E::TAG == 0 { 0 } else { VISITED }
}

/// Whether this thread's last check through a shard's lock was of `key` too (and notes `key` as its last).
#[inline]
pub(super) fn repeated(key: u64) -> bool {
    LAST.with(|last| last.replace(key)) == key
}

/// Whether the key word is a token bucket's (else a sliding window's).
#[inline]
pub(super) fn is_bucket(key: u64) -> bool {
    key & VISITED == 0
}

impl HotEntry {
    /// Decides a check of `key` (from [`key_word`]) on the copy, if it is `key`'s: `decide`, given the state's
    /// words, gives the decision and, for an admission, the words to write. An admission is written only if nothing
    /// was since the copy was read (then it is the decision on the state as it is). `Err(true)`: another thread
    /// was writing the copy, or wrote it since it was read, and the check may try again; `Err(false)`: the copy is
    /// another key's, or none, and the lock decides.
    ///
    /// One try: a caller's loop around the decision would keep the decision's constants live across its turns,
    /// and every check of a hot key would pay for that in spilled registers. Tries after a race go out of line.
    #[inline]
    pub(super) fn decide(
        &self,
        key: u64,
        decide: impl FnOnce([u64; 3]) -> (Decision, Option<[u64; 4]>),
    ) -> Result<Decision, bool> {
        let (seq, words) = self.read(key)?;
        let (decision, written) = decide(words);
        let Some(words) = written else {
            return Ok(decision);
        };
        if self
            .seq
            .compare_exchange(seq, seq + 1, Acquire, Relaxed)
            .is_ok()
        {
            self.write(seq, key, &words);
            return Ok(decision);
        }
        Err(true)
    }

    /// The copy's sequence and state words, if it is `key`'s, read whole: `Err(true)` if a writer was at it meanwhile
    /// (try again), `Err(false)` if the copy is not the key's.
    #[inline(always)]
    fn read(&self, key: u64) -> Result<(u64, [u64; 3]), bool> {
        let seq = self.seq.load(Acquire);
        if self.key.load(Relaxed) != key {
            return Err(false);
        }
        let words = [
            self.words[0].load(Relaxed),
            self.words[1].load(Relaxed),
            self.words[2].load(Relaxed),
        ];
        fence(Acquire);
        if seq & 1 != 0 || self.seq.load(Relaxed) != seq {
            return Err(true);
        }
        Ok((seq, words))
    }

    /// Makes `words`, `key`'s entry as its node holds it ([`Entry::to_words`]), the hot entry. Under the shard's
    /// lock, whose taking emptied the copy ([`take`](Self::take)): no check writes an empty copy (one that read the
    /// key before it was taken compares an older sequence and fails), so this is the copy's only writer.
    #[inline]
    pub(super) fn offer(&self, key: u64, words: [u64; 4]) {
        debug_assert_eq!(
            self.key.load(Relaxed),
            0,
            "the lock's taking emptied the copy"
        );
        let seq = self.seq.load(Relaxed);
        self.seq.store(seq + 1, Relaxed);
        self.write(seq, key, &words);
    }

    /// Takes the copy out, to be put back into its node: its key word and entry words. Called as the shard's lock
    /// is taken (no copy can be made meanwhile: that takes the lock); waits for a check writing the copy without
    /// the lock to finish (a few stores).
    #[inline]
    pub(super) fn take(&self) -> Option<(u64, [u64; 4])> {
        if self.key.load(Relaxed) == 0 {
            return None;
        }
        let mut spins = 0u32;
        let seq = loop {
            let seq = self.seq.load(Relaxed);
            if seq & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(seq, seq + 1, Acquire, Relaxed)
                    .is_ok()
            {
                break seq;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // The writer was descheduled between its two stores of the sequence.
                std::thread::yield_now();
            }
        };
        let key = self.key.load(Relaxed);
        let words = [
            self.words[0].load(Relaxed),
            self.words[1].load(Relaxed),
            self.words[2].load(Relaxed),
            self.words[3].load(Relaxed),
        ];
        self.key.store(0, Relaxed);
        self.seq.store(seq + 2, Release);
        Some((key, words))
    }

    /// Writes the copy, the sequence made odd (`seq + 1`) by the caller.
    #[inline]
    fn write(&self, seq: u64, key: u64, words: &[u64; 4]) {
        fence(Release);
        for (word, &value) in self.words.iter().zip(words) {
            word.store(value, Relaxed);
        }
        self.key.store(key, Relaxed);
        self.seq.store(seq + 2, Release);
    }
}
