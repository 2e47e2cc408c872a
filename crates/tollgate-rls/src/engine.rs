//! The one place a descriptor's decision is made: one store call for a request's descriptors where the store can
//! ([`Store::check_all`]: one script call on Redis), else a check per limited descriptor (concurrently, so a
//! request of four descriptors on Redis waits for one round trip, not four), and, for a refused request decided
//! all or nothing that way, the give-back of what the others spent.

use std::sync::Arc;

use futures_util::future::join_all;
use tollgate_core::{Check, Decision, Policy, Store, StoreError};

use crate::plan::Planned;

/// What the store decided for a request's descriptors.
pub(crate) struct Decided {
    /// One result per planned descriptor, in order (see [`Engine::decide_all`]).
    pub(crate) results: Vec<Option<Result<Decision, Arc<StoreError>>>>,
    /// Whether one store call decided them all or nothing: a refused request then spent nothing anywhere, and a
    /// descriptor that would have admitted it reports what it has left.
    pub(crate) as_one: bool,
}

/// The store key and policy of a descriptor the store decides.
fn limit_of<'p>(p: &'p Planned<'_>) -> Option<(&'p str, &'p Policy)> {
    let limit = p.limit.as_ref()?;
    Some((&limit.key, limit.limit.policy()?))
}

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
    /// `requests_per_unit: 0` (nothing to ask the store). `together`: the request is decided all or nothing (no
    /// descriptor in quota mode among them), else every descriptor's hits are counted whatever the others answer.
    ///
    /// A store that answers at once (in process) is asked descriptor by descriptor; one that needs I/O decides
    /// them all in one call where it can ([`Store::check_all`]): every descriptor counted independently then, or —
    /// `together` — none counted when one refuses.
    pub(crate) async fn decide_all(&self, plan: &[Planned<'_>], together: bool) -> Decided {
        let mut out: Vec<Option<Result<Decision, Arc<StoreError>>>> =
            Vec::with_capacity(plan.len());
        let mut waiting = Vec::new();
        for (i, p) in plan.iter().enumerate() {
            let Some((key, policy)) = limit_of(p) else {
                out.push(None);
                continue;
            };
            match self.store.check_immediate(key, policy, p.cost) {
                Some(result) => out.push(Some(result.map_err(Arc::new))),
                None => {
                    // The store needs I/O for the first descriptor it decides: all of them in one call, if it can.
                    if waiting.is_empty()
                        && out.iter().all(Option::is_none)
                        && let Some(decided) = self.decide_in_one_call(plan, together).await
                    {
                        return decided;
                    }
                    out.push(None);
                    waiting.push((i, self.store.check(key, policy, p.cost)));
                }
            }
        }
        if !waiting.is_empty() {
            let (slots, futures): (Vec<usize>, Vec<_>) = waiting.into_iter().unzip();
            for (slot, result) in slots.into_iter().zip(join_all(futures).await) {
                out[slot] = Some(result.map_err(Arc::new));
            }
        }
        Decided {
            results: out,
            as_one: false,
        }
    }

    /// [`decide_all`](Self::decide_all) in one store call, if the request has two limited descriptors or more and
    /// the store can decide them so.
    async fn decide_in_one_call(&self, plan: &[Planned<'_>], together: bool) -> Option<Decided> {
        let limited: Vec<usize> = (0..plan.len())
            .filter(|&i| limit_of(&plan[i]).is_some())
            .collect();
        if limited.len() < 2
            || (together
                && limited
                    .iter()
                    .any(|&i| plan[i].limit.as_ref().is_some_and(|l| l.limit.quota_mode)))
        {
            return None;
        }
        let checks: Vec<Check<'_>> = limited
            .iter()
            .filter_map(|&i| {
                let p = &plan[i];
                let (key, policy) = limit_of(p)?;
                let shadow = p.limit.as_ref().is_some_and(|l| l.limit.shadow_mode);
                Some(Check {
                    key,
                    policy,
                    cost: p.cost,
                    enforced: together && !shadow,
                })
            })
            .collect();
        let result = self.store.check_all(&checks)?.await;
        let mut results: Vec<Option<Result<Decision, Arc<StoreError>>>> =
            plan.iter().map(|_| None).collect();
        match result {
            Ok(decisions) => {
                for (&i, decision) in limited.iter().zip(decisions) {
                    results[i] = Some(Ok(decision));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for &i in &limited {
                    results[i] = Some(Err(Arc::clone(&e)));
                }
            }
        }
        Some(Decided {
            results,
            as_one: together,
        })
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
