//! The lease table: a request's look-up on its key's batch, its wait for a fetch, and the fetches it starts.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use event_listener::{Event, EventListener};
use std::sync::Mutex;
use tollgate_core::store::{BoundedTable, Evicted};
use tollgate_core::token_lease::TokenLeaseRequest;
use tollgate_core::{Clock, Decision, Policy, Store, StoreError};

use super::entry::{Entry, Landing, copy_error};
use crate::Name;

/// What a request's look-up decided, outside the table's lock.
pub(super) enum Take {
    Admit(Decision, Option<Fetch>),
    Deny(Decision),
    /// The batch cannot pay and a fetch is under way (`Fetch`: this request started it): wait for it (listening
    /// when asked to).
    Wait(Option<Fetch>, Option<(Arc<Landing>, EventListener)>),
    Plain(Option<Fetch>),
}

/// What the synchronous look-up of a request on a leasing limiter found.
pub(crate) enum Leased {
    /// Answered from the batch (admitted, or refused while the store said it is short).
    Decided(Decision),
    /// The batch is empty and a fetch is under way: [`LeaseTable::wait`] decides it from that fetch.
    Wait,
    /// The plain path (a cold key, or no fetch possible now).
    Plain,
}

/// What a request that waited for its key's fetch got.
pub(crate) enum Waited {
    Decided(Decision),
    /// The fetch failed or took longer than the bound: the failure policy answers.
    Failed(StoreError),
    Plain,
}

/// A fetch to start.
pub(super) struct Fetch {
    pub(super) digest: u64,
    pub(super) key: Box<str>,
    pub(super) request: TokenLeaseRequest,
    pub(super) sent: u64,
}

pub(crate) struct LeaseTable<St> {
    pub(super) inner: Arc<Inner<St>>,
    /// Returns every batch, best effort (built where the store type is known: `Drop` cannot bound it).
    pub(super) on_drop: Box<dyn Fn() + Send + Sync>,
}

pub(super) struct Inner<St> {
    pub(super) name: Name,
    pub(super) policy: Policy,
    pub(super) store: Arc<St>,
    pub(super) table: BoundedTable<Entry>,
    pub(super) check: RandomState,
    /// Keys that hold (or may hold) a batch: the idle sweep and the shutdown walk these.
    pub(super) leasing: Mutex<HashMap<u64, Box<str>>>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) instance: u64,
    pub(super) seq: AtomicU64,
    pub(super) epoch: u64,
    pub(super) max_batch: u64,
    /// The most a response shows: the burst less the largest batch (a batch that ends unspent takes its tokens
    /// out of the bucket until they refill).
    pub(super) shown_cap: u64,
    /// The quota's fixed point (one token is `token` units, `rate` units accrue per µs): the shown remaining's.
    pub(super) token: u64,
    pub(super) rate: u64,
    /// How long a request waits for a fetch under way.
    pub(super) wait: Duration,
    pub(super) ttl: Duration,
    pub(super) idle: u64,
    pub(super) margin: u64,
    pub(super) fetching: AtomicUsize,
    /// Notified when the last fetch under way lands (`fetching` back to 0).
    pub(super) settled: Event,
    pub(super) closed: AtomicBool,
    pub(super) return_on_drop: bool,
    pub(super) sweeper: OnceLock<()>,
    pub(super) local_allowed: AtomicU64,
    pub(super) local_limited: AtomicU64,
    pub(super) fetches: metrics::Counter,
    pub(super) returns: metrics::Counter,
    pub(super) allowed: metrics::Counter,
    pub(super) limited: metrics::Counter,
    pub(super) store_calls: AtomicU64,
}

