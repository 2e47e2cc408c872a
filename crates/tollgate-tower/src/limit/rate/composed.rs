//! Several limiters of a set deciding a request as one: admitted only if every limiter admits, and a refusal
//! spends nothing anywhere.
//!
//! Each limiter is decided in the set's order (a cached denial first, which refuses before any other limiter is
//! asked); when one refuses, what the others spent is given back, as a refund dated at their admission (see
//! `docs/design/several-limits.md` for why the refund is exact and what it cannot cover). The refusal answers with
//! the latest retry among the refusing limiters, and lists every limiter with what it has left.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Decision, Store, Timestamp};

use super::decide::{Conclusion, Shared};
use super::deny_cache::KeyDigests;
use crate::{BoxError, Rejection, RejectionKind, Verdict};

/// How a composed decision reaches a limiter's key again to give back what it spent.
pub(crate) enum SpentKey {
    /// By its digest (a store that keys by digest).
    Digest(u64),
    /// By its text, with its digests in the deny cache by its parts (`None`: by its text).
    Text(String, Option<KeyDigests>),
}

/// What a limiter's admission spent.
struct Spent<K, St, C> {
    shared: Arc<Shared<K, St, C>>,
    key: SpentKey,
    cost: u64,
}

impl<K: Send + Sync, St: Store, C: Send + Sync> Spent<K, St, C> {
    /// Gives back what the admission decided at `at` spent: by digest at once, by the key's text without waiting
    /// (`None`: the store's answer is not waited for).
    fn give_back_now(&self, at: Timestamp) -> Option<Decision> {
        match &self.key {
            SpentKey::Digest(digest) => self.shared.give_back_digest(*digest, self.cost, at),
            SpentKey::Text(key, deny) => {
                let key = key.clone();
                self.shared.give_back_detached(key, *deny, self.cost, at);
                None
            }
        }
    }

    /// [`give_back_now`](Self::give_back_now), waiting for the store's answer by the key's text.
    async fn give_back(&self, at: Timestamp) -> Option<Decision> {
        match &self.key {
            SpentKey::Digest(_) => self.give_back_now(at),
            SpentKey::Text(key, deny) => self.shared.give_back(key, *deny, self.cost, at).await,
        }
    }
}

/// One limiter's part of a composed decision, in the set's order.
enum Part<K, St, C> {
    /// Admitted: its verdict (always kept: its instant dates a give-back) and what it spent, if the store was
    /// asked (not for a failure policy's answer, nor a shadow-mode refusal).
    Admitted(Option<Box<Verdict>>, Option<Spent<K, St, C>>),
    Refused(BoxError),
}

/// The limiters of a set decided so far for one request.
pub(crate) struct Composed<K, St, C> {
    parts: Vec<Part<K, St, C>>,
    refused: bool,
}

impl<K: Send + Sync, St: Store, C: Send + Sync> Composed<K, St, C> {
    pub(crate) fn new(limiters: usize) -> Self {
        Self {
            parts: Vec::with_capacity(limiters),
            refused: false,
        }
    }

    /// Whether a limiter has refused the request.
    pub(crate) fn is_refused(&self) -> bool {
        self.refused
    }

    /// Adds a limiter's conclusion; `spent`: the key and the cost its store was asked with.
    pub(crate) fn push(
        &mut self,
        shared: &Arc<Shared<K, St, C>>,
        conclusion: Conclusion,
        spent: Option<(SpentKey, u64)>,
    ) {
        let part = match conclusion {
            Conclusion::Admit(verdict) => {
                // Only an admission the store decided spent anything: an open policy's has no verdict, a shadow
                // refusal's is not allowed.
                let spent =
                    spent.filter(|_| verdict.as_ref().is_some_and(|v| v.decision.is_allowed()));
                let spent = spent.map(|(key, cost)| Spent {
                    shared: shared.clone(),
                    key,
                    cost,
                });
                Part::Admitted(verdict, spent)
            }
            Conclusion::Reject(err) => {
                self.refused = true;
                Part::Refused(err)
            }
        };
        self.parts.push(part);
    }

