//! The in-process store: sharded, bounded (evicting by CLOCK at the bound, decayed entries first), self-cleaning.
//!
//! ```
//! use tollgate_core::{MemoryStore, Policy, Quota};
//!
//! let store = MemoryStore::new();
//! let policy = Policy::token_bucket(Quota::per_second(2)?);
//! assert!(store.check_now("client-1", &policy, 1)?.is_allowed());
//! assert!(store.check_now("client-1", &policy, 1)?.is_allowed());
//! assert!(!store.check_now("client-1", &policy, 1)?.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// The fixed window's and the token leases' parts of the store, on its shards.
mod fixed;
mod hot;
mod lease;

use parking_lot::{Mutex, MutexGuard};
use std::fmt;
use std::future::{Future, ready};
use std::hash::{BuildHasher, Hasher};

use ahash::RandomState;

use crate::algorithm::Step;
use crate::algorithm::charge;
use crate::algorithm::lockout::{self, Locked};
use crate::algorithm::sliding_window::{self, SlidingWindowState};
use crate::algorithm::token_bucket::{self, TokenBucketState};
use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Algorithm, Clock, Decision, Name, Policy, Store, StoreError, SystemClock, Timestamp};
use hashbrown::HashTable;

use super::evictions::{DEFAULT_NAME, EvictionCounts, EvictionLog, OnFull};
use super::table::{Arena, Expiry, Hand, SECOND, Slab, VISITED, sharding};
use hot::HotEntry;
use lease::LeaseBooks;

/// Default bound on tracked keys: about 40 MB of state at worst.
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;
/// A shard is not swept below this many keys.
const MIN_SWEEP: usize = 64;

/// In-process state for any number of keys and policies.
///
/// Keys are stored as 64-bit keyed digests ([`KeyHasher`](super::KeyHasher)), never raw, so a long or hostile key costs the same as a short
/// one, and the seed is random per store so collisions cannot be aimed for. State that has decayed back to
/// "fresh" is dropped as the store grows, without any chore for the caller.
///
/// At most `max_keys` keys are tracked (each of the N shards holds `max_keys / N`, rounded up). At the bound, by
/// default ([`OnFull::Evict`]), a key that is not tracked yet takes the place of another, chosen by CLOCK
/// (second chance) with decayed entries first. Each entry carries a *visited* bit beside its state, which a use
/// sets: a hit writes its entry and nothing else. An eviction takes a decayed entry if its *scout* finds one among
/// the 4 entries where it stopped last (that loses nothing; the scout goes round the shard, 4 entries per
/// eviction, so decayed entries anywhere are found without a scan; a shard of at most 4 is looked at whole).
/// Else the CLOCK *hand* walks on from where it stopped: a decayed entry it meets is taken, a visited one loses
/// its bit and is passed, and the first one not visited is evicted. The new key takes the evicted entry's slot,
/// just behind the hand. So a new client is always decided by its own bucket or window, never by the failure
/// policy, and a client that keeps sending (a limited abuser included) keeps its state as long as it comes back
/// before the hand does: a flood of new keys moves the hand one entry per key plus the visited entries it passes,
/// so in a shard of `n` keys of which `h` are in use a revolution takes about `n − h` new keys (exact LRU kept a
/// key for `n`). An eviction costs O(1) amortised (each bit the hand clears was set by a use; no allocation: the
/// new key takes the evicted one's slot). `docs/design/eviction.md` compares the policy with the exact LRU it
/// replaced on a hot set in a flood; `docs/BENCHMARKS.md` has the measurements.
///
/// A shard finds a key through an index of 32-bit words (a tag of the digest and the entry's slot): a hit reads
/// one word and the entry. The key a shard's checks keep coming back to (a thread checked it twice in a row) is the
/// shard's *hot entry*: checks of it decide on a copy of its entry without the shard's lock (a refusal writes
/// nothing, an admission one compare-and-swap), and anything else that takes the lock puts the copy back into its
/// entry first. `docs/design/memory-store.md` has the layout and the hot entry's rules.
///
/// Evictions are counted in `tollgate_evictions_total{limiter}` (the label is the store's
/// [name](MemoryStoreBuilder::name)) and in [`evictions`](Self::evictions); while entries that still hold state
/// are evicted, a warning is logged (at most one every 10 s): `max_keys` is too small for the traffic, or a flood
/// of new keys is on. A token bucket and a sliding window sharing a store share its bound and its hand.
///
/// Lockout ends ([`Policy::with_lockout`]) are kept beside the entries, in a per-shard table of the keys that have
/// one: an entry is only its algorithm's state, and a policy without a lockout never reads the table. An end
/// lives as long as its key's entry, which is not dropped as decayed before the end.
///
/// With [`OnFull::Refuse`], a key that is not tracked yet at the bound gets [`StoreError::KeyCapacity`] (the
/// limiter's failure policy decides what that means) and keys already tracked keep their state. New keys are
/// admitted again once expired ones can be swept: at the bound, once an eighth of the shard has expired (a sweep
/// scans the whole shard under its lock, so it is not done for every key a flood of new keys brings).
///
/// ```
/// use tollgate_core::{MemoryStore, OnFull, Policy, Quota, StoreError};
///
/// let policy = Policy::token_bucket(Quota::per_hour(1)?);
/// let store = MemoryStore::builder().max_keys(2).name("per-client").build();
/// assert!(store.check_now("old", &policy, 1)?.is_allowed());
/// assert!(store.check_now("active", &policy, 1)?.is_allowed());
/// assert!(!store.check_now("active", &policy, 1)?.is_allowed()); // limited, and the most recent
/// assert!(store.check_now("new", &policy, 1)?.is_allowed()); // evicts "old"
/// assert!(!store.check_now("active", &policy, 1)?.is_allowed()); // still limited
/// assert_eq!((store.len(), store.evictions().live), (2, 1));
///
/// let refusing = MemoryStore::builder().max_keys(1).on_full(OnFull::Refuse).build();
/// assert!(refusing.check_now("a", &policy, 1)?.is_allowed());
/// assert!(matches!(refusing.check_now("b", &policy, 1), Err(StoreError::KeyCapacity { max_keys: 1 })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MemoryStore<C = SystemClock> {
    shards: Box<[ShardLock]>,
    seed: RandomState,
    /// A digest's shard is `(digest >> shard_shift) & shard_mask` (the shard count is a power of two).
    shard_shift: u32,
    shard_mask: usize,
    bound: Bound,
    log: EvictionLog,
    clock: C,
    /// Token leases' books (see [`MemoryStore::lease_tokens_at`]), empty unless someone leases.
    pub(super) leases: LeaseBooks,
}

