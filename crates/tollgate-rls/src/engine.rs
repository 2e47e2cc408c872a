//! The one place a descriptor's decision is made: today a [`Store`] check per limited descriptor (those of a
//! request concurrently, so a request of four descriptors on Redis waits for one round trip, not four), and, for
//! a refused request decided all or nothing, the give-back of what the others spent.

use futures_util::future::join_all;
use tollgate_core::{Decision, Store, StoreError};

use crate::plan::Planned;

/// Decides planned descriptors on a store.
#[derive(Debug)]
pub(crate) struct Engine<S> {
    store: S,
}

impl<S: Store> Engine<S> {
    pub(crate) const fn new(store: S) -> Self {
        Self { store }
    }

    /// One result per planned descriptor, in order: `None` for a descriptor with no limit, an unlimited one, or
    /// `requests_per_unit: 0` (nothing to ask the store).
    pub(crate) async fn decide_all(
        &self,
        plan: &[Planned<'_>],
    ) -> Vec<Option<Result<Decision, StoreError>>> {
        let mut out: Vec<Option<Result<Decision, StoreError>>> = Vec::with_capacity(plan.len());
        let mut waiting = Vec::new();
        for (i, p) in plan.iter().enumerate() {
            let Some(limit) = &p.limit else {
                out.push(None);
                continue;
            };
            let Some(policy) = limit.limit.policy() else {
                out.push(None);
                continue;
            };
            match self.store.check_immediate(&limit.key, policy, p.cost) {
                Some(result) => out.push(Some(result)),
                None => {
                    out.push(None);
                    waiting.push((i, self.store.check(&limit.key, policy, p.cost)));
                }
            }
        }
        if !waiting.is_empty() {
            let (slots, futures): (Vec<usize>, Vec<_>) = waiting.into_iter().unzip();
            for (slot, result) in slots.into_iter().zip(join_all(futures).await) {
                out[slot] = Some(result);
            }
        }
        out
    }

    /// Gives back the hits of every descriptor the store admitted (`decided`: each one's decision, and whether the
    /// store made it), all at once, and keeps the state the store reports after it. A refund the store cannot make
    /// (a fixed window has none) or that fails leaves the decision as it was, logged.
    pub(crate) async fn give_back(
        &self,
        plan: &[Planned<'_>],
        decided: &mut [Option<(Decision, bool)>],
    ) {
        let mut refunds = Vec::new();
        for (i, (p, d)) in plan.iter().zip(decided.iter()).enumerate() {
            let (Some(limit), Some((decision, true))) = (&p.limit, d) else {
                continue;
            };
            let (Some(policy), Ok(hits)) = (limit.limit.policy(), i64::try_from(p.cost)) else {
                continue;
            };
            if decision.is_allowed() && hits > 0 {
                refunds.push((
                    i,
                    self.store.charge(&limit.key, policy, -hits, decision.now),
                ));
            }
        }
        let (slots, futures): (Vec<usize>, Vec<_>) = refunds.into_iter().unzip();
        for (i, result) in slots.into_iter().zip(join_all(futures).await) {
            let Some((decision, _)) = &mut decided[i] else {
                continue;
            };
            match result {
                Ok(after) => {
                    decision.remaining = after.remaining;
                    decision.reset = after.reset;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a refused request's hits could not be given back")
                }
            }
        }
    }
}