    /// The verdicts of an admission, in the set's order; `Err` with the refusal (what was spent given back) when a
    /// limiter refused. Gives back at once where the store answers at once, and detached elsewhere.
    pub(crate) fn conclude_now(self) -> Result<Vec<Option<Box<Verdict>>>, BoxError> {
        let Some(latest) = self.latest_refusal() else {
            return Ok(self.admitted());
        };
        Err(self.refuse_with(latest, |spent, verdict| {
            spent.give_back_now(verdict.decision.now)
        }))
    }

    /// [`conclude_now`](Self::conclude_now), waiting for every give-back by the key's text.
    pub(crate) async fn conclude(self) -> Result<Vec<Option<Box<Verdict>>>, BoxError> {
        let Some(latest) = self.latest_refusal() else {
            return Ok(self.admitted());
        };
        // Every give-back first, awaited in the set's order; `refuse_with` then takes their answers in that order.
        let mut after = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            let Part::Admitted(Some(verdict), Some(spent)) = part else {
                continue;
            };
            after.push(spent.give_back(verdict.decision.now).await);
        }
        let mut after = after.into_iter();
        Err(self.refuse_with(latest, |_, _| after.next().flatten()))
    }

    fn admitted(self) -> Vec<Option<Box<Verdict>>> {
        self.parts
            .into_iter()
            .map(|part| match part {
                Part::Admitted(verdict, _) => verdict,
                Part::Refused(_) => None,
            })
            .collect()
    }

    /// The refusal with the latest retry (one a retry cannot help counts as latest), if a limiter refused.
    fn latest_refusal(&self) -> Option<usize> {
        if !self.refused {
            return None;
        }
        self.parts
            .iter()
            .enumerate()
            .filter_map(|(i, part)| match part {
                Part::Refused(err) => Some((i, retry_of(err))),
                Part::Admitted(..) => None,
            })
            .max_by_key(|&(_, retry)| retry)
            .map(|(i, _)| i)
    }

    /// The composed refusal: the refusal at `latest`, carrying every other limiter's verdict in the set's order —
    /// an admitting limiter's as `give_back` left its key (`None`: its remaining plus what it had spent).
    fn refuse_with(
        self,
        latest: usize,
        mut give_back: impl FnMut(&Spent<K, St, C>, &Verdict) -> Option<Decision>,
    ) -> BoxError {
        let mut primary = None;
        let mut others = Vec::with_capacity(self.parts.len());
        for (i, part) in self.parts.into_iter().enumerate() {
            match part {
                Part::Refused(err) if i == latest => primary = Some(err),
                Part::Refused(err) => {
                    // Another refusing limiter: listed with its verdict.
                    if let Some(rejection) = err.downcast_ref::<Rejection>()
                        && let Some(verdict) = rejection.verdict()
                    {
                        others.push(verdict.clone());
                    }
                }
                Part::Admitted(Some(mut verdict), spent) => {
                    if let Some(spent) = &spent {
                        match give_back(spent, &verdict) {
                            Some(after) => {
                                verdict.decision.remaining = after.remaining;
                                verdict.decision.reset = after.reset;
                            }
                            None => {
                                let decision = &mut verdict.decision;
                                decision.remaining =
                                    (decision.remaining + spent.cost).min(decision.limit);
                            }
                        }
                    }
                    others.push(*verdict);
                }
                Part::Admitted(None, _) => {}
            }
        }
        // `latest` is a refusal's index.
        let mut primary: BoxError =
            primary.unwrap_or_else(|| Box::new(Rejection::new(RejectionKind::RateLimited, "")));
        if let Some(rejection) = primary.downcast_mut::<Rejection>() {
            others
                .into_iter()
                .rev()
                .for_each(|v| rejection.push_admitted(v));
        }
        primary
    }
}

/// A refusal's retry for choosing the latest: a rejection a retry cannot help (no retry) sorts last, as does an
/// error that is no rejection.
fn retry_of(err: &BoxError) -> Duration {
    err.downcast_ref::<Rejection>()
        .and_then(Rejection::retry_after)
        .unwrap_or(Duration::MAX)
}
