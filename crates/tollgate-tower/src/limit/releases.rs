//! This instance's slot releases still on their way to a shared store, per key.
//!
//! A shared store's release is sent by a task after the response (a dropped response never waits for Redis), so a
//! client that sends its next request as soon as it has read a response can reach the store before that release
//! and find its own previous slot still held. The concurrency limiter's acquire refused when one of this
//! instance's releases on the key was pending as it was sent, or is pending still, therefore waits for it and asks
//! once more. What counts is the release pending *as the acquire was sent*: it may reach the store after the
//! acquire and still be answered before the acquire's refusal comes back. The wait is here, in the
//! limiter's permit path, rather than in a store, because this path is what hands the release to a task: it holds
//! for every shared [`SlotStore`](tollgate_core::slot::SlotStore).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use event_listener::Event;

/// The releases in flight of one limiter, by key.
#[derive(Default)]
pub(crate) struct Releases {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The id of the next release started: ids grow, so a waiter knows which releases started before it.
    next: u64,
    keys: HashMap<String, Pending>,
}

struct Pending {
    ids: BTreeSet<u64>,
    settled: Event,
}

/// That releases on a key were pending at some instant: each was started then, so each has ended or is pending
/// still when the mark is used.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark;

/// One release in flight, counted until dropped (its first answer came, or its task ended).
pub(crate) struct InFlight {
    releases: Arc<Releases>,
    key: String,
    id: u64,
}

impl Releases {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a release of a slot on `key` until the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>, key: &str) -> InFlight {
        let mut state = self.lock();
        let id = state.next;
        state.next += 1;
        state
            .keys
            .entry(key.to_owned())
            .or_insert_with(|| Pending {
                ids: BTreeSet::new(),
                settled: Event::new(),
            })
            .ids
            .insert(id);
        InFlight {
            releases: self.clone(),
            key: key.to_owned(),
            id,
        }
    }

    /// A mark of the releases on `key` pending now, if any: [`wait_for`](Self::wait_for) given it says there were
    /// releases to wait for even if they have ended by then.
    pub(crate) fn mark(&self, key: &str) -> Option<Mark> {
        self.lock().keys.contains_key(key).then_some(Mark)
    }

    /// Waits until every release on `key` started before this call has ended, for at most `limit`; returns whether
    /// there was any, or a `mark` taken earlier. Releases started meanwhile are not waited for, so a busy key
    /// cannot keep a waiter waiting.
    pub(crate) async fn wait_for(&self, key: &str, mark: Option<Mark>, limit: Duration) -> bool {
        let before = {
            let state = self.lock();
            if !state.keys.contains_key(key) {
                // Those of the mark, if any, have ended already.
                return mark.is_some();
            }
            state.next
        };
        let settled = async {
            loop {
                // Listening under the lock: a release that ends after the check notifies this listener.
                let listener = {
                    let state = self.lock();
                    match state.keys.get(key) {
                        Some(pending) if pending.ids.first().is_some_and(|&id| id < before) => {
                            pending.settled.listen()
                        }
                        _ => return,
                    }
                };
                listener.await;
            }
        };
        // Past the limit the caller asks anyway, as it would have without a release in flight.
        let _ = tokio::time::timeout(limit, settled).await;
        true
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.releases.lock();
        if let Some(pending) = state.keys.get_mut(&self.key) {
            pending.ids.remove(&self.id);
            pending.settled.notify(usize::MAX);
            if pending.ids.is_empty() {
                state.keys.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_waiter_waits_for_the_releases_started_before_it_on_its_key_only() {
        let releases = Arc::new(Releases::default());
        assert!(!releases.wait_for("a", None, Duration::from_secs(60)).await);

        let first = releases.start("a");
        let other_key = releases.start("b");
        let mut wait = Box::pin(releases.wait_for("a", None, Duration::from_secs(60)));
        assert_eq!((&mut wait).now_or_never(), None);
        // Started after the waiter: not waited for.
        let later = releases.start("a");
        drop(first);
        assert_eq!((&mut wait).now_or_never(), Some(true));
        drop((later, other_key));
        assert!(
            releases.lock().keys.is_empty(),
            "no key outlives its releases"
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_mark_remembers_a_release_that_ended_before_the_wait() {
        let releases = Arc::new(Releases::default());
        assert!(releases.mark("a").is_none(), "nothing pending: no mark");
        let first = releases.start("a");
        let mark = releases.mark("a");
        drop(first);
        // Ended before the wait: without the mark there is nothing to wait for; with it, the wait says there was.
        assert!(!releases.wait_for("a", None, Duration::from_secs(60)).await);
        assert_eq!(
            Box::pin(releases.wait_for("a", mark, Duration::from_secs(60))).now_or_never(),
            Some(true)
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_release_that_never_ends_holds_a_waiter_for_the_limit_only() {
        let releases = Arc::new(Releases::default());
        let _stuck = releases.start("a");
        let started = tokio::time::Instant::now();
        assert!(releases.wait_for("a", None, Duration::from_secs(10)).await);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }
}
