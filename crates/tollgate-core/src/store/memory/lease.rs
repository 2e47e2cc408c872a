//! Token leases on the in-process store: the same rules as `lua/token_bucket_lease.lua` and
//! `lua/sliding_window_lease.lua`, so that a layer's leases can be tested on a manual clock and the Rust twins
//! run through a store.
//!
//! A token bucket's lease books live beside the shards, in one map that is consulted only once some key has been
//! leased (a plain decision reads one atomic flag more). A book is settled, and dropped once empty, by every
//! call on its key; at most the store's `max_keys` keys hold one (a lease beyond that is refused with
//! [`StoreError::KeyCapacity`], and the limiter decides that request on the plain path). A sliding window's
//! records live in a second map that only its lease calls consult (they never change a plain decision); a
//! book is dropped once it counts nothing, and at the bound the books that count nothing any more make room.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::MemoryStore;
use super::decide::WithLockout;
use super::entry::{BucketEntry, Window, WindowEntry};
use super::lock::lock;
use crate::algorithm::Step;
use crate::algorithm::lockout::{self, Locked};
use crate::algorithm::sliding_window_lease::{self, WindowBook};
use crate::algorithm::token_bucket_lease::{self, LeaseBook};
use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Algorithm, Clock, Decision, Outcome, Policy, StoreError, Timestamp};

/// The token buckets' lease books and the sliding windows' lease records, by key digest.
#[derive(Default)]
pub(crate) struct LeaseBooks {
    active: AtomicBool,
    books: Mutex<HashMap<u64, LeaseBook>>,
    windows: Mutex<HashMap<u64, WindowBook>>,
}

impl LeaseBooks {
    /// Whether any key was ever leased (then plain token bucket decisions consult the books).
    #[inline(always)]
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Answers a token lease call (see [`token_lease`](crate::token_lease)) at `now`: the same grant
    /// `RedisStore::lease_tokens_at` gives for the same calls and instants.
    ///
    /// # Errors
    /// [`StoreError::KeyCapacity`] when `max_keys` token bucket keys hold leases already, or the store is full and
    /// refuses new keys.
    pub fn lease_tokens_at(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
        now: Timestamp,
    ) -> Result<TokenLeaseGrant, StoreError> {
        let mut hasher = self.key_hasher_seeded();
        hasher.write(key.as_bytes());
        self.lease_digest_at(hasher.finish(), policy, request, now)
    }

