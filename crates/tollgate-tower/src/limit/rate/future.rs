use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::decide::Conclusion;
use crate::respond::Respond;
use crate::{BoxError, Verdict};

const POLLED_AFTER_COMPLETION: &str = "rate-limit response future polled after completion";

type Deciding = Pin<Box<dyn Future<Output = Conclusion> + Send>>;

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit): `R` answers with the ticket `Tk` it took from the
    /// request.
    pub struct ResponseFuture<F, S, Req, R, Tk> {
        #[pin]
        state: State<F, S, Req>,
        // Beside the state rather than in it: the admitted future is then the inner future plus a few words, built
        // in place.
        verdict: Option<Box<Verdict>>,
        // Set once this future has answered; polling again answers "polled after completion". The state is left as
        // it was (a finished inner future is dropped with this one: dropping it early costs a call per request and
        // buys nothing).
        answered: bool,
        respond: R,
        ticket: Tk,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, Req> {
        // The store is still deciding; the ready inner service and the request wait for it (boxed: this state is
        // rare, and keeping it small keeps the whole future small to move).
        Deciding { decide: Deciding, waiting: Option<Box<(S, Req)>> },
        // Admitted: the inner service is running; its result and the verdict go to the responder.
        Calling { #[pin] fut: F },
        // Rejected, the key could not be found, or the inner service failed to become ready.
        Failed { error: Option<BoxError> },
    }
}

impl<F, S, Req, R, Tk> ResponseFuture<F, S, Req, R, Tk> {
    // Inlined for the same reason as `RateLimit::conclude`: the inner future is large.
    #[inline(always)]
    pub(super) fn calling(
        fut: F,
        verdict: Option<Box<Verdict>>,
        (respond, ticket): (R, Tk),
    ) -> Self {
        Self {
            state: State::Calling { fut },
            verdict,
            answered: false,
            respond,
            ticket,
        }
    }

    pub(super) fn failed(error: BoxError, (respond, ticket): (R, Tk)) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            verdict: None,
            answered: false,
            respond,
            ticket,
        }
    }

    pub(super) fn deciding(
        decide: Deciding,
        inner: S,
        req: Req,
        (respond, ticket): (R, Tk),
    ) -> Self {
        Self {
            state: State::Deciding {
                decide,
                waiting: Some(Box::new((inner, req))),
            },
            verdict: None,
            answered: false,
            respond,
            ticket,
        }
    }
}

impl<F, S, Req, R, Tk> fmt::Debug for ResponseFuture<F, S, Req, R, Tk> {
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

impl<F, S, Req, R, Tk, T, E> Future for ResponseFuture<F, S, Req, R, Tk>
where
    S: Service<Req, Future = F, Response = T, Error = E>,
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    R: Respond<Req, T, Ticket = Tk>,
    Tk: Copy,
{
    type Output = Result<R::Response, R::Error>;

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
            let mut verdict = this.verdict.take();
            if let Ok(response) = result {
                verdict = this.respond.amend_ok(this.ticket, response, verdict);
            }
            return polled.map(|result| match result {
                Ok(response) => this.respond.finish_ok(*this.ticket, response, verdict),
                Err(err) => answer_error(this.respond, *this.ticket, err.into(), verdict),
            });
        }
        let result = match this.state.as_mut().project() {
            StateProj::Deciding { .. } if !*this.answered => {
                match ready!(decided(this.state.as_mut(), this.verdict, cx)) {
                    // Admitted: the state is now `Calling`.
                    None => return self.poll(cx),
                    Some(rejected) => Err(rejected),
                }
            }
            StateProj::Failed { error } if !*this.answered => Err(failure(error)),
            // Answered already (a `Calling` state that had not was answered above).
            _ => Err(POLLED_AFTER_COMPLETION.into()),
        };
        *this.answered = true;
        Poll::Ready(
            this.respond
                .respond(*this.ticket, result, this.verdict.take().map(|v| *v)),
        )
    }
}

/// Answers an error of the inner service (out of line: the admitted path is what `poll` keeps small).
#[cold]
#[inline(never)]
fn answer_error<Req, T, R: Respond<Req, T>>(
    respond: &R,
    ticket: R::Ticket,
    error: BoxError,
    verdict: Option<Box<Verdict>>,
) -> Result<R::Response, R::Error> {
    respond.respond(ticket, Err(error), verdict.map(|v| *v))
}

// The states an admitted request through the in-process store never visits, out of `poll`'s body (see
// `RateLimit::decide_later`).

/// Polls a store's decision: `None` once admitted (the inner service called and the state moved on to calling
/// it), or the error to answer with.
#[inline(never)]
fn decided<F, S, Req>(
    mut state: Pin<&mut State<F, S, Req>>,
    own: &mut Option<Box<Verdict>>,
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
        (Some(waiting), Conclusion::Admit(verdict)) => {
            let (mut inner, req) = *waiting;
            let fut = inner.call(req);
            state.set(State::Calling { fut });
            *own = verdict;
            None
        }
        (Some(_), Conclusion::Reject(rejection)) => Some(rejection),
        (None, _) => Some(POLLED_AFTER_COMPLETION.into()),
    })
}

/// The error a failed future answers with (taken by its one answer).
#[cold]
#[inline(never)]
fn failure(error: &mut Option<BoxError>) -> BoxError {
    error
        .take()
        .unwrap_or_else(|| POLLED_AFTER_COMPLETION.into())
}
