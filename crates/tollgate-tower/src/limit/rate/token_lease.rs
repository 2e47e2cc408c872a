//! Token leases: a hot key's tokens spent from a local batch leased from the shared store, exactly.
//!
//! With [`RateLimitLayer::leases`](crate::RateLimitLayer::leases) (opt-in; stores whose
//! [`supports_token_leases`](tollgate_core::Store::supports_token_leases) is true), the layer watches each key's
//! local demand. A key that asks for at least two tokens within a batch's time is **hot**: the layer leases a batch
//! of k tokens (token bucket) or window slots (sliding window) for it in **one** store call
//! ([`Store::lease_tokens`], one Lua script on Redis: the store debits them at
//! once, as if k requests had been admitted) and admits locally from it, with no round trip. Cold keys keep the
//! plain path (one store call each, the deny cache included).
//!
//! How a batch's size adapts, when the next is fetched, how requests wait on a fetch under way, short grants,
//! deadlines (before the store's own: less [`drift_margin`]), returns, what happens when the store forgets
//! ([`TokenLeaseGrant::held`] cuts the batch), failures, lockouts, why the fleet stays exact, and what a response's
//! `remaining` shows under leases (this instance's view: never above it, never rising but by refill):
//! `docs/design/token-leases.md`. Configured by [`LeaseConfig`]; stopped by
//! [`RateLimitLayer::leases_shutdown`](crate::RateLimitLayer::leases_shutdown).
//!
//! # Metrics
//!
//! `tollgate_token_lease_calls_total{limiter, call}` with `call` = `fetch` or `return` (store calls made by
//! leases), `tollgate_token_lease_local_total{limiter, outcome}` with `allowed` or `limited` (decisions answered
//! from a batch, also counted as ordinary decisions in `tollgate_decisions_total`).
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_tower::{BoxError, LeaseConfig, RateLimitLayer, Verdicts, VerdictSink};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! #[derive(Debug, Default)]
//! struct Reply(Verdicts);
//! impl VerdictSink for Reply {
//!     fn verdicts_mut(&mut self) -> &mut Verdicts { &mut self.0 }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! // Any store that leases tokens: Redis in production, the in-process store here.
//! let store = Arc::new(MemoryStore::new());
//! let layer = RateLimitLayer::new("api", Policy::token_bucket(Quota::per_second(1_000)?), store, "k")
//!     .leases(LeaseConfig::new().share_percent(5)?);
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer.clone()) // the clones share the leases
//!     .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) });
//! for _ in 0..200 {
//!     svc.ready().await?.call(()).await?;
//!     tokio::task::yield_now().await; // lets a fetch land
//! }
//! assert!(layer.leases_local_admissions() > 100); // most were admitted from a batch
//! layer.leases_shutdown().await; // unspent tokens go back to the store
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use event_listener::{Event, EventListener};
use std::sync::Mutex;
use tollgate_core::store::{BoundedTable, Evicted, Expiry, OnFull};
use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{
    Algorithm, Clock, Decision, Outcome, Policy, Store, StoreError, SystemClock, Timestamp,
};

use super::deny_cache::drift_margin;
use crate::{ConfigError, Name};

/// Store calls made by token leases, by limiter and `call` (`fetch`, `return`).
pub const TOKEN_LEASE_CALLS_TOTAL: &str = "tollgate_token_lease_calls_total";
/// Decisions answered from a leased batch, by limiter and `outcome` (`allowed`, `limited`).
pub const TOKEN_LEASE_LOCAL_TOTAL: &str = "tollgate_token_lease_local_total";

/// Keys a lease table holds by default (hot and recently seen keys).
pub const DEFAULT_LEASE_KEYS: usize = 1 << 14;

/// How long a request waits for its key's fetch under way by default ([`LeaseConfig::wait`]).
const DEFAULT_WAIT: Duration = Duration::from_secs(1);

/// How long a failed fetch keeps the next one off, in µs.
const RETRY_FAILED_MICROS: u64 = 100_000;

/// The token lease configuration, for [`RateLimitLayer::leases`](crate::RateLimitLayer::leases).
#[must_use]
#[derive(Clone)]
pub struct LeaseConfig {
    share_ppm: u64,
    batch_lasts: u32,
    ttl: Option<Duration>,
    idle: Option<Duration>,
    max_keys: usize,
    return_on_drop: bool,
    wait: Option<Duration>,
    clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for LeaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseConfig")
            .field("share_ppm", &self.share_ppm)
            .field(
                "batch_lasts",
                &format_args!("1/{} of the period", self.batch_lasts),
            )
            .field("ttl", &self.ttl)
            .field("idle", &self.idle)
            .field("max_keys", &self.max_keys)
            .field("return_on_drop", &self.return_on_drop)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseConfig {
    /// Batches of at most 10 % of the burst, each sized for a tenth of the period, a lease lifetime of the
    /// period (at least 100 ms, at most 10 s), returned after twice a batch's time idle.
    pub fn new() -> Self {
        Self {
            share_ppm: 100_000,
            batch_lasts: 10,
            ttl: None,
            idle: None,
            max_keys: DEFAULT_LEASE_KEYS,
            return_on_drop: true,
            wait: None,
            clock: None,
        }
    }

    /// The largest batch, as a percentage of the burst (1 to 100): what one instance can take from the others
    /// at once, and the most a crash of it can lose. A token bucket's is also bounded by its refill (see
    /// [`ttl`](Self::ttl)).
    ///
    /// # Errors
    /// When `percent` is not from 1 to 100.
    pub fn share_percent(mut self, percent: u32) -> Result<Self, ConfigError> {
        if !(1..=100).contains(&percent) {
            return Err(ConfigError::new(format!(
                "a lease share is a percentage of the burst from 1 to 100, not {percent}"
            )));
        }
        self.share_ppm = u64::from(percent) * 10_000;
        Ok(self)
    }

    /// A batch is sized for `1 / divisor` of the period of the key's local demand (default 10; at least 1).
    pub fn batch_lasts(mut self, divisor: u32) -> Self {
        self.batch_lasts = divisor.max(1);
        self
    }

    /// How long a token bucket lease lives (from the instance's send instant; a sliding window batch ends with
    /// its window anyway). A token bucket's batch holds at most what its quota refills in half of this (less the
    /// drift margin), so that a response's remaining holds when a batch ends unspent: a slow quota (per hour and
    /// slower) leases nothing with the default, the period capped at 10 s, and needs a longer lifetime to lease.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl.max(Duration::from_millis(1)));
        self
    }

