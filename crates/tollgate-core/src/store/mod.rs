//! Where limiter state lives: the [`Store`] trait and the in-process [`MemoryStore`].
//!
//! Any algorithm runs on any store, and every store returns the same decisions for the same inputs and times;
//! the state location only decides whether a limit holds per instance or for the whole fleet.

mod bounded;
mod error;
mod evictions;
mod memory;
mod table;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use bounded::{BoundedTable, BoundedTableBuilder, Evicted};
pub use error::StoreError;
pub use evictions::{DEFAULT_NAME, EVICTIONS_TOTAL, EvictionCounts, OnFull};
pub use memory::{DEFAULT_MAX_KEYS, MemoryStore, MemoryStoreBuilder};
pub use table::Expiry;

/// The keyed hasher of key digests ([`Store::key_hasher`]): aHash, keyed at random per store.
///
/// A client chooses its key (an address, an API key, anything a header carries), so the digest must be keyed: a
/// client who cannot learn the key cannot aim two keys at one digest or one bucket of the table. aHash is a keyed
/// hash built to resist hash flooding, at a fraction of SipHash's cost on short keys.
pub type KeyHasher = ahash::AHasher;

use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Decision, Policy, Timestamp};

/// Decides requests against state kept somewhere.
///
/// `key` identifies the client (or route, or both); the same key under two algorithms has separate state, and
/// callers namespace keys per policy. `cost` is how many tokens the request takes (0 inspects without
/// consuming, but is still a decision that may write: [`peek`](Self::peek) writes nothing).
pub trait Store: Send + Sync + 'static {
    /// Decides one request and updates the key's state, atomically.
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Decides one request that the caller may hold back for up to `hold`: under a token bucket (with no lockout),
    /// a request the store would admit no later than `hold` from now is admitted as of that instant, the key's state
    /// spent then ([`token_bucket::decide_held`](crate::algorithm::token_bucket::decide_held)), and answered
    /// [`Allowed`](crate::Outcome::Allowed) with `retry_after` the wait from the decision's `now`. The caller must
    /// not let the request proceed before the store's clock has reached that instant. Anything else is decided as
    /// by [`check`](Self::check).
    ///
    /// The default is [`check`](Self::check): a store may always answer without holding. (The rate limiter's deny
    /// cache, which asks for holds, waits on tokio's timer.)
    fn check_held(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        hold: Duration,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let _ = hold;
        self.check(key, policy, cost)
    }

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
    /// Writing a key's bytes to it in one write and deciding by [`check_digest`](Self::check_digest) of the
    /// result has the same effect as [`check_immediate`](Self::check_immediate) with that key. The digest depends
    /// on how the bytes are split into writes: a limiter that keys by a request's parts writes them the same way
    /// for every request.
    fn key_hasher(&self) -> Option<KeyHasher> {
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

    /// What a request of `cost` on `key` would get now — `remaining`, `reset`, `retry_after`, its outcome —
    /// without consuming anything or writing anything: for dashboards and "N attempts left" pages.
    ///
    /// Unlike [`check`](Self::check) with cost 0, which is a decision like any other (it may write: it refreshes
    /// a key's state and recency, it may rebase a bucket after a clock step back), a peek leaves the store exactly
    /// as it was: [`MemoryStore`] does not touch the key's state or recency, the Redis store runs a read-only
    /// script (`EVALSHA_RO` where the server has it). A peek races with concurrent requests like any read: by
    /// the time the answer is shown, another request may have spent what it reported.
    ///
    /// The answer is the decision the request would get: when admitted, its `remaining` is what would be left
    /// *after* it (so "attempts left, this one included" is `remaining + 1`); a peek of cost 0 reports what remains
    /// now. A policy with a [lockout](crate::Policy::with_lockout) is peeked with it: a locked key reports its
    /// lockout, and a request that would be refused reports the lockout it would start (a peek starts none).
    ///
    /// The default returns [`StoreError::Unsupported`]: a store opts in.
    fn peek(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let _ = (key, policy, cost);
        std::future::ready(Err(StoreError::Unsupported("peek")))
    }

    /// Charges `delta` more (a refund if negative) to `key` for a request decided at `decided_at`, once its real
    /// cost is known (after the response): never refused, it may overdraw, and the key then waits until the
    /// debt is repaid (see [`algorithm::charge`](crate::algorithm::charge) for the floor, and why a refund never
    /// leaves the state better than if the request had not happened). Returns the key's decision right after,
    /// as a request of cost 0 would get it: `remaining` left, or — in debt — `Limited` with `retry_after` the
    /// time until the debt is repaid.
    ///
    /// The default returns [`StoreError::Unsupported`]: a store opts in.
    fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let _ = (key, policy, delta, decided_at);
        std::future::ready(Err(StoreError::Unsupported("charge")))
    }

    /// Runs [`charge`](Self::charge) without waiting for its answer: how a limiter charges a cost known only when
    /// the response is ready, without holding the response back. The default polls the charge once, which is
    /// all an in-process store needs; a store whose charge needs I/O overrides it (the Redis store spawns it on
    /// the current tokio runtime). A failure is logged and handed to `lost` (the limiter counts it): the charge
    /// is lost, the request was already served.
    fn charge_detached(
        &self,
        key: String,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        lost: LostCharge,
    ) {
        let charge = self.charge(&key, policy, delta, decided_at);
        let mut charge = std::pin::pin!(charge);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match charge.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(_)) => {}
            std::task::Poll::Ready(Err(e)) => {
                tracing::warn!(error = %e, "a charge after the response failed; it is lost");
                lost.report(&e);
            }
            std::task::Poll::Pending => {
                tracing::warn!(
                    "this store's charge needs I/O and it does not override Store::charge_detached: the charge is lost"
                );
                lost.report(&StoreError::Unsupported("a detached charge that needs I/O"));
            }
        }
    }

    /// [`charge`](Self::charge) at once by the key's digest (see [`key_hasher`](Self::key_hasher)): how a set of
    /// limiters gives back what a request it refused had spent on a limiter that keys by digest. `None` when this
    /// store cannot (the default).
    fn charge_digest(
        &self,
        digest: u64,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (digest, policy, delta, decided_at);
        None
    }

    /// [`peek`](Self::peek) at once by the key's digest (see [`key_hasher`](Self::key_hasher)); `None` when this
    /// store cannot (the default).
    fn peek_digest(&self, digest: u64, policy: &Policy, cost: u64) -> Option<Decision> {
        let _ = (digest, policy, cost);
        None
    }

    /// Decides several limits of one request as one, atomically: when every enforced check admits, each is spent
    /// as [`check`](Self::check) would spend it; when one refuses, nothing is written anywhere, each refusing
    /// check answers its refusal and each that would have admitted answers as a request of cost 0 would (what
    /// it has left). The answers are in the order of `checks`. One instant decides them all.
    ///
    /// `None` when this store cannot decide these checks as one (the default): the caller decides them one by
    /// one. The Redis store answers in one script call, but for a policy with a lockout, two checks on one key,
    /// or keys in different hash slots of a Redis Cluster.
    fn check_all(
        &self,
        checks: &[Check<'_>],
    ) -> Option<impl Future<Output = Result<Vec<Decision>, StoreError>> + Send> {
        let _ = checks;
        None::<std::future::Ready<_>>
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

/// One limit of a request decided with the others by [`Store::check_all`].
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The key, as [`Store::check`] takes it.
    pub key: &'a str,
    /// The limit's policy.
    pub policy: &'a Policy,
    /// What the request costs on this limit.
    pub cost: u64,
    /// Whether this limit's refusal refuses the request (`false`: a limit in shadow mode, decided and reported,
    /// never refusing).
    pub enforced: bool,
}

/// What a [`Store::charge_detached`] calls when its charge cannot reach the store (an error, or no way to run
/// it): how a limiter counts its lost charges (`tollgate_charges_lost_total{limiter}`). Called at most once.
pub struct LostCharge(Option<Box<Report>>);

/// What a [`LostCharge`] calls.
type Report = dyn FnOnce(&StoreError) + Send;

impl LostCharge {
    /// Calls `f` with the reason the charge was lost.
    pub fn new(f: impl FnOnce(&StoreError) + Send + 'static) -> Self {
        Self(Some(Box::new(f)))
    }

    /// Nobody to tell (the loss is logged only).
    #[must_use]
    pub const fn ignored() -> Self {
        Self(None)
    }

    /// Tells that the charge was lost, and why.
    pub fn report(self, reason: &StoreError) {
        if let Some(f) = self.0 {
            f(reason);
        }
    }
}

impl std::fmt::Debug for LostCharge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LostCharge")
            .field("reported", &self.0.is_some())
            .finish()
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

    fn check_held(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        hold: Duration,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check_held(key, policy, cost, hold)
    }

    fn check_immediate(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).check_immediate(key, policy, cost)
    }

    fn key_hasher(&self) -> Option<KeyHasher> {
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

    fn peek(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).peek(key, policy, cost)
    }

    fn peek_digest(&self, digest: u64, policy: &Policy, cost: u64) -> Option<Decision> {
        (**self).peek_digest(digest, policy, cost)
    }

    fn charge_digest(
        &self,
        digest: u64,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).charge_digest(digest, policy, delta, decided_at)
    }

    fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).charge(key, policy, delta, decided_at)
    }

    fn charge_detached(
        &self,
        key: String,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        lost: LostCharge,
    ) {
        (**self).charge_detached(key, policy, delta, decided_at, lost);
    }

    fn check_all(
        &self,
        checks: &[Check<'_>],
    ) -> Option<impl Future<Output = Result<Vec<Decision>, StoreError>> + Send> {
        (**self).check_all(checks)
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
