//! The one response future every limiter returns, and the service-side steps every limiter's `call` shares: give
//! back the inner service's readiness when a request is not passed on, and wait for a store that cannot answer
//! at once.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};

use pin_project_lite::pin_project;
use tower_service::Service;

pub(crate) use super::charger::Charger;
use super::core::Conclusion;
use crate::BoxError;
use crate::respond::Respond;

const POLLED_AFTER_COMPLETION: &str = "limiter response future polled after completion";

/// A store's decision still being made (a Redis round trip): boxed, as it is the rare state.
pub(crate) type Deciding<G> = Pin<Box<dyn Future<Output = Conclusion<G>> + Send>>;

/// How a limiter's [`Machine`] turns the inner service's result, and what the admission granted, into its
/// output. Implemented by [`Responder`] (the rate limiter: a [`Respond`]er renders the verdict), the rate limit
/// set's answer and, with feature `stack`, `permit::Hold` (the slot limiters, the shedders and the adaptive
/// limiter: the response holds the permit until it is finished).
pub(crate) trait Answer<Req, T>: Grants {
    /// The limited service's output, `Result<Response, Error>`.
    type Output;

    /// Writes this answer's part of an admitted response in place (the path nearly every request takes); returns
    /// what [`finish_ok`](Self::finish_ok) still needs of the grant.
    fn amend_ok(&self, response: &mut T, grant: Option<Self::Grant>) -> Option<Self::Grant>;

    /// The output for an admitted response, after [`amend_ok`](Self::amend_ok).
    fn finish_ok(&self, response: T, grant: Option<Self::Grant>) -> Self::Output;

    /// The output for everything else: the inner service's error (with the grant of the admission), or the
    /// limiter's refusal (no grant).
    fn respond(&self, result: Result<T, BoxError>, grant: Option<Self::Grant>) -> Self::Output;
}

/// What an admission grants a request under an [`Answer`].
pub(crate) trait Grants {
    /// What an admission grants the request (a verdict for the headers, a permit to hold).
    type Grant;
}

/// The rate limiter's [`Answer`]: its [`Respond`]er and the ticket it took from the request, and for a limiter
/// that charges the cost after the response, what it needs to.
#[derive(Debug)]
pub(crate) struct Responder<R, Tk> {
    respond: R,
    ticket: Tk,
    settle: Option<Box<Settle>>,
}

impl<R, Tk> Responder<R, Tk> {
    pub(crate) fn new(respond: R, ticket: Tk) -> Self {
        Self {
            respond,
            ticket,
            settle: None,
        }
    }

    pub(crate) fn settle(&mut self, settle: Settle) {
        self.settle = Some(Box::new(settle));
    }
}

/// A request's part in a charge after the response: its key, what it was charged up front, and where its real
/// cost is read.
pub(crate) struct Settle {
    pub(crate) charger: std::sync::Arc<dyn Charger>,
    pub(crate) key: String,
    pub(crate) upfront: u64,
    pub(crate) source: crate::CostAfter,
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settle")
            .field("upfront", &self.upfront)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Settle {
    /// Charges the difference between the real cost the admitted `response` states and what was charged up front,
    /// and shows it in `verdict` (see [`shown_after_charge`]). Only a decided request is charged (a verdict says
    /// when): a failed-open one was never counted. A request admitted over the limit in shadow mode spent nothing up
    /// front, so it is charged its whole cost.
    fn after<Req, T, R: Respond<Req, T>>(
        &self,
        respond: &R,
        ticket: &R::Ticket,
        response: &mut T,
        verdict: Option<&mut crate::Verdict>,
    ) {
        if let Some(verdict) = verdict {
            let allowed = verdict.decision.is_allowed();
            let left = allowed.then_some(verdict.decision.remaining);
            let delta = self.on_response(
                respond,
                ticket,
                response,
                allowed,
                verdict.decision.now,
                left,
            );
            if allowed {
                shown_after_charge(verdict, delta, self.charger.charge_moves_reset());
            }
        }
    }

    /// [`after`](Self::after) for a request decided at `decided_at`, `allowed` or over the limit (shadow mode):
    /// the delta charged now (a refund if negative). A cost read as the body streams is charged by the ledger the
    /// response is handed (none charged now: the reservation is what the headers show), which starts from `left`,
    /// what the admission left.
    pub(crate) fn on_response<Req, T, R: Respond<Req, T>>(
        &self,
        respond: &R,
        ticket: &R::Ticket,
        response: &mut T,
        allowed: bool,
        decided_at: tollgate_core::Timestamp,
        left: Option<u64>,
    ) -> i64 {
        if let crate::CostAfter::Streamed(streamed) = self.source {
            if let Some(ledger) = respond.stream_charges(ticket, response) {
                let charged = if allowed { self.upfront } else { 0 };
                ledger.push(crate::stream_cost::StreamCharge::new(
                    self.charger.clone(),
                    self.key.clone(),
                    streamed,
                    charged,
                    decided_at,
                    left,
                ));
            }
            return 0;
        }
        let real = respond.final_cost(ticket, response, &self.source);
        self.after_decided(real, allowed, decided_at)
    }

    /// The charge of a request decided at `decided_at` whose real cost is `real`: the delta charged (a refund if
    /// negative).
    fn after_decided(
        &self,
        real: Option<u64>,
        allowed: bool,
        decided_at: tollgate_core::Timestamp,
    ) -> i64 {
        let Some(real) = real else {
            return 0;
        };
        let spent = if allowed { self.upfront } else { 0 };
        let delta = i64::try_from(real)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(spent).unwrap_or(i64::MAX));
        if delta != 0 {
            self.charger.charge(self.key.clone(), delta, decided_at);
        }
        delta
    }
}

