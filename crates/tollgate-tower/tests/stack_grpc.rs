//! The whole stack on a tonic server over real TCP (the gRPC crate's test services): a server-streaming call holds
//! its concurrency lease until the stream ends (`RESOURCE_EXHAUSTED` meanwhile), the fleet shedder answers
//! `UNAVAILABLE` to non-critical calls while critical ones pass, each with a `RetryInfo` detail.

#[path = "../../tollgate-grpc/tests/support/mod.rs"]
mod grpc;

use std::time::Duration;

use tollgate_core::{Policy, Quota};
use tollgate_grpc::GrpcLimitLayer;
use tollgate_grpc::key::MetadataKey;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{redis_url, unique_prefix};
use tollgate_tower::{ConcurrencyLimitLayer, FleetShedLayer, StackLayer, WorkerShedLayer};
use tollgate_tower::{Priority, RateLimitLayer};
use tonic::Code;
use tonic_types::StatusExt;

use grpc::countdown::CountRequest;

/// `x-priority` metadata names the class; anything else is `Normal`.
fn by_metadata<B>(req: &http::Request<B>) -> Priority {
    req.headers()
        .get("x-priority")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(Priority::Normal)
}

fn call(from: u32, client: &str, priority: Option<&str>) -> tonic::Request<CountRequest> {
    let mut req = tonic::Request::new(CountRequest { from });
    req.metadata_mut()
        .insert("x-client", client.parse().unwrap());
    if let Some(p) = priority {
        req.metadata_mut().insert("x-priority", p.parse().unwrap());
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_on_a_tonic_server() {
    let store = std::sync::Arc::new(
        RedisStore::builder(redis_url())
            .namespace(unique_prefix("stack-grpc"))
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap(),
    );
    let client_key = || MetadataKey::metadata("x-client").unwrap();
    let stack = StackLayer::new()
        .worker_shedder(WorkerShedLayer::new(100, by_metadata).unwrap())
        .rate_limit(RateLimitLayer::new(
            "per-client",
            Policy::token_bucket(Quota::per_hour(100).unwrap()),
            store.clone(),
            client_key(),
        ))
        .concurrency_limit(
            ConcurrencyLimitLayer::new("in-flight", 1, store.clone(), client_key()).unwrap(),
        )
        // Fleet capacity 2, half reserved: one non-critical call at a time.
        .fleet_shedder(
            FleetShedLayer::new(2, store.clone(), by_metadata)
                .unwrap()
                .reserve_percent(50)
                .unwrap(),
        );
    let (addr, go) =
        grpc::serve(GrpcLimitLayer::new(stack).headers(tollgate_http::HeaderSet::ALL)).await;
    let mut client = grpc::countdown(addr).await;

    // Ann's stream is open: it holds her concurrency lease and the fleet's one non-critical slot.
    let mut stream = client
        .count(call(1, "ann", None))
        .await
        .unwrap()
        .into_inner();
    go.add_permits(1);
    assert_eq!(stream.message().await.unwrap().unwrap().value, 1);

    let busy = client.ping(call(7, "ann", None)).await.unwrap_err();
    assert_eq!(busy.code(), Code::ResourceExhausted, "{busy:?}");
    assert_eq!(
        busy.get_details_error_info().unwrap().reason,
        "CONCURRENCY_LIMIT_EXCEEDED"
    );
    assert_eq!(
        busy.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(1))
    );

    let shed = client.ping(call(7, "bob", Some("high"))).await.unwrap_err();
    assert_eq!(shed.code(), Code::Unavailable, "{shed:?}");
    assert_eq!(shed.get_details_error_info().unwrap().reason, "LOAD_SHED");
    assert!(shed.get_details_retry_info().is_some());
    let critical = client.ping(call(7, "bob", Some("critical"))).await.unwrap();
    assert_eq!(
        critical.into_inner().value,
        7,
        "critical calls use the reserve"
    );
    assert!(
        critical_metadata_has_rate_fields(
            &client
                .ping(call(8, "carl", Some("critical")))
                .await
                .unwrap()
        ),
        "admitted calls carry the rate-limit metadata"
    );

    // The stream ends: its leases go back.
    go.add_permits(1);
    assert_eq!(stream.message().await.unwrap().unwrap().value, 0);
    assert!(stream.message().await.unwrap().is_none());
    let mut admitted = None;
    for _ in 0..500 {
        match client.ping(call(9, "ann", None)).await {
            Ok(reply) => {
                admitted = Some(reply.into_inner().value);
                break;
            }
            Err(status) => assert!(
                matches!(status.code(), Code::ResourceExhausted | Code::Unavailable),
                "{status:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        admitted,
        Some(9),
        "ann's lease came back when her stream ended"
    );
}

fn critical_metadata_has_rate_fields(reply: &tonic::Response<grpc::countdown::CountReply>) -> bool {
    grpc::meta(reply.metadata(), "ratelimit-policy")
        == r#""per-client";q=100;w=3600, "in-flight";q=1;qu="concurrent-requests""#
}