    /// How long a key must go without requests before its unspent tokens are returned.
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = Some(idle);
        self
    }

    /// Holds at most `max_keys` keys (hot ones and recently seen ones; at least 1): at the bound an expired entry,
    /// else one not used since the eviction hand last passed it, is evicted, and returns its batch.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Whether dropping the layer returns unspent tokens (default true, best effort: on the runtime it is dropped
    /// in). `false` is what a crash does, for tests.
    pub fn return_on_drop(mut self, on: bool) -> Self {
        self.return_on_drop = on;
        self
    }

    /// The longest a request waits for the fetch under way when it finds its key's batch empty (default 1 s). A
    /// fetch that fails, or takes longer, leaves the request to the layer's failure policy, as a store error or
    /// timeout on the plain path would. The fetch is itself bounded by the store's timeout, and its failure
    /// releases its waiters at once, so the default is only a backstop: a bound shorter than the store's timeout
    /// would fail requests on a slow round trip that the plain path would have waited out and answered.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Measures local time with `clock` (tests drive a [`ManualClock`](tollgate_core::ManualClock)); it must not
    /// run slower than real time.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The largest batch this configuration leases for `policy` (tokens for a token bucket, slots for a sliding
    /// window): the share of the burst and, for a token bucket, what it refills in half a lease's life. 0 for a
    /// token bucket that refills less than a token in that time (100 per hour, with the default lifetime): it
    /// leases nothing and every request takes the plain path; a longer [`ttl`](Self::ttl) leases.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Policy, Quota};
    /// use tollgate_tower::LeaseConfig;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = LeaseConfig::new(); // 10 % of the burst
    /// assert_eq!(config.largest_batch(&Policy::token_bucket(Quota::per_second(1_000)?)), 100);
    /// let slow = Policy::token_bucket(Quota::per_hour(100)?);
    /// assert_eq!(config.largest_batch(&slow), 0);
    /// assert_eq!(config.ttl(Duration::from_secs(3_600)).largest_batch(&slow), 10);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn largest_batch(&self, policy: &Policy) -> u64 {
        let ttl = self.ttl_for(policy);
        let margin = u64::try_from(drift_margin(ttl).as_micros()).unwrap_or(u64::MAX);
        max_batch(policy, self.share_ppm, ttl, margin)
    }

    /// How long a lease under `policy` lives: as configured, else the period within 100 ms to 10 s.
    fn ttl_for(&self, policy: &Policy) -> Duration {
        self.ttl.unwrap_or_else(|| {
            policy
                .quota()
                .period()
                .clamp(Duration::from_millis(100), Duration::from_secs(10))
        })
    }

    pub(crate) fn build<St: Store>(
        &self,
        name: &Name,
        policy: &Policy,
        store: Arc<St>,
    ) -> Arc<LeaseTable<St>> {
        let quota = policy.quota();
        let period = quota.period_micros();
        let ttl = self.ttl_for(policy);
        let epoch = (period / u64::from(self.batch_lasts)).max(1);
        let idle = self.idle.map_or(2 * epoch, |d| {
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
        });
        let wait = self.wait.unwrap_or(DEFAULT_WAIT);
        let margin = u64::try_from(drift_margin(ttl).as_micros()).unwrap_or(u64::MAX);
        let max_batch = max_batch(policy, self.share_ppm, ttl, margin);
        let label = name.to_string();
        let inner = Arc::new(Inner {
            name: name.clone(),
            policy: *policy,
            store,
            table: BoundedTable::builder()
                .max_keys(self.max_keys)
                .on_full(OnFull::Evict)
                .name(label.clone())
                .build(),
            check: RandomState::new(),
            leasing: Mutex::new(HashMap::new()),
            clock: self
                .clock
                .clone()
                .unwrap_or_else(|| Arc::new(SystemClock::new())),
            instance: random_u64(),
            seq: AtomicU64::new(0),
            epoch,
            max_batch,
            shown_cap: if policy.algorithm() == Algorithm::TokenBucket {
                quota.burst().saturating_sub(max_batch)
            } else {
                quota.burst()
            },
            token: quota.token_bucket_token(),
            rate: quota.token_bucket_rate(),
            wait,
            ttl,
            idle,
            margin,
            fetching: AtomicUsize::new(0),
            settled: Event::new(),
            closed: AtomicBool::new(false),
            return_on_drop: self.return_on_drop,
            sweeper: OnceLock::new(),
            local_allowed: AtomicU64::new(0),
            local_limited: AtomicU64::new(0),
            fetches: metrics::counter!(TOKEN_LEASE_CALLS_TOTAL, "limiter" => label.clone(), "call" => "fetch"),
            returns: metrics::counter!(TOKEN_LEASE_CALLS_TOTAL, "limiter" => label.clone(), "call" => "return"),
            allowed: metrics::counter!(TOKEN_LEASE_LOCAL_TOTAL, "limiter" => label.clone(), "outcome" => "allowed"),
            limited: metrics::counter!(TOKEN_LEASE_LOCAL_TOTAL, "limiter" => label, "outcome" => "limited"),
            store_calls: AtomicU64::new(0),
        });
        Arc::new(LeaseTable {
            on_drop: drop_hook(&inner),
            inner,
        })
    }
}

