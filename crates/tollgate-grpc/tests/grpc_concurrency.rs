//! The concurrent-requests limiter behind the gRPC adapter, over real TCP: a server stream holds its
//! permit until it ends or the client drops it; meanwhile the client's next call gets `RESOURCE_EXHAUSTED`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::countdown::CountRequest;
use support::{countdown, meta, serve};
use tollgate_core::slot::{MemorySlotStore, SlotStore};
use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_grpc::GrpcLimitLayer;
use tollgate_grpc::key::PeerIp;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{redis_url, unique_prefix};
use tollgate_tower::RateLimitLayer;
use tollgate_tower::{ConcurrencyLimitLayer, StackLayer};
use tonic::Code;
use tonic_types::StatusExt;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn a_server_stream_holds_its_in_process_permit_until_it_ends_or_is_dropped() -> TestResult {
    stream_holds_its_permit(Arc::new(MemorySlotStore::new())).await
}

#[tokio::test]
async fn a_server_stream_holds_its_redis_lease_until_it_ends_or_is_dropped() -> TestResult {
    let url = redis_url();
    // A healthy server: a generous timeout (the production 50 ms is a race on a loaded machine).
    let redis = RedisStore::builder(url.as_str())
        .namespace(unique_prefix("grpc-leases"))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {url} (REDIS_URL) is needed by this test: {e}"));
    stream_holds_its_permit(Arc::new(redis)).await
}

async fn stream_holds_its_permit<L: SlotStore>(leases: Arc<L>) -> TestResult {
    let rate = RateLimitLayer::new(
        "per-peer",
        Policy::token_bucket(Quota::per_minute(100)?),
        Arc::new(MemoryStore::new()),
        PeerIp,
    );
    let in_flight = ConcurrencyLimitLayer::new("in-flight", 1, leases, PeerIp)?;
    let stack = StackLayer::new()
        .rate_limit(rate)
        .concurrency_limit(in_flight);
    let (addr, go) = serve(GrpcLimitLayer::new(stack)).await;
    let mut client = countdown(addr).await;

    let mut stream = client.count(CountRequest { from: 1 }).await?.into_inner();
    go.add_permits(1);
    assert_eq!(stream.message().await?.map(|r| r.value), Some(1));

    // The stream is still open: its permit is held, so the next call is turned away at once.
    let status = client
        .ping(CountRequest { from: 9 })
        .await
        .expect_err("one call in flight at a time");
    assert_eq!(status.code(), Code::ResourceExhausted);
    let info = status
        .get_details_error_info()
        .expect("an ErrorInfo detail");
    assert_eq!(
        (info.reason.as_str(), info.metadata["limiter"].as_str()),
        ("CONCURRENCY_LIMIT_EXCEEDED", "in-flight")
    );
    assert!(
        status
            .get_details_retry_info()
            .and_then(|r| r.retry_delay)
            .is_some(),
        "a RetryInfo detail"
    );
    assert!(meta(status.metadata(), "retry-after").parse::<u64>()? >= 1);

    // The stream ends: the permit comes back.
    go.add_permits(1);
    assert_eq!(stream.message().await?.map(|r| r.value), Some(0));
    assert_eq!(stream.message().await?, None);
    assert_eq!(wait_until_admitted(&mut client).await?, 9);

    // A stream the client drops halfway gives its permit back too.
    let mut stream = client.count(CountRequest { from: 3 }).await?.into_inner();
    go.add_permits(1);
    assert_eq!(stream.message().await?.map(|r| r.value), Some(3));
    assert_eq!(
        client
            .ping(CountRequest { from: 9 })
            .await
            .expect_err("held")
            .code(),
        Code::ResourceExhausted
    );
    drop(stream);
    assert_eq!(wait_until_admitted(&mut client).await?, 9);
    Ok(())
}

/// Pings until one is admitted: the server drops a finished or cancelled stream's body (and its permit) shortly
/// after the client has seen the end, so the first ping may still meet the permit. Bounded.
async fn wait_until_admitted(
    client: &mut support::countdown::countdown_client::CountdownClient<tonic::transport::Channel>,
) -> Result<u32, Box<dyn std::error::Error>> {
    for _ in 0..200 {
        match client.ping(CountRequest { from: 9 }).await {
            Ok(reply) => return Ok(reply.into_inner().value),
            Err(status) if status.code() == Code::ResourceExhausted => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(status) => return Err(status.into()),
        }
    }
    Err("the permit was never given back".into())
}
