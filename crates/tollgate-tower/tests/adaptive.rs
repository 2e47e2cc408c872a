//! The adaptive concurrency limiter over real TCP: a full limit answers 503 with `Retry-After` while each class
//! keeps its guaranteed share, latencies are measured on the injected clock to the end of the response, permits
//! return on disconnect, cancellation and panic; on tonic, `UNAVAILABLE` with `RetryInfo`.

mod support;

#[path = "../../tollgate-grpc/tests/support/mod.rs"]
mod grpc;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::FutureExt as _;
use tollgate_core::{ManualClock, Timestamp};
use tollgate_grpc::GrpcLimitLayer;
use tollgate_http::HttpLimitLayer;
use tollgate_http::priority::HeaderPriority;
use tollgate_tower::StackLayer;
use tollgate_tower::limit::adaptive::{AdaptiveLimitLayer, Control};
use tollgate_tower::{BoxError, Priority};
use tonic::Code;
use tonic_types::StatusExt;
use tower::{Service, ServiceExt};

use support::{Gate, app, get, open, serve, try_open};

/// A limit pinned at `limit` (minimum = maximum), so that what is asserted is the admission, not the algorithm.
fn pinned(limit: u64) -> AdaptiveLimitLayer<HeaderPriority> {
    let g = Control::gradient2()
        .min_limit(limit)
        .initial_limit(limit)
        .max_limit(limit);
    AdaptiveLimitLayer::new(g, HeaderPriority::new()).unwrap()
}

