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
    /// `ratelimit` on admitted calls ([`HeaderSet::RATELIMIT_ONLY`]: what each limit has left and within which
    /// time); [`headers`](Self::headers) chooses more, or none.
    pub const fn new(limiters: L) -> Self {
        Self {
            limiters,
            headers: HeaderSet::RATELIMIT_ONLY,
        }
    }

    /// Chooses the rate-limit metadata written on admitted calls (the same names and values as the HTTP adapter's
    /// headers): [`HeaderSet::ALL`] writes `ratelimit-policy` and the `x-ratelimit-*` family too,
    /// [`HeaderSet::NONE`] nothing. Every field costs the server encoding it and every client decoding it on every
    /// call (HTTP/2 header compression turns a repeated value into a byte on the wire, not into no work), which is
    /// why the default is the one field a client paces itself by. A refusal carries its status, `RetryInfo` and
    /// every field whatever the choice: the refused client needs them to know when to come back.
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
