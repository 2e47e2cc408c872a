use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use crate::BoxError;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::decide::Conclusion;
use crate::{HoldPermit, Permit};

const POLLED_AFTER_COMPLETION: &str = "concurrency-limit response future polled after completion";

pub(crate) type Deciding = Pin<Box<dyn Future<Output = Conclusion> + Send>>;

pin_project! {
    /// Response future of [`LeaseLimit`](super::LeaseLimit).
    ///
    /// Dropping it (a cancelled request) drops the permit it holds, which releases the lease.
    pub struct ResponseFuture<F, S, Req> {
        #[pin]
        state: State<F, S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, Req> {
        // The lease store is still deciding; the ready inner service and the request wait for it.
        Deciding { decide: Deciding, inner: Option<S>, req: Option<Req> },
        // Admitted: the inner service runs while the permit is held; the response takes the permit over.
        Calling { #[pin] fut: F, permit: Option<Permit> },
        // Rejected, or the key could not be found.
        Failed { error: Option<BoxError> },
    }
}

impl<F, S, Req> ResponseFuture<F, S, Req> {
    pub(super) fn calling(fut: F, permit: Option<Permit>) -> Self {
        Self {
            state: State::Calling { fut, permit },
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
                inner: Some(inner),
                req: Some(req),
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
    T: HoldPermit,
{
    type Output = Result<T::Held, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Deciding { decide, inner, req } => {
                    let conclusion = ready!(decide.as_mut().poll(cx));
                    let (Some(mut inner), Some(req)) = (inner.take(), req.take()) else {
                        return Poll::Ready(Err(POLLED_AFTER_COMPLETION.into()));
                    };
                    match conclusion {
                        Conclusion::Admit(permit) => {
                            let fut = inner.call(req);
                            this.state.set(State::Calling { fut, permit });
                        }
                        Conclusion::Reject(rejection) => {
                            this.state.set(State::Failed { error: None });
                            return Poll::Ready(Err(rejection.into()));
                        }
                    }
                }
                StateProj::Calling { fut, permit } => {
                    // On error the permit stays here and goes when the future is dropped.
                    let response = ready!(fut.poll(cx)).map_err(Into::into)?;
                    return Poll::Ready(Ok(response.hold(permit.take())));
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
