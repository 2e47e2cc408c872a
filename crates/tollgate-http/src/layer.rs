use tollgate_core::Store;
use tollgate_stack::{AdaptiveLimitLayer, LeaseLimitLayer, StackLayer, WorkerShedLayer};
use tollgate_tower::{RateLimit, RateLimitLayer};
use tower::util::Either;
use tower_layer::{Identity, Layer, Stack};

use crate::{HeaderSet, HttpLimit, HttpResponder};

/// Wraps a tollgate layer (e.g. a [`RateLimitLayer`]) so that the service stays `Infallible` for axum: rejections
/// become 429/503 responses and every response gets the rate-limit headers.
///
/// Stack one per limit; each adds its own entry to the `RateLimit` fields. A [`RateLimitLayer`] answers in place
/// (one service, see [`HttpAdapt`]); the Stripe-stack layers are wrapped in an [`HttpLimit`].
#[derive(Debug, Clone)]
#[must_use]
pub struct HttpLimitLayer<L> {
    inner: L,
    responder: HttpResponder,
}

impl<L> HttpLimitLayer<L> {
    /// Adapts `inner`, writing every header family.
    pub fn new(inner: L) -> Self {
        Self {
            inner,
            responder: HttpResponder::new(HeaderSet::ALL),
        }
    }

    /// Chooses the header families to write.
    pub fn headers(mut self, headers: HeaderSet) -> Self {
        self.responder = HttpResponder::new(headers);
        self
    }

    /// The wrapped layer.
    pub fn get_ref(&self) -> &L {
        &self.inner
    }
}

impl<S, L: HttpAdapt<S>> Layer<S> for HttpLimitLayer<L> {
    type Service = L::Service;

    fn layer(&self, inner: S) -> Self::Service {
        self.inner.adapt(inner, self.responder)
    }
}

/// A tollgate layer that [`HttpLimitLayer`] can adapt to HTTP.
///
/// A [`RateLimitLayer`] builds a [`RateLimit`] that answers through the [`HttpResponder`] itself: one service
/// instead of two, and a single limiter's verdict goes straight from the decision to the headers. Every other
/// tollgate layer (the Stripe-stack layers, their [`StackLayer`], `tower::ServiceBuilder` stacks of them) is
/// wrapped in an [`HttpLimit`], which reads the verdicts the wrapped limiters leave on the response; the `Either`
/// of `tower::util::option_layer` adapts whichever side it holds. Implement it for a layer of your own by
/// wrapping it the same way: `HttpLimit::new(self.layer(inner), responder)`.
pub trait HttpAdapt<S> {
    /// The adapted service.
    type Service;

    /// Wraps `inner`, answering through `responder`.
    fn adapt(&self, inner: S, responder: HttpResponder) -> Self::Service;
}

impl<S, K: Clone, St: Store, C: Clone> HttpAdapt<S> for RateLimitLayer<K, St, C> {
    type Service = RateLimit<S, K, St, C, HttpResponder>;

    fn adapt(&self, inner: S, responder: HttpResponder) -> Self::Service {
        self.layer_with(inner, responder)
    }
}

/// Layers whose services leave their verdicts on the response: adapted by an [`HttpLimit`] around them.
macro_rules! adapt_by_wrapping {
    ($($layer:ident<$($param:ident),*>),* $(,)?) => {$(
        impl<S, $($param),*> HttpAdapt<S> for $layer<$($param),*>
        where
            $layer<$($param),*>: Layer<S>,
        {
            type Service = HttpLimit<<Self as Layer<S>>::Service>;

            fn adapt(&self, inner: S, responder: HttpResponder) -> Self::Service {
                HttpLimit::new(self.layer(inner), responder)
            }
        }
    )*};
}

adapt_by_wrapping!(
    LeaseLimitLayer<R, L>,
    WorkerShedLayer<P>,
    StackLayer<W, R, C, F, A>,
    AdaptiveLimitLayer<P>,
    Stack<Inner, Outer>,
    Identity<>,
);

/// `tower::util::option_layer`'s layer: each side adapted on its own, so that both answer `Infallible` and
/// `Either` (which wants one error type on both sides) serves either.
impl<S, A: HttpAdapt<S>, B: HttpAdapt<S>> HttpAdapt<S> for Either<A, B> {
    type Service = Either<A::Service, B::Service>;

    fn adapt(&self, inner: S, responder: HttpResponder) -> Self::Service {
        match self {
            Either::Left(layer) => Either::Left(layer.adapt(inner, responder)),
            Either::Right(layer) => Either::Right(layer.adapt(inner, responder)),
        }
    }
}
