//! Concurrency leases: how many requests per key are in flight, and the [`LeaseStore`]s that count them.
//!
//! A concurrent-requests limiter or a fleet load shedder asks a [`LeaseStore`] for a lease before a request runs
//! and gives it back when the response is finished. [`MemoryLeaseStore`] counts in process (a per-instance limit);
//! the Redis store counts for the whole fleet, where every lease has an expiry so that a crashed instance cannot
//! hold capacity forever ([`LeaseStore::leases_expire`]): a long request renews its lease while it runs.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::lease::{LeaseId, LeaseStore, MemoryLeaseStore, block_on_ready as block_on};
//!
//! # fn main() -> Result<(), tollgate_core::StoreError> {
//! let store = MemoryLeaseStore::new();
//! let ttl = Duration::from_secs(30);
//! let (a, b) = (LeaseId::new(), LeaseId::new());
//! assert!(block_on(store.acquire("client-1", a, 1, ttl))?.granted);
//! let denied = block_on(store.acquire("client-1", b, 1, ttl))?;
//! assert!(!denied.granted);
//! assert_eq!(denied.in_flight, 1);
//! block_on(store.release("client-1", a))?;
//! assert!(block_on(store.acquire("client-1", b, 1, ttl))?.granted);
//! # Ok(())
//! # }
//! ```

mod memory;

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use memory::MemoryLeaseStore;

use crate::StoreError;

/// A unique id for one request's lease: unique within the process (a counter) and, with overwhelming
/// probability, across a fleet (a random per-process half).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(u128);

impl LeaseId {
    /// A fresh id.
    #[must_use]
    pub fn new() -> Self {
        static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let process = *PROCESS.get_or_init(|| {
            // RandomState is seeded from the OS per process: no extra dependency for a random 64-bit value.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            if let Ok(since) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
                h.write_u128(since.as_nanos());
            }
            h.finish()
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self((u128::from(process) << 64) | u128::from(n))
    }

    /// The id as a number.
    #[must_use]
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl Default for LeaseId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A store's answer to a lease request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Whether the lease was granted.
    pub granted: bool,
    /// Leases held on the key: including the new one when granted, the ones blocking it when not.
    pub in_flight: u64,
    /// The ceiling the request was checked against.
    pub limit: u64,
}

/// Counts in-flight requests per key against a ceiling.
///
/// Every method on one key is atomic: cleanup of expired leases, the count and the admission happen together, so
/// concurrent acquirers can never exceed `limit` between them.
pub trait LeaseStore: Send + Sync + 'static {
    /// Whether leases live outside this process and expire unless renewed (a shared store): holders then renew
    /// them while the request runs, and release them from a spawned task. In-process leases never expire and their
    /// futures are ready at once.
    fn leases_expire(&self) -> bool;

    /// Grants `lease` on `key` if fewer than `limit` leases are held, for `ttl` (ignored by stores whose leases do
    /// not expire).
    fn acquire(
        &self,
        key: &str,
        lease: LeaseId,
        limit: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send;

    /// Extends a held lease to `ttl` from now; `false` when the lease was no longer held (it expired).
    fn renew(
        &self,
        key: &str,
        lease: LeaseId,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives a lease back. Releasing a lease that is not held does nothing.
    fn release(
        &self,
        key: &str,
        lease: LeaseId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl<L: LeaseStore> LeaseStore for Arc<L> {
    fn leases_expire(&self) -> bool {
        (**self).leases_expire()
    }

    fn acquire(
        &self,
        key: &str,
        lease: LeaseId,
        limit: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        (**self).acquire(key, lease, limit, ttl)
    }

    fn renew(
        &self,
        key: &str,
        lease: LeaseId,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).renew(key, lease, ttl)
    }

    fn release(
        &self,
        key: &str,
        lease: LeaseId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(key, lease)
    }
}

/// Polls a future that is ready at once (e.g. any [`MemoryLeaseStore`] call) and returns its output.
///
/// # Panics
/// If the future is not ready on its first poll: use an async runtime for stores that do I/O.
pub fn block_on_ready<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match fut
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => {
            panic!("block_on_ready: the future was not ready; await it on an async runtime")
        }
    }
}
