//! A cost charged after the response through the gRPC adapter, over real TCP with a tonic client, on both stores:
//! a limiter on its own and a limiter in a `RateLimitSet` (what a policy file builds), reading the real cost from
//! the reply's metadata or from the `FinalCost` extension the handler sets.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use support::helloworld::greeter_server::{Greeter, GreeterServer};
use support::helloworld::{HelloReply, HelloRequest};
use support::{greeter, hello, meta, with_api_key};
use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_grpc::GrpcLimitLayer;
use tollgate_grpc::key::MetadataKey;
use tollgate_http::HeaderSet;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{redis_url, unique_prefix};
use tollgate_tower::limit::rate::RateLimitSetLayer;
use tollgate_tower::{CostAfter, FinalCost, RateLimitLayer};
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

/// Greets, stating the call's real cost — the number in the request's name — in the reply's `x-cost` metadata
/// and in its `FinalCost` extension.
struct Metered;

#[tonic::async_trait]
impl Greeter for Metered {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let cost: u64 = req.into_inner().name.parse().expect("a number");
        let mut reply = Response::new(HelloReply {
            message: "metered".into(),
        });
        reply
            .metadata_mut()
            .insert("x-cost", cost.to_string().parse().expect("ASCII"));
        reply.extensions_mut().insert(FinalCost(cost));
        Ok(reply)
    }
}

async fn serve<L>(layer: L) -> SocketAddr
where
    L: tower_layer::Layer<tonic::service::Routes> + Clone + Send + Sync + 'static,
    L::Service: tower_service::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        > + Clone
        + Send
        + 'static,
    <L::Service as tower_service::Service<http::Request<tonic::body::Body>>>::Future:
        Send + 'static,
    <L::Service as tower_service::Service<http::Request<tonic::body::Body>>>::Error:
        Into<tollgate_tower::BoxError> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("the bound address");
    let router = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(GreeterServer::new(Metered));
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("the test server failed");
    });
    addr
}

/// 10 an hour per API key: a call that turns out to cost 15 overdraws its key's bucket (1 up front, 14 after),
/// and the next waits for the debt; calls that cost 0 are refunded.
async fn charged_and_refunded(addr: SocketAddr) {
    let mut client = greeter(addr).await;
    let call = |key: &str, cost: u64| with_api_key(hello(&cost.to_string()), key);
    let big = client.say_hello(call("ann", 15)).await.expect("admitted");
    // Shown with the charge taken: nothing left, the bucket full once 15 tokens of 6 minutes accrue.
    assert_eq!(meta(big.metadata(), "x-ratelimit-remaining"), "0");
    assert_eq!(meta(big.metadata(), "ratelimit"), r#""tokens";r=0;t=5400"#);
    // A shared store charges in a task after the response: calls of cost 1 until it landed, bounded.
    let mut denied = None;
    let mut admitted = 0;
    for _ in 0..300 {
        match client.say_hello(call("ann", 1)).await {
            Ok(_) => admitted += 1,
            Err(status) => {
                denied = Some(status);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = denied.expect("denied once the charge landed");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(meta(status.metadata(), "x-ratelimit-remaining"), "0");
    // 5 + `admitted` owed and 1 for this call, 6 minutes a token (less what passed since: under a minute);
    // without the charge, one token's 6 minutes.
    let retry = meta(status.metadata(), "retry-after")
        .parse::<u64>()
        .expect("whole seconds");
    let expected = (6 + admitted) * 360;
    assert!(
        retry <= expected && retry + 60 >= expected,
        "retry-after {retry}, expected {expected} ({admitted} admitted before the charge landed)"
    );
    // Refunds: once the first call's refund landed, the next finds bob's bucket full again (without them the
    // remaining count would only fall).
    let first = client.say_hello(call("bob", 0)).await.expect("admitted");
    assert_eq!(meta(first.metadata(), "x-ratelimit-remaining"), "9");
    for _ in 0..300 {
        let reply = client.say_hello(call("bob", 0)).await.expect("admitted");
        if meta(reply.metadata(), "x-ratelimit-remaining") == "9" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("bob was never refunded");
}

fn limiter<St: Store>(store: Arc<St>, source: CostAfter) -> RateLimitLayer<MetadataKey, St> {
    let policy = Policy::token_bucket(Quota::per_hour(10).unwrap());
    RateLimitLayer::new(
        "tokens",
        policy,
        store,
        MetadataKey::metadata("x-api-key").unwrap(),
    )
    .cost_after(source)
}

async fn alone<St: Store>(store: Arc<St>, source: CostAfter) {
    charged_and_refunded(
        serve(GrpcLimitLayer::new(limiter(store, source)).headers(HeaderSet::ALL)).await,
    )
    .await;
}

async fn in_a_set<St: Store>(store: Arc<St>, source: CostAfter) {
    let layer = limiter(store, source);
    let set = RateLimitSetLayer::new([(layer.clone(), true)]);
    charged_and_refunded(serve(GrpcLimitLayer::new(set).headers(HeaderSet::ALL)).await).await;
}

async fn redis(test: &str) -> Arc<RedisStore> {
    let url = redis_url();
    let store = RedisStore::builder(url.as_str())
        .namespace(unique_prefix(test))
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {url} (REDIS_URL) is needed by this test: {e}"));
    Arc::new(store)
}

fn header() -> CostAfter {
    CostAfter::Header("x-cost".into())
}

#[tokio::test]
async fn metadata_alone_in_process() {
    alone(Arc::new(MemoryStore::new()), header()).await;
}

#[tokio::test]
async fn metadata_alone_on_redis() {
    alone(redis("grpc-cost-alone").await, header()).await;
}

#[tokio::test]
async fn extension_alone_in_process() {
    alone(Arc::new(MemoryStore::new()), CostAfter::Extension).await;
}

#[tokio::test]
async fn extension_in_a_set_on_redis() {
    in_a_set(redis("grpc-cost-set-ext").await, CostAfter::Extension).await;
}

#[tokio::test]
async fn metadata_in_a_set_in_process() {
    in_a_set(Arc::new(MemoryStore::new()), header()).await;
}

#[tokio::test]
async fn metadata_in_a_set_on_redis() {
    in_a_set(redis("grpc-cost-set").await, header()).await;
}