/// The bound, as each shard applies it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bound {
    shard_capacity: usize,
    max_keys: usize,
    on_full: OnFull,
}

impl<C> fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("max_keys", &self.bound.max_keys)
            .field("on_full", &self.bound.on_full)
            .field("name", &self.log.name())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store on the system clock, holding at most [`DEFAULT_MAX_KEYS`] keys.
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder to set the key bound and what happens at it, the shard count, the name or the clock.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
            on_full: OnFull::default(),
            name: None,
            clock: SystemClock::new(),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

/// Configures a [`MemoryStore`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MemoryStoreBuilder<C = SystemClock> {
    max_keys: usize,
    shards: Option<usize>,
    on_full: OnFull,
    name: Option<Name>,
    clock: C,
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// Tracks at most `max_keys` keys (at least 1).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Uses `shards` shards, rounded up to a power of two (default: 16 × the available cores); fewer when the
    /// bound gives each under 256 keys, more when it gives each over 16 M.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// What a full store does with a new key: evict (the default) or refuse.
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = on_full;
        self
    }

    /// The `limiter` label of this store's `tollgate_evictions_total` and warnings (default
    /// [`"memory_store"`](super::DEFAULT_NAME)). A store only knows the name it is given: name it after the
    /// limiter it serves; a store shared by several limiters counts their evictions together.
    pub fn name(mut self, name: impl Into<Name>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Takes time from `clock` instead of the system clock.
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            max_keys: self.max_keys,
            shards: self.shards,
            on_full: self.on_full,
            name: self.name,
            clock,
        }
    }

    /// Builds the store.
    #[must_use]
    pub fn build(self) -> MemoryStore<C> {
        let (count, shard_capacity) = sharding(self.shards, self.max_keys);
        let seed = RandomState::new();
        MemoryStore {
            shards: (0..count).map(|_| ShardLock::default()).collect(),
            seed,
            shard_shift: 40 - count.trailing_zeros().min(24),
            shard_mask: count - 1,
            bound: Bound {
                shard_capacity,
                max_keys: self.max_keys,
                on_full: self.on_full,
            },
            log: EvictionLog::new(self.name.unwrap_or(Name::from(DEFAULT_NAME))),
            clock: self.clock,
            leases: LeaseBooks::default(),
        }
    }
}

impl<C> MemoryStore<C> {
    /// Number of keys currently tracked (expired ones included until they are swept).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no key is tracked.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured bound on tracked keys.
    #[must_use]
    pub fn max_keys(&self) -> usize {
        self.bound.max_keys
    }

    /// What this store does at its bound.
    #[must_use]
    pub fn on_full(&self) -> OnFull {
        self.bound.on_full
    }

