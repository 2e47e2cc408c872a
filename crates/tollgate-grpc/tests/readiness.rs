//! Readiness: a rejected call never holds on to the inner service's readiness, and an inner service that fails to
//! become ready is answered with a status (the layer's error type is `Infallible`).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_grpc::key::GrpcMethod;
use tollgate_grpc::{GrpcLimitLayer, MethodLimitLayer};
use tollgate_tower::{BoxError, RateLimitLayer};
use tonic::Code;
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn call(path: &str) -> http::Request<tonic::body::Body> {
    http::Request::builder()
        .uri(path)
        .body(tonic::body::Body::empty())
        .expect("a valid request")
}

fn status_of(response: &http::Response<tonic::body::Body>) -> Code {
    tonic::Status::from_header_map(response.headers()).map_or(Code::Ok, |s| s.code())
}

/// How long a call may wait for the inner service's one slot: paused time (the runtime skips ahead when every task
/// waits), so a leaked readiness permit fails the test at once instead of hanging it, and a loaded machine cannot.
const LEAKED: Duration = Duration::from_secs(60);

/// Calls `path` on a fresh clone of `base`, readied within [`LEAKED`]. The clone is kept alive afterwards (in
/// `kept`), so a permit it held on to would still be held when the next case asks for the slot.
async fn call_fresh<S>(
    base: &S,
    kept: &mut Vec<S>,
    path: &str,
) -> Result<http::Response<tonic::body::Body>, Box<dyn std::error::Error>>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>
        + Clone,
    S::Error: Into<BoxError>,
{
    let mut svc = base.clone();
    let response = tokio::time::timeout(LEAKED, async {
        let ready = svc.ready().await.map_err(Into::into)?;
        ready.call(call(path)).await.map_err(Into::into)
    })
    .await
    .map_err(|_| {
        format!("{path}: the inner service's one slot was never free again (a leaked permit)")
    })?
    .map_err(|e: BoxError| e.to_string())?;
    kept.push(svc);
    Ok(response)
}

#[tokio::test(start_paused = true)]
async fn rejected_calls_release_the_inner_services_readiness() -> TestResult {
    let store = Arc::new(MemoryStore::new());
    let one_a_minute = RateLimitLayer::new(
        "one",
        Policy::token_bucket(Quota::per_minute(1)?),
        store,
        GrpcMethod,
    );
    // The inner service admits one call at a time (its clones share the slot): a leaked readiness permit would
    // keep every later call from being ready.
    let base = ServiceBuilder::new()
        .layer(GrpcLimitLayer::new(
            MethodLimitLayer::new().method("/a.B/Limited", one_a_minute)?,
        ))
        .layer(ConcurrencyLimitLayer::new(1))
        .service_fn(|_req: http::Request<tonic::body::Body>| async {
            Ok::<_, Infallible>(http::Response::new(tonic::body::Body::empty()))
        });
    let mut kept = Vec::new();
    assert_eq!(
        status_of(&call_fresh(&base, &mut kept, "/a.B/Limited").await?),
        Code::Ok
    );
    for _ in 0..5 {
        let response = call_fresh(&base, &mut kept, "/a.B/Limited").await?;
        assert_eq!(status_of(&response), Code::ResourceExhausted);
        assert_eq!(
            response.status(),
            http::StatusCode::OK,
            "gRPC errors travel in an HTTP 200"
        );
        assert_eq!(response.headers()["content-type"], "application/grpc");
    }
    // An unlimited method still gets the inner service's one slot.
    assert_eq!(
        status_of(&call_fresh(&base, &mut kept, "/a.B/Other").await?),
        Code::Ok
    );
    Ok(())
}

/// An inner service whose readiness fails once.
#[derive(Clone)]
struct FailsReadinessOnce(bool);

impl Service<http::Request<tonic::body::Body>> for FailsReadinessOnce {
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if std::mem::replace(&mut self.0, false) {
            return Poll::Ready(Err(tonic::Status::unavailable("warming up").into()));
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(tonic::body::Body::empty())))
    }
}

#[tokio::test]
async fn a_readiness_error_becomes_the_next_calls_status() -> TestResult {
    let mut svc =
        GrpcLimitLayer::new(tower::layer::util::Identity::new()).layer(FailsReadinessOnce(true));
    // The adapter takes any request body: the one to call it with is named here.
    type Req = http::Request<tonic::body::Body>;
    let response = ServiceExt::<Req>::ready(&mut svc)
        .await?
        .call(call("/a.B/C"))
        .await?;
    let status = tonic::Status::from_header_map(response.headers()).expect("a status");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, "warming up")
    );
    assert_eq!(
        status_of(
            &ServiceExt::<Req>::ready(&mut svc)
                .await?
                .call(call("/a.B/C"))
                .await?
        ),
        Code::Ok
    );
    Ok(())
}
