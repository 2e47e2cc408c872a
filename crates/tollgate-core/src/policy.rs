//! Policies: which algorithm, how many requests, over which period.
//!
//! A [`Quota`] says "`limit` requests per `period`, with bursts of up to `burst`"; a [`Policy`] adds the
//! [`Algorithm`]. Both are validated when built, so a request can never meet an invalid one.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Policy, Quota};
//!
//! // 100 requests per second, in bursts of up to 20.
//! let bucket = Policy::token_bucket(Quota::per_second(100)?.with_burst(20)?);
//! // 1000 requests per rolling minute.
//! let window = Policy::sliding_window(Quota::per_minute(1000)?)?;
//! assert_eq!(window.quota().period(), Duration::from_secs(60));
//!
//! // Invalid quotas are typed errors with readable messages.
//! let err = Quota::per_second(0).unwrap_err();
//! assert_eq!(err.to_string(), "a quota's limit must be at least 1");
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use crate::divisor::Divisor;

/// The largest product of a count and a duration the integer arithmetic accepts.
///
/// The same formulas run in Redis Lua, where numbers are doubles: 2^52 keeps every intermediate sum below
/// 2^53, where doubles stop being exact integers.
pub const MAX_SCALED: u64 = 1 << 52;

/// Which algorithm decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Token bucket with lazy refill: bursts up to the bucket size, then `limit` per `period` on average.
    TokenBucket,
    /// Cloudflare's sliding window counter: `current + previous × (1 − elapsed / period)`, fixed state per key.
    SlidingWindowCounter,
    /// Fixed windows aligned to the period since the epoch, as envoyproxy/ratelimit counts (up to twice the limit
    /// across a boundary): for compatibility, not a default.
    FixedWindow,
}

impl Algorithm {
    /// A short stable name (`token_bucket`, `sliding_window`, `fixed_window`), used in keys, metrics and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::SlidingWindowCounter => "sliding_window",
            Self::FixedWindow => "fixed_window",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a quota or policy was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// The limit was zero.
    ZeroLimit,
    /// The period was zero.
    ZeroPeriod,
    /// The period was not a whole number of microseconds.
    SubMicrosecondPeriod,
    /// The burst was zero.
    ZeroBurst,
    /// The numbers are too large for exact integer arithmetic (here and in Redis Lua).
    TooLarge {
        /// Which product overflowed.
        what: &'static str,
    },
    /// A sliding window admits exactly `limit` per window; it has no separate burst.
    BurstNotSupported,
    /// A lockout was not a whole number of microseconds, or longer than 2^52 µs.
    InvalidLockout,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroLimit => f.write_str("a quota's limit must be at least 1"),
            Self::ZeroPeriod => f.write_str("a quota's period must be longer than zero"),
            Self::SubMicrosecondPeriod => {
                f.write_str("a quota's period must be a whole number of microseconds")
            }
            Self::ZeroBurst => f.write_str("a token bucket's burst must be at least 1"),
            Self::TooLarge { what } => write!(
                f,
                "{what} exceeds 2^52 and cannot be computed exactly; use a shorter period, a smaller \
                 limit or burst, or round numbers that share a common factor"
            ),
            Self::BurstNotSupported => f.write_str(
                "a sliding window admits `limit` per window and has no burst; use a token bucket for bursts",
            ),
            Self::InvalidLockout => f.write_str(
                "a lockout must be a whole number of microseconds, at most 2^52 µs (about 142 years)",
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

/// `limit` requests per `period`, with bursts of up to `burst` (token bucket only; defaults to `limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    // Divided by on a sliding window's every check (its window's start).
    period_us: Divisor,
    burst: u64,
    // Derived once here, not per request: a gcd is a loop of divisions, and a division by either is two
    // multiplications by its reciprocal.
    token: Divisor,
    rate: Divisor,
}

impl Quota {
    /// `limit` requests per `period`.
    pub const fn new(limit: u64, period: Duration) -> Result<Self, PolicyError> {
        if limit == 0 {
            return Err(PolicyError::ZeroLimit);
        }
        if period.is_zero() {
            return Err(PolicyError::ZeroPeriod);
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(PolicyError::SubMicrosecondPeriod);
        }
        let micros = period.as_micros();
        if micros > MAX_SCALED as u128 {
            return Err(PolicyError::TooLarge {
                what: "the period in microseconds",
            });
        }
        Self::checked(limit, micros as u64, limit)
    }

    /// `limit` requests per second.
    pub const fn per_second(limit: u64) -> Result<Self, PolicyError> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` requests per minute.
    pub const fn per_minute(limit: u64) -> Result<Self, PolicyError> {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` requests per hour.
    pub const fn per_hour(limit: u64) -> Result<Self, PolicyError> {
        Self::new(limit, Duration::from_secs(3_600))
    }

    /// The same rate with a bucket of `burst` tokens (token bucket only).
    pub const fn with_burst(self, burst: u64) -> Result<Self, PolicyError> {
        Self::checked(self.limit, self.period_us.get(), burst)
    }