    /// Entries evicted at the bound so far (also counted in `tollgate_evictions_total`).
    #[must_use]
    pub fn evictions(&self) -> EvictionCounts {
        self.shards
            .iter()
            .map(|s| lock(s).evictions)
            .fold(EvictionCounts::default(), |a, b| a + b)
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Decides a request at the clock's current time.
    pub fn check_now(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.check_at(key, policy, cost, self.clock.now())
    }

    /// Decides a request at `now` (time injection for tests and the shared decision vectors).
    pub fn check_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        // One string, nothing composed after it: the bytes alone identify it, without `str`'s extra terminator
        // write.
        let mut hasher = self.seed.build_hasher();
        hasher.write(key.as_bytes());
        self.check_digest_at(hasher.finish(), policy, cost, now)
    }

    /// Decides a request for the key whose digest, by [`Store::key_hasher`], is `hash`, at `now`.
    pub fn check_digest_at(
        &self,
        hash: u64,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        // The algorithms decide at no later instant; expiry and sweeping must agree with them.
        let now = now.min(Timestamp::LATEST);
        let (bound, log) = (&self.bound, &self.log);
        let check = Check { policy, cost, now };
        // One match on the algorithm, the lease flag read in the token bucket's arm only; a policy with a
        // lockout takes its own arms (the only ones that read the shard's lockout table).
        match (policy.algorithm(), policy.lockout_micros()) {
            (Algorithm::TokenBucket, _) if self.leases.active() => {
                self.check_leased_at(hash, policy, cost, now)
            }
            (Algorithm::TokenBucket, 0) => {
                self.shard(hash)
                    .check::<BucketEntry>(hash, now, bound, log, (), check)
            }
            (Algorithm::SlidingWindowCounter, 0) => self.shard(hash).check::<WindowEntry>(
                hash,
                now,
                bound,
                log,
                Window::sliding(policy),
                check,
            ),
            (Algorithm::FixedWindow, _) => self.check_fixed_at(hash, policy, cost, now),
            (Algorithm::TokenBucket, lockout) => lock(self.shard(hash)).apply::<BucketEntry, _>(
                hash,
                now,
                bound,
                log,
                (),
                WithLockout(|s| {
                    lockout::decide(s, lockout, |s| {
                        token_bucket::decide(s, policy.quota_ref(), cost, now)
                    })
                }),
            ),
            (Algorithm::SlidingWindowCounter, lockout) => lock(self.shard(hash))
                .apply::<WindowEntry, _>(
                    hash,
                    now,
                    bound,
                    log,
                    Window::sliding(policy),
                    WithLockout(|s| {
                        lockout::decide(s, lockout, |s| {
                            sliding_window::decide(s, policy, cost, now)
                        })
                    }),
                ),
        }
    }

    /// What a request of `cost` on `key` would get at the clock's current time, without consuming: see
    /// [`Store::peek`].
    pub fn peek_now(&self, key: &str, policy: &Policy, cost: u64) -> Decision {
        self.peek_at(key, policy, cost, self.clock.now())
    }

    /// What a request of `cost` on `key` would get at `now`, without consuming: the decision
    /// [`check_at`](Self::check_at) would return, while the key's state, its recency (what eviction at the bound
    /// goes by) and the store's size stay as they are.
    pub fn peek_at(&self, key: &str, policy: &Policy, cost: u64, now: Timestamp) -> Decision {
        let mut hasher = self.seed.build_hasher();
        hasher.write(key.as_bytes());
        self.peek_digest_at(hasher.finish(), policy, cost, now)
    }

