use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use pin_project_lite::pin_project;
use tollgate_http::HeaderSet;
use tollgate_tower::{BoxError, KeyError, Rejection, Verdicts};

use crate::status::{key_error_status, rejection_status};

const POLLED_AFTER_COMPLETION: &str = "gRPC limit future polled after completion";

pin_project! {
    /// Response future of [`GrpcLimit`](super::GrpcLimit).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        headers: HeaderSet,
        // Set once answered: polling again answers "polled after completion" instead of polling a finished inner
        // future (which may panic).
        answered: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Calling { #[pin] fut: F },
        // The inner service failed to become ready; the call answers with its status.
        Failed { error: Option<BoxError> },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) const fn new(fut: F, headers: HeaderSet) -> Self {
        Self {
            state: State::Calling { fut },
            headers,
            answered: false,
        }
    }

    pub(super) const fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            headers: HeaderSet::NONE,
            answered: false,
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

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Output = Result<http::Response<tonic::body::Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = match this.state.project() {
            _ if *this.answered => Err(POLLED_AFTER_COMPLETION.into()),
            StateProj::Calling { fut } => ready!(fut.poll(cx)).map_err(Into::into),
            StateProj::Failed { error } => Err(error
                .take()
                .unwrap_or_else(|| POLLED_AFTER_COMPLETION.into())),
        };
        *this.answered = true;
        Poll::Ready(Ok(match result {
            Ok(response) => admitted(response, *this.headers),
            Err(err) => rejected(err),
        }))
    }
}

/// Adds the verdicts' metadata of the families `headers`; the body is passed on as it is, guards and all.
fn admitted<B>(response: http::Response<B>, headers: HeaderSet) -> http::Response<tonic::body::Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = response.into_parts();
    if headers != HeaderSet::NONE
        && let Some(verdicts) = parts.extensions.get::<Verdicts>()
    {
        headers.render(verdicts, &mut parts.headers);
    }
    http::Response::from_parts(parts, tonic::body::Body::new(body))
}

/// A trailers-only response for an error from the limiters or the service.
pub(super) fn rejected(err: BoxError) -> http::Response<tonic::body::Body> {
    let status = if let Some(rejection) = err.downcast_ref::<Rejection>() {
        rejection_status(rejection)
    } else if let Some(key_error) = err.downcast_ref::<KeyError>() {
        key_error_status(key_error)
    } else {
        tonic::Status::from_error(err)
    };
    status.into_http()
}