/// The largest batch: `share_ppm` of the burst and, for a token bucket, no more than the quota refills over half a
/// batch's life (the lease's lifetime less the drift margin: the other half is left for the fetch's round trip),
/// so that what a batch holds when it ends unspent has been refilled by then (see "Headers under leases"). A
/// sliding window's is at least 1.
fn max_batch(policy: &Policy, share_ppm: u64, ttl: Duration, margin: u64) -> u64 {
    let quota = policy.quota();
    let share = quota.burst() * share_ppm / 1_000_000;
    if policy.algorithm() == Algorithm::TokenBucket {
        let life = u64::try_from(ttl.as_micros())
            .unwrap_or(u64::MAX)
            .saturating_sub(margin)
            / 2;
        let refilled = u128::from(quota.token_bucket_rate()) * u128::from(life)
            / u128::from(quota.token_bucket_token());
        // 0 when the quota refills less than a token in that time: no batch but what a request spends at once.
        return share.min(u64::try_from(refilled).unwrap_or(u64::MAX));
    }
    share.max(1)
}

/// A random 64-bit instance id: RandomState is seeded by the OS per process, and the counter tells two tables
/// of one process apart.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed)) >> 1
}

/// One key's lease state (or, for a cold key, only its demand).
struct Entry {
    check: u64,
    /// The key's text, once it leases (fetches and returns need it).
    key: Option<Box<str>>,
    /// Local demand: tokens asked in the epoch starting at `epoch`, and in the one before.
    epoch: u64,
    demand: u64,
    last_demand: u64,
    last_use: u64,
    /// The batch: unspent tokens, spendable until `deadline` (local µs).
    tokens: u64,
    deadline: u64,
    /// Sliding window: the window the batch is counted in, and an earlier batch's leftovers to give back.
    window_start: u64,
    leftover: u64,
    leftover_window: u64,
    /// The last fetch: the store's figures, and the local instant it was sent at.
    global: u64,
    reset: Timestamp,
    store_now: Timestamp,
    sent: u64,
    fetching: bool,
    /// No fetch before this local instant; refuse locally until `denied_until` when the batch cannot pay.
    next_fetch: u64,
    denied_until: u64,
    /// What requests that wait for the fetch under way listen on (made by the first of them).
    landing: Option<Arc<Landing>>,
    /// The remaining this instance last showed for the key (fixed point: `Inner::token` units per token), when,
    /// and whether the store's last answer left less than a batch unheld (no credit for refill then): see
    /// "Headers under leases".
    shown: Option<u64>,
    shown_at: u64,
    exhausted: bool,
}

/// A fetch that requests wait for: woken when it lands, with its error if it failed.
#[derive(Default)]
struct Landing {
    landed: Event,
    failure: OnceLock<StoreError>,
}

impl Landing {
    /// The fetch is over (`failure` if it failed): the waiters look at the entry again.
    fn land(&self, failure: Option<StoreError>) {
        if let Some(err) = failure {
            let _ = self.failure.set(err);
        }
        self.landed.notify(usize::MAX);
    }
}

/// A copy of a fetch's error for each request that waited on it (the error itself is not `Clone`).
fn copy_error(err: &StoreError) -> StoreError {
    match err {
        StoreError::KeyCapacity { max_keys } => StoreError::KeyCapacity {
            max_keys: *max_keys,
        },
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::CircuitOpen => StoreError::CircuitOpen,
        StoreError::Unsupported(what) => StoreError::Unsupported(what),
        StoreError::Backend(e) => StoreError::Backend(format!("token lease fetch: {e}").into()),
        other => StoreError::Backend(format!("token lease fetch: {other}").into()),
    }
}

impl Expiry for Entry {
    fn expires_at(&self) -> u64 {
        if self.fetching {
            return u64::MAX;
        }
        self.last_use
            .saturating_add(1)
            .max(if self.tokens > 0 { self.deadline } else { 0 })
    }
}

/// What a request's look-up decided, outside the table's lock.
enum Take {
    Admit(Decision, Option<Fetch>),
    Deny(Decision),
    /// The batch cannot pay and a fetch is under way (`Fetch`: this request started it): wait for it (listening
    /// when asked to).
    Wait(Option<Fetch>, Option<(Arc<Landing>, EventListener)>),
    Plain(Option<Fetch>),
}

/// What the synchronous look-up of a request on a leasing limiter found.
pub(crate) enum Leased {
    /// Answered from the batch (admitted, or refused while the store said it is short).
    Decided(Decision),
    /// The batch is empty and a fetch is under way: [`LeaseTable::wait`] decides it from that fetch.
    Wait,
    /// The plain path (a cold key, or no fetch possible now).
    Plain,
}

/// What a request that waited for its key's fetch got.
pub(crate) enum Waited {
    Decided(Decision),
    /// The fetch failed or took longer than the bound: the failure policy answers.
    Failed(StoreError),
    Plain,
}

/// A fetch to start.
struct Fetch {
    digest: u64,
    key: Box<str>,
    request: TokenLeaseRequest,
    sent: u64,
}

pub(crate) struct LeaseTable<St> {
    inner: Arc<Inner<St>>,
    /// Returns every batch, best effort (built where the store type is known: `Drop` cannot bound it).
    on_drop: Box<dyn Fn() + Send + Sync>,
}

