//! Token leases around a store, for callers that decide on a [`Store`] themselves instead of through
//! [`RateLimitLayer`](crate::RateLimitLayer) (a rate limit service answering gateways, one store call per
//! descriptor): [`LeaseConfig::around`] wraps a store that leases tokens (Redis) so that a hot key is admitted from
//! a batch leased from it, with the layer's rules (see [`token_lease`](super::token_lease)), whatever policy each
//! call brings.
//!
//! ```
//! use tollgate_core::{MemoryStore, Policy, Quota, Store};
//! use tollgate_tower::LeaseConfig;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Any store that leases tokens: Redis in production, the in-process store here.
//! let store = LeaseConfig::new().share_percent(5)?.around("gateway", MemoryStore::new());
//! let leases = store.clone(); // shares the leases
//! let policy = Policy::token_bucket(Quota::per_second(1_000)?);
//! for _ in 0..200 {
//!     assert!(store.check("hot", &policy, 1).await?.is_allowed());
//!     tokio::task::yield_now().await; // lets a fetch land
//! }
//! assert!(leases.local_admissions() > 100); // most were admitted from a batch
//! leases.shutdown().await; // unspent tokens go back to the store
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use tollgate_core::store::LostCharge;
use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{Algorithm, Decision, Policy, Store, StoreError, Timestamp};

use super::token_lease::{
    LeaseConfig, LeaseControl, LeaseFigures, LeaseTable, Leased, Leases, Pending, Waited,
};
use crate::Name;

impl LeaseConfig {
    /// Wraps `store` (one whose [`Store::supports_token_leases`] is true: Redis, the in-process store) in token
    /// leases with this configuration, counted under `limiter` in the lease metrics. Built once, up front.
    ///
    /// Each policy a call brings leases in a table of its own (a limit changed by a reload starts afresh; the
    /// tables of earlier policies end their batches as they expire or go idle), at most 256 at once: callers may
    /// bring policies of their own (a gateway's limit override), and each table holds up to
    /// [`max_keys`](LeaseConfig::max_keys) keys. A new policy beyond them first drops the tables whose keys hold
    /// no batch (their figures still counted; looked for at most once a second); if none can go, its requests take
    /// the plain path. A fixed window, which the stores do not lease, and a store that leases nothing keep the
    /// plain path.
    pub fn around<S: Store>(&self, limiter: impl Into<Name>, store: S) -> LeasedStore<S> {
        let store = Arc::new(store);
        LeasedStore {
            tables: Arc::new(Tables {
                name: limiter.into(),
                config: self.clone(),
                on: store.supports_token_leases(),
                store: store.clone(),
                by_policy: RwLock::new(HashMap::new()),
                retired: Mutex::new(LeaseFigures::default()),
                started: Instant::now(),
                next_room_search: AtomicU64::new(0),
                closed: AtomicBool::new(false),
            }),
            store,
        }
    }
}

/// The most policies a [`LeasedStore`] leases at once (see [`LeaseConfig::around`]).
pub(crate) const MAX_LEASED_POLICIES: usize = 256;

/// How often, at most, a full set of tables is searched for room (ms).
const ROOM_SEARCH_EVERY_MS: u64 = 1_000;

/// What a charge on a leased policy gets.
const CHARGE_UNDER_LEASES: StoreError = StoreError::Unsupported("charges on a leased policy");

/// A [`Store`] whose hot keys are admitted from batches of tokens leased from the store it wraps: from
/// [`LeaseConfig::around`].
///
/// [`check`](Store::check) answers from the key's batch, waits for the key's fetch under way, or asks the store
/// (its answer shown as this instance sees the key, the unspent batch included); [`check_immediate`](Store::check_immediate)
/// leaves every leased policy to `check`. A leased policy's [`charge`](Store::charge) is refused (a refund is not
/// floored at the leased tokens). The rest goes to the store unchanged. It says it leases no tokens itself
/// ([`Store::supports_token_leases`]), so that a layer over it does not lease a second time.
pub struct LeasedStore<S> {
    tables: Arc<Tables<S>>,
    store: Arc<S>,
}

impl<S> fmt::Debug for LeasedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedStore")
            .field("limiter", &self.tables.name)
            .field("leasing", &self.tables.on)
            .finish_non_exhaustive()
    }
}

impl<S: Store> LeasedStore<S> {
    /// The store it wraps.
    #[must_use]
    pub fn inner(&self) -> &S {
        &self.store
    }

    fn leases(&self) -> Leases {
        let control: Arc<dyn LeaseControl> = self.tables.clone();
        Leases(Some(control))
    }

    /// Stops leasing (later calls take the plain path), waits for fetches under way, and returns every unspent
    /// batch to the store. Call it before the process exits (on a clone kept for it: the clones share the leases).
    pub async fn shutdown(&self) {
        self.leases().shutdown().await;
    }

