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

mod clock;
mod config;
mod denial;
mod table;

use std::time::Duration;

pub use config::DenyCacheConfig;
pub(crate) use table::{Asked, DenyTable, KeyDigests};

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
