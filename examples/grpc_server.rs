//! The canonical gRPC Greeter behind tollgate: a demo and a black-box test target for any gRPC client.
//!
//! ```text
//! cargo run --example grpc_server -- --limit 3 --period 10s
//! cargo run --example grpc_client -- --count 5
//! ```
//!
//! `/helloworld.Greeter/SayHello` is limited per client: the peer's IP address, or with `--api-key-header NAME`
//! the (hashed) value of that metadata entry. A rejected call gets `RESOURCE_EXHAUSTED` (or `UNAVAILABLE` when
//! Redis fails and `--on-store-error closed`), a `google.rpc.RetryInfo` detail and rate-limit metadata. Without
//! `--redis-url` the limit holds per instance; with it, for every instance sharing the Redis.

#[path = "common/flags.rs"]
mod flags;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, MemoryStore, Policy, Store};
use tollgate_grpc::key::{MetadataKey, PeerIp};
use tollgate_grpc::{GrpcLimitLayer, MethodLimitLayer};
use tollgate_redis::RedisStore;
use tollgate_tower::{KeyError, KeyExtractor, RateLimitLayer};
use tonic::{Request, Response, Status};

/// The code generated from `crates/tollgate-grpc/proto/helloworld.proto` (see `proto/check.sh` there).
#[allow(unreachable_pub)]
mod helloworld {
    include!("../crates/tollgate-grpc/proto/helloworld.rs");
}

use helloworld::greeter_server::{Greeter, GreeterServer};
use helloworld::{HelloReply, HelloRequest};

const USAGE: &str = "\
usage: grpc_server [options]

  --addr HOST:PORT              listen address (default 127.0.0.1:50051)
  --limit N                     SayHello calls per period per client (default 10)
  --period DUR                  the period: 500ms, 1s, 10s, 5m, 1h (default 1s)
  --burst N                     token bucket size (default: the limit; token bucket only)
  --algorithm ALG               token-bucket | sliding-window (default token-bucket)
  --redis-url URL               share the limit through Redis (default: in-process store)
  --on-store-error POLICY       open | closed | local: when Redis fails (default closed)
  --api-key-header NAME         key clients by this metadata entry, hashed (default: the peer IP)
  -h, --help                    this text

service: helloworld.Greeter/SayHello, limited per client";

#[derive(Debug)]
struct Config {
    addr: SocketAddr,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
    algorithm: Algorithm,
    redis_url: Option<String>,
    on_store_error: FailurePolicy,
    api_key_header: Option<MetadataKey>,
}

impl Config {
    fn parse(args: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let mut config = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
            limit: 10,
            period: Duration::from_secs(1),
            burst: None,
            algorithm: Algorithm::TokenBucket,
            redis_url: None,
            on_store_error: FailurePolicy::Closed,
            api_key_header: None,
        };
        let mut flags = flags::Flags::new(args);
        while let Some(flag) = flags.next_flag() {
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--addr" => {
                    config.addr = flags.parsed(|v| {
                        v.parse()
                            .map_err(|_| format!("{v:?}: expected HOST:PORT, e.g. 127.0.0.1:50051"))
                    })?;
                }
                "--limit" => config.limit = flags.parsed(flags::positive)?,
                "--period" => config.period = flags.parsed(flags::duration)?,
                "--burst" => config.burst = Some(flags.parsed(flags::positive)?),
                "--algorithm" => config.algorithm = flags.parsed(flags::algorithm)?,
                "--redis-url" => config.redis_url = Some(flags.value()?),
                "--on-store-error" => {
                    config.on_store_error =
                        flags.parsed(|v| v.parse().map_err(|e| format!("{e}")))?;
                }
                "--api-key-header" => {
                    let header =
                        flags.parsed(|v| MetadataKey::new(v).map_err(|e| format!("{v:?}: {e}")))?;
                    config.api_key_header = Some(header);
                }
                other => return Err(format!("unknown argument {other:?} (try --help)")),
            }
        }
        Ok(Some(config))
    }

    fn policy(&self) -> Result<Policy, String> {
        flags::policy(self.algorithm, self.limit, self.period, self.burst)
    }
}

/// The peer IP, or an API key from metadata: one key type for the layer whichever was chosen.
#[derive(Clone)]
enum ClientKey {
    Peer,
    ApiKey(MetadataKey),
}

impl<B> KeyExtractor<http::Request<B>> for ClientKey {
    fn extract(&self, req: &http::Request<B>, key: &mut String) -> Result<(), KeyError> {
        match self {
            Self::Peer => PeerIp.extract(req, key),
            Self::ApiKey(metadata) => metadata.extract(req, key),
        }
    }
}

struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        Ok(Response::new(HelloReply {
            message: format!("Hello {}!", req.into_inner().name),
        }))
    }
}

async fn serve<St: Store>(config: &Config, policy: Policy, store: Arc<St>) -> Result<(), String> {
    let key = config
        .api_key_header
        .clone()
        .map_or(ClientKey::Peer, ClientKey::ApiKey);
    let say_hello =
        RateLimitLayer::new("say-hello", policy, store, key).on_store_error(config.on_store_error);
    let layer = GrpcLimitLayer::new(
        MethodLimitLayer::new()
            .method("/helloworld.Greeter/SayHello", say_hello)
            .map_err(|e| e.to_string())?,
    );
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("--addr {}: {e}", config.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!(
        "listening on {addr}  (SayHello: {} {} per {:?}, burst {}, store {}, on store error {}, key {})",
        policy.algorithm(),
        policy.quota().limit(),
        policy.quota().period(),
        policy.quota().burst(),
        config.redis_url.as_deref().unwrap_or("in-process"),
        config.on_store_error,
        config
            .api_key_header
            .as_ref()
            .map_or("peer ip", |k| k.name()),
    );
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(GreeterServer::new(Hello))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
        .await
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("grpc_server: {err}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let Some(config) = Config::parse(std::env::args().skip(1))? else {
        println!("{USAGE}");
        return Ok(());
    };
    let policy = config.policy()?;
    match &config.redis_url {
        None => serve(&config, policy, Arc::new(MemoryStore::new())).await,
        Some(url) => {
            let store = RedisStore::builder(url.clone())
                .namespace("tollgate-grpc-server")
                .build()
                .await
                .map_err(|e| format!("--redis-url {url:?}: {e}"))?;
            if let Err(e) = store.try_check("startup-probe", &policy, 0).await {
                eprintln!(
                    "warning: Redis at {url} is not answering ({e}); --on-store-error {} applies",
                    config.on_store_error
                );
            }
            // Without a store failure policy, Redis errors reach the layer: `--on-store-error` answers them.
            serve(&config, policy, Arc::new(store)).await
        }
    }
}
