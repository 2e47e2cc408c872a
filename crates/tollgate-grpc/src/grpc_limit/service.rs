use std::convert::Infallible;
use std::fmt;
use std::task::{Context, Poll};

use bytes::Bytes;
use tollgate_http::HeaderSet;
use tollgate_tower::__private::DeferredReadiness;
use tollgate_tower::BoxError;
use tower_service::Service;

use super::{RequestBody, ResponseFuture};

/// A service whose tollgate rejections are gRPC responses; built by [`GrpcLimitLayer`](super::GrpcLimitLayer).
///
/// The service inside sees each request's body as a [`tonic::body::Body`] (as a tonic server's layers do, whatever
/// body the server was given): one that reads the rest of itself if dropped unread, as a refused call's is.
pub struct GrpcLimit<S> {
    inner: S,
    headers: HeaderSet,
    // An error from the inner service's `poll_ready`, answered by the next call as a status: with an infallible
    // error type, readiness errors can only be reported through a response.
    not_ready: DeferredReadiness,
}

impl<S> GrpcLimit<S> {
    pub(super) const fn new(inner: S, headers: HeaderSet) -> Self {
        Self {
            inner,
            headers,
            not_ready: DeferredReadiness::new(),
        }
    }

    /// The limited service.
    pub const fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone> Clone for GrpcLimit<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            headers: self.headers,
            not_ready: self.not_ready.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for GrpcLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for GrpcLimit<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
    ReqBody: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    ReqBody::Error: Into<BoxError> + Send,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.not_ready.poll_ready(&mut self.inner, cx).map(Ok)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        match self.not_ready.take() {
            Some(err) => ResponseFuture::failed(err),
            None => {
                let req = req.map(|body| tonic::body::Body::new(RequestBody::new(body)));
                ResponseFuture::new(self.inner.call(req), self.headers)
            }
        }
    }
}
