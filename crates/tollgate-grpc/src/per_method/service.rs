use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tollgate_tower::BoxError;
use tower_service::Service;

use super::ResponseFuture;

/// Which limit applies to which path.
pub(super) struct Routes {
    pub(super) methods: HashMap<Box<str>, usize>,
    pub(super) services: HashMap<Box<str>, usize>,
    pub(super) default: Option<usize>,
}

impl Routes {
    fn select(&self, path: &str) -> Option<usize> {
        if let Some(&i) = self.methods.get(path) {
            return Some(i);
        }
        let service = path
            .strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .map(|(service, _)| service);
        service
            .and_then(|s| self.services.get(s).copied())
            .or(self.default)
    }
}

/// A service whose calls are limited per method by a [`MethodLimitLayer`](super::MethodLimitLayer).
///
/// Like tonic's and axum's routers it is always ready: the limit chosen for a call is made ready inside that
/// call's future, so no readiness is reserved for a call that has not arrived (and none leaks when one is
/// rejected).
pub struct MethodLimit<S, L> {
    inner: S,
    limited: Arc<[L]>,
    routes: Arc<Routes>,
}

impl<S, L> MethodLimit<S, L> {
    pub(super) fn new(inner: S, limited: Arc<[L]>, routes: Arc<Routes>) -> Self {
        Self {
            inner,
            limited,
            routes,
        }
    }

    /// The unlimited inner service (for calls no rule matches).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, L> Clone for MethodLimit<S, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limited: self.limited.clone(),
            routes: self.routes.clone(),
        }
    }
}

impl<S, L> fmt::Debug for MethodLimit<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodLimit")
            .field("methods", &self.routes.methods.len())
            .field("services", &self.routes.services.len())
            .field("default", &self.routes.default.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, L, B> Service<http::Request<B>> for MethodLimit<S, L>
where
    S: Service<http::Request<B>> + Clone,
    S::Error: Into<BoxError>,
    L: Service<http::Request<B>, Response = S::Response> + Clone,
    L::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<L, S, http::Request<B>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match self.routes.select(req.uri().path()) {
            Some(i) => ResponseFuture::limited(self.limited[i].clone(), req),
            None => ResponseFuture::unlimited(self.inner.clone(), req),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_rule_beats_its_service_rule_which_beats_the_default() {
        let routes = Routes {
            methods: HashMap::from([("/a.B/C".into(), 0)]),
            services: HashMap::from([("a.B".into(), 1)]),
            default: Some(2),
        };
        assert_eq!(routes.select("/a.B/C"), Some(0));
        assert_eq!(routes.select("/a.B/D"), Some(1));
        assert_eq!(routes.select("/x.Y/C"), Some(2));
        assert_eq!(routes.select("not a grpc path"), Some(2));
        let no_default = Routes {
            default: None,
            ..routes
        };
        assert_eq!(no_default.select("/x.Y/C"), None);
    }
}
