use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::decide::Conclusion;
use crate::{BoxError, Verdict, VerdictSink};

const POLLED_AFTER_COMPLETION: &str = "rate-limit response future polled after completion";

type Deciding = Pin<Box<dyn Future<Output = Conclusion> + Send>>;

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit).
    pub struct ResponseFuture<F, S, Req> {
        #[pin]
        state: State<F, S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, Req> {
        // The store is still deciding; the ready inner service and the request wait for it (boxed: this state is
        // rare, and keeping it small keeps the whole future small to move).
        Deciding { decide: Deciding, waiting: Option<Box<(S, Req)>> },
        // Admitted: the inner service is running; its response will carry the verdict.
        Calling { #[pin] fut: F, verdict: Option<Verdict> },
        // Rejected, or the key could not be found.
        Failed { error: Option<BoxError> },
    }
}

impl<F, S, Req> ResponseFuture<F, S, Req> {
    pub(super) fn calling(fut: F, verdict: Option<Verdict>) -> Self {
        Self {
            state: State::Calling { fut, verdict },
        }
    }

    pub(super) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }

    pub(super) fn deciding(decide: Deciding, inner: S, req: Req) -> Self {
        Self {
            state: State::Deciding {
                decide,
                waiting: Some(Box::new((inner, req))),
            },
        }
    }
}

impl<F, S, Req> fmt::Debug for ResponseFuture<F, S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Deciding { .. } => "deciding",
            State::Calling { .. } => "calling",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, S, Req, T, E> Future for ResponseFuture<F, S, Req>
where
    S: Service<Req, Future = F, Response = T, Error = E>,
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    T: VerdictSink,
{
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Deciding { decide, waiting } => {
                    let conclusion = ready!(decide.as_mut().poll(cx));
                    let Some(waiting) = waiting.take() else {
                        return Poll::Ready(Err(POLLED_AFTER_COMPLETION.into()));
                    };
                    let (mut inner, req) = *waiting;
                    match conclusion {
                        Conclusion::Admit(verdict) => {
                            let fut = inner.call(req);
                            this.state.set(State::Calling { fut, verdict });
                        }
                        Conclusion::Reject(rejection) => {
                            this.state.set(State::Failed { error: None });
                            return Poll::Ready(Err(rejection.into()));
                        }
                    }
                }
                StateProj::Calling { fut, verdict } => {
                    let mut response = ready!(fut.poll(cx)).map_err(Into::into)?;
                    if let Some(verdict) = verdict.take() {
                        response.verdicts_mut().push(verdict);
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .unwrap_or_else(|| POLLED_AFTER_COMPLETION.into())));
                }
            }
        }
    }
}