/// An admission's `verdict` as its response shows it once `delta` more than its up-front cost is charged, before
/// the headers are written: `remaining` less the charge (at least 0), so that a client spending the shown `r` is
/// admitted wherever the charge lands among its requests (they and the charge together take at most what the
/// decision left); and, when the charge moves the key's reset (`moves_reset`, a token bucket), the reset later by
/// the time the charge takes to accrue, never past the debt's floor (two windows from the decision). A refund
/// (`delta < 0`) shows nothing more: on a shared store it lands later, and the shown `r` must hold before it does.
pub(crate) fn shown_after_charge(verdict: &mut crate::Verdict, delta: i64, moves_reset: bool) {
    let Ok(more) = u64::try_from(delta) else {
        return;
    };
    if more == 0 {
        return;
    }
    let d = &mut verdict.decision;
    d.remaining = d.remaining.saturating_sub(more);
    if moves_reset && d.limit > 0 {
        let accrue =
            u128::from(more).saturating_mul(verdict.window.as_micros()) / u128::from(d.limit);
        let accrue = std::time::Duration::from_micros(u64::try_from(accrue).unwrap_or(u64::MAX));
        let floor = d.now.saturating_add(verdict.window.saturating_mul(2));
        d.reset = d.reset.saturating_add(accrue).min(floor.max(d.reset));
    }
}

impl<R, Tk> Grants for Responder<R, Tk> {
    type Grant = Box<crate::Verdict>;
}

impl<Req, T, R: Respond<Req, T, Ticket = Tk>, Tk: Copy> Answer<Req, T> for Responder<R, Tk> {
    type Output = Result<R::Response, R::Error>;

    #[inline]
    fn amend_ok(&self, response: &mut T, mut grant: Option<Self::Grant>) -> Option<Self::Grant> {
        if let Some(settle) = &self.settle {
            settle.after(&self.respond, &self.ticket, response, grant.as_deref_mut());
        }
        self.respond.amend_ok(&self.ticket, response, grant)
    }

    #[inline]
    fn finish_ok(&self, response: T, grant: Option<Self::Grant>) -> Self::Output {
        self.respond.finish_ok(self.ticket, response, grant)
    }

    fn respond(&self, result: Result<T, BoxError>, grant: Option<Self::Grant>) -> Self::Output {
        self.respond.respond(self.ticket, result, grant.map(|v| *v))
    }
}

pin_project! {
    /// The response future of every tollgate limiter, `Svc` (a [`RateLimit`](crate::RateLimit),
    /// a [`RateLimitSet`](crate::limit::rate::RateLimitSet), and with feature `stack` each limiter of the stack)
    /// limiting requests `Req`: waits for a store that could not decide at once, runs the inner service with what
    /// the admission granted, or answers a refusal. Its output is the limiter's `Result<Response, Error>`.
    ///
    /// Dropping it (a cancelled request) drops what it holds: a permit given back, a pending decision abandoned.
    // How the limiter answers is crate-private: the bound says which state machine runs, not a name a caller meets.
    #[allow(private_bounds)]
    pub struct ResponseFuture<Svc: Machinery<Req>, Req> {
        #[pin]
        inner: Svc::Machine,
    }
}

/// A limiter service and the state machine its [`ResponseFuture`] runs: the limiter's inner service's future and
/// the limiter's way to answer (a [`Responder`], the set's answer, a held permit).
///
/// Its implementations ask only what naming the machine needs: the bounds that make it a future (an error
/// `Into<BoxError>`...) stay on the [`Future`] impl, so that proving the future `Send` (in a spawned task) never
/// has to prove them for every lifetime.
pub(crate) trait Machinery<Req> {
    /// The state machine: a [`Machine`] over the inner service's future and the limiter's [`Answer`].
    type Machine: fmt::Debug;
}

