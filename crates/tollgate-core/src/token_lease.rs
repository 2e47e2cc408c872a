//! Token leases: a batch of a hot key's tokens (token bucket) or window slots (sliding window counter) taken from
//! a shared store in one call, to be spent by one instance without asking the store again.
//!
//! Not to be confused with [`lease`](crate::lease), the concurrency limiters' leases on in-flight requests. A
//! token lease is a *rate* limiter's: the store debits the batch atomically, as if that many requests had been
//! admitted, and the instance admits locally from it until its deadline. What keeps the fleet exact is in the
//! algorithms' docs: [`token_bucket_lease`](crate::algorithm::token_bucket_lease) (leased tokens hold the bucket
//! below its capacity) and [`sliding_window_lease`](crate::algorithm::sliding_window_lease) (a batch is spent
//! in the window it is counted in). A [`Store`](crate::Store) that supports them answers
//! [`Store::lease_tokens`](crate::Store::lease_tokens); the tower layer's `RateLimitLayer::leases` uses them.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::token_lease::TokenLeaseRequest;
//! use tollgate_core::{MemoryStore, Policy, Quota, Timestamp};
//!
//! let store = MemoryStore::new();
//! let policy = Policy::token_bucket(Quota::per_second(100)?);
//! let now = Timestamp::from_micros(1_700_000_000_000_000);
//! let ask = TokenLeaseRequest::take(7, 1, 30, Duration::from_millis(500));
//! let grant = store.lease_tokens_at("hot", &policy, &ask, now)?;
//! assert_eq!((grant.granted, grant.remaining), (30, 70));
//! // Plain requests see the 70 tokens nobody holds.
//! assert_eq!(store.check_at("hot", &policy, 1, now)?.remaining, 69);
//! // The instance returns the 10 it did not spend: they are the bucket's again.
//! let done = store.lease_tokens_at("hot", &policy, &ask.next(2).ending(10), now)?;
//! assert_eq!(done.remaining, 79);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use crate::Timestamp;

/// One lease call: take a batch, report what is left of the last one, or end the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenLeaseRequest {
    /// The calling instance's id, unique within the fleet (a random 64-bit number per limiter and process).
    pub instance: u64,
    /// The call's number, increasing per instance: the store ignores a call not above the last one it saw (a
    /// call that timed out and landed late), so a report can never raise what an instance holds.
    pub seq: u64,
    /// Tokens or slots wanted (the store caps it at the burst or limit).
    pub want: u64,
    /// What the instance still held of its batch when it sent this call: the rest of its batch was spent. A
    /// sliding window returns these slots; a token bucket keeps them leased (or returns them with `end`).
    pub unspent: u64,
    /// Sliding window only: the start (µs since the epoch) of the window `unspent` was granted in.
    pub window_start: u64,
    /// How long the lease lives (token bucket: from the store's instant; the instance stops spending at its
    /// own send instant plus this, earlier than the store's expiry).
    pub ttl: Duration,
    /// End the lease (token bucket): return `unspent`, drop the record. A sliding window keeps no record (any
    /// call gives back its `unspent`); [`ending`](Self::ending) also sets `want` to 0 for both.
    pub end: bool,
}

impl TokenLeaseRequest {
    /// Takes up to `want` tokens, as call `seq` of `instance`, holding nothing yet, for `ttl`.
    #[must_use]
    pub const fn take(instance: u64, seq: u64, want: u64, ttl: Duration) -> Self {
        Self {
            instance,
            seq,
            want,
            unspent: 0,
            window_start: 0,
            ttl,
            end: false,
        }
    }

    /// The same request as call `seq`.
    #[must_use]
    pub const fn next(self, seq: u64) -> Self {
        Self { seq, ..self }
    }

    /// The same request reporting `unspent` left (of a sliding window batch granted in the window starting at
    /// `window_start`; 0 for a token bucket).
    #[must_use]
    pub const fn holding(self, unspent: u64, window_start: u64) -> Self {
        Self {
            unspent,
            window_start,
            ..self
        }
    }

    /// The same request ending the lease, returning `unspent`.
    #[must_use]
    pub const fn ending(self, unspent: u64) -> Self {
        Self {
            unspent,
            want: 0,
            end: true,
            ..self
        }
    }
}

/// The store's answer to a [`TokenLeaseRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenLeaseGrant {
    /// Tokens or slots granted (0 to `want`).
    pub granted: u64,
    /// What the key has left for everyone after the grant (tokens no instance holds; slots left in the window).
    pub remaining: u64,
    /// When the full quota is available again, as the plain decision would say.
    pub reset: Timestamp,
    /// When less than wanted was granted: how long until the whole `want` would be there by refill (token
    /// bucket) or would fit (sliding window), absent other traffic and lease reports.
    pub retry_after: Option<Duration>,
    /// The store's instant.
    pub now: Timestamp,
    /// The store's deadline for the batch: token bucket, `now + ttl` (the record's expiry); sliding window, the
    /// end of the window the batch is counted in.
    pub expires: Timestamp,
    /// Sliding window: the start of the window the batch is counted in (to report returns with); token bucket 0.
    pub window_start: u64,
    /// The call was older than the instance's record (a late duplicate): nothing was changed or granted.
    pub stale: bool,
    /// What the store knows the caller holds after this call, the grant included: token bucket, its record
    /// (the unspent tokens it reported, at most what the record held, plus the grant); sliding window, the
    /// slots the current window counts for it (granted, less given back). The caller keeps no more than this
    /// of its batch: when it holds more, the store has lost state (a restart without persistence, a flush, a
    /// failover to a replica that missed the last writes, a record that expired early) and the rest must not
    /// be spent, or the fleet would admit a fresh bucket or window plus every batch held before.
    pub held: u64,
}
