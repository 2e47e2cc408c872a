//! Concurrency slots: how many requests per key are in flight, and the [`SlotStore`]s that count them.
//!
//! A concurrent-requests limiter or a fleet load shedder asks a [`SlotStore`] for a slot before a request runs
//! and gives it back when the response is finished. [`MemorySlotStore`] counts in process (a per-instance limit);
//! the Redis store counts for the whole fleet, where every slot has an expiry so that a crashed instance cannot
//! hold capacity forever ([`SlotStore::slots_expire`]): a long request renews its slot while it runs.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::slot::{SlotId, SlotStore, MemorySlotStore, block_on_ready as block_on};
//!
//! # fn main() -> Result<(), tollgate_core::StoreError> {
//! let store = MemorySlotStore::new();
//! let ttl = Duration::from_secs(30);
//! let (a, b) = (SlotId::new(), SlotId::new());
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

pub use memory::MemorySlotStore;

use crate::StoreError;

/// A unique id for one request's slot: unique within the process (a counter) and, with overwhelming
/// probability, across a fleet (a random per-process half).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(u128);

impl SlotId {
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

impl Default for SlotId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A store's answer to a slot request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Whether the slot was granted.
    pub granted: bool,
    /// Slots held on the key: including the new one when granted, the ones blocking it when not.
    pub in_flight: u64,
    /// The ceiling the request was checked against.
    pub limit: u64,
}

/// Counts in-flight requests per key against a ceiling.
///
/// Every method on one key is atomic: cleanup of expired slots, the count and the admission happen together, so
/// concurrent acquirers can never exceed `limit` between them.
pub trait SlotStore: Send + Sync + 'static {
    /// Whether slots live outside this process and expire unless renewed (a shared store): holders then renew
    /// them while the request runs, and release them from a spawned task. In-process slots never expire and their
    /// futures are ready at once.
    fn slots_expire(&self) -> bool;

    /// Grants `slot` on `key` if fewer than `limit` slots are held, for `ttl` (ignored by stores whose slots do
    /// not expire).
    fn acquire(
        &self,
        key: &str,
        slot: SlotId,
        limit: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send;

    /// Extends a held slot to `ttl` from now; `false` when the slot was no longer held (it expired).
    fn renew(
        &self,
        key: &str,
        slot: SlotId,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives a slot back. Releasing a slot that is not held does nothing.
    fn release(
        &self,
        key: &str,
        slot: SlotId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl<L: SlotStore> SlotStore for Arc<L> {
    fn slots_expire(&self) -> bool {
        (**self).slots_expire()
    }

    fn acquire(
        &self,
        key: &str,
        slot: SlotId,
        limit: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        (**self).acquire(key, slot, limit, ttl)
    }

    fn renew(
        &self,
        key: &str,
        slot: SlotId,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).renew(key, slot, ttl)
    }

    fn release(
        &self,
        key: &str,
        slot: SlotId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(key, slot)
    }
}

/// Polls a future that is ready at once (e.g. any [`MemorySlotStore`] call) and returns its output.
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
