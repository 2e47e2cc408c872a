//! A shard behind its lock, beside its hot entry: the checks that decide without the lock, and the taking of it.

use parking_lot::{Mutex, MutexGuard};

use super::decide::Check;
use super::entry::{BucketEntry, Entry, WindowEntry};
use super::hot::{self, HotEntry};
use super::shard::{Bound, Shard};
use crate::store::evictions::EvictionLog;
use crate::{Decision, StoreError, Timestamp};

/// A shard behind its lock (parking_lot's: under two threads on one key it spins adaptively before parking, where
/// std's convoyed; and a shard cannot be poisoned), and the shard's hot entry, which checks of its key decide on
/// without the lock.
#[derive(Default)]
pub(super) struct ShardLock {
    shard: Mutex<Shard>,
    hot: HotEntry,
}

impl ShardLock {
    /// A request's check without a lockout: on the shard's [`HotEntry`] if it is the key's, without the lock;
    /// otherwise under the lock, after which a key this thread checked twice in a row becomes the hot entry.
    #[inline]
    pub(super) fn check<E: Entry>(
        &self,
        hash: u64,
        now: Timestamp,
        bound: &Bound,
        log: &EvictionLog,
        ctx: E::Ctx,
        check: Check<'_>,
    ) -> Result<Decision, StoreError> {
        let key = hot::key_word::<E>(hash);
        match self
            .hot
            .decide(key, |state| on_copy::<E>(state, ctx, check))
        {
            Ok(decision) => return Ok(decision),
            Err(true) => {
                if let Some(decision) = self.retry_hot::<E>(key, ctx, check) {
                    return Ok(decision);
                }
            }
            Err(false) => {}
        }
        let mut shard = lock(self);
        let decision = shard.apply::<E, _>(hash, now, bound, log, ctx, check)?;
        if hot::repeated(key)
            && let Some(entry) = E::slab_ref(&shard.slabs).get(hash)
        {
            self.hot.offer(key, E::to_words(entry.state(ctx), ctx));
        }
        Ok(decision)
    }

    /// The tries on the hot entry after one raced with another thread's write (as governor's compare-and-swap loop
    /// does), up to [`hot::TRIES`] in all; `None`: the lock decides.
    #[cold]
    #[inline(never)]
    fn retry_hot<E: Entry>(&self, key: u64, ctx: E::Ctx, check: Check<'_>) -> Option<Decision> {
        for _ in 1..hot::TRIES {
            std::hint::spin_loop();
            match self
                .hot
                .decide(key, |state| on_copy::<E>(state, ctx, check))
            {
                Ok(decision) => return Some(decision),
                Err(true) => {}
                Err(false) => return None,
            }
        }
        None
    }
}

/// A check on a hot entry's state words: the decision and, for an admission, the words to write.
#[inline(always)]
fn on_copy<E: Entry>(
    state: [u64; 3],
    ctx: E::Ctx,
    check: Check<'_>,
) -> (Decision, Option<[u64; 4]>) {
    let step = E::check(
        Some(E::state_of(state)),
        check.policy,
        check.cost,
        check.now,
    );
    (
        step.decision,
        step.state.map(|state| E::to_words(state, ctx)),
    )
}

/// The shard's lock, for every step but a check on the hot entry. The hot entry is put back into its node first:
/// whatever the holder reads or writes, each key's state is in its node.
#[inline]
pub(super) fn lock(shard: &ShardLock) -> MutexGuard<'_, Shard> {
    let mut guard = shard.shard.lock();
    if let Some((key, words)) = shard.hot.take() {
        if hot::is_bucket(key) {
            guard.slabs.put_back::<BucketEntry>(key, words);
        } else {
            guard.slabs.put_back::<WindowEntry>(key, words);
        }
    }
    guard
}
