use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tollgate_tower::{BoxError, Rejection, VerdictSink, Verdicts};

use crate::HeaderSet;
use crate::headers::Constant;
use crate::problem::error_response;

pin_project! {
    /// Response future of [`HttpLimit`](crate::HttpLimit).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        headers: HeaderSet,
        cache: Arc<OnceLock<Option<Constant>>>,
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
    pub(crate) fn new(fut: F, headers: HeaderSet, cache: Arc<OnceLock<Option<Constant>>>) -> Self {
        Self {
            state: State::Running { fut },
            headers,
            cache,
        }
    }

    pub(crate) fn failed(
        error: BoxError,
        headers: HeaderSet,
        cache: Arc<OnceLock<Option<Constant>>>,
    ) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            headers,
            cache,
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("headers", &self.headers)
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
        let response = match result {
            Ok(response) => response,
            Err(err) => {
                let mut response = error_response(&err);
                if let Some(verdict) = err.downcast_ref::<Rejection>().and_then(Rejection::verdict)
                {
                    response.verdicts_mut().push(verdict.clone());
                }
                response
            }
        };
        let (mut parts, body) = response.into_parts();
        if let Some(verdicts) = parts.extensions.get::<Verdicts>() {
            this.headers
                .render_with(verdicts, &mut parts.headers, Some(this.cache));
        }
        Poll::Ready(Ok(Response::from_parts(parts, body)))
    }
}
