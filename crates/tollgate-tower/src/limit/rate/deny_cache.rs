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
//! Why that is exact — both algorithms admit at the first instant their state allows, and other traffic only
//! delays it —, where the store's retry instant falls on the local clock (each reply bounds the clocks' offset;
//! less a drift allowance, [`drift_margin`]), what frees tokens early (returned leases, refunds after the response:
//! under-admission only, never over-admission), the single flight on expiry, asking ahead, and each case that
//! would break it: `docs/design/deny-cache.md`. In short:
//!
//! - a cached denial refuses only requests of at least the denied cost, until the store's own retry instant;
//! - a token bucket's admission that leaves less than its cost is cached as the denial the next such request
//!   would get, until the bucket holds the cost again;
//! - just before such an entry expires, one request asks the store ahead and is held until the token accrues
//!   ([`Store::check_held`](tollgate_core::Store::check_held); the Redis store holds): the entry for the token
//!   after lands before the expiry, and a flooded key's requests never wait for a store call;
//! - not cached: store errors, other admissions, `CostExceedsCapacity`, the concurrency limiter's refusals, and
//!   (by default) a limiter that charges after the response;
//! - an operator who resets a key in Redis calls
//!   [`RateLimitLayer::deny_cache_forget`](crate::RateLimitLayer::deny_cache_forget) or
//!   [`RateLimitLayer::deny_cache_clear`](crate::RateLimitLayer::deny_cache_clear) on
//!   each instance (or waits out the entry: at most the retry delay the store announced);
//! - memory is bounded: [`DenyCacheConfig::max_keys`] entries (65 536 by default, about 152 bytes each), evictions
//!   counted in `tollgate_evictions_total{limiter}`.
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
//! use tollgate_tower::{BoxError, DenyCacheConfig, RateLimitLayer, Rejection, Verdicts, VerdictSink};
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
//!     "everyone",
//! )
//! .deny_cache_config(DenyCacheConfig::new().clock(clock.clone()));
//! let cache = layer.clone(); // the clones share the cache
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) });
//!
//! svc.ready().await?.call(()).await?; // the one token: the bucket is empty until the next one
//! let denied = svc.ready().await?.call(()).await.unwrap_err(); // refused by the cache, as the store would
//! let retry = denied.downcast_ref::<Rejection>().unwrap().retry_after().unwrap();
//! assert_eq!(cache.deny_cache_len(), 1);
//! clock.advance(Duration::from_millis(400));
//! let cached = svc.ready().await?.call(()).await.unwrap_err(); // answered locally
//! assert_eq!(
//!     cached.downcast_ref::<Rejection>().unwrap().retry_after(),
//!     Some(retry - Duration::from_millis(400)),
//! );
//! cache.deny_cache_clear(); // e.g. after an operator reset the key in the store
//! assert!(cache.deny_cache_is_empty());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};

use ahash::RandomState;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tollgate_core::KeyHasher;

use event_listener::{Event, EventListener};
use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};
use tollgate_core::store::{BoundedTable, Expiry, OnFull};
use tollgate_core::{Algorithm, Clock, Decision, Outcome, Policy, StoreError, Timestamp};

use crate::Name;

/// Entries a deny cache holds by default.
pub const DEFAULT_DENY_CACHE_KEYS: usize = 1 << 16;

/// Cached denials served from the local cache, by limiter.
pub const DENY_CACHE_HITS_TOTAL: &str = "tollgate_deny_cache_hits_total";

