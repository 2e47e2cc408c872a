use tollgate_http::HeaderSet;
use tower_layer::Layer;

use super::GrpcLimit;

/// Turns the rejections of the tollgate layers `L` into gRPC statuses: see the [module docs](super).
#[derive(Debug, Clone)]
#[must_use]
pub struct GrpcLimitLayer<L> {
    limiters: L,
    headers: HeaderSet,
}

impl<L: Default> Default for GrpcLimitLayer<L> {
    fn default() -> Self {
        Self::new(L::default())
    }
}

impl<L> GrpcLimitLayer<L> {
    /// Wraps `limiters`: one tollgate layer, or several stacked (e.g. with `tower::ServiceBuilder`), writing
    /// every family of rate-limit metadata on admitted calls.
    pub const fn new(limiters: L) -> Self {
        Self {
            limiters,
            headers: HeaderSet::ALL,
        }
    }

    /// Chooses the families of rate-limit metadata written on admitted calls (the same names and values as the
    /// HTTP adapter's headers): [`HeaderSet::NONE`] writes none, and saves the server encoding them and every
    /// client decoding them. A refusal carries its status, `RetryInfo` and fields whatever the choice: the
    /// refused client needs them to know when to come back.
    pub const fn headers(mut self, headers: HeaderSet) -> Self {
        self.headers = headers;
        self
    }

    /// The wrapped layers.
    pub const fn get_ref(&self) -> &L {
        &self.limiters
    }
}

impl<S, L: Layer<S>> Layer<S> for GrpcLimitLayer<L> {
    type Service = GrpcLimit<L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcLimit::new(self.limiters.layer(inner), self.headers)
    }
}
