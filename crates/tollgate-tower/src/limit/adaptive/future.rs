use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use crate::BoxError;
use pin_project_lite::pin_project;

use super::limiter::{AdaptivePermit, Outcome};
use crate::{HoldPermit, Permit};

pin_project! {
    /// Response future of [`AdaptiveLimit`](super::AdaptiveLimit).
    ///
    /// Dropping it (a cancelled request) gives the slot back without a latency sample.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // Admitted: the slot is held until the response (its body) is finished.
        Calling { #[pin] fut: F, permit: Option<AdaptivePermit> },
        // Over the limit.
        Failed { error: Option<BoxError> },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn calling(fut: F, permit: Option<AdaptivePermit>) -> Self {
        Self {
            state: State::Calling { fut, permit },
        }
    }

    pub(super) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Calling { .. } => "calling",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    T: HoldPermit,
{
    type Output = Result<T::Held, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Calling { fut, permit } => match ready!(fut.poll(cx)) {
                Ok(response) => {
                    // The latency sample is taken when the body is finished: the permit moves into it.
                    let permit = permit.take().map(|mut p| {
                        p.outcome = Outcome::Responded;
                        Permit::new(p)
                    });
                    Poll::Ready(Ok(response.hold(permit)))
                }
                Err(err) => {
                    if let Some(mut p) = permit.take() {
                        p.outcome = Outcome::Dropped;
                    }
                    Poll::Ready(Err(err.into()))
                }
            },
            StateProj::Failed { error } => Poll::Ready(Err(error.take().unwrap_or_else(|| {
                "adaptive-limit response future polled after completion".into()
            }))),
        }
    }
}