impl<St: Store> LeaseTable<St> {
    /// Answers a request from the key's batch (admitted, or refused while the store said it is short), says to
    /// wait for the fetch under way when the batch cannot pay, or leaves it to the plain path; starts a fetch when
    /// one is due.
    pub(crate) fn take(&self, key: &str, cost: u64) -> Leased {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::Relaxed) {
            return Leased::Plain;
        }
        let now = inner.clock.now().as_micros();
        let digest = inner.table.digest(key.as_bytes());
        let check = inner.check.hash_one(key.as_bytes());
        let take = inner.table.get(digest, |e| {
            if e.check != check {
                return Take::Plain(None);
            }
            inner.lookup(e, digest, key, cost, now, false)
        });
        match take {
            None => {
                let entry = Entry::cold(check, cost, now);
                if let Ok(Some(evicted)) = inner.table.insert(digest, entry, now) {
                    self.evicted(evicted);
                }
                Leased::Plain
            }
            Some(take) => match self.settle(take) {
                Some(Ok(decision)) => Leased::Decided(decision),
                Some(Err(_)) => Leased::Wait,
                None => Leased::Plain,
            },
        }
    }

    /// Counts a look-up's answer and starts the fetch it asks for: `Some(Ok)` decided, `Some(Err)` wait (with
    /// the listener if one was asked for), `None` the plain path.
    #[allow(clippy::type_complexity)]
    fn settle(
        &self,
        take: Take,
    ) -> Option<Result<Decision, Option<(Arc<Landing>, EventListener)>>> {
        let inner = &*self.inner;
        match take {
            Take::Admit(decision, fetch) => {
                inner.local_allowed.fetch_add(1, Ordering::Relaxed);
                inner.allowed.increment(1);
                if let Some(fetch) = fetch {
                    self.start(fetch);
                }
                Some(Ok(decision))
            }
            Take::Deny(decision) => {
                inner.local_limited.fetch_add(1, Ordering::Relaxed);
                inner.limited.increment(1);
                Some(Ok(decision))
            }
            Take::Wait(fetch, listener) => {
                // Without a runtime to fetch on there is nothing to wait for.
                if let Some(fetch) = fetch
                    && !self.start(fetch)
                {
                    return None;
                }
                Some(Err(listener))
            }
            Take::Plain(fetch) => {
                if let Some(fetch) = fetch {
                    self.start(fetch);
                }
                None
            }
        }
    }

    /// Decides a request [`take`](Self::take) said to wait for: from the batch the fetch under way brings (or
    /// the next one, if others spent it first), within the configured bound; past it, or when the fetch fails,
    /// the failure policy answers. Its demand was counted by `take`.
    pub(crate) async fn wait(&self, key: &str, cost: u64) -> Waited {
        let inner = &*self.inner;
        if tokio::runtime::Handle::try_current().is_err() {
            return Waited::Plain;
        }
        let digest = inner.table.digest(key.as_bytes());
        let check = inner.check.hash_one(key.as_bytes());
        let deadline = tokio::time::Instant::now() + inner.wait;
        loop {
            if inner.closed.load(Ordering::Relaxed) {
                return Waited::Plain;
            }
            let now = inner.clock.now().as_micros();
            let take = inner.table.get(digest, |e| {
                if e.check != check {
                    return Take::Plain(None);
                }
                inner.lookup(e, digest, key, cost, now, true)
            });
            let Some(take) = take else {
                return Waited::Plain;
            };
            let (landing, landed) = match self.settle(take) {
                Some(Ok(decision)) => return Waited::Decided(decision),
                Some(Err(Some(wait))) => wait,
                Some(Err(None)) | None => return Waited::Plain,
            };
            if tokio::time::timeout_at(deadline, landed).await.is_err() {
                return Waited::Failed(StoreError::Timeout(inner.wait));
            }
            if let Some(err) = landing.failure.get() {
                return Waited::Failed(copy_error(err));
            }
        }
    }

    /// This instance's view on the store's own answer to a request on the plain path (see "Headers under
    /// leases"): the store's remaining plus the unspent batch, never above what it showed before plus what
    /// refilled since.
    pub(crate) fn show_plain(&self, key: &str, cost: u64, decision: &mut Decision) {
        let inner = &*self.inner;
        let now = inner.clock.now().as_micros();
        let digest = inner.table.digest(key.as_bytes());
        let check = inner.check.hash_one(key.as_bytes());
        let limit = inner.policy.quota().burst();
        let shown = inner.table.get(digest, |e| {
            if e.check != check {
                return decision.remaining;
            }
            let tokens = if now < e.deadline { e.tokens } else { 0 };
            let want = e.last_demand.max(e.demand).min(inner.max_batch).max(1);
            e.exhausted = !decision.is_allowed() || decision.remaining < want;
            if inner.policy.lockout_micros() > 0
                && !decision.is_allowed()
                && let Some(retry) = decision.retry_after
            {
                // Under a lockout policy the store's refusal is a lockout (started or reported) until at least
                // `retry`: refused here until then, the batch included, with no store call.
                let until = now
                    .saturating_add(u64::try_from(retry.as_micros()).unwrap_or(u64::MAX))
                    .saturating_sub(inner.margin);
                e.denied_until = e.denied_until.max(until);
                e.next_fetch = e.next_fetch.max(until);
            }
            let view = decision.remaining.saturating_add(tokens).min(limit);
            let spent = if decision.is_allowed() { cost } else { 0 };
            inner.show(e, view, spent, now)
        });
        if let Some(shown) = shown {
            decision.remaining = shown;
        }
    }

    /// Starts `fetch` on the current runtime; false (and the key left on the plain path) without one.
    fn start(&self, fetch: Fetch) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to fetch on: this key stays on the plain path.
            self.inner.table.get(fetch.digest, |e| e.fetching = false);
            return false;
        };
        {
            let mut leasing = self.inner.leasing.lock().unwrap_or_else(|p| p.into_inner());
            leasing
                .entry(fetch.digest)
                .or_insert_with(|| fetch.key.clone());
        }
        self.inner.fetching.fetch_add(1, Ordering::AcqRel);
        self.inner.spawn_sweeper(&runtime, &self.inner);
        let inner = self.inner.clone();
        runtime.spawn(async move { inner.fetch(fetch).await });
        true
    }

    /// An entry the table evicted at its bound: its batch ends as a lease does.
    fn evicted(&self, evicted: Evicted<Entry>) {
        let inner = &self.inner;
        let e = evicted.value;
        if let Some(landing) = &e.landing {
            // Its waiters find no entry and take the plain path.
            landing.land(None);
        }
        inner
            .leasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&evicted.key);
        if let (Some(key), Ok(runtime)) = (e.key.clone(), tokio::runtime::Handle::try_current())
            && let Some(request) = inner.ending(&e)
        {
            let inner = inner.clone();
            runtime.spawn(async move { inner.give_back(&key, request).await });
        }
    }

    /// Whether no key holds a batch and no fetch is under way: dropping the table then returns nothing and leaves
    /// no fetch to land in a table nobody reads.
    pub(crate) fn is_quiet(&self) -> bool {
        self.inner.fetching.load(Ordering::Acquire) == 0
            && self
                .inner
                .leasing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }
}