/// The fixed part of the clock-drift margin an entry expires early by on a clock that may step (a clock of one's
/// own, [`DenyCacheConfig::clock`]), in µs: ten times the largest correction
/// [`SystemClock`](tollgate_core::SystemClock)'s resynchronisation makes (some µs).
const MARGIN_FIXED_MICROS: u64 = 100;
/// The fixed part on a clock that never steps (the default monotonic clock, [`DenyCacheConfig::steady_clock`]): the
/// readings' rounding to whole µs, the local one's and the store's.
const STEADY_FIXED_MICROS: u64 = 1;
/// The proportional part: 1 / 2 000 of the retry delay is 500 ppm, the fastest an NTP daemon slews a clock
/// (Linux's bound), far above two disciplined clocks' rate difference.
const MARGIN_PPM_DIVISOR: u64 = 2_000;
/// [`MARGIN_PPM_DIVISOR`], to divide a `Duration` by.
const PPM_DIVISOR: u32 = MARGIN_PPM_DIVISOR as u32;
/// The oldest reply whose bound on the clocks' offset a key's next entry still uses, in µs: with 500 ppm of drift
/// it is worth at most 500 µs less than a fresh one by then, and a key that moved to another server (a failover,
/// resharding) keeps the old server's bound no longer than this.
const OFFSET_MAX_AGE_MICROS: u64 = 1_000_000;
/// The least time between two sweeps of expired entries, in µs.
const SWEEP_EVERY_MICROS: u64 = 1_000_000;
/// The longest an expired entry still coalesces its key's store calls after its retry instant, in µs (and at most
/// its retry delay): long enough for the calls that follow an expiry (a few round trips), short enough that a key
/// which stopped being refused soon goes back to concurrent calls.
const FLIGHT_WINDOW_MICROS: u64 = 1_000_000;
/// The most single flights one request waits for before it asks the store itself.
const MAX_WAITS: u32 = 4;
/// How long before a token bucket's entry expires the key's next request asks the store ahead, to be held until
/// the token accrues (µs): longer than a store call takes under load, so that the reply (and the entry for the
/// token after) lands before the entry expires and the key's other requests never wait for the store.
const AHEAD_MICROS: u64 = 2_000;

/// How long before the store's retry instant, `retry` after a request was sent, a local clock that may be
/// corrected by some µs (such as [`SystemClock`](tollgate_core::SystemClock), or a clock given to
/// [`DenyCacheConfig::clock`]) must stop counting on a denial: the bound on the drift between it and the store's
/// clock over that delay, 100 µs + 500 ppm of `retry`. A deny cache entry expires by it when the reply is the only one that
/// bounds the clocks' offset; on the default monotonic clock the fixed part is 1 µs, and a key's earlier replies
/// can move the expiry closer to the store's instant (see the module docs).
#[must_use]
pub const fn drift_margin(retry: Duration) -> Duration {
    let micros = retry.as_micros() as u64;
    Duration::from_micros(MARGIN_FIXED_MICROS + micros / MARGIN_PPM_DIVISOR)
}

/// The default local clock: the system's monotonic clock (`Instant`: `CLOCK_MONOTONIC` on Linux), which an NTP
/// daemon slews but never steps, so an entry on it needs no allowance for a step of its own clock.
struct Monotonic(Instant);

impl Clock for Monotonic {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(u64::try_from(self.0.elapsed().as_micros()).unwrap_or(u64::MAX))
    }
}

/// What the store's replies for a key say about its clock against the local one: `bound` is the store's
/// instant of a decision minus the local instant `at` its request was sent at (µs). The store decided after the
/// send, so its clock then ran ahead of the local one by at most `bound`; `at + Δ` later, by at most `bound` +
/// 500 ppm of Δ.
#[derive(Debug, Clone, Copy)]
struct Offset {
    bound: i64,
    at: u64,
}

impl Offset {
    /// The bound one reply gives: `decision` of a request sent at local instant `sent`.
    fn of(sent: u64, decision: &Decision) -> Self {
        Self {
            bound: signed(decision.now.as_micros()).saturating_sub(signed(sent)),
            at: sent,
        }
    }

    /// The bound as of local instant `t` (no earlier than `at`): drift of at most 500 ppm since.
    fn by(self, t: u64) -> i64 {
        self.bound
            .saturating_add(signed(t.saturating_sub(self.at) / MARGIN_PPM_DIVISOR))
    }

    /// The tighter of two bounds, as of the later one's instant (both then age alike); a bound older than
    /// [`OFFSET_MAX_AGE_MICROS`] by then loses.
    fn min(self, other: Self) -> Self {
        let (older, newer) = if self.at <= other.at {
            (self, other)
        } else {
            (other, self)
        };
        if newer.at - older.at > OFFSET_MAX_AGE_MICROS || newer.bound <= older.by(newer.at) {
            newer
        } else {
            older
        }
    }

    /// The local instant, by this bound, no later than the one at which the store's clock reads `instant` (µs),
    /// before the allowance for a step of the local clock: `instant − bound`, less 500 ppm of the time from `at`
    /// to then.
    fn local(self, instant: u64) -> u64 {
        let estimate = i128::from(instant) - i128::from(self.bound);
        let drift = (estimate - i128::from(self.at)).max(0) / i128::from(MARGIN_PPM_DIVISOR);
        u64::try_from((estimate - drift).max(0)).unwrap_or(u64::MAX)
    }
}

