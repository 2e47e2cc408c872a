//! The fetch engine: when a batch is fetched, how its grant is applied, and what goes back to the store.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{Algorithm, Store};

use super::entry::{Entry, copy_error};
use super::table::{Fetch, Inner};

/// How long a failed fetch keeps the next one off, in µs.
const RETRY_FAILED_MICROS: u64 = 100_000;

impl<St: Store> Inner<St> {
    /// The fetch to start now, if one is `due` and allowed (not under way, not too early, a hot key), for `want`
    /// (the key's demand) or `need` (what the request that asks lacks), whichever is more. A token bucket's
    /// batch, what is left of it included, holds at most `max_batch` beyond what the request needs.
    ///
    /// A sliding window's slots left at a batch's end still count in the store until given back, so a call that
    /// gives them back is always made (asking for nothing when no fetch is due): a plain call decided before it
    /// would find the window fuller than the view said.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fetch_if(
        &self,
        e: &mut Entry,
        due: bool,
        digest: u64,
        key: &str,
        want: u64,
        need: u64,
        now: u64,
    ) -> Option<Fetch> {
        // A batch of one is not worth a call of its own (the plain path is one call too); what a request lacks
        // of a batch that pays the rest is.
        let worth = want >= 2 || need >= 2 || (need > 0 && e.tokens > 0);
        let asks = due && now >= e.next_fetch && worth;
        let gives_back = e.leftover > 0;
        if e.fetching || !(asks || gives_back) {
            return None;
        }
        let want = match self.policy.algorithm() {
            _ if !asks => 0, // the give-back alone
            Algorithm::TokenBucket => want.min(self.max_batch.saturating_sub(e.tokens)).max(need),
            _ => want.max(need),
        };
        if want == 0 && !gives_back {
            return None;
        }
        e.fetching = true;
        let key = e.key.get_or_insert_with(|| key.into()).clone();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut request = TokenLeaseRequest::take(self.instance, seq, want, self.ttl);
        request = match self.policy.algorithm() {
            // What is left of the batch now: the instance goes on spending it, and only ever reports less later. (A
            // fixed window is never granted a batch: its store answers that it has no leases.)
            Algorithm::TokenBucket | Algorithm::FixedWindow => request.holding(e.tokens, 0),
            // Only slots that can no longer be spent are given back.
            Algorithm::SlidingWindowCounter => {
                let back = request.holding(e.leftover, e.leftover_window);
                e.leftover = 0;
                back
            }
        };
        Some(Fetch {
            digest,
            key,
            request,
            sent: now,
        })
    }

    /// Runs one fetch and applies its grant.
    pub(super) async fn fetch(self: Arc<Self>, fetch: Fetch) {
        self.fetches.increment(1);
        self.store_calls.fetch_add(1, Ordering::Relaxed);
        let result = self
            .store
            .lease_tokens(&fetch.key, &self.policy, &fetch.request)
            .await;
        let now = self.clock.now().as_micros();
        let (orphan, landing, surplus) = self
            .table
            .get(fetch.digest, |e| {
                if !e.fetching || e.key.as_deref() != Some(&*fetch.key) {
                    return (true, None, None);
                }
                e.fetching = false;
                let mut surplus = None;
                match &result {
                    Ok(grant) => {
                        self.apply(e, &fetch, grant, now);
                        surplus = self.surplus(e, grant);
                    }
                    Err(err) => {
                        tracing::debug!(limiter = &*self.name, error = %err, "token lease fetch failed");
                        e.next_fetch = now + RETRY_FAILED_MICROS;
                    }
                }
                (false, e.landing.take(), surplus)
            })
            .unwrap_or((true, None, None));
        if let Some(landing) = landing {
            // Its waiters listened under the entry's lock, before it was taken out: none misses this.
            landing.land(result.as_ref().err().map(copy_error));
        }
        if let Some(back) = surplus {
            // Its waiters are released first; the fetch counts as under way until what it gives back has landed.
            self.give_back(&fetch.key, back).await;
        }
        if self.fetching.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify(usize::MAX);
        }
        if orphan && let Ok(grant) = result {
            // The entry went (evicted) while the call was out: what it granted goes straight back.
            if grant.granted > 0 {
                let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
                let back = TokenLeaseRequest::take(self.instance, seq, 0, self.ttl)
                    .ending(grant.granted)
                    .holding(grant.granted, grant.window_start);
                self.give_back(&fetch.key, back).await;
            }
        }
    }

    /// A grant landed at `now`: the batch grows by it and lives until the new deadline.
    fn apply(&self, e: &mut Entry, fetch: &Fetch, grant: &TokenLeaseGrant, now: u64) {
        if grant.stale {
            return;
        }
        let lifetime = grant
            .expires
            .as_micros()
            .saturating_sub(grant.now.as_micros());
        let deadline = (fetch.sent + lifetime).saturating_sub(self.margin);
        if self.policy.algorithm() == Algorithm::SlidingWindowCounter
            && grant.window_start != e.window_start
            && e.tokens > 0
        {
            // A new window: what is left of the old batch can no longer be spent (its deadline has passed, as the
            // old window ended before this call ran); given back with the next call.
            e.leftover += e.tokens;
            e.leftover_window = e.window_start;
            e.tokens = 0;
        }
        // The store's record bounds the batch: holding more means it lost state (a restart, a flush, a failover
        // to a lagging replica, a record that expired early), and what it no longer counts is not spent.
        e.tokens = (e.tokens + grant.granted).min(grant.held);
        e.deadline = deadline;
        e.window_start = grant.window_start;
        e.global = grant.remaining;
        // Less than another batch left unheld: the key is being drained, and its refill is not shown.
        e.exhausted = grant.retry_after.is_some() || grant.remaining < fetch.request.want;
        e.reset = grant.reset;
        e.store_now = grant.now;
        e.sent = fetch.sent;
        match grant.retry_after {
            Some(retry) => {
                // The store is short: no fetch, and no plain call, before `want` is there.
                let mut until = (fetch.sent + u64::try_from(retry.as_micros()).unwrap_or(u64::MAX))
                    .saturating_sub(self.margin);
                // A sliding window's slots that come free late in a window are its own: waiting for a whole batch
                // past the window's end would lose them (in a flood, every window would end short of its limit).
                // Ask again a tenth of a batch's time before the end, for the smaller batch the rest of the window
                // can spend (`window_share`; the plain path in its last instants).
                let end = deadline.saturating_sub(self.epoch / 10);
                if self.policy.algorithm() == Algorithm::SlidingWindowCounter
                    && until > end
                    && end > fetch.sent
                {
                    until = end;
                }
                // Never due again on landing: a retry shorter than the drift margin would have the request that
                // waited for this fetch start the same fetch again at once.
                e.next_fetch = until.max(now + 1);
                // Under a lockout a short store is no refusal: the requests the batch cannot pay take the plain
                // path, whose denial starts the lockout (learned in `show_plain`), as without leases.
                if self.policy.lockout_micros() == 0 {
                    e.denied_until = until;
                }
            }
            None => {
                e.next_fetch = 0;
                e.denied_until = 0;
            }
        }
    }

    /// A token bucket batch that a short grant left above `max_batch` (the store could not pay what a request
    /// lacked, so that request is refused): the call that gives it all back at once, since a batch that large
    /// could end unspent before the bucket refills it. Requests take the plain path until the next fetch.
    fn surplus(&self, e: &mut Entry, grant: &TokenLeaseGrant) -> Option<TokenLeaseRequest> {
        if self.policy.algorithm() != Algorithm::TokenBucket
            || grant.retry_after.is_none()
            || e.tokens <= self.max_batch
        {
            return None;
        }
        let back = self.ending(e);
        e.tokens = 0;
        e.denied_until = 0;
        back
    }

    /// The call that ends `e`'s lease, if it holds anything to give back; clears the batch.
    pub(super) fn ending(&self, e: &Entry) -> Option<TokenLeaseRequest> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let base = TokenLeaseRequest::take(self.instance, seq, 0, self.ttl);
        match self.policy.algorithm() {
            Algorithm::TokenBucket | Algorithm::FixedWindow => {
                (e.tokens > 0 || e.fetching).then(|| base.ending(e.tokens))
            }
            Algorithm::SlidingWindowCounter => {
                // Unspent slots of the current batch and leftovers of an earlier one: one call gives back either.
                if e.tokens > 0 {
                    Some(base.ending(e.tokens).holding(e.tokens, e.window_start))
                } else {
                    (e.leftover > 0).then(|| {
                        base.ending(e.leftover)
                            .holding(e.leftover, e.leftover_window)
                    })
                }
            }
        }
    }

    pub(super) async fn give_back(&self, key: &str, request: TokenLeaseRequest) {
        self.returns.increment(1);
        self.store_calls.fetch_add(1, Ordering::Relaxed);
        // A failed return loses nothing but the tokens it carried: the record expires at its deadline.
        let _ = self.store.lease_tokens(key, &self.policy, &request).await;
    }
}
