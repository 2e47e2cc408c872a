//! The guard of one concurrency lease: renews a shared lease while the request runs, releases it on drop.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tollgate_core::lease::{LeaseId, LeaseStore};

/// How long a shared store's release is retried before the lease is left to expire.
const RELEASE_RETRIES_FOR: Duration = Duration::from_secs(60);

/// Holds `lease` on `key` in `store` until dropped.
pub(crate) struct LeaseGuard<L: LeaseStore> {
    store: Arc<L>,
    key: String,
    lease: LeaseId,
    renewal: Option<JoinHandle<()>>,
    armed: bool,
}

impl<L: LeaseStore> LeaseGuard<L> {
    /// Guards a granted lease. A lease that expires (a shared store) is renewed every `ttl / 3` while the guard
    /// lives, so a long request keeps it while a crashed instance's leases run out after `ttl`.
    pub(crate) fn new(store: Arc<L>, key: String, lease: LeaseId, ttl: Duration) -> Self {
        let renewal = if store.leases_expire() {
            match Handle::try_current() {
                Ok(handle) => Some(handle.spawn(renew(store.clone(), key.clone(), lease, ttl))),
                Err(_) => {
                    tracing::debug!(
                        key,
                        "no tokio runtime: the lease is not renewed and lasts {ttl:?}"
                    );
                    None
                }
            }
        } else {
            None
        };
        Self {
            store,
            key,
            lease,
            renewal,
            armed: true,
        }
    }
}

impl<L: LeaseStore> LeaseGuard<L> {
    /// A guard that never renews: for a lease whose grant is not known yet (the acquire is in flight and may be
    /// cancelled) or never will be (its reply was lost). Released on drop unless [`disarm`](Self::disarm)ed.
    pub(crate) fn unrenewed(store: Arc<L>, key: String, lease: LeaseId) -> Self {
        Self {
            store,
            key,
            lease,
            renewal: None,
            armed: true,
        }
    }

    /// The lease is known not to be held (or another guard holds it): nothing to release on drop.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

async fn renew<L: LeaseStore>(store: Arc<L>, key: String, lease: LeaseId, ttl: Duration) {
    let every = (ttl / 3).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(every).await;
        match store.renew(&key, lease, ttl).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    key,
                    "concurrency lease expired before its request finished (renewals failed for longer than \
                     the lease time {ttl:?}); the request now runs uncounted"
                );
                return;
            }
            // The next renewal may succeed before the lease runs out.
            Err(err) => tracing::debug!(key, error = %err, "concurrency lease renewal failed"),
        }
    }
}

impl<L: LeaseStore> Drop for LeaseGuard<L> {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if !self.armed {
            return;
        }
        let shared = self.store.leases_expire();
        // A store doing I/O needs the runtime (its timeout and connections live there); without one the lease
        // simply expires.
        let handle = match (shared, Handle::try_current()) {
            (false, _) => None,
            (true, Ok(handle)) => Some(handle),
            (true, Err(_)) => {
                tracing::debug!(
                    key = self.key,
                    "no tokio runtime to release the lease: it expires instead"
                );
                return;
            }
        };
        let store = self.store.clone();
        let key = std::mem::take(&mut self.key);
        let lease = self.lease;
        let mut release = Box::pin(async move {
            // A shared store's release is retried while it fails (a stall, an open circuit that skips it): a lease
            // not given back holds its slot until it expires, and one whose acquire timed out may be granted
            // when the stall ends with nobody left to give it back but this release (the store refuses a lease
            // released before it was acquired).
            let give_up = Instant::now() + RELEASE_RETRIES_FOR;
            let mut pause = Duration::from_millis(50);
            loop {
                match store.release(&key, lease).await {
                    Ok(()) => return,
                    Err(err) if shared && Instant::now() + pause < give_up => {
                        tracing::debug!(key, error = %err, "releasing a concurrency lease failed; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                    Err(err) => {
                        tracing::debug!(key, error = %err, "releasing a concurrency lease failed; it expires instead");
                        return;
                    }
                }
            }
        });
        // In-process stores release at once; a shared store's release is finished by a task, so a dropped
        // response never waits for Redis.
        let pending = release
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending();
        if let (true, Some(handle)) = (pending, handle) {
            handle.spawn(release);
        }
    }
}