struct Inner<St> {
    name: Name,
    policy: Policy,
    store: Arc<St>,
    table: BoundedTable<Entry>,
    check: RandomState,
    /// Keys that hold (or may hold) a batch: the idle sweep and the shutdown walk these.
    leasing: Mutex<HashMap<u64, Box<str>>>,
    clock: Arc<dyn Clock>,
    instance: u64,
    seq: AtomicU64,
    epoch: u64,
    max_batch: u64,
    /// The most a response shows: the burst less the largest batch (a batch that ends unspent takes its tokens
    /// out of the bucket until they refill).
    shown_cap: u64,
    /// The quota's fixed point (one token is `token` units, `rate` units accrue per µs): the shown remaining's.
    token: u64,
    rate: u64,
    /// How long a request waits for a fetch under way.
    wait: Duration,
    ttl: Duration,
    idle: u64,
    margin: u64,
    fetching: AtomicUsize,
    /// Notified when the last fetch under way lands (`fetching` back to 0).
    settled: Event,
    closed: AtomicBool,
    return_on_drop: bool,
    sweeper: OnceLock<()>,
    local_allowed: AtomicU64,
    local_limited: AtomicU64,
    fetches: metrics::Counter,
    returns: metrics::Counter,
    allowed: metrics::Counter,
    limited: metrics::Counter,
    store_calls: AtomicU64,
}

impl<St: Store> LeaseTable<St> {
    /// Answers a request from the key's batch (admitted, or refused while the store said it is short), says to
    /// wait for the fetch under way when the batch cannot pay, or leaves it to the plain path; starts a fetch when
    /// one is due.
    pub(crate) fn take(&self, key: &str, cost: u64) -> Leased {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::Relaxed) {
            return Leased::Plain;
        }
        let now = inner.clock.now().as_micros();
        let digest = inner.table.digest(key.as_bytes());
        let check = inner.check.hash_one(key.as_bytes());
        let take = inner.table.get(digest, |e| {
            if e.check != check {
                return Take::Plain(None);
            }
            inner.lookup(e, digest, key, cost, now, false)
        });
        match take {
            None => {
                let entry = Entry::cold(check, cost, now);
                if let Ok(Some(evicted)) = inner.table.insert(digest, entry, now) {
                    self.evicted(evicted);
                }
                Leased::Plain
            }
            Some(take) => match self.settle(take) {
                Some(Ok(decision)) => Leased::Decided(decision),
                Some(Err(_)) => Leased::Wait,
                None => Leased::Plain,
            },
        }
    }

    /// Counts a look-up's answer and starts the fetch it asks for: `Some(Ok)` decided, `Some(Err)` wait (with
    /// the listener if one was asked for), `None` the plain path.
    #[allow(clippy::type_complexity)]
    fn settle(
        &self,
        take: Take,
    ) -> Option<Result<Decision, Option<(Arc<Landing>, EventListener)>>> {
        let inner = &*self.inner;
        match take {
            Take::Admit(decision, fetch) => {
                inner.local_allowed.fetch_add(1, Ordering::Relaxed);
                inner.allowed.increment(1);
                if let Some(fetch) = fetch {
                    self.start(fetch);
                }
                Some(Ok(decision))
            }
            Take::Deny(decision) => {
                inner.local_limited.fetch_add(1, Ordering::Relaxed);
                inner.limited.increment(1);
                Some(Ok(decision))
            }
            Take::Wait(fetch, listener) => {
                // Without a runtime to fetch on there is nothing to wait for.
                if let Some(fetch) = fetch
                    && !self.start(fetch)
                {
                    return None;
                }
                Some(Err(listener))
            }
            Take::Plain(fetch) => {
                if let Some(fetch) = fetch {
                    self.start(fetch);
                }
                None
            }
        }
    }

    /// Decides a request [`take`](Self::take) said to wait for: from the batch the fetch under way brings (or
    /// the next one, if others spent it first), within the configured bound; past it, or when the fetch fails,
    /// the failure policy answers. Its demand was counted by `take`.
    pub(crate) async fn wait(&self, key: &str, cost: u64) -> Waited {
        let inner = &*self.inner;
        if tokio::runtime::Handle::try_current().is_err() {
            return Waited::Plain;
        }
        let digest = inner.table.digest(key.as_bytes());
        let check = inner.check.hash_one(key.as_bytes());
        let deadline = tokio::time::Instant::now() + inner.wait;
        loop {
            if inner.closed.load(Ordering::Relaxed) {
                return Waited::Plain;
            }
            let now = inner.clock.now().as_micros();
            let take = inner.table.get(digest, |e| {
                if e.check != check {
                    return Take::Plain(None);
                }
                inner.lookup(e, digest, key, cost, now, true)
            });
            let Some(take) = take else {
                return Waited::Plain;
            };
            let (landing, landed) = match self.settle(take) {
                Some(Ok(decision)) => return Waited::Decided(decision),
                Some(Err(Some(wait))) => wait,
                Some(Err(None)) | None => return Waited::Plain,
            };
            if tokio::time::timeout_at(deadline, landed).await.is_err() {
                return Waited::Failed(StoreError::Timeout(inner.wait));
            }
            if let Some(err) = landing.failure.get() {
                return Waited::Failed(copy_error(err));
            }
        }
    }

    /// This instance's view on the store's own answer to a request on the plain path (see "Headers under
    /// leases"): the store's remaining plus the unspent batch, never above what it showed before plus what
    /// refilled since.
    pub(crate) fn show_plain(&self, key: &str, cost: u64, decision: &mut Decision) {
        let inner = &*self.inner;
        let now = inner.clock.now().as_micros();
        let digest = inner.table.digest(key.as_bytes());
        let check = inner.check.hash_one(key.as_bytes());
        let limit = inner.policy.quota().burst();
        let shown = inner.table.get(digest, |e| {
            if e.check != check {
                return decision.remaining;
            }
            let tokens = if now < e.deadline { e.tokens } else { 0 };
            let want = e.last_demand.max(e.demand).min(inner.max_batch).max(1);
            e.exhausted = !decision.is_allowed() || decision.remaining < want;
            if inner.policy.lockout_micros() > 0
                && !decision.is_allowed()
                && let Some(retry) = decision.retry_after
            {
                // Under a lockout policy the store's refusal is a lockout (started or reported) until at least
                // `retry`: refused here until then, the batch included, with no store call.
                let until = now
                    .saturating_add(u64::try_from(retry.as_micros()).unwrap_or(u64::MAX))
                    .saturating_sub(inner.margin);
                e.denied_until = e.denied_until.max(until);
                e.next_fetch = e.next_fetch.max(until);
            }
            let view = decision.remaining.saturating_add(tokens).min(limit);
            let spent = if decision.is_allowed() { cost } else { 0 };
            inner.show(e, view, spent, now)
        });
        if let Some(shown) = shown {
            decision.remaining = shown;
        }
    }

    /// Starts `fetch` on the current runtime; false (and the key left on the plain path) without one.
    fn start(&self, fetch: Fetch) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to fetch on: this key stays on the plain path.
            self.inner.table.get(fetch.digest, |e| e.fetching = false);
            return false;
        };
        {
            let mut leasing = self.inner.leasing.lock().unwrap_or_else(|p| p.into_inner());
            leasing
                .entry(fetch.digest)
                .or_insert_with(|| fetch.key.clone());
        }
        self.inner.fetching.fetch_add(1, Ordering::AcqRel);
        self.inner.spawn_sweeper(&runtime, &self.inner);
        let inner = self.inner.clone();
        runtime.spawn(async move { inner.fetch(fetch).await });
        true
    }

    /// An entry the table evicted at its bound: its batch ends as a lease does.
    fn evicted(&self, evicted: Evicted<Entry>) {
        let inner = &self.inner;
        let e = evicted.value;
        if let Some(landing) = &e.landing {
            // Its waiters find no entry and take the plain path.
            landing.land(None);
        }
        inner
            .leasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&evicted.key);
        if let (Some(key), Ok(runtime)) = (e.key.clone(), tokio::runtime::Handle::try_current())
            && let Some(request) = inner.ending(&e)
        {
            let inner = inner.clone();
            runtime.spawn(async move { inner.give_back(&key, request).await });
        }
    }

    /// Whether no key holds a batch and no fetch is under way: dropping the table then returns nothing and leaves
    /// no fetch to land in a table nobody reads.
    pub(crate) fn is_quiet(&self) -> bool {
        self.inner.fetching.load(Ordering::Acquire) == 0
            && self
                .inner
                .leasing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// A handle for shutdown, idle returns and figures.
    pub(crate) fn handle(self: &Arc<Self>) -> Arc<dyn LeaseControl> {
        self.clone()
    }
}

