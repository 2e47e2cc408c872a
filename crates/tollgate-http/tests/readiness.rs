//! A rate limit answering in place stays `Infallible`: an inner service that fails to become ready is answered with
//! a 500 by the next call (which spends no quota), and the call after that is limited as usual.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http::header::HeaderName;
use http::{Request, Response};
use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_http::HttpLimitLayer;
use tollgate_http::key::HeaderKey;
use tollgate_tower::{BoxError, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

/// An inner service whose readiness fails once.
#[derive(Clone)]
struct FailsReadinessOnce(bool);

impl Service<Request<Body>> for FailsReadinessOnce {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if std::mem::replace(&mut self.0, false) {
            return Poll::Ready(Err("warming up".into()));
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new(Body::from("hello"))))
    }
}

fn request() -> Request<Body> {
    Request::builder()
        .header("x-api-key", "k1")
        .body(Body::empty())
        .unwrap()
}

async fn send<S>(svc: &mut S) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    match svc.ready().await {
        Ok(ready) => match ready.call(request()).await {
            Ok(response) => response,
            Err(never) => match never {},
        },
        Err(never) => match never {},
    }
}

#[tokio::test]
async fn a_readiness_error_becomes_a_500_then_limits_resume() {
    let layer = RateLimitLayer::new(
        "api",
        Policy::token_bucket(Quota::per_minute(2).unwrap()),
        Arc::new(MemoryStore::new()),
        HeaderKey::new(HeaderName::from_static("x-api-key")),
    );
    let mut svc = HttpLimitLayer::new(layer).layer(FailsReadinessOnce(true));

    let failed = send(&mut svc).await;
    assert_eq!(failed.status(), 500);
    assert!(
        !failed.headers().contains_key("ratelimit"),
        "nothing was decided: {failed:?}"
    );

    let admitted = send(&mut svc).await;
    assert_eq!(admitted.status(), 200);
    assert_eq!(admitted.headers()["ratelimit"], r#""api";r=1;t=30"#);
    assert_eq!(admitted.headers()["x-ratelimit-used"], "1");
}