/// `x` as a signed number of µs (saturating: no clock reads 2^63 µs).
fn signed(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

/// The deny cache's configuration, for [`RateLimitLayer::deny_cache_config`](crate::RateLimitLayer::deny_cache_config).
#[must_use]
#[derive(Clone)]
pub struct DenyCacheConfig {
    max_keys: usize,
    clock: Option<Arc<dyn Clock>>,
    /// The fixed part of the margin (µs): how far the clock may step, with the readings' rounding.
    fixed: u64,
}

impl Default for DenyCacheConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for DenyCacheConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCacheConfig")
            .field("max_keys", &self.max_keys)
            .field(
                "clock",
                &match (&self.clock, self.fixed) {
                    (None, _) => "monotonic",
                    (Some(_), STEADY_FIXED_MICROS) => "custom, steady",
                    (Some(_), _) => "custom",
                },
            )
            .finish()
    }
}

impl DenyCacheConfig {
    /// [`DEFAULT_DENY_CACHE_KEYS`] entries on the system's monotonic clock (`Instant`, which never steps).
    pub fn new() -> Self {
        Self {
            max_keys: DEFAULT_DENY_CACHE_KEYS,
            clock: None,
            fixed: STEADY_FIXED_MICROS,
        }
    }

    /// Holds at most `max_keys` denied keys (at least 1): at the bound an expired entry is replaced, else one not
    /// used since the eviction hand last passed it is evicted.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Measures local time with `clock` (tests drive a [`ManualClock`](tollgate_core::ManualClock)). It must not
    /// run slower than real time: an entry lasts its retry delay by this clock. It may be corrected (stepped
    /// either way) by some µs, as [`SystemClock`](tollgate_core::SystemClock) is: entries then expire 100 µs
    /// earlier than on a clock that never steps ([`drift_margin`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self.fixed = MARGIN_FIXED_MICROS;
        self
    }

    /// Measures local time with `clock`, which never steps: it runs at real time's rate (within 500 ppm) and is
    /// never set back or forward (a monotonic clock; a [`ManualClock`](tollgate_core::ManualClock) only ever
    /// advanced). Entries need no allowance for a step then, only 1 µs for rounding, as on the default clock.
    pub fn steady_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self.fixed = STEADY_FIXED_MICROS;
        self
    }

    pub(crate) fn build(&self, limiter: &Name) -> DenyTable {
        DenyTable {
            table: BoundedTable::builder()
                .max_keys(self.max_keys)
                .on_full(OnFull::Evict)
                .name(limiter.clone())
                .build(),
            seed: RandomState::new(),
            clock: self
                .clock
                .clone()
                .unwrap_or_else(|| Arc::new(Monotonic(Instant::now()))),
            fixed: self.fixed,
            hits: metrics::counter!(DENY_CACHE_HITS_TOTAL, "limiter" => limiter.to_string()),
            next_sweep: AtomicU64::new(0),
        }
    }
}

/// One cached denial.
#[derive(Debug, Clone)]
struct Denial {
    /// The key's second digest, against collisions of the first.
    check: u64,
    /// The digest of the key's text, by which an operator forgets it ([`RateLimitLayer::deny_cache_forget`](crate::RateLimitLayer::deny_cache_forget)).
    text: u64,
    /// The cost denied: costs from here up to the burst are covered.
    cost: u64,
    /// Local instant (µs) the request was sent at.
    sent: u64,
    /// Local instant (µs) of the store's retry, as the headers count down to it: `sent + retry_after`, or later
    /// where the key's replies bound the clocks' offset tighter (by that bound and its drift allowance).
    due: u64,
    /// Local instant (µs) from which the entry no longer answers: the store's retry instant by the tightest bound
    /// on the clocks' offset, less the drift since that bound and the clock's step allowance.
    expires: u64,
    /// The tightest bound on the clocks' offset the key's replies gave.
    offset: Offset,
    /// Local instant (µs) from which the key's next request asks the store ahead, to be held until the token
    /// accrues (`u64::MAX`: never; only a token bucket without a lockout holds).
    ahead_at: u64,
    /// Whether the store held the key's requests asked ahead (until one of them comes back refused within its
    /// hold), carried from entry to entry.
    holds: bool,
    /// Local instant (µs) until which the expired entry still coalesces the key's store calls (single flight).
    coalesce_until: u64,
    /// The store call under way for the key since the entry expired, which other requests for it wait for.
    flight: Option<Arc<Flight>>,
    /// The store's decision.
    decision: Decision,
}

