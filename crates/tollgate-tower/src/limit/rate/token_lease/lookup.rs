//! A request decided on its key's batch, and the remaining a response shows under leases.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Outcome, Store};

use super::entry::Entry;
use super::table::{Inner, Take};

impl<St: Store> Inner<St> {
    /// The decision for one request on the key's entry, under its lock. `resume`: a request that waited (its
    /// demand is counted already), which listens on the fetch under way if it must wait again.
    pub(super) fn lookup(
        &self,
        e: &mut Entry,
        digest: u64,
        key: &str,
        cost: u64,
        now: u64,
        resume: bool,
    ) -> Take {
        // Demand per epoch (a batch's time): the epoch before, unless the key was idle longer than that.
        if now >= e.epoch + self.epoch {
            e.last_demand = if now < e.epoch + 2 * self.epoch {
                e.demand
            } else {
                0
            };
            e.demand = 0;
            e.epoch = now - (now - e.epoch) % self.epoch;
        }
        if !resume {
            e.demand = e.demand.saturating_add(cost);
        }
        e.last_use = now;
        let want = self.window_share(e, e.last_demand.max(e.demand).min(self.max_batch), now);
        if now >= e.deadline && e.tokens > 0 {
            // Past its deadline a batch is not spent: a sliding window gives its slots back with the next call; a
            // token bucket's record expires in the store (its tokens are lost, as the proof requires).
            if self.policy.algorithm() == Algorithm::SlidingWindowCounter {
                e.leftover = e.tokens;
                e.leftover_window = e.window_start;
                // A short grant's local refusal counted these slots as spent: given back, they are the store's
                // again, and its own answer (after the give-back) decides.
                if self.policy.lockout_micros() == 0 {
                    e.denied_until = 0;
                }
            }
            e.tokens = 0;
        }
        let limit = self.policy.quota().burst();
        // A lockout this instance learned (a plain denial) stops its batch too: the key is refused until then.
        let learned = self.policy.lockout_micros() > 0 && now < e.denied_until;
        if e.tokens >= cost && cost > 0 && !learned {
            e.tokens -= cost;
            let view = (e.global + e.tokens).min(limit);
            let decision = Decision {
                outcome: Outcome::Allowed,
                limit,
                remaining: self.show(e, view, cost, now),
                reset: e.reset,
                retry_after: None,
                now: e.store_now(now),
            };
            let due = e.tokens < want.div_ceil(2);
            return Take::Admit(decision, self.fetch_if(e, due, digest, key, want, 0, now));
        }
        if now < e.denied_until && cost > 0 {
            let view = (e.global + e.tokens).min(limit);
            return Take::Deny(Decision {
                outcome: Outcome::Limited,
                limit,
                remaining: self.show(e, view, 0, now),
                reset: e.reset,
                retry_after: Some(Duration::from_micros(e.denied_until - now)),
                now: e.store_now(now),
            });
        }
        // The batch cannot pay: wait for the fetch under way (or the one due now) rather than ask the store beside
        // it, whose answer would leave that batch out of this instance's view. A token bucket's fetch asks for at
        // least what this request lacks, so that a request costing more than the batch holds is paid from the
        // batch and the store together, as the view that counts both promised (this request spends what it
        // brings at once).
        // A sliding window's fetch does the same while a batch granted now can still be spent: not in the window's
        // last drift margin, where its deadline would have passed when it lands.
        let lacking = match self.policy.algorithm() {
            Algorithm::TokenBucket => cost.saturating_sub(e.tokens).min(limit),
            Algorithm::SlidingWindowCounter if self.window_left(e, now) > 0 => {
                cost.saturating_sub(e.tokens).min(limit)
            }
            _ => 0,
        };
        let fetch = self.fetch_if(e, true, digest, key, want, lacking, now);
        if !e.fetching || cost == 0 {
            return Take::Plain(fetch);
        }
        let listen = resume.then(|| {
            let landing = e.landing.get_or_insert_with(Arc::default).clone();
            let landed = landing.landed.listen();
            (landing, landed)
        });
        Take::Wait(fetch, listen)
    }

    /// The remaining to show for a response whose view (the store's figure plus the unspent batch, after this
    /// request's take) is `view`, `spent` its cost if admitted: the view, but never more than what this instance
    /// showed last, less `spent`, plus what the quota refilled since — and no refill while the store's last answer
    /// left less than a batch unheld (the key is being drained: what refills is not this instance's to show).
    pub(super) fn show(&self, e: &mut Entry, view: u64, spent: u64, now: u64) -> u64 {
        let view = view.min(self.shown_cap).saturating_mul(self.token);
        let shown = match e.shown {
            None => view,
            Some(shown) => {
                let credit = if e.exhausted {
                    0
                } else {
                    self.rate.saturating_mul(now.saturating_sub(e.shown_at))
                };
                shown
                    .saturating_add(credit)
                    .saturating_sub(spent.saturating_mul(self.token))
                    .min(view)
            }
        };
        e.shown = Some(shown);
        e.shown_at = now;
        shown / self.token
    }

    /// A sliding window batch no larger than the demand the rest of its window can spend (`want` is a batch's
    /// time of demand): a slot leased late in a window and unspent at its end is lost to that window, so batches
    /// shrink over the window's last batch time (to 1 in its last instants: the plain path, exact). A token bucket
    /// batch is not tied to a window.
    fn window_share(&self, e: &Entry, want: u64, now: u64) -> u64 {
        if self.policy.algorithm() != Algorithm::SlidingWindowCounter || e.window_start == 0 {
            return want;
        }
        let left = self.window_left(e, now);
        if left >= self.epoch {
            return want;
        }
        // ⌈want × left ÷ epoch⌉ in u128: want ≤ the burst, left < epoch.
        u64::try_from((u128::from(want) * u128::from(left)).div_ceil(u128::from(self.epoch)))
            .unwrap_or(want)
    }

    /// How long a sliding window batch granted now could be spent: the rest of the store's current window, less
    /// the drift margin (`u64::MAX` before the first grant says where windows start).
    fn window_left(&self, e: &Entry, now: u64) -> u64 {
        let period = self.policy.quota().period_micros();
        let at = e.store_now(now).as_micros();
        if e.window_start == 0 || at < e.window_start {
            return u64::MAX;
        }
        (period - (at - e.window_start) % period).saturating_sub(self.margin)
    }
}
