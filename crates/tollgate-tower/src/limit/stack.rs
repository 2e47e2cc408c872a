//! [`StackLayer`]: the four limiters in one layer, in a fixed, documented order.
//!
//! A request meets, from the outside in:
//!
//! 1. the **worker-utilization shedder** — in-process, no I/O, and the only limiter that protects this instance
//!    from itself: it goes first so that a request it drops costs nothing else (no rate token spent, no slot
//!    taken, no Redis round trip while the instance is already overloaded);
//! 2. the **adaptive concurrency limiter** (optional, [`AdaptiveLimitLayer`](crate::AdaptiveLimitLayer)) —
//!    in-process too, a limit on this instance's in-flight requests that follows their latency: after the worker
//!    shedder, whose fixed lines it refines, and before anything that costs a store call;
//! 3. the **request-rate limiter** — one store call, no state to give back: a client over its rate is turned away
//!    before it can take a concurrency slot it would have to release again;
//! 4. the **concurrent-requests limiter** — per client key; its slot is held until the response is finished;
//! 5. the **fleet-usage shedder** — the one fleet-wide key every instance writes (the hottest key in Redis), so
//!    it is asked last, only for requests every per-client limit has admitted; shedding there costs those
//!    requests' slots a release, which is cheap and rare next to keeping the hot key free of doomed requests.
//!
//! Each slot is optional (an unset slot is [`Identity`]), and each limiter keeps its own name, shadow mode, kill
//! switch, metrics and failure policy. Wrap the stack in `tollgate_http::HttpLimitLayer` for axum (a router, a
//! route, a method router) or in `tollgate_grpc::GrpcLimitLayer` for tonic: they turn rejections into 429/503 or
//! `RESOURCE_EXHAUSTED`/`UNAVAILABLE`. See the [crate docs](crate) for a complete example.

use tower_layer::{Identity, Layer};

/// The four limiters of Stripe's stack (and the adaptive limiter) as one layer: see the [module docs](self) for
/// the order.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct StackLayer<W = Identity, R = Identity, C = Identity, F = Identity, A = Identity> {
    worker: W,
    rate: R,
    concurrency: C,
    fleet: F,
    adaptive: A,
}

impl StackLayer {
    /// An empty stack: every slot passes requests through until set.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<W, R, C, F, A> StackLayer<W, R, C, F, A> {
    /// Sets the worker-utilization shedder (outermost), e.g. a [`WorkerShedLayer`](crate::WorkerShedLayer).
    pub fn worker_shedder<W2>(self, worker: W2) -> StackLayer<W2, R, C, F, A> {
        StackLayer {
            worker,
            rate: self.rate,
            concurrency: self.concurrency,
            fleet: self.fleet,
            adaptive: self.adaptive,
        }
    }

    /// Sets the request-rate limiter(s), e.g. a `RateLimitLayer` on a `MemoryStore` or a `RedisStore` (several
    /// stacked with `tower::ServiceBuilder` count as one slot).
    pub fn rate_limit<R2>(self, rate: R2) -> StackLayer<W, R2, C, F, A> {
        StackLayer {
            worker: self.worker,
            rate,
            concurrency: self.concurrency,
            fleet: self.fleet,
            adaptive: self.adaptive,
        }
    }

    /// Sets the concurrent-requests limiter, e.g. a [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer).
    pub fn concurrency_limit<C2>(self, concurrency: C2) -> StackLayer<W, R, C2, F, A> {
        StackLayer {
            worker: self.worker,
            rate: self.rate,
            concurrency,
            fleet: self.fleet,
            adaptive: self.adaptive,
        }
    }

    /// Sets the fleet-usage shedder (innermost), e.g. a [`FleetShedLayer`](crate::FleetShedLayer).
    pub fn fleet_shedder<F2>(self, fleet: F2) -> StackLayer<W, R, C, F2, A> {
        StackLayer {
            worker: self.worker,
            rate: self.rate,
            concurrency: self.concurrency,
            fleet,
            adaptive: self.adaptive,
        }
    }

    /// Sets the adaptive concurrency limiter (right after the worker shedder), e.g. an
    /// [`AdaptiveLimitLayer`](crate::AdaptiveLimitLayer).
    pub fn adaptive_limit<A2>(self, adaptive: A2) -> StackLayer<W, R, C, F, A2> {
        StackLayer {
            worker: self.worker,
            rate: self.rate,
            concurrency: self.concurrency,
            fleet: self.fleet,
            adaptive,
        }
    }
}

impl<S, W, R, C, F, A> Layer<S> for StackLayer<W, R, C, F, A>
where
    F: Layer<S>,
    C: Layer<F::Service>,
    R: Layer<C::Service>,
    A: Layer<R::Service>,
    W: Layer<A::Service>,
{
    type Service = W::Service;

    fn layer(&self, inner: S) -> Self::Service {
        self.worker.layer(
            self.adaptive.layer(
                self.rate
                    .layer(self.concurrency.layer(self.fleet.layer(inner))),
            ),
        )
    }
}
