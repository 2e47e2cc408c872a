//! The deny cache around a store, for callers that decide on a [`Store`] themselves instead of through
//! [`RateLimitLayer`](crate::RateLimitLayer) (a rate limit service answering gateways, one store call per
//! descriptor): [`DenyCacheConfig::around`] wraps a shared store so that its denials are answered locally until the
//! store's own retry instant, with the same rules as the layer's cache (see [`deny_cache`](super::deny_cache)).
//!
//! ```
//! use tollgate_core::{Decision, MemoryStore, Policy, Quota, Store, StoreError};
//! use tollgate_tower::DenyCacheConfig;
//!
//! // A stand-in for Redis: a shared store that answers asynchronously.
//! struct Shared(MemoryStore);
//! impl Store for Shared {
//!     async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
//!         self.0.check(key, policy, cost).await
//!     }
//!     fn is_shared(&self) -> bool { true }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::token_bucket(Quota::per_minute(2)?);
//! let store = DenyCacheConfig::new().around("gateway", Shared(MemoryStore::new()));
//! assert!(store.check("ann", &policy, 1).await?.is_allowed()); // a token left: nothing held
//! assert!(store.is_empty());
//! assert!(store.check("ann", &policy, 1).await?.is_allowed()); // the last: the next request's denial is held
//! assert_eq!(store.len(), 1);
//! // Answered locally without a store call until the store's retry instant:
//! assert!(!store.check("ann", &policy, 1).await?.is_allowed());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;

use tollgate_core::store::LostCharge;
use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{Check, Decision, Policy, Store, StoreError, Timestamp};

use super::deny_cache::{Asked, DenyCacheConfig, DenyTable, KeyDigests};
use crate::Name;

impl DenyCacheConfig {
    /// Wraps `store` (a shared one: Redis) in this deny cache, its hits counted under `limiter` in
    /// `tollgate_deny_cache_hits_total{limiter}`. Built once, up front.
    ///
    /// An entry belongs to a key *and* its policy: a request decided under another policy (a limit changed by a
    /// reload, or given by the request) is not answered by a denial made under the first, and asks the store.
    pub fn around<S: Store>(&self, limiter: impl Into<Name>, store: S) -> DenyCachedStore<S> {
        DenyCachedStore {
            table: self.build(&limiter.into()),
            store,
        }
    }
}

/// A [`Store`] whose denials are answered locally until the store's own retry instant: from
/// [`DenyCacheConfig::around`].
///
/// [`check`](Store::check) refuses from the cache, without I/O, or asks the store (a key whose entry has just
/// expired asks once, the other requests wait for that reply). The rest goes to the store unchanged. It says it is not shared
/// ([`Store::is_shared`]), so that a layer over it does not cache its denials a second time.
pub struct DenyCachedStore<S> {
    table: DenyTable,
    store: S,
}

impl<S> fmt::Debug for DenyCachedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCachedStore")
            .field("denials", &self.table.len())
            .finish_non_exhaustive()
    }
}

impl<S> DenyCachedStore<S> {
    /// The store it wraps.
    pub const fn inner(&self) -> &S {
        &self.store
    }

    /// Forgets every cached denial (an operator reset keys in the store): the next requests ask the store.
    pub fn clear(&self) {
        self.table.clear();
    }

    /// Denied keys held now (expired ones included until replaced or swept).
    #[must_use]
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no denial is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<S: Store> Store for DenyCachedStore<S> {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        let key_under = self.table.key_under(key, policy);
        match self
            .table
            .decide(key_under, key, policy, cost, |hold| {
                self.store.check_held(key, policy, cost, hold)
            })
            .await
        {
            Asked::Cached(decision) => Ok(decision),
            Asked::Store(result) => result,
        }
    }

    /// The wrapped store's one call; its denials are cached, and its admissions' next denials if it wrote them.
    /// `None` (each check then takes [`check`](Store::check)'s way) when a check that does not refuse the others
    /// has an entry in the cache (a cached denial, or one just expired whose single flight the key's requests
    /// share): the cache answers it. An enforced check is asked with the others even so: a cached denial would
    /// refuse the request, and the one call that the others need for what they have left refuses it as well,
    /// spending nothing.
    fn check_all(
        &self,
        checks: &[Check<'_>],
    ) -> Option<impl Future<Output = Result<Vec<Decision>, StoreError>> + Send> {
        let keys: Vec<KeyDigests> = checks
            .iter()
            .map(|c| self.table.key_under(c.key, c.policy))
            .collect();
        if keys
            .iter()
            .zip(checks)
            .any(|(&key, c)| !c.enforced && self.table.holds_entry(key, c.cost))
        {
            return None;
        }
        let sent = self.table.now();
        let call = self.store.check_all(checks)?;
        Some(async move {
            let decisions = call.await?;
            let committed = decisions
                .iter()
                .zip(checks)
                .all(|(d, c)| d.is_allowed() || !c.enforced);
            for ((decision, c), key) in decisions.iter().zip(checks).zip(keys) {
                if committed || !decision.is_allowed() {
                    self.table.record(
                        key,
                        c.key,
                        c.policy,
                        c.cost,
                        sent,
                        std::time::Duration::ZERO,
                        decision,
                    );
                }
            }
            Ok(decisions)
        })
    }

    // No look-up of its own here: `check` answers a cached denial without I/O, and a look-up in both would hash
    // and search the key twice on every call the store must answer.
    fn check_immediate(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
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

    fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        // A refund only makes a cached denial stricter than the store until it expires (never an admission the
        // store would refuse); an extra charge only delays what the store admits.
        self.store.charge(key, policy, delta, decided_at)
    }

    fn charge_detached(
        &self,
        key: String,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        lost: LostCharge,
    ) {
        self.store
            .charge_detached(key, policy, delta, decided_at, lost);
    }

    fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> impl Future<Output = Result<TokenLeaseGrant, StoreError>> + Send {
        self.store.lease_tokens(key, policy, request)
    }

    fn supports_token_leases(&self) -> bool {
        self.store.supports_token_leases()
    }
}