impl Denial {
    /// Starts the key's single flight: the store call the key's other requests wait for.
    fn fly(&mut self) -> Arc<Flight> {
        let flight = Arc::new(Flight::default());
        self.flight = Some(flight.clone());
        flight
    }
}

impl Expiry for Denial {
    fn expires_at(&self) -> u64 {
        self.coalesce_until
    }
}

/// The one store call for an expired entry's key, and the requests waiting for its reply.
#[derive(Debug, Default)]
struct Flight {
    landed: Event,
    /// Set when the call brought the store's decision: the waiters look at the entry again (refused from the
    /// new one, or the next of them asks). Unset when it failed or was dropped: they ask on their own, so that
    /// none queues behind an outage.
    decided: AtomicBool,
}

/// What a request for a key whose cached denial it may wait on does.
enum Enter {
    /// Refused with the cached decision.
    Hit(Decision),
    /// Asks the store, as the key's single flight.
    Probe(Arc<Flight>),
    /// Asks the store ahead of the entry's expiry, as the key's single flight, ready to be held for up to this
    /// long; the key's other requests are still refused by the entry meanwhile.
    Ahead(Arc<Flight>, Duration),
    /// Waits for the flight under way.
    Wait(Arc<Flight>, EventListener),
    /// Asks the store on its own (no entry covers it, or it waited long enough).
    Alone,
}

/// A key's two digests in a [`DenyTable`]: the entry's and the check against collisions of the first.
#[derive(Clone, Copy)]
pub(crate) struct KeyDigests {
    digest: u64,
    check: u64,
}

/// What [`DenyTable::decide`] got for a request.
pub(crate) enum Asked {
    /// Refused from a cached denial, with the numbers the store gave.
    Cached(Decision),
    /// The store's own answer.
    Store(Result<Decision, StoreError>),
}

/// A request's turn at a key the deny cache may hold.
enum Turn<'a> {
    /// Refuse it with this cached decision.
    Refuse(Decision),
    /// Ask the store (ready to hold the request for the duration, if not zero); with the key's single flight,
    /// hold the flight until the reply is recorded.
    Ask(Option<FlightGuard<'a>>, Duration),
}

/// Held by the request that asks the store for an expired entry's key; dropping it lets the waiters go.
pub(crate) struct FlightGuard<'a> {
    table: &'a DenyTable,
    digest: u64,
    check: u64,
    flight: Arc<Flight>,
}

impl FlightGuard<'_> {
    /// The store decided, and the decision is recorded: the waiters look at the entry again.
    pub(crate) fn decided(&self) {
        self.flight.decided.store(true, Ordering::Release);
    }
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        // A new entry (a denial recorded) replaced the flight already; otherwise the key has none under way now.
        self.table.table.get(self.digest, |d| {
            if d.check == self.check
                && d.flight
                    .as_ref()
                    .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
            {
                d.flight = None;
            }
        });
        self.flight.landed.notify(usize::MAX);
    }
}

/// A layer's table of denied keys.
pub(crate) struct DenyTable {
    table: BoundedTable<Denial>,
    /// The key of every digest the table takes.
    seed: RandomState,
    clock: Arc<dyn Clock>,
    /// The fixed part of the margin an entry expires early by (µs).
    fixed: u64,
    hits: metrics::Counter,
    next_sweep: AtomicU64,
}

/// What a key's state is carried on by for its second digest.
const CHECK_BLOCK: u64 = u64::from_le_bytes(*b"checkkey");

impl DenyTable {
    /// The local instant, in µs: take it before the store is asked.
    pub(crate) fn now(&self) -> u64 {
        self.clock.now().as_micros()
    }

    /// A hasher keyed by this table's seed: write a key's parts into it, then [`finish`](Self::finish) it.
    pub(crate) fn hasher(&self) -> KeyHasher {
        self.seed.build_hasher()
    }

    /// The digests of the key written into `state`: the entry's, and the check against its collisions — the same
    /// state carried one block further, so that the key is read once and two keys whose entry digests collide
    /// still differ in their checks.
    #[inline]
    pub(crate) fn finish(state: KeyHasher) -> KeyDigests {
        let digest = state.finish();
        let mut further = state;
        further.write_u64(CHECK_BLOCK);
        KeyDigests {
            digest,
            check: further.finish(),
        }
    }