impl Entry {
    fn cold(check: u64, cost: u64, now: u64) -> Self {
        Self {
            check,
            key: None,
            epoch: now,
            demand: cost,
            last_demand: 0,
            last_use: now,
            tokens: 0,
            deadline: 0,
            window_start: 0,
            leftover: 0,
            leftover_window: 0,
            global: 0,
            reset: Timestamp::from_micros(0),
            store_now: Timestamp::from_micros(0),
            sent: 0,
            fetching: false,
            next_fetch: 0,
            denied_until: 0,
            landing: None,
            shown: None,
            shown_at: 0,
            exhausted: false,
        }
    }

    /// The store's instant now, as of the last fetch plus the local time since.
    fn store_now(&self, now: u64) -> Timestamp {
        Timestamp::from_micros(self.store_now.as_micros() + now.saturating_sub(self.sent))
    }
}

impl<St: Store> Inner<St> {
    /// The decision for one request on the key's entry, under its lock. `resume`: a request that waited (its
    /// demand is counted already), which listens on the fetch under way if it must wait again.
    fn lookup(
        &self,
        e: &mut Entry,
        digest: u64,
        key: &str,
        cost: u64,
        now: u64,
        resume: bool,
    ) -> Take {
        // Demand per epoch (a batch's time): the epoch before, unless the key was idle longer than that.
        if now >= e.epoch + self.epoch {
            e.last_demand = if now < e.epoch + 2 * self.epoch {
                e.demand
            } else {
                0
            };
            e.demand = 0;
            e.epoch = now - (now - e.epoch) % self.epoch;
        }
        if !resume {
            e.demand = e.demand.saturating_add(cost);
        }
        e.last_use = now;
        let want = self.window_share(e, e.last_demand.max(e.demand).min(self.max_batch), now);
        if now >= e.deadline && e.tokens > 0 {
            // Past its deadline a batch is not spent: a sliding window gives its slots back with the next call; a
            // token bucket's record expires in the store (its tokens are lost, as the proof requires).
            if self.policy.algorithm() == Algorithm::SlidingWindowCounter {
                e.leftover = e.tokens;
                e.leftover_window = e.window_start;
                // A short grant's local refusal counted these slots as spent: given back, they are the store's
                // again, and its own answer (after the give-back) decides.
                if self.policy.lockout_micros() == 0 {
                    e.denied_until = 0;
                }
            }
            e.tokens = 0;
        }
        let limit = self.policy.quota().burst();
        // A lockout this instance learned (a plain denial) stops its batch too: the key is refused until then.
        let learned = self.policy.lockout_micros() > 0 && now < e.denied_until;
        if e.tokens >= cost && cost > 0 && !learned {
            e.tokens -= cost;
            let view = (e.global + e.tokens).min(limit);
            let decision = Decision {
                outcome: Outcome::Allowed,
                limit,
                remaining: self.show(e, view, cost, now),
                reset: e.reset,
                retry_after: None,
                now: e.store_now(now),
            };
            let due = e.tokens < want.div_ceil(2);
            return Take::Admit(decision, self.fetch_if(e, due, digest, key, want, 0, now));
        }
        if now < e.denied_until && cost > 0 {
            let view = (e.global + e.tokens).min(limit);
            return Take::Deny(Decision {
                outcome: Outcome::Limited,
                limit,
                remaining: self.show(e, view, 0, now),
                reset: e.reset,
                retry_after: Some(Duration::from_micros(e.denied_until - now)),
                now: e.store_now(now),
            });
        }
        // The batch cannot pay: wait for the fetch under way (or the one due now) rather than ask the store beside
        // it, whose answer would leave that batch out of this instance's view. A token bucket's fetch asks for at
        // least what this request lacks, so that a request costing more than the batch holds is paid from the
        // batch and the store together, as the view that counts both promised (this request spends what it
        // brings at once).
        // A sliding window's fetch does the same while a batch granted now can still be spent: not in the window's
        // last drift margin, where its deadline would have passed when it lands.
        let lacking = match self.policy.algorithm() {
            Algorithm::TokenBucket => cost.saturating_sub(e.tokens).min(limit),
            Algorithm::SlidingWindowCounter if self.window_left(e, now) > 0 => {
                cost.saturating_sub(e.tokens).min(limit)
            }
            _ => 0,
        };
        let fetch = self.fetch_if(e, true, digest, key, want, lacking, now);
        if !e.fetching || cost == 0 {
            return Take::Plain(fetch);
        }
        let listen = resume.then(|| {
            let landing = e.landing.get_or_insert_with(Arc::default).clone();
            let landed = landing.landed.listen();
            (landing, landed)
        });
        Take::Wait(fetch, listen)
    }

