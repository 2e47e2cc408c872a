//! Ending leases (idle returns, shutdown, a dropped table) and the handles that reach a table whatever its store.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tollgate_core::Store;

use super::table::{Inner, LeaseTable};

impl<St: Store> Inner<St> {
    /// Ends the leases of keys idle for `idle` (or all of them, `all`): their batches go back to the store.
    async fn end_leases(&self, all: bool) {
        let now = self.clock.now().as_micros();
        let keys: Vec<(u64, Box<str>)> = self
            .leasing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(d, k)| (*d, k.clone()))
            .collect();
        for (digest, key) in keys {
            let ended = self
                .table
                .get(digest, |e| {
                    if e.fetching || (!all && now < e.last_use + self.idle) {
                        return None;
                    }
                    let request = self.ending(e);
                    e.tokens = 0;
                    e.leftover = 0;
                    e.key = None;
                    Some(request)
                })
                .unwrap_or(Some(None));
            if let Some(request) = ended {
                self.leasing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&digest);
                if let Some(request) = request {
                    self.give_back(&key, request).await;
                }
            }
        }
    }

    /// Starts the idle sweep on the first fetch: every `idle`, idle keys' batches go back. It holds the table
    /// weakly, and ends with it.
    pub(super) fn spawn_sweeper(&self, runtime: &tokio::runtime::Handle, this: &Arc<Self>) {
        if self.sweeper.set(()).is_err() {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(this);
        let every = Duration::from_micros(self.idle.max(1_000));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.closed.load(Ordering::Relaxed) {
                    return;
                }
                inner.end_leases(false).await;
            }
        });
    }
}

impl<St: Store> LeaseTable<St> {
    /// A handle for shutdown, idle returns and figures.
    pub(crate) fn handle(self: &Arc<Self>) -> Arc<dyn LeaseControl> {
        self.clone()
    }
}

/// A future a [`LeaseControl`] returns.
pub(crate) type Pending<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// What a layer's leases did so far, read by [`Leases`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LeaseFigures {
    local_allowed: u64,
    local_limited: u64,
    store_calls: u64,
    fetching: usize,
}

impl LeaseFigures {
    /// The figures of two tables together.
    pub(crate) const fn sum(self, other: Self) -> Self {
        Self {
            local_allowed: self.local_allowed + other.local_allowed,
            local_limited: self.local_limited + other.local_limited,
            store_calls: self.store_calls + other.store_calls,
            fetching: self.fetching + other.fetching,
        }
    }
}

/// What [`Leases`] reach, whatever the store type.
pub(crate) trait LeaseControl: Send + Sync {
    fn shutdown(&self) -> Pending<'_>;
    fn return_idle(&self) -> Pending<'_>;
    fn settled(&self) -> Pending<'_>;
    fn figures(&self) -> LeaseFigures;
}

impl<St> Inner<St> {
    /// Until no fetch is under way: woken by the one that lands last, not by polling.
    async fn settled(&self) {
        loop {
            if self.fetching.load(Ordering::Acquire) == 0 {
                return;
            }
            // Listening before looking again: a fetch landing in between notifies this listener.
            let landed = self.settled.listen();
            if self.fetching.load(Ordering::Acquire) == 0 {
                return;
            }
            landed.await;
        }
    }
}

impl<St: Store> LeaseControl for LeaseTable<St> {
    fn shutdown(&self) -> Pending<'_> {
        Box::pin(async move {
            self.inner.closed.store(true, Ordering::Relaxed);
            self.inner.settled().await;
            self.inner.end_leases(true).await;
        })
    }

    fn return_idle(&self) -> Pending<'_> {
        Box::pin(self.inner.end_leases(false))
    }

    fn settled(&self) -> Pending<'_> {
        Box::pin(self.inner.settled())
    }

    fn figures(&self) -> LeaseFigures {
        let i = &self.inner;
        LeaseFigures {
            local_allowed: i.local_allowed.load(Ordering::Relaxed),
            local_limited: i.local_limited.load(Ordering::Relaxed),
            store_calls: i.store_calls.load(Ordering::Relaxed),
            fetching: i.fetching.load(Ordering::Acquire),
        }
    }
}

impl<St> Drop for LeaseTable<St> {
    fn drop(&mut self) {
        (self.on_drop)();
    }
}

/// The best-effort return of a dropped table's batches, on the runtime it is dropped in (without one, the
/// records expire at their deadlines). Fetches under way hold `Inner` and land in the table; their grants then
/// expire likewise.
pub(super) fn drop_hook<St: Store>(inner: &Arc<Inner<St>>) -> Box<dyn Fn() + Send + Sync> {
    let weak = Arc::downgrade(inner);
    Box::new(move || {
        let Some(inner) = weak.upgrade() else { return };
        if !inner.return_on_drop || inner.closed.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { inner.end_leases(true).await });
        }
    })
}

/// A layer's or a leased store's token leases, whatever the store type: what their lease methods
/// ([`RateLimitLayer::leases_shutdown`](crate::RateLimitLayer::leases_shutdown) and the others,
/// [`LeasedStore::shutdown`](crate::LeasedStore::shutdown) and the others) reach; `None`: no leases.
pub(crate) struct Leases(pub(crate) Option<Arc<dyn LeaseControl>>);

impl Leases {
    pub(crate) async fn shutdown(&self) {
        if let Some(table) = self.0.as_ref() {
            table.shutdown().await;
        }
    }

    pub(crate) async fn return_idle(&self) {
        if let Some(table) = self.0.as_ref() {
            table.return_idle().await;
        }
    }

    pub(crate) async fn settled(&self) {
        if let Some(table) = self.0.as_ref() {
            table.settled().await;
        }
    }

    fn figures(&self) -> LeaseFigures {
        self.0.as_ref().map(|t| t.figures()).unwrap_or_default()
    }

    pub(crate) fn local_admissions(&self) -> u64 {
        self.figures().local_allowed
    }

    pub(crate) fn local_denials(&self) -> u64 {
        self.figures().local_limited
    }

    pub(crate) fn store_calls(&self) -> u64 {
        self.figures().store_calls
    }

    pub(crate) fn fetches_in_flight(&self) -> usize {
        self.figures().fetching
    }
}