    /// [`peek_at`](Self::peek_at) for the key whose digest, by [`Store::key_hasher`], is `hash`.
    pub fn peek_digest_at(
        &self,
        hash: u64,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Decision {
        let now = now.min(Timestamp::LATEST);
        let lockout = policy.lockout_micros();
        let shard = lock(self.shard(hash));
        // Only read: the entry is not marked visited.
        match policy.algorithm() {
            Algorithm::TokenBucket => {
                let state = shard.slabs.locked::<BucketEntry>(hash, lockout, ());
                lockout::decide(state, lockout, |s| {
                    token_bucket::decide(s, policy.quota_ref(), cost, now)
                })
                .decision
            }
            Algorithm::SlidingWindowCounter => {
                let state =
                    shard
                        .slabs
                        .locked::<WindowEntry>(hash, lockout, Window::sliding(policy));
                lockout::decide(state, lockout, |s| {
                    sliding_window::decide(s, policy, cost, now)
                })
                .decision
            }
            Algorithm::FixedWindow => {
                drop(shard);
                self.peek_fixed_at(hash, policy, cost, now)
            }
        }
    }

    /// A sliding-window slab entry's state with its lockout end, read only (the fixed window keeps its state there).
    pub(super) fn locked_window(
        &self,
        hash: u64,
        lockout_us: u64,
        window: Window,
    ) -> Option<Locked<SlidingWindowState>> {
        lock(self.shard(hash))
            .slabs
            .locked::<WindowEntry>(hash, lockout_us, window)
    }

    /// Charges `delta` (a refund if negative) to `key` at `now` for a request decided at `decided_at`: see
    /// [`Store::charge`].
    pub fn charge_at(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        let mut hasher = self.seed.build_hasher();
        hasher.write(key.as_bytes());
        self.charge_digest_at(hasher.finish(), policy, delta, decided_at, now)
    }

    /// [`charge_at`](Self::charge_at) for the key whose digest, by [`Store::key_hasher`], is `hash`.
    pub fn charge_digest_at(
        &self,
        hash: u64,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        let now = now.min(Timestamp::LATEST);
        let lockout = policy.lockout_micros();
        let mut shard = lock(self.shard(hash));
        let (bound, log) = (&self.bound, &self.log);
        // A charge writes the state and keeps the key's lockout as it is; a policy with a lockout reports it.
        match policy.algorithm() {
            Algorithm::FixedWindow => Err(StoreError::Unsupported(
                "a charge after the response on a fixed window",
            )),
            Algorithm::TokenBucket => shard.apply::<BucketEntry, _>(
                hash,
                now,
                bound,
                log,
                (),
                WithLockout(|s: Option<Locked<_>>| {
                    let state = Locked {
                        state: charge::token_bucket(
                            s.map(|s| s.state),
                            policy.quota_ref(),
                            delta,
                            now,
                        ),
                        locked_until: s.map_or(0, |s| s.locked_until),
                    };
                    charged(state, lockout, |s| {
                        token_bucket::decide(s, policy.quota_ref(), 0, now)
                    })
                }),
            ),
            Algorithm::SlidingWindowCounter => shard.apply::<WindowEntry, _>(
                hash,
                now,
                bound,
                log,
                Window::sliding(policy),
                WithLockout(|s: Option<Locked<_>>| {
                    let inner = s.map(|s| s.state);
                    let state = Locked {
                        state: charge::sliding_window(inner, policy, delta, decided_at, now),
                        locked_until: s.map_or(0, |s| s.locked_until),
                    };
                    charged(state, lockout, |s| {
                        sliding_window::decide(s, policy, 0, now)
                    })
                }),
            ),
        }
    }

    /// The key's shard: the digest's `log2(shards)` bits below bit 40.
    #[inline(always)]
    pub(super) fn shard(&self, hash: u64) -> &ShardLock {
        // Shift and mask derived once (the test for one shard and the `min` per check were ~8 instructions of the
        // steady path, by `memory_store`'s instruction counts).
        &self.shards[(hash >> self.shard_shift) as usize & self.shard_mask]
    }

    /// Drops every key whose state is indistinguishable from a fresh one. Never required: the store sweeps
    /// itself as it grows.
    pub fn sweep(&self) {
        let now = self.clock.now().as_micros();
        for shard in &*self.shards {
            lock(shard).sweep(now, &self.bound);
        }
    }

    /// The store's key seed.
    pub(super) fn seed(&self) -> &RandomState {
        &self.seed
    }

    /// The bound and the eviction log, as [`Shard::apply`] takes them.
    pub(super) fn bound_and_log(&self) -> (&Bound, &EvictionLog) {
        (&self.bound, &self.log)
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        ready(self.check_now(key, policy, cost))
    }

    fn check_immediate(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        Some(self.check_now(key, policy, cost))
    }

    fn key_hasher(&self) -> Option<super::KeyHasher> {
        Some(self.seed.build_hasher())
    }

    fn check_digest(
        &self,
        digest: u64,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        Some(self.check_digest_at(digest, policy, cost, self.clock.now()))
    }

    fn peek(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        ready(Ok(self.peek_now(key, policy, cost)))
    }

    fn peek_digest(&self, digest: u64, policy: &Policy, cost: u64) -> Option<Decision> {
        Some(self.peek_digest_at(digest, policy, cost, self.clock.now()))
    }

    fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        ready(self.charge_at(key, policy, delta, decided_at, self.clock.now()))
    }

