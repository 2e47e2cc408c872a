//! What a set's admission grants a request, and how the set answers: the verdicts of its limiters and the charges
//! due once the response states its real cost.

use std::sync::Arc;

use tollgate_core::Store;

use crate::limit::future::{Answer, Grants, Settle, shown_after_charge};
use crate::limit::rate::decide::Shared;
use crate::respond::Respond;
use crate::{BoxError, Rejection, Verdict, VerdictSink};

/// What a set's admission grants a request: the verdict of its first admitting limiter (the outermost), handed to
/// the responder as a lone limiter's is, and — rarely — the others' and the charges due once the response states
/// its real cost.
#[derive(Debug, Default)]
pub(crate) struct SetGrant {
    own: Option<Box<Verdict>>,
    more: Option<Box<More>>,
}

/// The part of a [`SetGrant`] a single limiter without a charge after the response never needs.
#[derive(Debug, Default)]
struct More {
    /// The verdicts of the set's further limiters, in the set's order.
    rest: Vec<Verdict>,
    /// The limiters that charge after the response, with when and how each decided.
    settles: Vec<Settled>,
}

#[derive(Debug)]
struct Settled {
    settle: Settle,
    /// The limiter whose verdict shows the charge.
    limiter: crate::Name,
    allowed: bool,
    decided_at: tollgate_core::Timestamp,
}

impl SetGrant {
    /// Adds a limiter's verdict (kept only if the responder reads verdicts).
    #[inline]
    pub(super) fn push(&mut self, verdict: Option<Box<Verdict>>, keep: bool) {
        let Some(verdict) = verdict.filter(|_| keep) else {
            return;
        };
        if self.own.is_none() {
            self.own = Some(verdict);
        } else {
            self.more().rest.push(*verdict);
        }
    }

    fn more(&mut self) -> &mut More {
        self.more.get_or_insert_default()
    }

    /// Remembers a charge after the response for a limiter that decided `verdict`.
    pub(super) fn settle<K, St, C>(
        &mut self,
        shared: &Arc<Shared<K, St, C>>,
        key: String,
        cost: u64,
        verdict: &Verdict,
    ) where
        K: Send + Sync + 'static,
        St: Store,
        C: Send + Sync + 'static,
    {
        let source = shared.after.clone().unwrap_or(crate::CostAfter::Extension);
        let settle = Settle {
            charger: shared.clone(),
            key,
            upfront: cost,
            source,
        };
        self.more().settles.push(Settled {
            settle,
            limiter: verdict.limiter.clone(),
            allowed: verdict.decision.is_allowed(),
            decided_at: verdict.decision.now,
        });
    }

    /// A rejection (of a later limiter, or further in) carrying the verdicts of the limiters that admitted the
    /// request before it: they counted it.
    pub(super) fn into_rejection(self, err: BoxError) -> BoxError {
        let rest = self.more.map(|more| more.rest).unwrap_or_default();
        with_admitted(with_admitted(err, rest), self.own.map(|v| *v))
    }
}

/// The set's [`Answer`]: its [`Respond`]er and the ticket it took from the request. The set's first limiter
/// counts as the outermost: verdicts are listed innermost first, so the others go into the response last to first
/// (headers then list the limiters in the set's order) and the first is the responder's own, as a lone limiter's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetAnswer<R, Tk> {
    pub(super) respond: R,
    pub(super) ticket: Tk,
}

impl<R, Tk> Grants for SetAnswer<R, Tk> {
    type Grant = SetGrant;
}

impl<Req, T, R, Tk> Answer<Req, T> for SetAnswer<R, Tk>
where
    T: VerdictSink,
    R: Respond<Req, T, Ticket = Tk>,
    Tk: Copy,
{
    type Output = Result<R::Response, R::Error>;

    #[inline]
    fn amend_ok(&self, response: &mut T, grant: Option<SetGrant>) -> Option<SetGrant> {
        let (mut own, more) = grant.map_or((None, None), |g| (g.own, g.more));
        if let Some(more) = more {
            self.amend_more(response, *more, own.as_deref_mut());
        }
        let own = self.respond.amend_ok(&self.ticket, response, own)?;
        Some(SetGrant {
            own: Some(own),
            more: None,
        })
    }

    #[inline]
    fn finish_ok(&self, response: T, grant: Option<SetGrant>) -> Self::Output {
        self.respond
            .finish_ok(self.ticket, response, grant.and_then(|g| g.own))
    }

    fn respond(&self, result: Result<T, BoxError>, grant: Option<SetGrant>) -> Self::Output {
        let (mut own, more) = grant.map_or((None, None), |g| (g.own, g.more));
        let result = match (result, more) {
            (Ok(mut response), Some(more)) => {
                self.amend_more(&mut response, *more, own.as_deref_mut());
                Ok(response)
            }
            (Err(err), Some(more)) => Err(with_admitted(err, more.rest)),
            (result, None) => result,
        };
        self.respond.respond(self.ticket, result, own.map(|v| *v))
    }
}

impl<R, Tk> SetAnswer<R, Tk> {
    /// Charges what the response states to the limiters that charge after it, shows each charge in its limiter's
    /// verdict (`own`, the responder's, or one of the further limiters'), and leaves the further limiters'
    /// verdicts on the response (last to first) for the responder.
    fn amend_more<Req, T>(&self, response: &mut T, mut more: More, mut own: Option<&mut Verdict>)
    where
        T: VerdictSink,
        R: Respond<Req, T, Ticket = Tk>,
    {
        for Settled {
            settle,
            limiter,
            allowed,
            decided_at,
        } in &more.settles
        {
            let shown = match own.as_deref_mut() {
                Some(v) if v.limiter == *limiter => Some(v),
                _ => more.rest.iter_mut().find(|v| v.limiter == *limiter),
            };
            let left = shown
                .as_ref()
                .filter(|_| *allowed)
                .map(|v| v.decision.remaining);
            let delta = settle.on_response(
                &self.respond,
                &self.ticket,
                response,
                *allowed,
                *decided_at,
                left,
            );
            if !*allowed {
                continue;
            }
            if let Some(verdict) = shown {
                shown_after_charge(verdict, delta, settle.charger.charge_moves_reset());
            }
        }
        if !more.rest.is_empty() {
            response.verdicts_mut().extend(more.rest.into_iter().rev());
        }
    }
}

/// A rejection further in carries the verdicts of the limiters that admitted the request before it.
pub(super) fn with_admitted(
    mut err: BoxError,
    admitted: impl IntoIterator<Item = Verdict, IntoIter: DoubleEndedIterator>,
) -> BoxError {
    if let Some(rejection) = err.downcast_mut::<Rejection>() {
        admitted
            .into_iter()
            .rev()
            .for_each(|v| rejection.push_admitted(v));
    }
    err
}