#[allow(private_bounds)]
impl<Svc: Machinery<Req>, Req> ResponseFuture<Svc, Req> {
    #[inline]
    pub(crate) fn new(inner: Svc::Machine) -> Self {
        Self { inner }
    }
}

#[allow(private_bounds)]
impl<Svc: Machinery<Req>, Req> fmt::Debug for ResponseFuture<Svc, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

#[allow(private_bounds)]
impl<Svc, Req> Future for ResponseFuture<Svc, Req>
where
    Svc: Machinery<Req> + Service<Req>,
    Svc::Machine: Future<Output = Result<Svc::Response, Svc::Error>>,
{
    type Output = Result<<Svc as Service<Req>>::Response, <Svc as Service<Req>>::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

pin_project! {
    /// What a limiter's [`ResponseFuture`] runs: decides (a store that has to wait), calls the inner service `S`
    /// (whose future is `F`) with what the admission granted, or answers a refusal, through the answer `A`.
    pub(crate) struct Machine<F, S, Req, A: Grants> {
        #[pin]
        state: State<F, S, Req, A::Grant>,
        // Beside the state rather than in it: the admitted future is then the inner future plus a few words,
        // built in place.
        grant: Option<A::Grant>,
        // Set once this future has answered; polling again answers "polled after completion". The state is left as
        // it was (a finished inner future is dropped with this one: dropping it early costs a call per request and
        // buys nothing).
        answered: bool,
        answer: A,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, Req, G> {
        // The store is still deciding; the ready inner service and the request wait for it (boxed: this state is
        // rare, and keeping it small keeps the whole future small to move).
        Deciding { decide: Deciding<G>, waiting: Option<Box<(S, Req)>> },
        // Admitted: the inner service is running; its result and the grant go to the answer.
        Calling { #[pin] fut: F },
        // Refused, the key could not be found, or the inner service failed to become ready.
        Failed { error: Option<BoxError> },
    }
}

impl<F, S, Req, A: Grants> Machine<F, S, Req, A> {
    #[inline]
    pub(crate) fn calling(fut: F, grant: Option<A::Grant>, answer: A) -> Self {
        Self {
            state: State::Calling { fut },
            grant,
            answered: false,
            answer,
        }
    }

    pub(crate) fn failed(error: BoxError, answer: A) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            grant: None,
            answered: false,
            answer,
        }
    }

    fn deciding(decide: Deciding<A::Grant>, inner: S, req: Req, answer: A) -> Self {
        Self {
            state: State::Deciding {
                decide,
                waiting: Some(Box::new((inner, req))),
            },
            grant: None,
            answered: false,
            answer,
        }
    }
}

impl<F, S, Req, A: Grants> fmt::Debug for Machine<F, S, Req, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Deciding { .. } => "deciding",
            State::Calling { .. } => "calling",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<F, S, Req, A, T, E> Future for Machine<F, S, Req, A>
where
    S: Service<Req, Future = F, Response = T, Error = E>,
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    A: Answer<Req, T>,
{
    type Output = A::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.as_mut().project();
        // The common end: the inner service's response, answered in place where the inner future left it, so that
        // it moves once, into the output.
        if let (false, StateProj::Calling { fut }) = (*this.answered, this.state.as_mut().project())
        {
            let mut polled = fut.poll(cx);
            let Poll::Ready(result) = &mut polled else {
                return Poll::Pending;
            };
            *this.answered = true;
            let mut grant = this.grant.take();
            if let Ok(response) = result {
                grant = this.answer.amend_ok(response, grant);
            }
            return polled.map(|result| match result {
                Ok(response) => this.answer.finish_ok(response, grant),
                Err(err) => answer_error(this.answer, err.into(), grant),
            });
        }
        let result = match this.state.as_mut().project() {
            StateProj::Deciding { .. } if !*this.answered => {
                match ready!(decided(this.state.as_mut(), this.grant, cx)) {
                    // Admitted: the state is now `Calling`.
                    None => return self.poll(cx),
                    Some(refused) => Err(refused),
                }
            }
            StateProj::Failed { error } if !*this.answered => Err(failure(error)),
            // Answered already (a `Calling` state that had not was answered above).
            _ => Err(POLLED_AFTER_COMPLETION.into()),
        };
        *this.answered = true;
        Poll::Ready(this.answer.respond(result, this.grant.take()))
    }
}

/// Answers an error of the inner service.
fn answer_error<Req, T, A: Answer<Req, T>>(
    answer: &A,
    error: BoxError,
    grant: Option<A::Grant>,
) -> A::Output {
    answer.respond(Err(error), grant)
}

