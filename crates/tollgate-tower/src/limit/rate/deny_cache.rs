//! The exact deny cache: a shared store's denials answered locally until the store's own retry instant.
//!
//! A rate limiter on a shared store (Redis) pays a round trip for every request, the refused ones included: a
//! client flooding one key drives Redis at the rate of its flood. With the deny cache (on by default for a store
//! whose [`Store::is_shared`](tollgate_core::Store::is_shared) is true, switched by
//! [`RateLimitLayer::deny_cache`](crate::RateLimitLayer::deny_cache)), when the store denies key K a request of
//! cost `c` with a retry delay `r`, the layer remembers "K is denied for costs ≥ c until T" and refuses further
//! such requests for K itself until T, with the numbers the store gave: the same `limit`, `remaining` and
//! `reset`, `now` advanced by the local time elapsed, and `retry_after` counting down to the store's retry
//! instant. Response headers stay what Redis said.
//!
//! # Why a cached denial is exact
//!
//! Both algorithms (token bucket, sliding window counter) admit a request of cost `c` at the first instant
//! their state allows it, and the store's `retry_after` is that instant minus the decision's, in whole
//! microseconds, never rounded up: the token bucket's `admit_at = full_at − ⌊(capacity − need + remainder) /
//! rate⌋` is the earliest microsecond with enough tokens, and the sliding window's `admit_at` is the first tick
//! at which the previous window's weight has decayed enough (the same in `lua/*.lua`). Until then:
//!
//! - **other traffic only delays admission**: other instances can only spend more (admitted requests add to the
//!   state; denied ones leave it alone), so the store would deny K until T at least;
//! - **a costlier request is denied at least as long**: both algorithms admit `c' ≥ c` only where they admit `c`,
//!   so an entry answers every cost from `c` up to the burst (beyond it the store answers
//!   `CostExceedsCapacity`, which is not cached); its `retry_after` is then the one for `c`, never later than the
//!   store's own for `c'`; `remaining` does not depend on the cost;
//! - **a cheaper request may pass earlier**: a cost below `c` is not covered, and goes to the store; when the
//!   store admits it, the entry is dropped (it would still refuse exactly, but with a `remaining` and `reset`
//!   the store no longer gives).
//!
//! T is measured on the local clock from the instant the request was **sent** (before the store was asked),
//! not from when the reply arrived: the store decided no earlier than that, so T = sent + `r` is no later than
//! the store's retry instant, whatever the latency. What is left is the two clocks' rates: over `r` the local
//! clock (a calibrated counter, see [`SystemClock`]) and Redis's `TIME` may drift apart
//! by tens of parts per million, and the local clock's resynchronisation moves it by some microseconds either
//! way, and an NTP daemon slewing either clock runs it at most 500 ppm off. The entry therefore expires a margin
//! early, **100 µs + 500 ppm of `r`** ([`drift_margin`]), and a denial whose `r` is within that margin is not
//! cached. (The margin also costs calls: requests in its window ask the store, which for a key whose tokens
//! accrue every 10 ms is 1 % of a flood's requests.) The residual: a Redis clock stepped forward (an NTP step on the Redis host, or a
//! failover to a replica whose clock runs ahead) by more than the margin while an entry is live admits there
//! earlier than the entry expires — by at most the step, for at most `r`; a step back only makes the cache more
//! conservative than needed.
//!
//! # What would break it, and how each case is handled
//!
//! - **A policy changed under a running key** (a deploy with a larger limit): the cache is one per layer, and a
//!   layer's policy is fixed when it is built; a new layer (new policy) starts with an empty cache. Instances
//!   still running the old policy answer as their own store calls would, under the old policy.
//! - **An operator resetting a key in Redis** (deleting it to lift a block): the cache cannot see it. Call
//!   [`DenyCacheHandle::forget`] for that key or [`DenyCacheHandle::clear`] (from
//!   [`RateLimitLayer::deny_cache_handle`](crate::RateLimitLayer::deny_cache_handle)) on each instance, or wait
//!   out the entry (at most the retry delay the store announced).
//! - **A cheaper request**: entries are cost-aware (see above).
//! - **Two keys with the same digest**: entries are found by a 64-bit digest and checked against a second,
//!   independently keyed one: a wrong denial needs a 128-bit collision.
//! - **A store that synthesizes denials** (a store-level failure policy answering for an unreachable Redis):
//!   such a store must not report `is_shared` (`RedisStore` does not while it has one): its denials are not the
//!   shared state's.
//!
//! Not cached: store errors (the failure policy answers each), admissions, `CostExceedsCapacity`, and the
//! concurrency limiter's refusals. A concurrency denial is not exact in general: a shared lease is released at
//! any time (a response finishes on another instance) and there is no instant before which the store would
//! surely refuse; caching it would refuse what the store admits.
//!
//! # Memory
//!
//! A [`BoundedTable`] with `MemoryStore`'s rules at the bound ([`DenyCache::max_keys`], 65 536 by default, about
//! 120 bytes each with the table's own overhead): an expired entry is replaced first, else the least recently
//! used is evicted — evicting a live entry only costs its key one store call. Expired entries are also swept (at most once a
//! second, from an insertion, shard by shard). Evictions count in `tollgate_evictions_total{limiter}`.
//!
//! # Metrics
//!
//! `tollgate_deny_cache_hits_total{limiter}`: requests the cache refused (or, in shadow mode, would have). Each
//! also counts as an ordinary `limited` (or `shadow_limited`) decision in `tollgate_decisions_total`.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tollgate_core::{Decision, ManualClock, MemoryStore, Policy, Quota, Store, StoreError, Timestamp};
//! use tollgate_tower::{BoxError, ConstKey, DenyCache, RateLimitLayer, Rejection, Verdicts, VerdictSink};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! #[derive(Debug, Default)]
//! struct Reply(Verdicts);
//! impl VerdictSink for Reply {
//!     fn verdicts_mut(&mut self) -> &mut Verdicts { &mut self.0 }
//! }
//!
//! // A stand-in for Redis: a shared store that answers asynchronously.
//! struct Shared(MemoryStore<ManualClock>);
//! impl Store for Shared {
//!     async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
//!         self.0.check_now(key, policy, cost)
//!     }
//!     fn is_shared(&self) -> bool { true }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
//! let store = Arc::new(Shared(MemoryStore::builder().clock(clock.clone()).build()));
//! let layer = RateLimitLayer::new(
//!     "api",
//!     Policy::token_bucket(Quota::per_second(1)?),
//!     store,
//!     ConstKey::new("everyone"),
//! )
//! .deny_cache_config(DenyCache::new().clock(clock.clone()));
//! let cache = layer.deny_cache_handle();
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) });
//!
//! svc.ready().await?.call(()).await?; // the one token
//! let denied = svc.ready().await?.call(()).await.unwrap_err(); // the store's denial, now cached
//! let retry = denied.downcast_ref::<Rejection>().unwrap().retry_after().unwrap();
//! assert_eq!(cache.len(), 1);
//! clock.advance(Duration::from_millis(400));
//! let cached = svc.ready().await?.call(()).await.unwrap_err(); // answered locally
//! assert_eq!(
//!     cached.downcast_ref::<Rejection>().unwrap().retry_after(),
//!     Some(retry - Duration::from_millis(400)),
//! );
//! cache.clear(); // e.g. after an operator reset the key in the store
//! assert!(cache.is_empty());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tollgate_core::store::{BoundedTable, Expiry, OnFull};
use tollgate_core::{Clock, Decision, Outcome, SystemClock};