    fn charge_digest(
        &self,
        digest: u64,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> Option<Result<Decision, StoreError>> {
        Some(self.charge_digest_at(digest, policy, delta, decided_at, self.clock.now()))
    }

    fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> impl Future<Output = Result<TokenLeaseGrant, StoreError>> + Send {
        ready(self.lease_tokens_now(key, policy, request))
    }

    fn supports_token_leases(&self) -> bool {
        true
    }
}

/// The step of a charge: the charged state, always written, and the decision a request of cost 0 gets on it.
fn charged<S: Copy + Default>(
    state: Locked<S>,
    lockout_us: u64,
    decide: impl FnOnce(Option<S>) -> Step<S>,
) -> Step<Locked<S>> {
    Step {
        decision: charge::decision(state, lockout_us, decide),
        state: Some(state),
    }
}

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
    fn check<E: Entry>(
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

/// How a shard's `apply` decides: a request without a lockout ([`Check`]), any step on the algorithm's state (a
/// closure), or a step on the state with its lockout ([`WithLockout`]: a lockout policy, a charge, a lease).
pub(super) trait Decide<S> {
    /// Whether the step reads and may set the key's lockout (in the shard's lockout table).
    const LOCKOUT: bool;
    /// The step on the key's state (`None`: not held) under the lockout ending at `locked_until` (0: none, or not
    /// read), and the lockout end to keep with the new state.
    fn decide<E: Entry<State = S>>(self, state: Option<S>, locked_until: u64) -> (Step<S>, u64);
}

impl<S, F: FnOnce(Option<S>) -> Step<S>> Decide<S> for F {
    const LOCKOUT: bool = false;
    #[inline]
    fn decide<E: Entry<State = S>>(self, state: Option<S>, _: u64) -> (Step<S>, u64) {
        (self(state), 0)
    }
}

/// A request's check without a lockout: [`Entry::check`], a direct call the compiler inlines (a closure measured
/// called out of line, ~50 instructions more per check).
#[derive(Clone, Copy)]
struct Check<'a> {
    policy: &'a Policy,
    cost: u64,
    now: Timestamp,
}

impl<S> Decide<S> for Check<'_> {
    const LOCKOUT: bool = false;
    #[inline(always)]
    fn decide<E: Entry<State = S>>(self, state: Option<S>, _: u64) -> (Step<S>, u64) {
        (E::check(state, self.policy, self.cost, self.now), 0)
    }
}

/// A step on the state and its lockout ([`lockout::decide`], a charge), for the policies that have one.
pub(super) struct WithLockout<F>(pub(super) F);

impl<S: Copy, F: FnOnce(Option<Locked<S>>) -> Step<Locked<S>>> Decide<S> for WithLockout<F> {
    const LOCKOUT: bool = true;
    #[inline(always)]
    fn decide<E: Entry<State = S>>(self, state: Option<S>, locked_until: u64) -> (Step<S>, u64) {
        let step = (self.0)(state.map(|state| Locked {
            state,
            locked_until,
        }));
        let kept = step.state.map_or(locked_until, |s| s.locked_until);
        let step = Step {
            decision: step.decision,
            state: step.state.map(|s| s.state),
        };
        (step, kept)
    }
}