    /// The digests of a key's text.
    pub(crate) fn key(&self, key: &str) -> KeyDigests {
        let mut state = self.hasher();
        state.write(key.as_bytes());
        Self::finish(state)
    }

    /// The digests of `key` decided under `policy`, for a table shared by keys whose policy may change (a
    /// store wrapped by [`DenyCacheConfig::around`]): an entry answers only requests under the policy it was made
    /// under.
    pub(crate) fn key_under(&self, key: &str, policy: &Policy) -> KeyDigests {
        let mut state = self.hasher();
        state.write(key.as_bytes());
        policy.hash(&mut state);
        Self::finish(state)
    }

    /// The cached denial of the key `key` digests for a request of `cost`, as the store would give it now; `None`
    /// when the store must be asked.
    pub(crate) fn lookup(&self, key: KeyDigests, cost: u64) -> Option<Decision> {
        let KeyDigests { digest, check } = key;
        let now = self.now();
        let decision = self
            .table
            .get(digest, |d| {
                (d.check == check
                    && covers(d, cost)
                    && now < d.expires
                    && (now < d.ahead_at || d.flight.is_some()))
                .then(|| answer(d, now))
            })
            .flatten()?;
        self.hits.increment(1);
        Some(decision)
    }

    /// Decides a request on the key `key` digests (`text` its text) with this cache: refused from an entry (one a
    /// flight it waited for brought), or asked of the store by `ask` — as the key's single flight when its entry
    /// has just expired, while the others wait for that reply (at most [`MAX_WAITS`] flights, each one store
    /// call) — whose answer is recorded; or, just before a token bucket's entry expires, asked ahead by `ask` with
    /// a hold ([`Store::check_held`](tollgate_core::Store::check_held)), the admission it brings held here until
    /// the store's clock reaches its instant. Measured from before the request is sent: the store decides no
    /// earlier.
    pub(crate) async fn decide<F>(
        &self,
        key: KeyDigests,
        text: &str,
        policy: &Policy,
        cost: u64,
        ask: impl FnOnce(Duration) -> F,
    ) -> Asked
    where
        F: Future<Output = Result<Decision, StoreError>>,
    {
        let (flight, hold) = match self.turn(key, cost).await {
            Turn::Refuse(decision) => return Asked::Cached(decision),
            Turn::Ask(flight, hold) => (flight, hold),
        };
        let sent = self.now();
        let mut result = ask(hold).await;
        match &result {
            Ok(decision) => {
                self.record(key, text, policy, cost, sent, hold, decision);
                if let Some(flight) = &flight {
                    flight.decided();
                }
            }
            // Asked ahead, and the store failed: the entry, still live, refuses the request as it would have
            // without asking, and the key waits for the entry's expiry (its failure policy then answers).
            Err(_) if !hold.is_zero() => {
                if let Some(decision) = self.ahead_failed(key, cost) {
                    return Asked::Cached(decision);
                }
            }
            Err(_) => {}
        }
        drop(flight);
        if let Ok(decision) = &mut result
            && let Some(wait) = held(decision)
        {
            // The store's clock read the decision's `now` before the reply arrived: it reaches the admission's
            // instant no later than `wait` from here, and the drift allowance, on this clock.
            let allowance = wait / PPM_DIVISOR + Duration::from_micros(self.fixed);
            tokio::time::sleep(wait + allowance).await;
            decision.now = decision.now.saturating_add(wait);
            decision.retry_after = None;
        }
        Asked::Store(result)
    }

