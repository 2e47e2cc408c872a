use std::convert::Infallible;
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate_tower::__private::DeferredReadiness;
use tollgate_tower::BoxError;
use tower_service::Service;

use crate::{HttpResponder, ResponseFuture};

/// An `Infallible` HTTP service around tollgate limiters that leave their verdicts on the response (the
/// Stripe-stack layers): answers their rejections itself and renders the headers. Built by
/// [`HttpLimitLayer`](crate::HttpLimitLayer).
#[derive(Debug, Clone)]
pub struct HttpLimit<S> {
    inner: S,
    responder: HttpResponder,
    /// An error from the inner `poll_ready`, answered (500) by the next call: `poll_ready` cannot respond.
    not_ready: DeferredReadiness,
}

impl<S> HttpLimit<S> {
    /// Wraps `inner`, answering through `responder`.
    pub fn new(inner: S, responder: HttpResponder) -> Self {
        Self {
            inner,
            responder,
            not_ready: DeferredReadiness::default(),
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for HttpLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: From<String>,
{
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.not_ready.poll_ready(&mut self.inner, cx).map(Ok)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let outer = self.responder.mark(&mut req);
        let responder = self.responder;
        match self.not_ready.take() {
            Some(err) => ResponseFuture::failed(err, responder, outer),
            None => ResponseFuture::new(self.inner.call(req), responder, outer),
        }
    }
}