    /// The remaining to show for a response whose view (the store's figure plus the unspent batch, after this
    /// request's take) is `view`, `spent` its cost if admitted: the view, but never more than what this instance
    /// showed last, less `spent`, plus what the quota refilled since — and no refill while the store's last answer
    /// left less than a batch unheld (the key is being drained: what refills is not this instance's to show).
    fn show(&self, e: &mut Entry, view: u64, spent: u64, now: u64) -> u64 {
        let view = view.min(self.shown_cap).saturating_mul(self.token);
        let shown = match e.shown {
            None => view,
            Some(shown) => {
                let credit = if e.exhausted {
                    0
                } else {
                    self.rate.saturating_mul(now.saturating_sub(e.shown_at))
                };
                shown
                    .saturating_add(credit)
                    .saturating_sub(spent.saturating_mul(self.token))
                    .min(view)
            }
        };
        e.shown = Some(shown);
        e.shown_at = now;
        shown / self.token
    }

    /// A sliding window batch no larger than the demand the rest of its window can spend (`want` is a batch's
    /// time of demand): a slot leased late in a window and unspent at its end is lost to that window, so batches
    /// shrink over the window's last batch time (to 1 in its last instants: the plain path, exact). A token bucket
    /// batch is not tied to a window.
    fn window_share(&self, e: &Entry, want: u64, now: u64) -> u64 {
        if self.policy.algorithm() != Algorithm::SlidingWindowCounter || e.window_start == 0 {
            return want;
        }
        let left = self.window_left(e, now);
        if left >= self.epoch {
            return want;
        }
        // ⌈want × left ÷ epoch⌉ in u128: want ≤ the burst, left < epoch.
        u64::try_from((u128::from(want) * u128::from(left)).div_ceil(u128::from(self.epoch)))
            .unwrap_or(want)
    }

    /// How long a sliding window batch granted now could be spent: the rest of the store's current window, less
    /// the drift margin (`u64::MAX` before the first grant says where windows start).
    fn window_left(&self, e: &Entry, now: u64) -> u64 {
        let period = self.policy.quota().period_micros();
        let at = e.store_now(now).as_micros();
        if e.window_start == 0 || at < e.window_start {
            return u64::MAX;
        }
        (period - (at - e.window_start) % period).saturating_sub(self.margin)
    }

    /// The fetch to start now, if one is `due` and allowed (not under way, not too early, a hot key), for `want`
    /// (the key's demand) or `need` (what the request that asks lacks), whichever is more. A token bucket's
    /// batch, what is left of it included, holds at most `max_batch` beyond what the request needs.
    ///
    /// A sliding window's slots left at a batch's end still count in the store until given back, so a call that
    /// gives them back is always made (asking for nothing when no fetch is due): a plain call decided before it
    /// would find the window fuller than the view said.
    #[allow(clippy::too_many_arguments)]
    fn fetch_if(
        &self,
        e: &mut Entry,
        due: bool,
        digest: u64,
        key: &str,
        want: u64,
        need: u64,
        now: u64,
    ) -> Option<Fetch> {
        // A batch of one is not worth a call of its own (the plain path is one call too); what a request lacks
        // of a batch that pays the rest is.
        let worth = want >= 2 || need >= 2 || (need > 0 && e.tokens > 0);
        let asks = due && now >= e.next_fetch && worth;
        let gives_back = e.leftover > 0;
        if e.fetching || !(asks || gives_back) {
            return None;
        }
        let want = match self.policy.algorithm() {
            _ if !asks => 0, // the give-back alone
            Algorithm::TokenBucket => want.min(self.max_batch.saturating_sub(e.tokens)).max(need),
            _ => want.max(need),
        };
        if want == 0 && !gives_back {
            return None;
        }
        e.fetching = true;
        let key = e.key.get_or_insert_with(|| key.into()).clone();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut request = TokenLeaseRequest::take(self.instance, seq, want, self.ttl);
        request = match self.policy.algorithm() {
            // What is left of the batch now: the instance goes on spending it, and only ever reports less later. (A
            // fixed window is never granted a batch: its store answers that it has no leases.)
            Algorithm::TokenBucket | Algorithm::FixedWindow => request.holding(e.tokens, 0),
            // Only slots that can no longer be spent are given back.
            Algorithm::SlidingWindowCounter => {
                let back = request.holding(e.leftover, e.leftover_window);
                e.leftover = 0;
                back
            }
        };
        Some(Fetch {
            digest,
            key,
            request,
            sent: now,
        })
    }