use crate::Name;

/// Entries a deny cache holds by default.
pub const DEFAULT_DENY_CACHE_KEYS: usize = 1 << 16;

/// Cached denials served from the local cache, by limiter.
pub const DENY_CACHE_HITS_TOTAL: &str = "tollgate_deny_cache_hits_total";

/// The fixed part of the clock-drift margin an entry expires early by, in µs: ten times the largest correction
/// the local clock's resynchronisation makes (some µs).
const MARGIN_FIXED_MICROS: u64 = 100;
/// The proportional part: 1 / 2 000 of the retry delay is 500 ppm, the fastest an NTP daemon slews a clock
/// (Linux's bound), far above two disciplined clocks' rate difference.
const MARGIN_PPM_DIVISOR: u64 = 2_000;
/// The least time between two sweeps of expired entries, in µs.
const SWEEP_EVERY_MICROS: u64 = 1_000_000;

/// How long before the store's retry instant an entry for a retry delay of `retry` µs expires: the bound on
/// the drift between the local clock and the store's over that delay (see the module docs).
#[must_use]
pub const fn drift_margin(retry: Duration) -> Duration {
    let micros = retry.as_micros() as u64;
    Duration::from_micros(MARGIN_FIXED_MICROS + micros / MARGIN_PPM_DIVISOR)
}

