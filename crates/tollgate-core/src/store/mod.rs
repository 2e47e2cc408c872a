//! Where limiter state lives: the [`Store`] trait and the in-process [`MemoryStore`].
//!
//! Any algorithm runs on any store, and every store returns the same decisions for the same inputs and times;
//! the state location only decides whether a limit holds per instance or for the whole fleet.

mod bounded;
mod error;
mod evictions;
mod memory;
mod memory_lease;
mod table;

use std::future::Future;
use std::hash::DefaultHasher;
use std::sync::Arc;

pub use bounded::{BoundedTable, BoundedTableBuilder, Evicted};
pub use error::StoreError;
pub use evictions::{DEFAULT_NAME, EVICTIONS_TOTAL, EvictionCounts, OnFull};
pub use memory::{DEFAULT_MAX_KEYS, MemoryStore, MemoryStoreBuilder};
pub use table::Expiry;

use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Decision, Policy};

/// Decides requests against state kept somewhere.
///
/// `key` identifies the client (or route, or both); the same key under two algorithms has separate state, and
/// callers namespace keys per policy. `cost` is how many tokens the request takes (0 inspects without
/// consuming).
pub trait Store: Send + Sync + 'static {
    /// Decides one request and updates the key's state, atomically.
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Decides at once when this store can do so without waiting (an in-process store), with the same effect as
    /// [`check`](Self::check); `None` when the answer needs I/O and `check` must be awaited. Lets a limiter skip
    /// allocating a future on its hot path.
    fn check_immediate(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (key, policy, cost);
        None
    }

    /// For a store that keeps only keyed digests of its keys (the in-process one): a hasher keyed as this store's
    /// own, so that a limiter can feed it a key's parts and skip building the key's text. `None` (the default)
    /// for a store that needs the text.
    ///
    /// Writing a key's bytes to it and deciding by [`check_digest`](Self::check_digest) of the result has the
    /// same effect as [`check_immediate`](Self::check_immediate) with that key.
    fn key_hasher(&self) -> Option<DefaultHasher> {
        None
    }

    /// Decides at once the key whose digest, by [`key_hasher`](Self::key_hasher), is `digest`. `None` when this
    /// store cannot (it then needs the key's text).
    fn check_digest(
        &self,
        digest: u64,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (digest, policy, cost);
        None
    }

    /// Whether this store's state is shared by other instances (Redis) and its denials are the shared state's
    /// own answers: a rate limiter then caches them until their retry instant (its deny cache, on by default for
    /// such a store). `false` (the default) for an in-process store, and for a store that may synthesize
    /// denials of its own (a store-level failure policy answering for an unreachable server).
    fn is_shared(&self) -> bool {
        false
    }

    /// Answers a [token lease](crate::token_lease) call on the store's clock: a batch of `key`'s tokens (token
    /// bucket) or window slots (sliding window) debited at once, a report of what is left, or a return. The
    /// default answers [`StoreError::Unsupported`]; see [`supports_token_leases`](Self::supports_token_leases).
    fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> impl Future<Output = Result<TokenLeaseGrant, StoreError>> + Send {
        let _ = (key, policy, request);
        std::future::ready(Err(StoreError::Unsupported("token leases")))
    }

    /// Whether [`lease_tokens`](Self::lease_tokens) is answered (the in-process and Redis stores: true).
    fn supports_token_leases(&self) -> bool {
        false
    }
}

impl<S: Store> Store for Arc<S> {
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check(key, policy, cost)
    }

    fn check_immediate(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).check_immediate(key, policy, cost)
    }

    fn key_hasher(&self) -> Option<DefaultHasher> {
        (**self).key_hasher()
    }

    fn check_digest(
        &self,
        digest: u64,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).check_digest(digest, policy, cost)
    }

    fn is_shared(&self) -> bool {
        (**self).is_shared()
    }

    fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> impl Future<Output = Result<TokenLeaseGrant, StoreError>> + Send {
        (**self).lease_tokens(key, policy, request)
    }

    fn supports_token_leases(&self) -> bool {
        (**self).supports_token_leases()
    }
}
