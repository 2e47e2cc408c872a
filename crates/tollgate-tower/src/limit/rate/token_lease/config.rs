//! The token lease configuration, and the table it builds for a limiter.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use event_listener::Event;
use std::sync::Mutex;
use tollgate_core::store::{BoundedTable, OnFull};
use tollgate_core::{Algorithm, Clock, Policy, Store, SystemClock};

use super::control::drop_hook;
use super::table::{Inner, LeaseTable};
use super::{TOKEN_LEASE_CALLS_TOTAL, TOKEN_LEASE_LOCAL_TOTAL};
use crate::limit::rate::deny_cache::drift_margin;
use crate::{ConfigError, Name};

/// Keys a lease table holds by default (hot and recently seen keys).
pub const DEFAULT_LEASE_KEYS: usize = 1 << 14;

/// How long a request waits for its key's fetch under way by default ([`LeaseConfig::wait`]).
const DEFAULT_WAIT: Duration = Duration::from_secs(1);

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
