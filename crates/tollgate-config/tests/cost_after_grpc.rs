//! `cost-after` in a policy file built for tonic (`tollgate_config::tonic`), over real gRPC on both stores: the
//! real cost is read from the reply's metadata (`header:`) or from the `FinalCost` extension the handler sets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tollgate_config::Source;
use tollgate_core::{MemoryStore, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::FinalCost;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

#[allow(
    dead_code,
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic
)]
mod helloworld {
    include!("../../tollgate-grpc/proto/helloworld.rs");
}

use helloworld::greeter_client::GreeterClient;
use helloworld::greeter_server::{Greeter, GreeterServer};
use helloworld::{HelloReply, HelloRequest};

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

async fn serve<St: Store>(policy: &str, store: Arc<St>) -> SocketAddr {
    let (limits, _reloader) =
        tollgate_config::tonic(Source::text(policy, "policy.toml"), store).expect("a valid policy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    let router = tonic::transport::Server::builder()
        .layer(limits)
        .add_service(GreeterServer::new(Metered));
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("the test server failed");
    });
    addr
}

fn meta<'a>(md: &'a tonic::metadata::MetadataMap, name: &str) -> &'a str {
    md.get(name)
        .unwrap_or_else(|| panic!("no {name} metadata in {md:?}"))
        .to_str()
        .expect("ASCII metadata")
}

fn call(key: &str, cost: u64) -> Request<HelloRequest> {
    let mut req = Request::new(HelloRequest {
        name: cost.to_string(),
    });
    req.metadata_mut()
        .insert("x-api-key", key.parse().expect("an ASCII key"));
    req
}

/// 10 an hour per API key: a call that turns out to cost 15 overdraws its key's bucket (1 up front, 14 after), so
/// the next waits for the debt (6 + those admitted before the charge landed tokens of 6 minutes, less what passed
/// since); without the charge it would wait one token's 6 minutes.
async fn overdrawn(source: &str, store: Arc<impl Store>) {
    let policy = format!(
        "[[limiter]]\nname = \"tokens\"\nkey = \"header:x-api-key\"\nlimit = 10\nperiod = \"1h\"\ncost-after = \"{source}\"\n"
    );
    let addr = serve(&policy, store).await;
    let mut client = GreeterClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let big = client.say_hello(call("ann", 15)).await.expect("admitted");
    // Shown with the charge taken: nothing left, the bucket full once 15 tokens of 6 minutes accrue (in
    // `ratelimit`, the one field an admitted gRPC call carries).
    assert_eq!(meta(big.metadata(), "ratelimit"), r#""tokens";r=0;t=5400"#);
    assert!(big.metadata().get("x-ratelimit-remaining").is_none());
    let mut admitted = 0;
    let mut denied = None;
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
    let retry: u64 = meta(status.metadata(), "retry-after")
        .parse()
        .expect("whole seconds");
    let expected = (6 + admitted) * 360;
    assert!(
        retry <= expected && retry + 60 >= expected,
        "retry-after {retry}, expected {expected} ({admitted} admitted before the charge landed)"
    );
}

async fn private_redis() -> (RedisServer, Arc<RedisStore>) {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .build()
        .await
        .expect("the private Redis");
    (redis, Arc::new(store))
}

#[tokio::test]
async fn metadata_in_process() {
    overdrawn("header:x-cost", Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn metadata_on_redis() {
    let (_redis, store) = private_redis().await;
    overdrawn("header:x-cost", store).await;
}

#[tokio::test]
async fn extension_in_process() {
    overdrawn("extension", Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn extension_on_redis() {
    let (_redis, store) = private_redis().await;
    overdrawn("extension", store).await;
}
