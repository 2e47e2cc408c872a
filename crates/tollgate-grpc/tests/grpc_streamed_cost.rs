//! A server stream charged as it streams, over real TCP: on a budget of 3 messages, a countdown of 10 is cut after
//! its third message with `RESOURCE_EXHAUSTED` in the trailers, and the next call is refused — on the in-process
//! store and on Redis.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::countdown::CountRequest;
use support::{countdown, serve};
use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_grpc::GrpcLimitLayer;
use tollgate_grpc::key::PeerIp;
use tollgate_grpc::stream::GrpcMessages;
use tollgate_http::stream::StreamCostLayer;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{redis_url, unique_prefix};
use tollgate_tower::stream_cost::{Exhausted, Streamed, Tokens};
use tollgate_tower::{CostAfter, RateLimitLayer};
use tonic::Code;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn a_server_stream_is_cut_at_its_budget_in_process() -> TestResult {
    cut_at_the_budget(Arc::new(MemoryStore::new())).await
}

#[tokio::test]
async fn a_server_stream_is_cut_at_its_budget_on_redis() -> TestResult {
    let url = redis_url();
    let redis = RedisStore::builder(url.as_str())
        .namespace(unique_prefix("grpc-streamed"))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {url} (REDIS_URL) is needed by this test: {e}"));
    cut_at_the_budget(Arc::new(redis)).await
}

async fn cut_at_the_budget<St: Store>(store: Arc<St>) -> TestResult {
    let streamed = Streamed::new(Tokens::Output)
        .on_exhausted(Exhausted::Cut)
        .batch(1, Duration::from_secs(60));
    let rate = RateLimitLayer::new(
        "messages",
        Policy::token_bucket(Quota::per_hour(3)?),
        store,
        PeerIp,
    )
    .cost_after(CostAfter::Streamed(streamed));
    let layers = tower::ServiceBuilder::new()
        .map_response(|r: http::Response<_>| r.map(tonic::body::Body::new))
        .layer(StreamCostLayer::new(GrpcMessages::per_message(1)))
        .layer(GrpcLimitLayer::new(rate));
    let (addr, go) = serve(layers).await;
    go.add_permits(100);
    let mut client = countdown(addr).await;

    let mut stream = client.count(CountRequest { from: 9 }).await?.into_inner();
    let mut got = Vec::new();
    let status = loop {
        match stream.message().await {
            Ok(Some(reply)) => got.push(reply.value),
            Ok(None) => panic!("the stream ended without its cut: {got:?}"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    // The reservation (1) and two more: the admission said 2 were left, so this instance knows the budget is met
    // at the third message without waiting for the store's answer to its debit.
    assert_eq!(got, [9, 8, 7], "messages before the cut");
    let next = client
        .ping(CountRequest { from: 1 })
        .await
        .expect_err("over the budget");
    assert_eq!(next.code(), Code::ResourceExhausted);
    Ok(())
}