    const fn checked(limit: u64, period_us: u64, burst: u64) -> Result<Self, PolicyError> {
        if burst == 0 {
            return Err(PolicyError::ZeroBurst);
        }
        let divisor = gcd(limit, period_us);
        let (token, rate) = (period_us / divisor, limit / divisor);
        let quota = Self {
            limit,
            period_us: Divisor::new(period_us),
            burst,
            token: Divisor::new(token),
            rate: Divisor::new(rate),
        };
        match burst.checked_mul(token) {
            Some(cap) if cap <= MAX_SCALED && rate <= MAX_SCALED => Ok(quota),
            _ => Err(PolicyError::TooLarge {
                what: "burst × period ÷ gcd(limit, period)",
            }),
        }
    }

    /// Requests admitted per period on average.
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The period the limit applies to.
    #[must_use]
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_us.get())
    }

    /// The period in microseconds.
    #[must_use]
    pub const fn period_micros(&self) -> u64 {
        self.period_us.get()
    }

    /// The largest burst (token bucket capacity).
    #[must_use]
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// The window announced to clients: the time over which `burst` requests accrue at this rate, `period × burst
    /// ÷ limit` rounded up to a whole microsecond — the period itself unless a token bucket's burst differs from
    /// its limit.
    ///
    /// A client is told "`burst` per window" ([`Decision::limit`](crate::Decision::limit) is the burst): the most
    /// it may ever have remaining at once, over the time an emptied bucket takes to refill. "10 per second with
    /// bursts of 20" is "20 per 2 s": the same sustained rate, and a remaining count never above the limit
    /// announced beside it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::Quota;
    ///
    /// assert_eq!(Quota::per_second(10)?.window(), Duration::from_secs(1));
    /// assert_eq!(Quota::per_second(10)?.with_burst(20)?.window(), Duration::from_secs(2));
    /// assert_eq!(Quota::per_hour(4)?.with_burst(2)?.window(), Duration::from_secs(1_800));
    /// # Ok::<(), tollgate_core::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn window(&self) -> Duration {
        // burst × token ≤ MAX_SCALED (checked when built): exact in u64.
        Duration::from_micros((self.burst * self.token.get()).div_ceil(self.rate.get()))
    }

    /// Fixed-point size of one token: a token is `period / gcd(limit, period)` units.
    #[must_use]
    pub const fn token_bucket_token(&self) -> u64 {
        self.token.get()
    }

    /// Fixed-point refill: `limit / gcd(limit, period)` units accrue per microsecond.
    #[must_use]
    pub const fn token_bucket_rate(&self) -> u64 {
        self.rate.get()
    }

    /// [`period_micros`](Self::period_micros), to divide by.
    pub(crate) const fn period_divisor(&self) -> Divisor {
        self.period_us
    }

    /// [`token_bucket_token`](Self::token_bucket_token), to divide by.
    pub(crate) const fn token_divisor(&self) -> Divisor {
        self.token
    }

    /// [`token_bucket_rate`](Self::token_bucket_rate), to divide by.
    pub(crate) const fn rate_divisor(&self) -> Divisor {
        self.rate
    }

    /// The sliding window's time resolution in microseconds: 1 µs, 1 ms or 1 s, the finest that keeps
    /// `limit × period` exact.
    const fn sliding_window_tick(&self) -> Option<NonZeroU64> {
        let ticks = [1, 1_000, 1_000_000];
        let mut i = 0;
        while i < ticks.len() {
            let tick = ticks[i];
            if self.period_us.get().is_multiple_of(tick) {
                match self.limit.checked_mul(self.period_us.get() / tick) {
                    Some(p) if p <= MAX_SCALED => return NonZeroU64::new(tick),
                    _ => {}
                }
            }
            i += 1;
        }
        None
    }
}

/// An algorithm with its quota: everything a store needs to decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    algorithm: Algorithm,
    quota: Quota,
    tick_us: Divisor,
    // Derived once here, not per request (a division the sliding window's steady path paid): the period in
    // ticks. With the tick and the quota's period, the sliding window's divisors.
    ticks: Divisor,
    /// 0: no lockout.
    lockout_us: u64,
}

impl Policy {
    /// A token bucket holding `quota.burst()` tokens, refilled at `quota.limit()` per `quota.period()`.
    #[must_use]
    pub const fn token_bucket(quota: Quota) -> Self {
        Self {
            algorithm: Algorithm::TokenBucket,
            quota,
            tick_us: Divisor::new(1),
            ticks: quota.period_us,
            lockout_us: 0,
        }
    }