/// The deny cache's configuration, for [`RateLimitLayer::deny_cache_config`](crate::RateLimitLayer::deny_cache_config).
#[must_use]
#[derive(Clone)]
pub struct DenyCache {
    max_keys: usize,
    clock: Option<Arc<dyn Clock>>,
}

impl Default for DenyCache {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCache")
            .field("max_keys", &self.max_keys)
            .field(
                "clock",
                &if self.clock.is_some() {
                    "custom"
                } else {
                    "system"
                },
            )
            .finish()
    }
}

impl DenyCache {
    /// [`DEFAULT_DENY_CACHE_KEYS`] entries on the monotonic [`SystemClock`].
    pub fn new() -> Self {
        Self {
            max_keys: DEFAULT_DENY_CACHE_KEYS,
            clock: None,
        }
    }

    /// Holds at most `max_keys` denied keys (at least 1): at the bound an expired entry is replaced, else the
    /// least recently used is evicted.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Measures local time with `clock` (tests drive a [`ManualClock`](tollgate_core::ManualClock)). It must not
    /// run slower than real time: an entry lasts its retry delay by this clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    pub(crate) fn build(&self, limiter: &Name) -> DenyTable {
        DenyTable {
            table: BoundedTable::builder()
                .max_keys(self.max_keys)
                .on_full(OnFull::EvictLru)
                .name(limiter.to_string())
                .build(),
            check: RandomState::new(),
            clock: self
                .clock
                .clone()
                .unwrap_or_else(|| Arc::new(SystemClock::new())),
            hits: metrics::counter!(DENY_CACHE_HITS_TOTAL, "limiter" => limiter.to_string()),
            next_sweep: AtomicU64::new(0),
        }
    }
}

/// One cached denial.
#[derive(Debug, Clone, Copy)]
struct Denial {
    /// The key's second digest, against collisions of the first.
    check: u64,
    /// The cost denied: costs from here up to the burst are covered.
    cost: u64,
    /// Local instant (µs) the request was sent at.
    sent: u64,
    /// Local instant (µs) of the store's retry: `sent + retry_after`.
    due: u64,
    /// Local instant (µs) from which the entry no longer answers: `due` minus the drift margin.
    expires: u64,
    /// The store's decision.
    decision: Decision,
}

impl Expiry for Denial {
    fn expires_at(&self) -> u64 {
        self.expires
    }
}

/// A layer's table of denied keys.
pub(crate) struct DenyTable {
    table: BoundedTable<Denial>,
    check: RandomState,
    clock: Arc<dyn Clock>,
    hits: metrics::Counter,
    next_sweep: AtomicU64,
}

impl DenyTable {
    /// The local instant, in µs: take it before the store is asked.
    pub(crate) fn now(&self) -> u64 {
        self.clock.now().as_micros()
    }

    fn digests(&self, key: &str) -> (u64, u64) {
        (
            self.table.digest(key.as_bytes()),
            self.check.hash_one(key.as_bytes()),
        )
    }