/// Waits (bounded) until `done` holds: for what the server does after the client has its answer.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{what} never happened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_limit_sheds_and_every_class_keeps_its_guaranteed_share() {
    // Limit 10; default shares: Critical 50 % (5), High 20 % (2), Normal 20 % (2), Low 10 % (1).
    let layer = pinned(10);
    let probe = layer.clone();
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(layer)))).await;
    let hold = |priority: &'static str| {
        tokio::spawn(async move { get(addr, "/hold", &[("x-priority", priority)]).await })
    };
    // Low borrows the whole limit while nobody else wants it.
    let mut held: Vec<_> = (0..10).map(|_| hold("low")).collect();
    gate.wait_entered(10).await;
    assert_eq!(probe.in_flight_of(Priority::Low), 10);

    let shed = get(addr, "/fast", &[("x-priority", "low")]).await;
    assert_eq!(shed.status, 503);
    assert!(shed.body.contains(r#""kind":"shed""#), "{}", shed.body);
    assert!(shed.body.contains("adaptive"), "{}", shed.body);
    assert_eq!(shed.header("retry-after"), "1");

    // The limit is full, but Critical holds none of its 5 and Normal none of its 2.
    held.extend((0..5).map(|_| hold("critical")));
    held.extend((0..2).map(|_| hold("normal")));
    gate.wait_entered(17).await;
    for priority in ["critical", "normal", "high"] {
        let reply = get(addr, "/fast", &[("x-priority", priority)]).await;
        let expected = if priority == "high" { 200 } else { 503 };
        assert_eq!(reply.status, expected, "{priority} beyond its share");
    }
    assert_eq!(probe.in_flight(), 17);

    gate.release(17);
    for task in held {
        assert_eq!(task.await.unwrap().status, 200);
    }
    until("every permit back", || probe.in_flight() == 0).await;
    assert_eq!(
        get(addr, "/fast", &[("x-priority", "low")]).await.status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_is_measured_on_the_clock_to_the_end_of_the_response() {
    let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
    // One request per window: the baseline after one request is its latency.
    let g = Control::gradient2()
        .window(Duration::ZERO)
        .window_samples(1);
    let layer = AdaptiveLimitLayer::new(g, HeaderPriority::new())
        .unwrap()
        .clock(clock.clone());
    let probe = layer.clone();
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(layer)))).await;

    let held = tokio::spawn(async move { get(addr, "/hold", &[]).await });
    gate.wait_entered(1).await;
    clock.advance(Duration::from_millis(30));
    gate.release(1);
    assert_eq!(held.await.unwrap().status, 200);
    until("the sample", || probe.in_flight() == 0).await;
    assert_eq!(probe.long_latency(), Duration::from_millis(30));

    // A streaming body holds its slot until it is dropped (its latency is then a sample too).
    let streaming = open(addr, "GET", "/stream", &[]).await;
    assert_eq!(streaming.status(), 200);
    assert_eq!(probe.in_flight(), 1);
    clock.advance(Duration::from_millis(30));
    drop(streaming);
    until("the stream's slot back", || probe.in_flight() == 0).await;
    assert_eq!(probe.long_latency(), Duration::from_millis(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_return_on_disconnect_cancellation_and_panic() -> Result<(), BoxError> {
    let layer = pinned(1);
    let probe = layer.clone();
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(layer.clone())))).await;

    // A client that goes away while its request is held: hyper drops the handler, the slot comes back.
    let client = tokio::spawn(async move { get(addr, "/hold", &[]).await });
    gate.wait_entered(1).await;
    assert_eq!(get(addr, "/fast", &[]).await.status, 503);
    client.abort();
    until("the disconnected request's slot back", || {
        probe.in_flight() == 0
    })
    .await;

    // A panicking handler: unwinding drops the permit.
    assert!(try_open(addr, "GET", "/panic", &[]).await.is_err());
    until("the panicked request's slot back", || {
        probe.in_flight() == 0
    })
    .await;
    assert_eq!(get(addr, "/fast", &[]).await.status, 200);

    // A call future dropped before it finished, without a server in between.
    let never = Arc::new(tokio::sync::Notify::new());
    let mut svc = tower::ServiceBuilder::new()
        .layer(HttpLimitLayer::new(layer))
        .service_fn(move |_req: http::Request<axum::body::Body>| {
            let never = never.clone();
            async move {
                never.notified().await; // nobody notifies: only cancellation ends it
                Ok::<_, BoxError>(http::Response::new(axum::body::Body::empty()))
            }
        });
    let pending = svc
        .ready()
        .await?
        .call(http::Request::new(axum::body::Body::empty()));
    let mut pending = Box::pin(pending);
    assert!((&mut pending).now_or_never().is_none());
    assert_eq!(probe.in_flight(), 1);
    drop(pending);
    assert_eq!(probe.in_flight(), 0, "the cancelled call released it");
    assert_eq!(gate.entered.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_the_stack_on_tonic_a_full_limit_is_unavailable_with_retry_info() {
    let by_metadata = |req: &http::Request<tonic::body::Body>| {
        req.headers()
            .get("x-priority")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(Priority::Normal)
    };
    let aimd = Control::aimd().min_limit(1).initial_limit(1).max_limit(1);
    // Everything guaranteed to Critical: Normal only borrows.
    let adaptive = AdaptiveLimitLayer::new(aimd, by_metadata)
        .unwrap()
        .shares(0, 0, 0, 100)
        .unwrap();
    let probe = adaptive.clone();
    let stack = StackLayer::new().adaptive_limit(adaptive);
    let (addr, go) = grpc::serve(GrpcLimitLayer::new(stack)).await;
    let mut client = grpc::countdown(addr).await;

    // An open stream holds the one slot until it ends.
    let mut stream = client
        .count(tonic::Request::new(grpc::countdown::CountRequest {
            from: 1,
        }))
        .await
        .unwrap()
        .into_inner();
    go.add_permits(1);
    assert_eq!(stream.message().await.unwrap().unwrap().value, 1);

    let shed = client
        .ping(tonic::Request::new(grpc::countdown::CountRequest {
            from: 7,
        }))
        .await
        .unwrap_err();
    assert_eq!(shed.code(), Code::Unavailable, "{shed:?}");
    assert_eq!(shed.get_details_error_info().unwrap().reason, "LOAD_SHED");
    assert_eq!(
        shed.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(1))
    );
    let mut critical = tonic::Request::new(grpc::countdown::CountRequest { from: 7 });
    critical
        .metadata_mut()
        .insert("x-priority", "critical".parse().unwrap());
    assert_eq!(client.ping(critical).await.unwrap().into_inner().value, 7);

    go.add_permits(1);
    assert_eq!(stream.message().await.unwrap().unwrap().value, 0);
    assert!(stream.message().await.unwrap().is_none());
    grpc::eventually("the stream's slot back", || probe.in_flight() == 0).await;
    let ping = tonic::Request::new(grpc::countdown::CountRequest { from: 9 });
    assert_eq!(client.ping(ping).await.unwrap().into_inner().value, 9);
}
