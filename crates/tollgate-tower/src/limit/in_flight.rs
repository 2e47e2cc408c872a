//! The service of the limiters whose requests hold a permit while in flight.

use std::fmt;

/// A service whose requests hold a permit while in flight: what each in-flight limiter's layer builds —
/// [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer), [`FleetShedLayer`](crate::FleetShedLayer),
/// [`WorkerShedLayer`](crate::WorkerShedLayer) and [`AdaptiveLimitLayer`](crate::AdaptiveLimitLayer), the layer
/// being `L` (as tower's two concurrency layers build one service).
///
/// The response holds the permit ([`HoldPermit`](crate::HoldPermit)) until it is finished: for HTTP, until its
/// body is done or dropped. Errors are the inner service's, boxed, plus [`Rejection`](crate::Rejection)s and, for
/// a per-key limit, [`KeyError`](crate::KeyError)s.
///
/// Cheap to clone: every clone decides on the state its layer built.
///
/// ```
/// use std::sync::Arc;
/// use tollgate_core::slot::MemorySlotStore;
/// use tollgate_tower::{BoxError, ConcurrencyLimitLayer, InFlightLimit, Mode};
/// use tower::{Layer, service_fn};
///
/// let layer = ConcurrencyLimitLayer::new("in-flight", 2, Arc::new(MemorySlotStore::new()), "all")?;
/// let inner = service_fn(|_: http::Request<()>| async { Ok::<_, BoxError>(http::Response::new(())) });
/// let svc: InFlightLimit<_, ConcurrencyLimitLayer<_, _>> = layer.layer(inner);
/// // The service reaches its layer's handles: flipping its switch flips every service the layer built.
/// svc.layer().enforcement().set(Mode::Shadow);
/// assert_eq!(layer.enforcement().mode(), Mode::Shadow);
/// # Ok::<(), tollgate_tower::ConfigError>(())
/// ```
pub struct InFlightLimit<S, L> {
    pub(crate) inner: S,
    pub(crate) layer: L,
}

impl<S, L> InFlightLimit<S, L> {
    pub(crate) const fn new(inner: S, layer: L) -> Self {
        Self { inner, layer }
    }

    /// The inner service.
    pub const fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The layer that built this service: its settings and handles (e.g. its
    /// [`enforcement`](crate::ConcurrencyLimitLayer::enforcement) switch), shared with every service it built.
    pub const fn layer(&self) -> &L {
        &self.layer
    }
}

impl<S: Clone, L: Clone> Clone for InFlightLimit<S, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, L: fmt::Debug> fmt::Debug for InFlightLimit<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimit")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

/// The `Service` of an [`InFlightLimit`] built by one in-flight limiter's layer, written once: `poll_ready` asks
/// the inner service, and `call` takes the state machine `$decide(&mut inner, &layer, req)` returns (or, given
/// fields, `$decide(&mut inner, &layer.field.field, req)`). `$layer` is the layer's type with its parameters
/// `$param`, bound by `$bounds`.
macro_rules! in_flight_service {
    ($decide:ident $(($($field:ident).+))? for $layer:ident<$($param:ident),+> where $($bounds:tt)+) => {
        impl<S, $($param,)+ Req> tower_service::Service<Req>
            for $crate::limit::InFlightLimit<S, $layer<$($param),+>>
        where
            S: tower_service::Service<Req> + Clone,
            S::Error: Into<$crate::BoxError>,
            S::Response: $crate::HoldPermit,
            $($bounds)+
        {
            type Response = <S::Response as $crate::HoldPermit>::Held;
            type Error = $crate::BoxError;
            type Future = $crate::limit::ResponseFuture<Self, Req>;

            fn poll_ready(
                &mut self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                self.inner.poll_ready(cx).map_err(Into::into)
            }

            #[inline]
            fn call(&mut self, req: Req) -> Self::Future {
                $crate::limit::ResponseFuture::new($decide(
                    &mut self.inner,
                    &self.layer $($(.$field)+)?,
                    req,
                ))
            }
        }

        impl<S, $($param,)+ Req> $crate::limit::Machinery<Req>
            for $crate::limit::InFlightLimit<S, $layer<$($param),+>>
        where
            S: tower_service::Service<Req>,
        {
            type Machine = $crate::limit::Machine<S::Future, S, Req, $crate::permit::Hold>;
        }
    };
}
pub(crate) use in_flight_service;