    /// Runs one fetch and applies its grant.
    async fn fetch(self: Arc<Self>, fetch: Fetch) {
        self.fetches.increment(1);
        self.store_calls.fetch_add(1, Ordering::Relaxed);
        let result = self
            .store
            .lease_tokens(&fetch.key, &self.policy, &fetch.request)
            .await;
        let now = self.clock.now().as_micros();
        let (orphan, landing, surplus) = self
            .table
            .get(fetch.digest, |e| {
                if !e.fetching || e.key.as_deref() != Some(&*fetch.key) {
                    return (true, None, None);
                }
                e.fetching = false;
                let mut surplus = None;
                match &result {
                    Ok(grant) => {
                        self.apply(e, &fetch, grant, now);
                        surplus = self.surplus(e, grant);
                    }
                    Err(err) => {
                        tracing::debug!(limiter = &*self.name, error = %err, "token lease fetch failed");
                        e.next_fetch = now + RETRY_FAILED_MICROS;
                    }
                }
                (false, e.landing.take(), surplus)
            })
            .unwrap_or((true, None, None));
        if let Some(landing) = landing {
            // Its waiters listened under the entry's lock, before it was taken out: none misses this.
            landing.land(result.as_ref().err().map(copy_error));
        }
        if let Some(back) = surplus {
            // Its waiters are released first; the fetch counts as under way until what it gives back has landed.
            self.give_back(&fetch.key, back).await;
        }
        if self.fetching.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify(usize::MAX);
        }
        if orphan && let Ok(grant) = result {
            // The entry went (evicted) while the call was out: what it granted goes straight back.
            if grant.granted > 0 {
                let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
                let back = TokenLeaseRequest::take(self.instance, seq, 0, self.ttl)
                    .ending(grant.granted)
                    .holding(grant.granted, grant.window_start);
                self.give_back(&fetch.key, back).await;
            }
        }
    }

    /// A grant landed at `now`: the batch grows by it and lives until the new deadline.
    fn apply(&self, e: &mut Entry, fetch: &Fetch, grant: &TokenLeaseGrant, now: u64) {
        if grant.stale {
            return;
        }
        let lifetime = grant
            .expires
            .as_micros()
            .saturating_sub(grant.now.as_micros());
        let deadline = (fetch.sent + lifetime).saturating_sub(self.margin);
        if self.policy.algorithm() == Algorithm::SlidingWindowCounter
            && grant.window_start != e.window_start
            && e.tokens > 0
        {
            // A new window: what is left of the old batch can no longer be spent (its deadline has passed, as the
            // old window ended before this call ran); given back with the next call.
            e.leftover += e.tokens;
            e.leftover_window = e.window_start;
            e.tokens = 0;
        }
        // The store's record bounds the batch: holding more means it lost state (a restart, a flush, a failover
        // to a lagging replica, a record that expired early), and what it no longer counts is not spent.
        e.tokens = (e.tokens + grant.granted).min(grant.held);
        e.deadline = deadline;
        e.window_start = grant.window_start;
        e.global = grant.remaining;
        // Less than another batch left unheld: the key is being drained, and its refill is not shown.
        e.exhausted = grant.retry_after.is_some() || grant.remaining < fetch.request.want;
        e.reset = grant.reset;
        e.store_now = grant.now;
        e.sent = fetch.sent;
        match grant.retry_after {
            Some(retry) => {
                // The store is short: no fetch, and no plain call, before `want` is there.
                let mut until = (fetch.sent + u64::try_from(retry.as_micros()).unwrap_or(u64::MAX))
                    .saturating_sub(self.margin);
                // A sliding window's slots that come free late in a window are its own: waiting for a whole batch
                // past the window's end would lose them (in a flood, every window would end short of its limit).
                // Ask again a tenth of a batch's time before the end, for the smaller batch the rest of the window
                // can spend (`window_share`; the plain path in its last instants).
                let end = deadline.saturating_sub(self.epoch / 10);
                if self.policy.algorithm() == Algorithm::SlidingWindowCounter
                    && until > end
                    && end > fetch.sent
                {
                    until = end;
                }
                // Never due again on landing: a retry shorter than the drift margin would have the request that
                // waited for this fetch start the same fetch again at once.
                e.next_fetch = until.max(now + 1);
                // Under a lockout a short store is no refusal: the requests the batch cannot pay take the plain
                // path, whose denial starts the lockout (learned in `show_plain`), as without leases.
                if self.policy.lockout_micros() == 0 {
                    e.denied_until = until;
                }
            }
            None => {
                e.next_fetch = 0;
                e.denied_until = 0;
            }
        }
    }

    /// A token bucket batch that a short grant left above `max_batch` (the store could not pay what a request
    /// lacked, so that request is refused): the call that gives it all back at once, since a batch that large
    /// could end unspent before the bucket refills it. Requests take the plain path until the next fetch.
    fn surplus(&self, e: &mut Entry, grant: &TokenLeaseGrant) -> Option<TokenLeaseRequest> {
        if self.policy.algorithm() != Algorithm::TokenBucket
            || grant.retry_after.is_none()
            || e.tokens <= self.max_batch
        {
            return None;
        }
        let back = self.ending(e);
        e.tokens = 0;
        e.denied_until = 0;
        back
    }

    /// The call that ends `e`'s lease, if it holds anything to give back; clears the batch.
    fn ending(&self, e: &Entry) -> Option<TokenLeaseRequest> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let base = TokenLeaseRequest::take(self.instance, seq, 0, self.ttl);
        match self.policy.algorithm() {
            Algorithm::TokenBucket | Algorithm::FixedWindow => {
                (e.tokens > 0 || e.fetching).then(|| base.ending(e.tokens))
            }
            Algorithm::SlidingWindowCounter => {
                // Unspent slots of the current batch and leftovers of an earlier one: one call gives back either.
                if e.tokens > 0 {
                    Some(base.ending(e.tokens).holding(e.tokens, e.window_start))
                } else {
                    (e.leftover > 0).then(|| {
                        base.ending(e.leftover)
                            .holding(e.leftover, e.leftover_window)
                    })
                }
            }
        }
    }

    async fn give_back(&self, key: &str, request: TokenLeaseRequest) {
        self.returns.increment(1);
        self.store_calls.fetch_add(1, Ordering::Relaxed);
        // A failed return loses nothing but the tokens it carried: the record expires at its deadline.
        let _ = self.store.lease_tokens(key, &self.policy, &request).await;
    }

    /// Ends the leases of keys idle for `idle` (or all of them, `all`): their batches go back to the store.
    async fn end_leases(&self, all: bool) {
        let now = self.clock.now().as_micros();
        let keys: Vec<(u64, Box<str>)> = self
            .leasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(d, k)| (*d, k.clone()))
            .collect();
        for (digest, key) in keys {
            let ended = self
                .table
                .get(digest, |e| {
                    if e.fetching || (!all && now < e.last_use + self.idle) {
                        return None;
                    }
                    let request = self.ending(e);
                    e.tokens = 0;
                    e.leftover = 0;
                    e.key = None;
                    Some(request)
                })
                .unwrap_or(Some(None));
            if let Some(request) = ended {
                self.leasing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&digest);
                if let Some(request) = request {
                    self.give_back(&key, request).await;
                }
            }
        }
    }

    /// Starts the idle sweep on the first fetch: every `idle`, idle keys' batches go back. It holds the table
    /// weakly, and ends with it.
    fn spawn_sweeper(&self, runtime: &tokio::runtime::Handle, this: &Arc<Self>) {
        if self.sweeper.set(()).is_err() {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(this);
        let every = Duration::from_micros(self.idle.max(1_000));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.closed.load(Ordering::Relaxed) {
                    return;
                }
                inner.end_leases(false).await;
            }
        });
    }
}