    async fn turn(&self, key: KeyDigests, cost: u64) -> Turn<'_> {
        let KeyDigests { digest, check } = key;
        let guard = |flight| {
            Some(FlightGuard {
                table: self,
                digest,
                check,
                flight,
            })
        };
        let mut waits = 0;
        loop {
            match self.enter(digest, check, cost, waits < MAX_WAITS) {
                Enter::Hit(decision) => {
                    self.hits.increment(1);
                    return Turn::Refuse(decision);
                }
                Enter::Probe(flight) => return Turn::Ask(guard(flight), Duration::ZERO),
                Enter::Ahead(flight, hold) => return Turn::Ask(guard(flight), hold),
                Enter::Alone => return Turn::Ask(None, Duration::ZERO),
                Enter::Wait(flight, landed) => {
                    landed.await;
                    if !flight.decided.load(Ordering::Acquire) {
                        return Turn::Ask(None, Duration::ZERO);
                    }
                    waits += 1;
                }
            }
        }
    }

    /// One look at the key's entry, under its shard's lock: a live entry answers (but for one request, which asks
    /// ahead, just before a token bucket's entry expires); an expired one within its window sends one request to
    /// the store and makes the others wait (a listener registered under the lock the flight is cleared under, so
    /// no wake-up is missed).
    fn enter(&self, digest: u64, check: u64, cost: u64, may_wait: bool) -> Enter {
        let now = self.now();
        self.table
            .get(digest, |d| {
                if d.check != check || !covers(d, cost) || now >= d.coalesce_until {
                    return Enter::Alone;
                }
                if now < d.expires {
                    if now < d.ahead_at || d.flight.is_some() {
                        return Enter::Hit(answer(d, now));
                    }
                    // Held up to the store's instant, as far as this clock can tell, and as long again: a reply
                    // whose request reached the store later than that is a plain answer.
                    let hold = d.due.saturating_sub(now) + AHEAD_MICROS;
                    return Enter::Ahead(d.fly(), Duration::from_micros(hold));
                }
                match &d.flight {
                    Some(flight) if may_wait => Enter::Wait(flight.clone(), flight.landed.listen()),
                    Some(_) => Enter::Alone,
                    None => Enter::Probe(d.fly()),
                }
            })
            .unwrap_or(Enter::Alone)
    }

    /// Remembers the store's `decision` under `policy` on `key` for a request of `cost` sent at local instant
    /// `sent` (ready to be held for `hold`, if not zero), if it is a denial that can be cached, or an admission
    /// that tells the denial the key's next such request would get ([`next_denial`]); any reply also tightens the
    /// bound on the clocks' offset an entry for the key keeps.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        key: KeyDigests,
        text: &str,
        policy: &Policy,
        cost: u64,
        sent: u64,
        hold: Duration,
        decision: &Decision,
    ) {
        // A request asked ahead that the store refused though its instant fell within the hold: the store does
        // not hold (or not for this key: tokens leased on it), and the key's next entries do not ask ahead.
        let unheld = !hold.is_zero()
            && !decision.is_allowed()
            && decision.retry_after.is_some_and(|retry| retry <= hold);
        let from_admission = decision.is_allowed();
        let next;
        let decision = if decision.is_allowed() {
            // A held admission is the store's at the instant the entry announced (or later): the entry stays
            // until the one for the next denial replaces it.
            if held(decision).is_none() {
                self.admitted(key, sent, decision);
            }
            let Some(denial) = next_denial(policy, cost, decision) else {
                return;
            };
            next = denial;
            &next
        } else {
            decision
        };
        let (Outcome::Limited, Some(retry)) = (decision.outcome, decision.retry_after) else {
            return;
        };
        let KeyDigests { digest, check } = key;
        let now = self.now();
        let own = Offset::of(sent, decision);
        // The key's earlier replies (to the same server, which keeps one clock) may bound the offset tighter:
        // one whose request reached the store sooner after its send.
        let previous = self
            .table
            .get(digest, |d| {
                (d.check == check).then(|| {
                    d.offset = d.offset.min(own);
                    d.holds &= !unheld;
                    (d.offset, d.cost, d.expires, d.coalesce_until, d.holds)
                })
            })
            .flatten();
        let offset = previous.map_or(own, |(offset, ..)| offset);
        let holds = previous.map_or(!unheld, |(.., holds)| holds);
        let retry_micros = u64::try_from(retry.as_micros()).unwrap_or(u64::MAX);
        let instant = decision.now.as_micros().saturating_add(retry_micros);
        let latest = own.local(instant).max(offset.local(instant));
        let expires = latest.saturating_sub(self.fixed);
        if expires <= sent || cost == 0 {
            return;
        }
        let due = sent.saturating_add(retry_micros).max(latest);
        // A denial just before the instant (a retry of some µs) does not shorten the key's coalescing window: its
        // entry expires before the waiters look again, and they would all ask at once.
        let coalesce_until = previous
            .map_or(0, |(.., until, _)| until)
            .max(due.saturating_add(retry_micros.min(FLIGHT_WINDOW_MICROS)));
        // Asked ahead: a token bucket's entry (no lockout) that an admission made (a flooded key: the next token
        // is the key's next admission) and that lives longer than the lead, on a store that holds.
        let ahead = holds
            && from_admission
            && policy.algorithm() == Algorithm::TokenBucket
            && policy.lockout_micros() == 0
            && expires.saturating_sub(now) > AHEAD_MICROS;
        let entry = Denial {
            check,
            text: self.key(text).digest,
            cost,
            sent,
            due,
            expires,
            ahead_at: if ahead {
                expires - AHEAD_MICROS
            } else {
                u64::MAX
            },
            holds,
            coalesce_until,
            offset,
            flight: None,
            decision: *decision,
        };
        // Keep a live entry that already covers this one (a reply overtaken by a later one).
        if previous.is_some_and(|(_, covering, until, ..)| {
            now < until && covering <= cost && until >= entry.expires
        }) {
            return;
        }
        // Never refuses (`Evict`); an evicted entry only costs its key a store call.
        let _ = self.table.insert(digest, entry, now);
        self.sweep(now);
    }

    /// A request on `key` asked ahead and the store failed: the key's entry asks ahead no more, and answers the
    /// request if it still covers it.
    fn ahead_failed(&self, key: KeyDigests, cost: u64) -> Option<Decision> {
        let KeyDigests { digest, check } = key;
        self.table.get(digest, |d| {
            if d.check == check {
                d.ahead_at = u64::MAX;
            }
        });
        self.lookup(key, cost)
    }

    /// The store admitted a request for `key`, sent at local instant `sent`.
    fn admitted(&self, key: KeyDigests, sent: u64, decision: &Decision) {
        let KeyDigests { digest, check } = key;
        let now = self.now();
        // A live entry goes: a cheaper request spent from the key, and the entry would still refuse exactly, but
        // with numbers (`remaining`, `reset`) the store no longer gives; the next costly request asks again. An
        // expired one stays while the key has no room for another request of its cost (the token that accrued
        // is spent): the next request then asks alone, the others wait for it, as after the expiry; the reply
        // bounds the clocks' offset for the entry the next denial makes.
        let drop = self.table.get(digest, |d| {
            if d.check != check {
                return false;
            }
            if now < d.expires || decision.remaining >= d.cost {
                return true;
            }
            d.offset = d.offset.min(Offset::of(sent, decision));
            false
        });
        if drop == Some(true) {
            self.table.remove(digest);
        }
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

    /// Ends the cached denial of the key `key` digests, if any: the key's state changed under it (a set gave
    /// back what a request it refused had spent), and the next request on the key asks the store.
    pub(crate) fn expire(&self, key: KeyDigests) {
        let now = self.now();
        self.table.get(key.digest, |d| {
            if d.check == key.check {
                d.expires = d.expires.min(now);
            }
        });
    }

    /// Forgets every entry.
    pub(crate) fn clear(&self) {
        self.table.sweep(u64::MAX);
    }

    /// Entries held (expired ones included until replaced or swept).
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Forgets the entry of the key whose text is `key` (entries are found by digests of the key's parts, which
    /// the text does not give: a scan, for an operator's action).
    pub(crate) fn forget(&self, key: &str) {
        let text = self.key(key).digest;
        self.table.remove_where(|d| d.text == text);
    }
}

/// The denial the store would give the next request of `cost` after admitting one of `cost` with `decision`,
/// where the decision alone tells it: a token bucket (without a lockout, whose denial would start one) that the
/// admission left short of `cost`. The reply gives the bucket's `full_at` (its reset) but not the sub-µs remainder
/// of its state; the algorithm run on the remainder that refills soonest (one unit short of a µs) gives the earliest
/// instant the store can admit `cost` again: no later than the store's own, and at most 1 µs before it. A sliding
/// window's next admission depends on counts the decision does not give: its admissions make no entry.
fn next_denial(policy: &Policy, cost: u64, decision: &Decision) -> Option<Decision> {
    let quota = policy.quota();
    if policy.algorithm() != Algorithm::TokenBucket
        || policy.lockout_micros() > 0
        || !decision.is_allowed()
        || decision.limit != quota.burst()
        || decision.remaining >= cost
    {
        return None;
    }
    let soonest = TokenBucketState {
        full_at: decision.reset.as_micros(),
        remainder: quota.token_bucket_rate() - 1,
    };
    // Refused there too (a cost above the burst is not, and has no retry instant): the retry is the entry's.
    let retry = token_bucket::decide(Some(soonest), &quota, cost, decision.now)
        .decision
        .retry_after
        .filter(|retry| !retry.is_zero())?;
    Some(Decision {
        outcome: Outcome::Limited,
        retry_after: Some(retry),
        ..*decision
    })
}

/// How long the store held an admission back ([`Store::check_held`](tollgate_core::Store::check_held)): the wait
/// from its `now` to the instant it was admitted as of; `None` for any other decision.
fn held(decision: &Decision) -> Option<Duration> {
    decision
        .retry_after
        .filter(|wait| decision.is_allowed() && !wait.is_zero())
}

/// Whether `entry` answers a request of `cost`: costs from the one denied up to the limit.
fn covers(entry: &Denial, cost: u64) -> bool {
    entry.cost <= cost && cost <= entry.decision.limit
}

/// The cached decision as the store would give it at local instant `now` (before the entry expires).
fn answer(entry: &Denial, now: u64) -> Decision {
    Decision {
        retry_after: Some(Duration::from_micros(entry.due - now)),
        // The local clock may have been set back a little since: never before the store's instant.
        now: tollgate_core::Timestamp::from_micros(
            entry.decision.now.as_micros() + now.saturating_sub(entry.sent),
        ),
        ..entry.decision
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};
    use tollgate_core::{Policy, Quota, Timestamp};

    use super::next_denial;

    /// Quotas whose refill is not a whole number of µs per token (`rate` > 1) as well as ones where it is.
    fn quotas() -> impl Strategy<Value = Quota> {
        (1..40_u64, 1..5_000_000_u64, 0..3_u64).prop_map(|(limit, period, extra)| {
            let quota = Quota::new(limit, std::time::Duration::from_micros(period)).unwrap();
            quota.with_burst(limit + extra * limit).unwrap()
        })
    }

    proptest! {
        /// After any admission that leaves a token bucket short of the cost, the entry's retry instant is when the
        /// bucket holds the cost again, to the µs: the store refuses the cost 1 µs before it and admits it 1 µs
        /// after (an instant the entry no longer covers). With room left, no entry.
        #[test]
        fn an_admissions_entry_ends_when_the_bucket_can_admit_again(
            quota in quotas(),
            history in prop::collection::vec((0..3_000_000_u64, 1..6_u64), 1..30),
        ) {
            let policy = Policy::token_bucket(quota);
            let mut state: Option<TokenBucketState> = None;
            let mut now = 1_000_000_000_u64;
            for (advance, cost) in history {
                now += advance;
                let cost = cost.min(quota.burst());
                let step = token_bucket::decide(state, &quota, cost, Timestamp::from_micros(now));
                if step.state.is_some() {
                    state = step.state;
                }
                let decision = step.decision;
                let next = next_denial(&policy, cost, &decision);
                if !decision.is_allowed() || decision.remaining >= cost {
                    prop_assert!(next.is_none(), "{decision:?} made {next:?}");
                    continue;
                }
                let at = |t: u64| token_bucket::decide(state, &quota, cost, Timestamp::from_micros(t)).decision;
                match next {
                    Some(denial) => {
                        let retry = u64::try_from(denial.retry_after.unwrap().as_micros()).unwrap();
                        let admit_at = now + retry;
                        prop_assert!(!at(admit_at - 1).is_allowed(), "admitted before {admit_at}: {decision:?}");
                        prop_assert!(at(admit_at + 1).is_allowed(), "refused after {admit_at}: {decision:?}");
                        prop_assert_eq!(
                            (denial.limit, denial.remaining, denial.reset, denial.now),
                            (decision.limit, decision.remaining, decision.reset, decision.now)
                        );
                    }
                    // The bucket holds the cost again within a µs.
                    None => prop_assert!(at(now + 1).is_allowed(), "{decision:?}"),
                }
            }
        }
    }

    /// A sliding window's admission, or a token bucket's under a lockout, makes no entry.
    #[test]
    fn no_entry_where_the_decision_does_not_tell_the_next_denial() {
        let quota = Quota::per_second(1).unwrap();
        let decision = token_bucket::decide(None, &quota, 1, Timestamp::from_micros(1)).decision;
        assert!(next_denial(&Policy::token_bucket(quota), 1, &decision).is_some());
        let locking = Policy::token_bucket(quota)
            .with_lockout(std::time::Duration::from_secs(5))
            .unwrap();
        assert!(next_denial(&locking, 1, &decision).is_none());
        let window = Policy::sliding_window(quota).unwrap();
        assert!(next_denial(&window, 1, &decision).is_none());
    }
}
