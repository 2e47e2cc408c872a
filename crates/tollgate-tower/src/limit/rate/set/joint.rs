//! A set's limiters on one shared store decided in one store call ([`Store::check_all`]): every one admits, or
//! none spends anything, with no give-back and no window between the admissions and a refusal.

use std::sync::Arc;

use tollgate_core::{Check, Store};

use super::Waiting;
use crate::Mode;
use crate::limit::rate::decide::Conclusion;
use crate::observe::timed_async;

/// What one store call decided for some of a set's waiting limiters.
pub(super) struct Joint {
    /// Per waiting limiter, in the set's order: its conclusion, if the call decided it.
    conclusions: Vec<Option<Conclusion>>,
    /// Whether the call wrote what its admissions spent (every enforced limit admitted).
    pub(super) committed: bool,
}

impl Joint {
    /// The conclusion of the waiting limiter at `index`, if the call decided it.
    pub(super) fn take(&mut self, index: usize) -> Option<Conclusion> {
        self.conclusions.get_mut(index)?.take()
    }
}

/// Decides in one call, where the store can, the limiters of `waiting` that can join one (see
/// [`Shared::joins`](crate::limit::rate::decide::Shared::joins)) on the store of the first of them; `kept`: every
/// admission carries its verdict. `None`: fewer than two can, or the store cannot (each is then decided alone).
pub(super) async fn decide<K, St, C>(waiting: &[Waiting<K, St, C>], kept: bool) -> Option<Joint>
where
    K: Send + Sync,
    St: Store,
    C: Send + Sync,
{
    let joined: Vec<(usize, u64)> = waiting
        .iter()
        .enumerate()
        .filter_map(|(i, w)| Some((i, w.shared.joins(&w.key, w.deny, w.cost)?)))
        .collect();
    let store = &waiting[joined.first()?.0].shared.store;
    let joined: Vec<(usize, u64)> = joined
        .into_iter()
        .filter(|&(i, _)| Arc::ptr_eq(&waiting[i].shared.store, store))
        .collect();
    if joined.len() < 2 {
        return None;
    }
    let checks: Vec<Check<'_>> = joined
        .iter()
        .map(|&(i, _)| {
            let w = &waiting[i];
            Check {
                key: &w.key,
                policy: &w.shared.policy,
                cost: w.cost,
                enforced: w.mode == Mode::Enforce,
            }
        })
        .collect();
    let result = timed_async(store.check_all(&checks)?).await;
    let committed = result.as_ref().is_ok_and(|decisions| {
        decisions
            .iter()
            .zip(&checks)
            .all(|(d, check)| d.is_allowed() || !check.enforced)
    });
    let mut conclusions: Vec<Option<Conclusion>> = waiting.iter().map(|_| None).collect();
    for (n, &(i, sent)) in joined.iter().enumerate() {
        let w = &waiting[i];
        let answer = match &result {
            Ok(decisions) => Ok(decisions[n]),
            Err(err) => Err(err),
        };
        let keep = kept || w.settle;
        conclusions[i] = Some(w.shared.conclude_joint(
            answer, committed, &w.key, w.deny, w.cost, w.mode, keep, sent,
        ));
    }
    Some(Joint {
        conclusions,
        committed,
    })
}