// The states an admitted request through the in-process store never visits.

/// Polls a store's decision: `None` once admitted (the inner service called and the state moved on to calling
/// it), or the error to answer with.
fn decided<F, S, Req, G>(
    mut state: Pin<&mut State<F, S, Req, G>>,
    own: &mut Option<G>,
    cx: &mut Context<'_>,
) -> Poll<Option<BoxError>>
where
    S: Service<Req, Future = F>,
{
    let StateProj::Deciding { decide, waiting } = state.as_mut().project() else {
        return Poll::Ready(Some(POLLED_AFTER_COMPLETION.into()));
    };
    let conclusion = ready!(decide.as_mut().poll(cx));
    Poll::Ready(match (waiting.take(), conclusion) {
        (Some(waiting), Conclusion::Admit(grant)) => {
            let (mut inner, req) = *waiting;
            let fut = inner.call(req);
            state.set(State::Calling { fut });
            *own = grant;
            None
        }
        (Some(_), Conclusion::Reject(refused)) => Some(refused),
        (None, _) => Some(POLLED_AFTER_COMPLETION.into()),
    })
}

/// The error a failed future answers with (taken by its one answer).
fn failure(error: &mut Option<BoxError>) -> BoxError {
    error
        .take()
        .unwrap_or_else(|| POLLED_AFTER_COMPLETION.into())
}

/// Passes the request straight on, undecided: enforcement is off.
#[inline]
pub(crate) fn pass<S, Req, A>(inner: &mut S, req: Req, answer: A) -> Machine<S::Future, S, Req, A>
where
    S: Service<Req>,
    A: Grants,
{
    Machine::calling(inner.call(req), None, answer)
}

/// Takes the inner service that `poll_ready` made ready, leaving a clone (not yet ready) in its place: a refused or
/// deferred request must not hold on to (or leak) the readiness it was granted.
pub(crate) fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// Answers with `error` (a rejection, or a key that could not be found) without calling the inner service, whose
/// granted readiness is given back.
pub(crate) fn refuse<S, Req, A>(
    inner: &mut S,
    error: BoxError,
    answer: A,
) -> Machine<S::Future, S, Req, A>
where
    S: Service<Req> + Clone,
    A: Answer<Req, S::Response>,
{
    drop(take_ready(inner));
    Machine::failed(error, answer)
}

/// Runs a decision that may have to wait (a shared store). It may still answer at once (a cache, an open
/// circuit, an in-process store): an admitted request then calls the ready inner service directly, without
/// cloning it. Otherwise the response future polls it again with the real waker (every future re-registers its
/// waker on each poll).
pub(crate) fn decide_later<S, Req, A>(
    inner: &mut S,
    mut decide: Deciding<A::Grant>,
    req: Req,
    answer: A,
) -> Machine<S::Future, S, Req, A>
where
    S: Service<Req> + Clone,
    A: Answer<Req, S::Response>,
{
    match decide
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(Conclusion::Admit(grant)) => Machine::calling(inner.call(req), grant, answer),
        Poll::Ready(Conclusion::Reject(refused)) => refuse(inner, refused, answer),
        Poll::Pending => {
            let ready = take_ready(inner);
            Machine::deciding(decide, ready, req, answer)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{Decision, Outcome, Timestamp};

    use super::shown_after_charge;
    use crate::Verdict;

    /// 10 per minute, 9 left after the up-front cost, full again in 6 s.
    fn admitted() -> Verdict {
        Verdict::new(
            "v",
            Duration::from_secs(60),
            Decision {
                outcome: Outcome::Allowed,
                limit: 10,
                remaining: 9,
                reset: Timestamp::from_micros(6_000_000),
                retry_after: None,
                now: Timestamp::from_micros(0),
            },
        )
    }

    #[test]
    fn a_charge_shows_in_remaining_and_a_token_buckets_reset() {
        let shown = |delta, moves_reset| {
            let mut v = admitted();
            shown_after_charge(&mut v, delta, moves_reset);
            (
                v.decision.remaining,
                v.decision.reset.as_micros() / 1_000_000,
            )
        };
        // 3 more: 6 left; the bucket is full 3 tokens (18 s) later.
        assert_eq!(shown(3, true), (6, 24));
        // 14 more: nothing left, full once the 15 tokens accrue (90 s).
        assert_eq!(shown(14, true), (0, 90));
        // Beyond the debt's floor (two windows): the reset stops there.
        assert_eq!(shown(1_000, true), (0, 120));
        // A sliding window's reset does not move.
        assert_eq!(shown(3, false), (6, 6));
        // A refund, or nothing more, shows nothing more.
        assert_eq!(shown(-5, true), (9, 6));
        assert_eq!(shown(0, true), (9, 6));
    }
}