    /// A sliding window counter admitting `quota.limit()` per rolling `quota.period()`.
    pub const fn sliding_window(quota: Quota) -> Result<Self, PolicyError> {
        if quota.burst != quota.limit {
            return Err(PolicyError::BurstNotSupported);
        }
        match quota.sliding_window_tick() {
            Some(tick_us) => Ok(Self {
                algorithm: Algorithm::SlidingWindowCounter,
                quota,
                tick_us: Divisor::new(tick_us.get()),
                ticks: Divisor::new(quota.period_us.get() / tick_us.get()),
                lockout_us: 0,
            }),
            None => Err(PolicyError::TooLarge {
                what: "limit × period",
            }),
        }
    }

    /// Fixed windows admitting `quota.limit()` per `quota.period()`, aligned to multiples of the period since the
    /// epoch (see [`algorithm::fixed_window`](crate::algorithm::fixed_window)).
    pub const fn fixed_window(quota: Quota) -> Result<Self, PolicyError> {
        if quota.burst != quota.limit {
            return Err(PolicyError::BurstNotSupported);
        }
        Ok(Self {
            algorithm: Algorithm::FixedWindow,
            quota,
            tick_us: Divisor::new(1),
            ticks: quota.period_us,
            lockout_us: 0,
        })
    }

    /// `algorithm` over `quota`.
    pub const fn new(algorithm: Algorithm, quota: Quota) -> Result<Self, PolicyError> {
        match algorithm {
            Algorithm::TokenBucket => Ok(Self::token_bucket(quota)),
            Algorithm::SlidingWindowCounter => Self::sliding_window(quota),
            Algorithm::FixedWindow => Self::fixed_window(quota),
        }
    }

    /// The same policy with a lockout: after a denial (`Limited`), the key is refused for `lockout` whatever its
    /// quota holds — brute-force protection for logins, password resets, one-time codes. `Duration::ZERO` removes
    /// it.
    ///
    /// The lockout starts at the denial and is not extended by the requests it refuses (a fixed duration, as
    /// rate-limiter-flexible's `blockDuration`). The denial that starts it, and every refusal during it, say
    /// `remaining` 0, `reset` no earlier than the lockout's end, and `retry_after` until the lockout's end (or
    /// until the quota admits the request, if that is later): `Retry-After` tells the truth. A cost that can
    /// never be admitted ([`Outcome::CostExceedsCapacity`](crate::Outcome)) neither starts nor reports a lockout.
    /// Both stores keep the lockout with the key's state, in one atomic step, and the key lives until it ends.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{ManualClock, MemoryStore, Policy, Quota, Timestamp};
    ///
    /// let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    /// let store = MemoryStore::builder().clock(clock.clone()).build();
    /// let login = Policy::token_bucket(Quota::per_minute(5)?).with_lockout(Duration::from_secs(900))?;
    /// for _ in 0..5 {
    ///     assert!(store.check_now("user:ann", &login, 1)?.is_allowed());
    /// }
    /// let denied = store.check_now("user:ann", &login, 1)?;
    /// assert_eq!(denied.retry_after, Some(Duration::from_secs(900)));
    /// clock.advance(Duration::from_secs(60)); // the bucket is full again, the key still locked out
    /// assert_eq!(store.check_now("user:ann", &login, 1)?.retry_after, Some(Duration::from_secs(840)));
    /// clock.advance(Duration::from_secs(840));
    /// assert!(store.check_now("user:ann", &login, 1)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn with_lockout(mut self, lockout: Duration) -> Result<Self, PolicyError> {
        if !lockout.subsec_nanos().is_multiple_of(1_000) || lockout.as_micros() > MAX_SCALED as u128
        {
            return Err(PolicyError::InvalidLockout);
        }
        self.lockout_us = lockout.as_micros() as u64;
        Ok(self)
    }

    /// The lockout after a denial, if any (see [`with_lockout`](Self::with_lockout)).
    #[must_use]
    pub const fn lockout(&self) -> Option<Duration> {
        if self.lockout_us == 0 {
            None
        } else {
            Some(Duration::from_micros(self.lockout_us))
        }
    }

    /// The lockout in microseconds (0: none).
    #[must_use]
    pub const fn lockout_micros(&self) -> u64 {
        self.lockout_us
    }

    /// The algorithm.
    #[must_use]
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The quota.
    #[must_use]
    pub const fn quota(&self) -> Quota {
        self.quota
    }

    /// The quota, borrowed: a store's hot path reads a field or two and need not copy all of it.
    pub(crate) const fn quota_ref(&self) -> &Quota {
        &self.quota
    }

    /// The sliding window's resolution in microseconds (1 for the token bucket).
    #[must_use]
    pub const fn tick_micros(&self) -> u64 {
        self.tick_us.get()
    }

    /// [`tick_micros`](Self::tick_micros), to divide by.
    pub(crate) const fn tick(&self) -> Divisor {
        self.tick_us
    }

    /// The period in ticks, `quota.period_micros() / tick_micros()`, to divide by.
    pub(crate) const fn ticks(&self) -> Divisor {
        self.ticks
    }

    /// The largest cost a single request may have: a larger one can never be admitted.
    #[must_use]
    pub const fn max_cost(&self) -> u64 {
        self.quota.burst
    }
}