    /// The cached denial of `key` for a request of `cost`, as the store would give it now; `None` when the
    /// store must be asked.
    pub(crate) fn lookup(&self, key: &str, cost: u64) -> Option<Decision> {
        let (digest, check) = self.digests(key);
        let now = self.now();
        let decision = self
            .table
            .get(digest, |d| {
                (d.check == check && d.cost <= cost && cost <= d.decision.limit && now < d.expires)
                    .then(|| Decision {
                        retry_after: Some(Duration::from_micros(d.due - now)),
                        // The local clock may have been set back a little since: never before the store's instant.
                        now: tollgate_core::Timestamp::from_micros(
                            d.decision.now.as_micros() + now.saturating_sub(d.sent),
                        ),
                        ..d.decision
                    })
            })
            .flatten()?;
        self.hits.increment(1);
        Some(decision)
    }

    /// Remembers the store's `decision` on `key` for a request of `cost` sent at local instant `sent`, if it is
    /// a denial that can be cached.
    pub(crate) fn record(&self, key: &str, cost: u64, sent: u64, decision: &Decision) {
        if decision.is_allowed() {
            // A cheaper request spent from the key: an entry would still refuse exactly, but with numbers
            // (`remaining`, `reset`) the store no longer gives. The next costly request asks again.
            self.forget(key);
            return;
        }
        let (Outcome::Limited, Some(retry)) = (decision.outcome, decision.retry_after) else {
            return;
        };
        let margin = drift_margin(retry);
        if retry <= margin || cost == 0 {
            return;
        }
        let due = sent.saturating_add(retry.as_micros() as u64);
        let entry = Denial {
            check: 0,
            cost,
            sent,
            due,
            expires: due - margin.as_micros() as u64,
            decision: *decision,
        };
        let (digest, check) = self.digests(key);
        let now = self.now();
        // Keep a live entry that already covers this one (a reply overtaken by a later one).
        let covered = self
            .table
            .get(digest, |d| {
                d.check == check && now < d.expires && d.cost <= cost && d.expires >= entry.expires
            })
            .unwrap_or(false);
        if covered {
            return;
        }
        // Never refuses (`EvictLru`); an evicted entry only costs its key a store call.
        let _ = self.table.insert(digest, Denial { check, ..entry }, now);
        self.sweep(now);
    }

    /// Drops expired entries, at most once a second (the first insertion after the second passes does it).
    fn sweep(&self, now: u64) {
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now < due
            || self
                .next_sweep
                .compare_exchange(
                    due,
                    now + SWEEP_EVERY_MICROS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        self.table.sweep(now);
    }

    fn forget(&self, key: &str) {
        let (digest, check) = self.digests(key);
        if self.table.get(digest, |d| d.check == check) == Some(true) {
            self.table.remove(digest);
        }
    }
}

/// A handle on one layer's deny cache, to drop denials the store no longer holds (an operator reset a key in
/// Redis). From [`RateLimitLayer::deny_cache_handle`](crate::RateLimitLayer::deny_cache_handle); cheap to clone.
#[derive(Clone)]
pub struct DenyCacheHandle {
    name: Name,
    table: Arc<OnceLock<Arc<DenyTable>>>,
}

impl fmt::Debug for DenyCacheHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCacheHandle")
            .field("limiter", &self.name)
            .field("len", &self.len())
            .finish()
    }
}

impl DenyCacheHandle {
    pub(crate) fn new(name: Name, table: Arc<OnceLock<Arc<DenyTable>>>) -> Self {
        Self { name, table }
    }

    /// Forgets the cached denial of the client key `key` (as the layer's key extractor writes it): the next
    /// request for it asks the store.
    pub fn forget(&self, key: &str) {
        if let Some(table) = self.table.get() {
            table.forget(&format!("{}:{key}", self.name));
        }
    }

    /// Forgets every cached denial.
    pub fn clear(&self) {
        if let Some(table) = self.table.get() {
            table.table.sweep(u64::MAX);
        }
    }

    /// Denied keys held now (expired ones included until replaced or swept).
    #[must_use]
    pub fn len(&self) -> usize {
        self.table.get().map_or(0, |t| t.table.len())
    }

    /// Whether no denial is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the layer built a deny cache (it is on, and a service was built).
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.table.get().is_some()
    }
}
