use std::sync::{Arc, OnceLock};

use tower_layer::Layer;

use crate::headers::Constant;
use crate::{HeaderSet, HttpLimit};

/// Wraps a tollgate layer (e.g. a [`RateLimitLayer`](tollgate_tower::RateLimitLayer)) so that the service stays
/// `Infallible` for axum: rejections become 429/503 responses and every response gets the rate-limit headers.
///
/// Stack one per limit; each adds its own entry to the `RateLimit` fields.
#[derive(Debug, Clone)]
#[must_use]
pub struct HttpLimitLayer<L> {
    inner: L,
    headers: HeaderSet,
    /// The constant header values of the wrapped limiter, shared by every service the layer builds.
    cache: Arc<OnceLock<Option<Constant>>>,
}

impl<L> HttpLimitLayer<L> {
    /// Adapts `inner`, writing every header family.
    pub fn new(inner: L) -> Self {
        Self {
            inner,
            headers: HeaderSet::ALL,
            cache: Arc::default(),
        }
    }

    /// Chooses the header families to write.
    pub fn headers(mut self, headers: HeaderSet) -> Self {
        self.headers = headers;
        self
    }

    /// The wrapped layer.
    pub fn get_ref(&self) -> &L {
        &self.inner
    }
}

impl<S, L: Layer<S>> Layer<S> for HttpLimitLayer<L> {
    type Service = HttpLimit<L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpLimit::new(self.inner.layer(inner), self.headers, self.cache.clone())
    }
}
