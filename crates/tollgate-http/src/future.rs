use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tollgate_tower::BoxError;

use crate::HttpResponder;

pin_project! {
    /// Response future of [`HttpLimit`](crate::HttpLimit).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        responder: HttpResponder,
        outer: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Running { #[pin] fut: F },
        // The inner service failed to become ready.
        Failed { error: Option<BoxError> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(fut: F, responder: HttpResponder, outer: bool) -> Self {
        Self {
            state: State::Running { fut },
            responder,
            outer,
        }
    }

    pub(crate) fn failed(error: BoxError, responder: HttpResponder, outer: bool) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            responder,
            outer,
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("responder", &self.responder)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: From<String>,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = match this.state.project() {
            StateProj::Running { fut } => ready!(fut.poll(cx)).map_err(Into::into),
            StateProj::Failed { error } => Err(error
                .take()
                .unwrap_or_else(|| "polled after completion".into())),
        };
        Poll::Ready(Ok(this.responder.answer(*this.outer, result, None)))
    }
}