/// A future a [`LeaseControl`] returns.
pub(crate) type Pending<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// What a layer's leases did so far, read by [`Leases`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LeaseFigures {
    local_allowed: u64,
    local_limited: u64,
    store_calls: u64,
    fetching: usize,
}

impl LeaseFigures {
    /// The figures of two tables together.
    pub(crate) const fn sum(self, other: Self) -> Self {
        Self {
            local_allowed: self.local_allowed + other.local_allowed,
            local_limited: self.local_limited + other.local_limited,
            store_calls: self.store_calls + other.store_calls,
            fetching: self.fetching + other.fetching,
        }
    }
}

/// What [`Leases`] reach, whatever the store type.
pub(crate) trait LeaseControl: Send + Sync {
    fn shutdown(&self) -> Pending<'_>;
    fn return_idle(&self) -> Pending<'_>;
    fn settled(&self) -> Pending<'_>;
    fn figures(&self) -> LeaseFigures;
}

impl<St> Inner<St> {
    /// Until no fetch is under way: woken by the one that lands last, not by polling.
    async fn settled(&self) {
        loop {
            if self.fetching.load(Ordering::Acquire) == 0 {
                return;
            }
            // Listening before looking again: a fetch landing in between notifies this listener.
            let landed = self.settled.listen();
            if self.fetching.load(Ordering::Acquire) == 0 {
                return;
            }
            landed.await;
        }
    }
}

impl<St: Store> LeaseControl for LeaseTable<St> {
    fn shutdown(&self) -> Pending<'_> {
        Box::pin(async move {
            self.inner.closed.store(true, Ordering::Relaxed);
            self.inner.settled().await;
            self.inner.end_leases(true).await;
        })
    }

    fn return_idle(&self) -> Pending<'_> {
        Box::pin(self.inner.end_leases(false))
    }

    fn settled(&self) -> Pending<'_> {
        Box::pin(self.inner.settled())
    }

    fn figures(&self) -> LeaseFigures {
        let i = &self.inner;
        LeaseFigures {
            local_allowed: i.local_allowed.load(Ordering::Relaxed),
            local_limited: i.local_limited.load(Ordering::Relaxed),
            store_calls: i.store_calls.load(Ordering::Relaxed),
            fetching: i.fetching.load(Ordering::Acquire),
        }
    }
}

impl<St> Drop for LeaseTable<St> {
    fn drop(&mut self) {
        (self.on_drop)();
    }
}

/// The best-effort return of a dropped table's batches, on the runtime it is dropped in (without one, the
/// records expire at their deadlines). Fetches under way hold `Inner` and land in the table; their grants then
/// expire likewise.
fn drop_hook<St: Store>(inner: &Arc<Inner<St>>) -> Box<dyn Fn() + Send + Sync> {
    let weak = Arc::downgrade(inner);
    Box::new(move || {
        let Some(inner) = weak.upgrade() else { return };
        if !inner.return_on_drop || inner.closed.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { inner.end_leases(true).await });
        }
    })
}

/// A layer's or a leased store's token leases, whatever the store type: what their lease methods
/// ([`RateLimitLayer::leases_shutdown`](crate::RateLimitLayer::leases_shutdown) and the others,
/// [`LeasedStore::shutdown`](crate::LeasedStore::shutdown) and the others) reach; `None`: no leases.
pub(crate) struct Leases(pub(crate) Option<Arc<dyn LeaseControl>>);

impl Leases {
    pub(crate) async fn shutdown(&self) {
        if let Some(table) = self.0.as_ref() {
            table.shutdown().await;
        }
    }

    pub(crate) async fn return_idle(&self) {
        if let Some(table) = self.0.as_ref() {
            table.return_idle().await;
        }
    }

    pub(crate) async fn settled(&self) {
        if let Some(table) = self.0.as_ref() {
            table.settled().await;
        }
    }

    fn figures(&self) -> LeaseFigures {
        self.0.as_ref().map(|t| t.figures()).unwrap_or_default()
    }

    pub(crate) fn local_admissions(&self) -> u64 {
        self.figures().local_allowed
    }

    pub(crate) fn local_denials(&self) -> u64 {
        self.figures().local_limited
    }

    pub(crate) fn store_calls(&self) -> u64 {
        self.figures().store_calls
    }

    pub(crate) fn fetches_in_flight(&self) -> usize {
        self.figures().fetching
    }
}
