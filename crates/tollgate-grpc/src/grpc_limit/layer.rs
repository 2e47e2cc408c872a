use tower_layer::Layer;

use super::GrpcLimit;

/// Turns the rejections of the tollgate layers `L` into gRPC statuses: see the [module docs](super).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct GrpcLimitLayer<L> {
    limiters: L,
}

impl<L> GrpcLimitLayer<L> {
    /// Wraps `limiters`: one tollgate layer, or several stacked (e.g. with `tower::ServiceBuilder`).
    pub const fn new(limiters: L) -> Self {
        Self { limiters }
    }

    /// The wrapped layers.
    pub const fn get_ref(&self) -> &L {
        &self.limiters
    }
}

impl<S, L: Layer<S>> Layer<S> for GrpcLimitLayer<L> {
    type Service = GrpcLimit<L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcLimit::new(self.limiters.layer(inner))
    }
}
