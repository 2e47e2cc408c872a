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

mod builder;
mod decide;
mod entry;
// The fixed window's and the token leases' parts of the store, on its shards.
mod fixed;
mod hot;
mod lease;
mod lock;
mod lockouts;
mod shard;

use std::fmt;
use std::future::{Future, ready};
use std::hash::{BuildHasher, Hasher};

use ahash::RandomState;

use crate::algorithm::Step;
use crate::algorithm::charge;
use crate::algorithm::lockout::{self, Locked};
use crate::algorithm::sliding_window::{self, SlidingWindowState};
use crate::algorithm::token_bucket;
use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Algorithm, Clock, Decision, Policy, Store, StoreError, SystemClock, Timestamp};

use super::evictions::{EvictionCounts, EvictionLog, OnFull};
pub use builder::MemoryStoreBuilder;
use decide::{Check, WithLockout};
use entry::{BucketEntry, Window, WindowEntry};
use lease::LeaseBooks;
use lock::{ShardLock, lock};
use shard::Bound;

/// Default bound on tracked keys: about 40 MB of state at worst.
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

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
    fn locked_window(
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
    fn shard(&self, hash: u64) -> &ShardLock {
        // Shift and mask derived once: no test for one shard and no `min` on the steady path.
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

    /// The bound and the eviction log, as [`Shard::apply`](shard::Shard::apply) takes them.
    fn bound_and_log(&self) -> (&Bound, &EvictionLog) {
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