/// A stored algorithm state, which knows when it has decayed back to "fresh" (its lockout aside, which the
/// shard's lockout table keeps).
pub(super) trait Entry: Copy + Expiry {
    type State: Copy;
    /// What the entry needs besides the state to be written and read back: a window's period.
    type Ctx: Copy;
    /// Tells this algorithm's links from the other's under the shard's one hand.
    const TAG: u32;
    fn slab(slabs: &mut Slabs) -> &mut Slab<Self>;
    fn slab_ref(slabs: &Slabs) -> &Slab<Self>;
    /// A request's decision, without a lockout.
    fn check(
        state: Option<Self::State>,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Step<Self::State>;
    fn new(state: Self::State, ctx: Self::Ctx) -> Self;
    fn state(&self, ctx: Self::Ctx) -> Self::State;
    /// The entry of `state` as a shard's hot entry ([`HotEntry`]) keeps it: the state in the first three words
    /// (decided on as they are, with no conversion), then what else the entry holds.
    fn to_words(state: Self::State, ctx: Self::Ctx) -> [u64; 4];
    /// The state in a hot entry's first three words.
    fn state_of(words: [u64; 3]) -> Self::State;
    /// The entry back from a hot entry's words.
    fn from_words(words: [u64; 4]) -> Self;
}

/// A token bucket's entry: its state alone, 16 bytes (a lockout, if any, is in the shard's lockout table).
#[derive(Clone, Copy)]
pub(super) struct BucketEntry(TokenBucketState);

/// A bucket lives until it is full again.
impl Expiry for BucketEntry {
    fn expires_at(&self) -> u64 {
        self.0.full_at
    }
}

impl Entry for BucketEntry {
    type State = TokenBucketState;
    type Ctx = ();
    const TAG: u32 = 0;
    #[inline]
    fn slab(slabs: &mut Slabs) -> &mut Slab<Self> {
        &mut slabs.buckets
    }
    fn slab_ref(slabs: &Slabs) -> &Slab<Self> {
        &slabs.buckets
    }
    #[inline(always)]
    fn check(
        state: Option<TokenBucketState>,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Step<TokenBucketState> {
        token_bucket::decide(state, policy.quota_ref(), cost, now)
    }
    #[inline(always)]
    fn new(state: TokenBucketState, (): ()) -> Self {
        Self(state)
    }
    #[inline(always)]
    fn state(&self, (): ()) -> TokenBucketState {
        self.0
    }
    #[inline(always)]
    fn to_words(state: TokenBucketState, (): ()) -> [u64; 4] {
        [state.full_at, state.remainder, 0, 0]
    }
    #[inline(always)]
    fn state_of([full_at, remainder, _]: [u64; 3]) -> TokenBucketState {
        TokenBucketState { full_at, remainder }
    }
    #[inline(always)]
    fn from_words([full_at, remainder, ..]: [u64; 4]) -> Self {
        Self(TokenBucketState { full_at, remainder })
    }
}

// A node is its key word and its state, nothing more: the visited mark rides in the key's word.
const _: () = assert!(size_of::<super::table::Node<BucketEntry>>() == 24);
const _: () = assert!(size_of::<super::table::Node<WindowEntry>>() == 32);

/// A window's entry, 24 bytes: its counts and the instant it expires, from which (with the period) its window's
/// start is read back; the window's start is a multiple of the period, and the entry expires a whole number of
/// periods after it ([`Window::periods`]), so nothing is lost.
#[derive(Clone, Copy)]
pub(super) struct WindowEntry {
    /// The state's reset: the window's start plus [`Window::periods`] periods.
    expires_at: u64,
    previous: u64,
    current: u64,
}

/// How a window's entry is written and read back: its policy's period, and whether the state is a fixed window's
/// (kept in the sliding window's slab, `previous` unused).
#[derive(Clone, Copy)]
pub(super) struct Window {
    period: u64,
    fixed: bool,
}

impl Window {
    /// A sliding window counter's entries under `policy`.
    #[inline(always)]
    pub(super) fn sliding(policy: &Policy) -> Self {
        Self {
            period: policy.quota_ref().period_micros(),
            fixed: false,
        }
    }

    /// A fixed window's entries under `policy`.
    pub(super) fn fixed(policy: &Policy) -> Self {
        Self {
            period: policy.quota_ref().period_micros(),
            fixed: true,
        }
    }

    /// How many periods after its window's start a state stops mattering (its reset): two while the current
    /// window holds requests (its count still weighs in the next one), one while only the previous does or a fixed
    /// window's does, none when nothing is counted (it is as good as fresh then).
    #[inline(always)]
    fn periods(self, previous: u64, current: u64) -> u64 {
        match (current > 0, previous > 0) {
            (true, _) if !self.fixed => 2,
            (true, _) | (false, true) => 1,
            (false, false) => 0,
        }
    }
}

impl Entry for WindowEntry {
    type State = SlidingWindowState;
    type Ctx = Window;
    const TAG: u32 = WINDOW;
    #[inline]
    fn slab(slabs: &mut Slabs) -> &mut Slab<Self> {
        &mut slabs.windows
    }
    fn slab_ref(slabs: &Slabs) -> &Slab<Self> {
        &slabs.windows
    }
    #[inline(always)]
    fn check(
        state: Option<SlidingWindowState>,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Step<SlidingWindowState> {
        sliding_window::decide(state, policy, cost, now)
    }
    #[inline(always)]
    fn new(state: SlidingWindowState, window: Window) -> Self {
        let periods = window.periods(state.previous, state.current);
        Self {
            expires_at: state.window_start + periods * window.period,
            previous: state.previous,
            current: state.current,
        }
    }
    #[inline(always)]
    fn state(&self, window: Window) -> SlidingWindowState {
        let periods = window.periods(self.previous, self.current);
        SlidingWindowState {
            window_start: self.expires_at - periods * window.period,
            previous: self.previous,
            current: self.current,
        }
    }
    #[inline(always)]
    fn to_words(state: SlidingWindowState, window: Window) -> [u64; 4] {
        [
            state.window_start,
            state.previous,
            state.current,
            Self::new(state, window).expires_at,
        ]
    }
    #[inline(always)]
    fn state_of([window_start, previous, current]: [u64; 3]) -> SlidingWindowState {
        SlidingWindowState {
            window_start,
            previous,
            current,
        }
    }
    #[inline(always)]
    fn from_words([_, previous, current, expires_at]: [u64; 4]) -> Self {
        Self {
            expires_at,
            previous,
            current,
        }
    }
}

impl Expiry for WindowEntry {
    fn expires_at(&self) -> u64 {
        self.expires_at
    }
}

/// The top bit of a link under a shard's hand: the sliding-window slab (clear: the token-bucket slab).
const WINDOW: u32 = SECOND;

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
    fn get(&self, tag: u32, key: u64) -> u64 {
        let key = key & !VISITED;
        let table = self.table(tag);
        if table.is_empty() {
            return 0;
        }
        table.find(key, |e| e.0 == key).map_or(0, |e| e.1)
    }