    /// Returns the batches of keys idle for the configured time now, rather than at the next sweep.
    pub async fn return_idle(&self) {
        self.leases().return_idle().await;
    }

    /// Calls admitted from a leased batch so far.
    #[must_use]
    pub fn local_admissions(&self) -> u64 {
        self.leases().local_admissions()
    }

    /// Calls refused locally (a batch spent while the store said it was short) so far.
    #[must_use]
    pub fn local_denials(&self) -> u64 {
        self.leases().local_denials()
    }

    /// Store calls leases made so far (fetches and returns; the plain path's calls are not counted here).
    #[must_use]
    pub fn store_calls(&self) -> u64 {
        self.leases().store_calls()
    }

    /// Fetches under way now.
    #[must_use]
    pub fn fetches_in_flight(&self) -> usize {
        self.leases().fetches_in_flight()
    }

    /// Waits until no fetch is under way (tests and benchmarks that step a manual clock).
    pub async fn settled(&self) {
        self.leases().settled().await;
    }
}

/// A clone shares the leases (and the store): shut them down through any clone.
impl<S> Clone for LeasedStore<S> {
    fn clone(&self) -> Self {
        Self {
            tables: self.tables.clone(),
            store: self.store.clone(),
        }
    }
}

/// The lease tables of a [`LeasedStore`], one per policy.
struct Tables<S> {
    name: Name,
    config: LeaseConfig,
    /// Whether the store leases tokens at all.
    on: bool,
    store: Arc<S>,
    by_policy: RwLock<HashMap<Policy, Arc<LeaseTable<S>>>>,
    /// The figures of the tables dropped to make room.
    retired: Mutex<LeaseFigures>,
    /// When the tables were made: the origin of `next_room_search`.
    started: Instant,
    /// Milliseconds after `started` before which a full set of tables is not searched for room again.
    next_room_search: AtomicU64,
    /// Shut down: no table is made any more.
    closed: AtomicBool,
}

impl<S: Store> Tables<S> {
    /// Whether the store leases `policy`'s tokens (a fixed window is never leased).
    fn leases(&self, policy: &Policy) -> bool {
        self.on && policy.algorithm() != Algorithm::FixedWindow
    }

    /// Whether `policy` is leased now: decided by [`check`](Store::check) from a batch, its charges refused. Read
    /// without the tables' lock, so that only `check` looks a table up.
    fn leased(&self, policy: &Policy) -> bool {
        self.leases(policy) && !self.closed.load(Ordering::Relaxed)
    }

    /// The table `policy` leases in, made on its first call; `None` for the plain path.
    fn table(&self, policy: &Policy) -> Option<Arc<LeaseTable<S>>> {
        if !self.leases(policy) {
            return None;
        }
        let full = {
            let tables = self.by_policy.read().unwrap_or_else(|p| p.into_inner());
            if let Some(table) = tables.get(policy) {
                return Some(table.clone());
            }
            tables.len() >= MAX_LEASED_POLICIES
        };
        // Full: room is looked for at most once a second, so that the requests of policies beyond the bound take
        // the plain path without the write lock and a walk of every table each.
        if (full && !self.room_search_due()) || self.closed.load(Ordering::Relaxed) {
            return None;
        }
        let mut tables = self.by_policy.write().unwrap_or_else(|p| p.into_inner());
        if let Some(table) = tables.get(policy) {
            return Some(table.clone());
        }
        if tables.len() >= MAX_LEASED_POLICIES {
            if full {
                self.make_room(&mut tables);
            }
            if tables.len() >= MAX_LEASED_POLICIES {
                return None;
            }
        }
        let table = self.config.build(&self.name, policy, self.store.clone());
        tables.insert(*policy, table.clone());
        Some(table)
    }

