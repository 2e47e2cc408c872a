use std::fmt;

use tollgate_core::Store;
use tollgate_tower::limit::rate::{RateLimitSet, RateLimitSetLayer};
use tollgate_tower::{RateLimit, RateLimitLayer};
use tower_layer::Layer;

use crate::problem::ProblemTypes;
use crate::{HeaderSet, HttpLimit, HttpResponder};

/// Wraps any tower layer whose services fail with tollgate rejections (a tollgate limiter, a `StackLayer`, a
/// `tower::ServiceBuilder` stack of them, or a foreign layer around one) so that the service stays `Infallible`
/// for axum: rejections become 429/503 responses and every response gets the rate-limit headers of the limiters
/// it passed.
///
/// Stack one per limit, or one around several; each limiter adds its own entry to the `RateLimit` fields. For a
/// single [`RateLimitLayer`], [`HttpRateLimitLayer`] does the same in one service.
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
        self.responder = self.responder.with_headers(headers);
        self
    }

    /// Chooses the problem types of the rejections' bodies (default: [`ProblemTypes::IETF`], the IETF draft's
    /// registered types). Build yours in a `const` or `static`: `.problem_types(&MY_TYPES)`.
    pub fn problem_types(mut self, types: &'static ProblemTypes) -> Self {
        self.responder = self.responder.with_problem_types(types);
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
        HttpLimit::new(self.inner.layer(inner), self.responder)
    }
}

/// A [`RateLimitLayer`] adapted to HTTP in place: the limiter answers through the [`HttpResponder`] itself, so
/// its verdict goes straight from the decision to the headers — one service instead of two, and no verdict stored
/// in the response's extensions on the way (the figures are in `docs/BENCHMARKS.md`). It answers exactly as
/// [`HttpLimitLayer`] around the same limiter does, and stacks with it.
///
/// ```
/// use std::sync::Arc;
/// use axum::{Router, routing::get};
/// use tollgate_core::{MemoryStore, Policy, Quota};
/// use tollgate_http::HttpRateLimitLayer;
/// use tollgate_http::key::PeerIp;
/// use tollgate_tower::RateLimitLayer;
///
/// let per_client = RateLimitLayer::new(
///     "per-client",
///     Policy::token_bucket(Quota::per_second(10)?),
///     Arc::new(MemoryStore::new()),
///     PeerIp,
/// );
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(HttpRateLimitLayer::new(per_client));
/// # let _ = app;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct HttpRateLimitLayer<K, St, C>(HttpLimitLayer<RateLimitLayer<K, St, C>>);

impl<K, St, C> HttpRateLimitLayer<K, St, C> {
    /// Adapts `inner`, writing every header family.
    pub fn new(inner: RateLimitLayer<K, St, C>) -> Self {
        Self(HttpLimitLayer::new(inner))
    }

    /// Chooses the header families to write.
    pub fn headers(self, headers: HeaderSet) -> Self {
        Self(self.0.headers(headers))
    }

    /// Chooses the problem types of the rejections' bodies (see [`HttpLimitLayer::problem_types`]).
    pub fn problem_types(self, types: &'static ProblemTypes) -> Self {
        Self(self.0.problem_types(types))
    }

    /// The wrapped layer.
    pub fn get_ref(&self) -> &RateLimitLayer<K, St, C> {
        self.0.get_ref()
    }
}

impl<K: Clone, St, C: Clone> Clone for HttpRateLimitLayer<K, St, C> {
    fn clone(&self) -> Self {
        Self(HttpLimitLayer {
            inner: self.0.inner.clone(),
            responder: self.0.responder,
        })
    }
}

impl<K, St, C> fmt::Debug for HttpRateLimitLayer<K, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HttpRateLimitLayer").field(&self.0).finish()
    }
}

impl<S, K: Clone, St: Store, C: Clone> Layer<S> for HttpRateLimitLayer<K, St, C> {
    type Service = RateLimit<S, K, St, C, HttpResponder>;

    fn layer(&self, inner: S) -> Self::Service {
        self.0.inner.layer_with(inner, self.0.responder)
    }
}

/// A [`RateLimitSetLayer`] adapted to HTTP in place, as [`HttpRateLimitLayer`] adapts one limiter: the set answers
/// through the [`HttpResponder`] itself, so a request that one of its limiters decides costs what the same
/// limiter built in code and adapted in place costs (no second service, no verdict list in the response's
/// extensions). It answers exactly as [`HttpLimitLayer`] around the same set does. What a policy file builds for
/// axum (`tollgate_config::axum`).
#[must_use]
pub struct HttpRateLimitSetLayer<K, St, C, A> {
    inner: RateLimitSetLayer<K, St, C, A>,
    responder: HttpResponder,
}

impl<K, St, C, A> HttpRateLimitSetLayer<K, St, C, A> {
    /// Adapts `inner`, writing every header family.
    pub fn new(inner: RateLimitSetLayer<K, St, C, A>) -> Self {
        Self {
            inner,
            responder: HttpResponder::new(HeaderSet::ALL),
        }
    }

    /// Chooses the header families to write.
    pub fn headers(mut self, headers: HeaderSet) -> Self {
        self.responder = self.responder.with_headers(headers);
        self
    }

    /// Chooses the problem types of the rejections' bodies (see [`HttpLimitLayer::problem_types`]).
    pub fn problem_types(mut self, types: &'static ProblemTypes) -> Self {
        self.responder = self.responder.with_problem_types(types);
        self
    }

    /// The wrapped set.
    pub fn get_ref(&self) -> &RateLimitSetLayer<K, St, C, A> {
        &self.inner
    }
}

impl<K, St, C, A> Clone for HttpRateLimitSetLayer<K, St, C, A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            responder: self.responder,
        }
    }
}

impl<K, St, C, A> fmt::Debug for HttpRateLimitSetLayer<K, St, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRateLimitSetLayer")
            .field("inner", &self.inner)
            .field("responder", &self.responder)
            .finish()
    }
}

impl<S, K, St, C, A> Layer<S> for HttpRateLimitSetLayer<K, St, C, A> {
    type Service = RateLimitSet<S, K, St, C, A, HttpResponder>;

    fn layer(&self, inner: S) -> Self::Service {
        self.inner.layer_with(inner, self.responder)
    }
}
