use tollgate_tower::respond::LayerWith;
use tower_layer::Layer;

use crate::problem::ProblemTypes;
use crate::{HeaderSet, HttpLimit, HttpResponder};

/// Makes tollgate layers `Infallible` for axum: rejections become 429/503 responses and every response gets the
/// rate-limit headers of the limiters it passed.
///
/// It wraps one tollgate layer — a [`RateLimitLayer`](tollgate_tower::RateLimitLayer), a policy file's set,
/// Stripe's `StackLayer`, a concurrency limiter or a load shedder — or a `tower::ServiceBuilder` stack of them
/// (which may hold foreign layers too). Whatever it wraps, it takes the fastest path there is: a rate limiter
/// answers through the [`HttpResponder`] itself, so its verdict goes straight from the decision to the headers
/// (one service, no verdict stored in the response's extensions); other layers leave their verdicts on the
/// response for an [`HttpLimit`] around them to render. Both answer alike.
///
/// Stack one per limit, or one around several; each limiter adds its own entry to the `RateLimit` fields.
///
/// ```
/// use std::sync::Arc;
/// use axum::{Router, routing::get};
/// use tollgate_core::{MemoryStore, Policy, Quota};
/// use tollgate_http::HttpLimitLayer;
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
///     .layer(HttpLimitLayer::new(per_client));
/// # let _ = app;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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

impl<S, L: LayerWith<S, HttpResponder>> Layer<S> for HttpLimitLayer<L> {
    type Service = L::Service;

    fn layer(&self, inner: S) -> Self::Service {
        self.inner.layer_with(inner, self.responder)
    }
}

/// The service around layers that leave their verdicts on the response.
impl<T> Layer<T> for HttpResponder {
    type Service = HttpLimit<T>;

    fn layer(&self, inner: T) -> HttpLimit<T> {
        HttpLimit::new(inner, *self)
    }
}
