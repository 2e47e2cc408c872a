//! [`StreamCostLayer`]: meters the response bodies of the limiters inside it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tollgate_tower::stream_cost::StreamCharges;
use tower_layer::Layer;
use tower_service::Service;

use super::{MakeMeter, MeteredBody};

/// Meters each response's body with the meter `make` makes for its request, for the rate limiters inside this
/// layer that charge as the response streams (see the [module docs](super)). Goes outside those limiters (and
/// outside the HTTP adapter): it reads the ledger they leave on the response.
#[must_use]
#[derive(Debug, Clone)]
pub struct StreamCostLayer<M> {
    make: M,
}

impl<M> StreamCostLayer<M> {
    /// Meters with `make` (a ready-made meter such as [`OpenAiSse`](super::OpenAiSse), or a closure from the
    /// request to a [`Meter`](super::Meter)).
    pub const fn new(make: M) -> Self {
        Self { make }
    }
}

impl<S, M: Clone> Layer<S> for StreamCostLayer<M> {
    type Service = StreamCost<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        StreamCost {
            inner,
            make: self.make.clone(),
        }
    }
}

/// The service of a [`StreamCostLayer`].
#[derive(Debug, Clone)]
pub struct StreamCost<S, M> {
    inner: S,
    make: M,
}

impl<S, M, ReqBody, ResBody> Service<Request<ReqBody>> for StreamCost<S, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    M: MakeMeter<ReqBody>,
{
    type Response = Response<MeteredBody<ResBody, M::Meter>>;
    type Error = S::Error;
    type Future = StreamCostFuture<S::Future, M::Meter>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let meter = self.make.make(&req);
        StreamCostFuture {
            inner: self.inner.call(req),
            meter: Some(meter),
        }
    }
}

pin_project! {
    /// The response future of a [`StreamCost`] service.
    pub struct StreamCostFuture<F, M> {
        #[pin]
        inner: F,
        meter: Option<M>,
    }
}

impl<F, M> std::fmt::Debug for StreamCostFuture<F, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCostFuture").finish_non_exhaustive()
    }
}

impl<F, M, B, E> Future for StreamCostFuture<F, M>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<MeteredBody<B, M>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let meter = this
            .meter
            .take()
            .expect("StreamCostFuture polled after completion");
        let (mut parts, body) = response.into_parts();
        let charges = parts.extensions.remove::<StreamCharges>();
        Poll::Ready(Ok(Response::from_parts(
            parts,
            MeteredBody::new(body, meter, charges),
        )))
    }
}
