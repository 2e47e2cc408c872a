use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use crate::BoxError;
use pin_project_lite::pin_project;

use crate::{HoldPermit, Permit};

pin_project! {
    /// Response future of [`WorkerShed`](super::WorkerShed).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // Admitted: counted in flight until the response (its body) is finished.
        Calling { #[pin] fut: F, permit: Option<Permit> },
        // Shed.
        Failed { error: Option<BoxError> },
    }
}

impl<F> ResponseFuture<F> {
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
            StateProj::Calling { fut, permit } => {
                let response = ready!(fut.poll(cx)).map_err(Into::into)?;
                Poll::Ready(Ok(response.hold(permit.take())))
            }
            StateProj::Failed { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| "worker-shed response future polled after completion".into()))),
        }
    }
}
