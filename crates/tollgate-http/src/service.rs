use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate_tower::BoxError;
use tower_service::Service;

use crate::headers::Constant;
use crate::{HeaderSet, ResponseFuture};

/// The service built by [`HttpLimitLayer`](crate::HttpLimitLayer): never fails, answers rejections itself.
#[derive(Debug, Clone)]
pub struct HttpLimit<S> {
    inner: S,
    headers: HeaderSet,
    cache: Arc<OnceLock<Option<Constant>>>,
    /// An error from the inner `poll_ready`, answered (500) by the next call: `poll_ready` cannot respond.
    not_ready: Option<String>,
}

impl<S> HttpLimit<S> {
    pub(crate) fn new(
        inner: S,
        headers: HeaderSet,
        cache: Arc<OnceLock<Option<Constant>>>,
    ) -> Self {
        Self {
            inner,
            headers,
            cache,
            not_ready: None,
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
        if self.not_ready.is_some() {
            return Poll::Ready(Ok(()));
        }
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(err)) => {
                self.not_ready = Some(err.into().to_string());
                Poll::Ready(Ok(()))
            }
        }
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        match self.not_ready.take() {
            Some(err) => ResponseFuture::failed(err.into(), self.headers, self.cache.clone()),
            None => ResponseFuture::new(self.inner.call(req), self.headers, self.cache.clone()),
        }
    }
}