    fn set(&mut self, tag: u32, key: u64, until: u64) {
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
    fn remove(&mut self, tag: u32, key: u64) {
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

/// A shard's two slabs, one per algorithm, which its one hand walks, and their keys' lockout ends.
#[derive(Default)]
pub(super) struct Slabs {
    buckets: Slab<BucketEntry>,
    windows: Slab<WindowEntry>,
    lockouts: Lockouts,
}

impl Slabs {
    /// Puts a hot entry taken out of the shard's [`HotEntry`] back into its key's node (which a key in the copy
    /// keeps: only the lock's holder removes nodes, and taking the lock puts the copy back first).
    fn put_back<E: Entry>(&mut self, key: u64, words: [u64; 4]) {
        let slab = E::slab(self);
        if let Some(slot) = slab.find(key) {
            slab.node_mut(slot).value = E::from_words(words);
        }
    }

    /// The key's state with its lockout end, read only; the end is read only for a policy with a lockout
    /// (`lockout_us > 0`: one without ignores it).
    fn locked<E: Entry>(&self, key: u64, lockout_us: u64, ctx: E::Ctx) -> Option<Locked<E::State>> {
        let state = E::slab_ref(self).get(key)?.state(ctx);
        let locked_until = if lockout_us == 0 {
            0
        } else {
            self.lockouts.get(E::TAG, key)
        };
        Some(Locked {
            state,
            locked_until,
        })
    }
}

impl Arena for Slabs {
    fn lens(&self) -> [u32; 2] {
        [self.buckets.len() as u32, self.windows.len() as u32]
    }

    fn pass(&mut self, link: u32) -> bool {
        if link & WINDOW == 0 {
            self.buckets.node_mut(link).pass()
        } else {
            self.windows.node_mut(link & !WINDOW).pass()
        }
    }

    /// The entry's own expiry, or its lockout's end if later: a locked key is neither swept nor evicted as
    /// decayed (the table is read only while some key of this algorithm in the shard has a lockout end).
    fn expires_at(&self, link: u32) -> u64 {
        let (tag, slot) = (link & WINDOW, link & !WINDOW);
        let (own, key) = if tag == 0 {
            let node = self.buckets.node(slot);
            (node.value.expires_at(), node.key())
        } else {
            let node = self.windows.node(slot);
            (node.value.expires_at(), node.key())
        };
        own.max(self.lockouts.get(tag, key))
    }
}

#[derive(Default)]
pub(super) struct Shard {
    slabs: Slabs,
    hand: Hand,
    evictions: EvictionCounts,
    /// Sweep when the shard grows to this many keys…
    sweep_at: usize,
    /// …but only once some key may have expired.
    next_expiry: u64,
}

impl Shard {
    fn len(&self) -> usize {
        self.slabs.buckets.len() + self.slabs.windows.len()
    }

    #[inline(always)]
    pub(super) fn apply<E: Entry, D: Decide<E::State>>(
        &mut self,
        hash: u64,
        now: Timestamp,
        bound: &Bound,
        log: &EvictionLog,
        ctx: E::Ctx,
        decide: D,
    ) -> Result<Decision, StoreError> {
        let slab = E::slab(&mut self.slabs);
        let slot = slab.find(hash);
        let state = slot.map(|slot| slab.node_mut(slot).value.state(ctx));
        // Only a step with a lockout reads the key's end (only a held key has one).
        let held = if D::LOCKOUT && slot.is_some() {
            self.slabs.lockouts.get(E::TAG, hash)
        } else {
            0
        };
        let (step, locked_until) = decide.decide::<E>(state, held);
        if let Some(slot) = slot {
            // The state and the visited bit are one node: a hit writes that alone.
            let node = E::slab(&mut self.slabs).node_mut(slot);
            node.visit();
            if let Some(state) = step.state {
                node.value = E::new(state, ctx);
                if D::LOCKOUT && locked_until != held {
                    self.slabs.lockouts.set(E::TAG, hash, locked_until);
                }
            }
            return Ok(step.decision);
        }
        let Some(state) = step.state else {
            return Ok(step.decision);
        };
        let entry = E::new(state, ctx);
        let now = now.as_micros();
        let expires_at = entry.expires_at().max(locked_until);
        if expires_at <= now {
            return Ok(step.decision); // already indistinguishable from fresh
        }
        let cap = bound.shard_capacity;
        let len = self.len();
        match bound.on_full {
            OnFull::Evict => {
                // Sweeps only while growing (each one at twice the keys of the last: O(1) amortised); at the bound,
                // eviction makes room one key at a time, decayed keys first, so no request waits on a scan.
                if len < cap && len >= self.sweep_at.max(MIN_SWEEP) && now >= self.next_expiry {
                    self.sweep(now, bound);
                }
                if self.len() >= cap && self.evict_for(hash, entry, expires_at, now, bound, log) {
                    if D::LOCKOUT && locked_until != 0 {
                        self.slabs.lockouts.set(E::TAG, hash, locked_until);
                    }
                    return Ok(step.decision);
                }
            }
            OnFull::Refuse => {
                if (len >= self.sweep_at.max(MIN_SWEEP) || len >= cap) && now >= self.next_expiry {
                    self.sweep(now, bound);
                }
                if self.len() >= cap {
                    return Err(StoreError::KeyCapacity {
                        max_keys: bound.max_keys,
                    });
                }
            }
        }
        self.next_expiry = self.next_expiry.min(expires_at);
        E::slab(&mut self.slabs).push(hash, entry);
        if D::LOCKOUT && locked_until != 0 {
            self.slabs.lockouts.set(E::TAG, hash, locked_until);
        }
        Ok(step.decision)
    }

    /// Evicts the hand's victim for the new key `hash`, which takes the victim's slot when both are of one
    /// algorithm (no allocation, nothing moved); `false` if it still has to be added (the victim was of the other
    /// algorithm, or there was none).
    fn evict_for<E: Entry>(
        &mut self,
        hash: u64,
        entry: E,
        expires_at: u64,
        now: u64,
        bound: &Bound,
        log: &EvictionLog,
    ) -> bool {
        let Some((victim, decayed)) = self.hand.victim(&mut self.slabs, now) else {
            return false; // an empty shard is never full (its capacity is at least 1)
        };
        self.next_expiry = self.next_expiry.min(expires_at);
        let replaced = victim & WINDOW == E::TAG;
        if replaced {
            let (old, _) = E::slab(&mut self.slabs).replace(victim & !WINDOW, hash, entry);
            self.slabs.lockouts.remove(E::TAG, old);
        } else {
            self.remove(victim);
        }
        self.evictions.add(!decayed);
        log.record(!decayed, &self.evictions, bound.max_keys);
        replaced
    }

    /// Removes the entry at `link` from its slab (whose last entry moves into its slot) and its lockout end.
    fn remove(&mut self, link: u32) {
        let (tag, slot) = (link & WINDOW, link & !WINDOW);
        let key = if tag == 0 {
            self.slabs.buckets.swap_remove(slot).key()
        } else {
            self.slabs.windows.swap_remove(slot).key()
        };
        self.slabs.lockouts.remove(tag, key);
    }

    fn sweep(&mut self, now: u64, bound: &Bound) {
        let mut next = u64::MAX;
        for (tag, len) in [
            (0, self.slabs.buckets.len()),
            (WINDOW, self.slabs.windows.len()),
        ] {
            // From the last slot down: the entry a removal moves into a slot was already looked at.
            for slot in (0..len as u32).rev() {
                let link = slot | tag;
                let expires_at = self.slabs.expires_at(link);
                if expires_at <= now {
                    self.remove(link);
                } else {
                    next = next.min(expires_at);
                }
            }
        }
        self.next_expiry = next;
        self.sweep_at = (self.len() * 2).max(MIN_SWEEP);
        // Refusing and still (nearly) full: sweeping again as soon as the next key expires would scan the whole
        // shard, under its lock, for every new key (a client spraying keys at the bound). Wait until an eighth of
        // it can go; new keys are refused meanwhile, as they would be at the bound anyway. (An evicting store does
        // not sweep at the bound.)
        let cap = bound.shard_capacity;
        let batch = (cap / 8).max(1);
        if bound.on_full == OnFull::Refuse && self.len() + batch > cap {
            let links = (0..self.slabs.buckets.len() as u32)
                .chain((0..self.slabs.windows.len() as u32).map(|slot| slot | WINDOW));
            let mut expiries: Vec<u64> = links.map(|link| self.slabs.expires_at(link)).collect();
            if !expiries.is_empty() {
                let index = batch.min(expiries.len()) - 1;
                self.next_expiry = *expiries.select_nth_unstable(index).1;
            }
        }
    }
}