    /// Whether a full set of tables may be searched for room now: once a second at most, the first caller after
    /// the second passes.
    fn room_search_due(&self) -> bool {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let due = self.next_room_search.load(Ordering::Relaxed);
        now >= due
            && self
                .next_room_search
                .compare_exchange(
                    due,
                    now + ROOM_SEARCH_EVERY_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Drops the tables that no request holds (under the write lock no request can take one) and that are quiet
    /// ([`LeaseTable::is_quiet`]), keeping their figures.
    fn make_room(&self, tables: &mut HashMap<Policy, Arc<LeaseTable<S>>>) {
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        tables.retain(|_, table| {
            let idle = Arc::strong_count(table) == 1 && table.is_quiet();
            if idle {
                *retired = retired.sum(table.figures());
            }
            !idle
        });
    }

    /// Every table made so far.
    fn all(&self) -> Vec<Arc<LeaseTable<S>>> {
        self.by_policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

impl<S: Store> LeaseControl for Tables<S> {
    fn shutdown(&self) -> Pending<'_> {
        Box::pin(async move {
            self.closed.store(true, Ordering::Relaxed);
            for table in self.all() {
                table.shutdown().await;
            }
        })
    }

    fn return_idle(&self) -> Pending<'_> {
        Box::pin(async move {
            for table in self.all() {
                table.return_idle().await;
            }
        })
    }

    fn settled(&self) -> Pending<'_> {
        Box::pin(async move {
            for table in self.all() {
                table.settled().await;
            }
        })
    }

    fn figures(&self) -> LeaseFigures {
        let tables = self.by_policy.read().unwrap_or_else(|p| p.into_inner());
        let retired = *self.retired.lock().unwrap_or_else(|p| p.into_inner());
        tables
            .values()
            .map(|table| table.figures())
            .fold(retired, LeaseFigures::sum)
    }
}

impl<S: Store> Store for LeasedStore<S> {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        let Some(table) = self.tables.table(policy) else {
            return self.store.check(key, policy, cost).await;
        };
        match table.take(key, cost) {
            Leased::Decided(decision) => return Ok(decision),
            // The key's batch is empty and a fetch is under way: decided from the batch it brings.
            Leased::Wait => match table.wait(key, cost).await {
                Waited::Decided(decision) => return Ok(decision),
                Waited::Failed(err) => return Err(err),
                Waited::Plain => {}
            },
            Leased::Plain => {}
        }
        let mut decision = self.store.check(key, policy, cost).await?;
        table.show_plain(key, cost, &mut decision);
        Ok(decision)
    }

    // A leased policy is decided by `check` alone: a look-up here and another there would count the request's
    // demand twice.
    fn check_immediate(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        if self.tables.leased(policy) {
            return None;
        }
        self.store.check_immediate(key, policy, cost)
    }

    fn peek(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.store.peek(key, policy, cost)
    }

    // A refund would put tokens back under leased ones (the store's charge does not floor at what is leased): a
    // leased policy's charge is refused, as the layer keeps leases and charges after the response apart.
    async fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> Result<Decision, StoreError> {
        if self.tables.leased(policy) {
            return Err(CHARGE_UNDER_LEASES);
        }
        self.store.charge(key, policy, delta, decided_at).await
    }

    fn charge_detached(
        &self,
        key: String,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        lost: LostCharge,
    ) {
        if self.tables.leased(policy) {
            lost.report(&CHARGE_UNDER_LEASES);
            return;
        }
        self.store
            .charge_detached(key, policy, delta, decided_at, lost);
    }

    fn is_shared(&self) -> bool {
        self.store.is_shared()
    }

    fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> impl Future<Output = Result<TokenLeaseGrant, StoreError>> + Send {
        self.store.lease_tokens(key, policy, request)
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::{ManualClock, MemoryStore, Policy, Quota, Store, Timestamp};

    use super::MAX_LEASED_POLICIES;
    use crate::LeaseConfig;

    /// Policies brought by callers beyond the bound: the quiet tables make room, the one whose key holds a batch
    /// stays and keeps leasing, and the admissions counted never fall.
    #[tokio::test(flavor = "current_thread")]
    async fn policies_beyond_the_bound_drop_quiet_tables_and_keep_the_leasing_ones() {
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000_000));
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let leased = LeaseConfig::new()
            .clock(clock.clone())
            .around("gateway", store);
        let handle = leased.clone();
        let hot = Policy::token_bucket(Quota::per_second(1_000).unwrap());
        for _ in 0..40 {
            assert!(leased.check("hot", &hot, 1).await.unwrap().is_allowed());
            handle.settled().await;
        }
        let leased_before = handle.local_admissions();
        assert!(leased_before > 0, "the hot key leases");
        for i in 0..3 * MAX_LEASED_POLICIES as u64 {
            let policy = Policy::token_bucket(Quota::per_hour(10_000 + i).unwrap());
            assert!(leased.check("cold", &policy, 1).await.unwrap().is_allowed());
            let tables = leased.tables.by_policy.read().unwrap().len();
            assert!(tables <= MAX_LEASED_POLICIES, "{tables} tables");
            assert!(handle.local_admissions() >= leased_before);
        }
        assert!(
            leased.tables.by_policy.read().unwrap().contains_key(&hot),
            "the table holding a batch stays"
        );
        for _ in 0..10 {
            assert!(leased.check("hot", &hot, 1).await.unwrap().is_allowed());
            handle.settled().await;
        }
        assert!(
            handle.local_admissions() > leased_before,
            "and keeps leasing"
        );
        handle.shutdown().await;
    }
}
