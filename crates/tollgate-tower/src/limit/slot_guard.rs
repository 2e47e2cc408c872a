//! The guard of one concurrency slot: renews a shared slot while the request runs, releases it on drop (counted
//! in its limiter's [`Releases`], if it keeps them, until the store's first answer).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tollgate_core::slot::{SlotId, SlotStore};

use crate::limit::releases::Releases;

/// Holds `slot` on `key` in `store` until dropped.
pub(crate) struct SlotGuard<L: SlotStore> {
    store: Arc<L>,
    releases: Option<Arc<Releases>>,
    key: String,
    slot: SlotId,
    /// The slot's time to live: a release is retried this long, by when the slot has expired anyway.
    ttl: Duration,
    renewal: Option<JoinHandle<()>>,
    armed: bool,
}

impl<L: SlotStore> SlotGuard<L> {
    /// Guards a granted slot. A slot that expires (a shared store) is renewed every `ttl / 3` while the guard
    /// lives, so a long request keeps it while a crashed instance's slots run out after `ttl`.
    pub(crate) fn new(
        store: Arc<L>,
        releases: Option<Arc<Releases>>,
        key: String,
        slot: SlotId,
        ttl: Duration,
    ) -> Self {
        let renewal = if store.slots_expire() {
            match Handle::try_current() {
                Ok(handle) => Some(handle.spawn(renew(store.clone(), key.clone(), slot, ttl))),
                Err(_) => {
                    tracing::debug!(
                        key,
                        "no tokio runtime: the slot is not renewed and lasts {ttl:?}"
                    );
                    None
                }
            }
        } else {
            None
        };
        Self {
            store,
            releases,
            key,
            slot,
            ttl,
            renewal,
            armed: true,
        }
    }
}

impl<L: SlotStore> SlotGuard<L> {
    /// A guard that never renews: for a slot whose grant is not known yet (the acquire is in flight and may be
    /// cancelled) or never will be (its reply was lost), asked for `ttl`. Released on drop unless
    /// [`disarm`](Self::disarm)ed.
    pub(crate) fn unrenewed(
        store: Arc<L>,
        releases: Option<Arc<Releases>>,
        key: String,
        slot: SlotId,
        ttl: Duration,
    ) -> Self {
        Self {
            store,
            releases,
            key,
            slot,
            ttl,
            renewal: None,
            armed: true,
        }
    }

    /// The slot is known not to be held (or another guard holds it): nothing to release on drop.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

async fn renew<L: SlotStore>(store: Arc<L>, key: String, slot: SlotId, ttl: Duration) {
    let every = (ttl / 3).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(every).await;
        match store.renew(&key, slot, ttl).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    key,
                    "concurrency slot expired before its request finished (renewals failed for longer than \
                     the slot time {ttl:?}); the request now runs uncounted"
                );
                return;
            }
            // The next renewal may succeed before the slot runs out.
            Err(err) => tracing::debug!(key, error = %err, "concurrency slot renewal failed"),
        }
    }
}

impl<L: SlotStore> Drop for SlotGuard<L> {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if !self.armed {
            return;
        }
        let shared = self.store.slots_expire();
        // A store doing I/O needs the runtime (its timeout and connections live there); without one the slot
        // simply expires.
        let handle = match (shared, Handle::try_current()) {
            (false, _) => None,
            (true, Ok(handle)) => Some(handle),
            (true, Err(_)) => {
                tracing::debug!(
                    key = self.key,
                    "no tokio runtime to release the slot: it expires instead"
                );
                return;
            }
        };
        // Counted from now, before the response is finished: the client's next request, which may reach the store
        // before this release, waits for it if refused.
        let mut in_flight = self
            .releases
            .as_ref()
            .filter(|_| shared)
            .map(|releases| releases.start(&self.key));
        let store = self.store.clone();
        let key = std::mem::take(&mut self.key);
        let slot = self.slot;
        // Renewed at most `ttl` ago, or asked for `ttl` now: by then the slot has expired on the store, and a
        // release has nothing left to give back.
        let give_up = Instant::now() + self.ttl;
        let mut release = Box::pin(async move {
            // A shared store's release is retried while it fails (a stall, an open circuit that skips it) until
            // the slot has expired: a slot not given back holds its place until then, and one whose acquire timed
            // out may be granted when the stall ends with nobody left to give it back but this release (the store
            // refuses a slot released before it was acquired).
            let mut pause = Duration::from_millis(50);
            let mut tries = 0u32;
            loop {
                let released = store.release(&key, slot).await;
                tries += 1;
                // The acquires refused meanwhile wait for the release to land, so that a client's next request
                // does not find its own finished request's slot held when one release is cut off on a busy
                // machine; past a second failure they stop waiting (a failing store would fail them too, and the
                // retries that follow may take a minute).
                if released.is_ok() || tries >= 2 {
                    drop(in_flight.take());
                }
                match released {
                    Ok(()) => return,
                    Err(err) if shared && Instant::now() + pause < give_up => {
                        tracing::debug!(key, error = %err, "releasing a concurrency slot failed; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                    Err(err) => {
                        tracing::debug!(key, error = %err, "releasing a concurrency slot failed; it expires instead");
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