    /// [`lease_tokens_at`](Self::lease_tokens_at) on the clock's time.
    ///
    /// # Errors
    /// As [`lease_tokens_at`](Self::lease_tokens_at).
    pub fn lease_tokens_now(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> Result<TokenLeaseGrant, StoreError> {
        self.lease_tokens_at(key, policy, request, self.clock().now())
    }

    fn lease_digest_at(
        &self,
        hash: u64,
        policy: &Policy,
        request: &TokenLeaseRequest,
        now: Timestamp,
    ) -> Result<TokenLeaseGrant, StoreError> {
        let now = now.min(Timestamp::LATEST);
        let mut grant = None;
        let (bound, log) = self.bound_and_log();
        let lockout = policy.lockout_micros();
        match policy.algorithm() {
            Algorithm::FixedWindow => {
                return Err(StoreError::Unsupported("token leases on a fixed window"));
            }
            Algorithm::SlidingWindowCounter => {
                // The records' lock, then the shard's.
                let mut windows = self.leases.windows.lock();
                let period = policy.quota().period_micros();
                let start = now.as_micros() - now.as_micros() % period;
                if !windows.contains_key(&hash) && windows.len() >= self.max_keys() {
                    windows.retain(|_, book| !book.is_spent(start, period));
                    if windows.len() >= self.max_keys() {
                        return Err(StoreError::KeyCapacity {
                            max_keys: self.max_keys(),
                        });
                    }
                }
                let book = windows.entry(hash).or_default();
                // A lease reads the key's lockout (a locked key grants nothing) and never sets one.
                lock(self.shard(hash)).apply::<WindowEntry, _>(
                    hash,
                    now,
                    bound,
                    log,
                    Window::sliding(policy),
                    WithLockout(|s: Option<Locked<_>>| {
                        let locked_until = s.map_or(0, |s| s.locked_until);
                        let (g, state) =
                            lockout::lease(false, locked_until, lockout, request, now, |request| {
                                sliding_window_lease::lease(
                                    s.map(|s| s.state),
                                    book,
                                    policy,
                                    request,
                                    now,
                                )
                            });
                        grant = Some(g);
                        as_step(
                            &g,
                            state.map(|state| Locked {
                                state,
                                locked_until,
                            }),
                        )
                    }),
                )?;
                if windows.get(&hash).is_some_and(WindowBook::is_empty) {
                    windows.remove(&hash);
                }
            }
            Algorithm::TokenBucket => {
                // The books' lock, then the shard's: the order every token bucket call takes them in.
                let mut books = self.leases.books.lock();
                if !books.contains_key(&hash) && books.len() >= self.max_keys() {
                    return Err(StoreError::KeyCapacity {
                        max_keys: self.max_keys(),
                    });
                }
                self.leases.active.store(true, Ordering::Release);
                let book = books.entry(hash).or_default();
                lock(self.shard(hash)).apply::<BucketEntry, _>(
                    hash,
                    now,
                    bound,
                    log,
                    (),
                    WithLockout(|s: Option<Locked<_>>| {
                        let locked_until = s.map_or(0, |s| s.locked_until);
                        let (g, state) = lockout::lease(
                            request.end,
                            locked_until,
                            lockout,
                            request,
                            now,
                            |request| {
                                let quota = policy.quota();
                                token_bucket_lease::lease(
                                    s.map(|s| s.state),
                                    book,
                                    &quota,
                                    request,
                                    now,
                                )
                            },
                        );
                        grant = Some(g);
                        as_step(
                            &g,
                            Some(Locked {
                                state,
                                locked_until,
                            }),
                        )
                    }),
                )?;
                if book.is_empty() {
                    books.remove(&hash);
                }
            }
        }
        grant.ok_or(StoreError::KeyCapacity {
            max_keys: self.max_keys(),
        })
    }

    /// A plain token bucket decision once leases are about: on the key's book, if it has one.
    #[cold]
    pub(super) fn check_leased_at(
        &self,
        hash: u64,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        let mut books = self.leases.books.lock();
        let mut empty = LeaseBook::default();
        let book = books.get_mut(&hash).unwrap_or(&mut empty);
        let (bound, log) = self.bound_and_log();
        let lockout = policy.lockout_micros();
        let decision = lock(self.shard(hash)).apply::<BucketEntry, _>(
            hash,
            now,
            bound,
            log,
            (),
            WithLockout(|s| {
                if lockout == 0 {
                    return lockout::decide(s, lockout, |s| {
                        token_bucket_lease::decide(s, book, policy.quota_ref(), cost, now)
                    });
                }
                // A refusal while locked writes nothing, the book's sweep included (as `lua/ops_close.lua`
                // skips every write of a locked key): the sweep is kept only with a state to write.
                let mut swept = book.clone();
                let step = lockout::decide(s, lockout, |s| {
                    token_bucket_lease::decide(s, &mut swept, policy.quota_ref(), cost, now)
                });
                if step.state.is_some() {
                    *book = swept;
                }
                step
            }),
        )?;
        if books.get(&hash).is_some_and(LeaseBook::is_empty) {
            books.remove(&hash);
        }
        Ok(decision)
    }

    fn key_hasher_seeded(&self) -> crate::store::KeyHasher {
        self.seed().build_hasher()
    }
}

/// A grant as the step the shard's `apply` stores: the entry expires with the grant's `reset`. A token
/// bucket's entry may expire at its `full_at` even while leases are out: its book (kept apart) floors it.
fn as_step<S: Copy>(grant: &TokenLeaseGrant, state: Option<S>) -> Step<S> {
    Step {
        decision: Decision {
            outcome: Outcome::Allowed,
            limit: 0,
            remaining: grant.remaining,
            reset: grant.reset,
            retry_after: None,
            now: grant.now,
        },
        state,
    }
}
