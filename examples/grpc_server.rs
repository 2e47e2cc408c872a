//! The canonical gRPC Greeter behind tollgate: a demo and a black-box test target for any gRPC client.
//!
//! ```text
//! cargo run --example grpc_server -- --limit 3 --period 10s
//! cargo run --example grpc_client -- --count 5
//! cargo run --example grpc_server -- --metrics-addr 127.0.0.1:9091   # then: curl 127.0.0.1:9091/metrics
//! ```
//!
//! `/helloworld.Greeter/SayHello` is limited per client: the peer's IP address, or with `--api-key-header NAME`
//! the (hashed) value of that metadata entry. A rejected call gets `RESOURCE_EXHAUSTED` (or `UNAVAILABLE` when
//! Redis fails and `--on-store-error closed`), a `google.rpc.RetryInfo` detail and rate-limit metadata. Without
//! `--redis-url` the limit holds per instance; with it, for every instance sharing the Redis.

#[path = "common/flags.rs"]
mod flags;
#[path = "common/observe.rs"]
mod observe;
#[path = "common/policy_file.rs"]
mod policy_file;

use std::sync::Arc;

use tollgate_core::{Policy, Store};
use tollgate_grpc::key::{MetadataKey, PeerIp};
use tollgate_grpc::{GrpcLimitLayer, MethodLimitLayer};
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
  --redis-url URL               share the limit through Redis: redis:// or rediss:// (TLS), user:pass@ allowed
                                (default: in-process store)
  --on-store-error POLICY       open | closed | local: when Redis fails (default closed)
  --max-keys N                  keys the in-process store tracks; a new key past them evicts the least
                                recently used (default 1048576)
  --deny-cache on|off           with --redis-url: refuse a denied client locally until Redis's own retry
                                instant (exact: Redis would refuse it too) instead of asking Redis again
                                (default on)
  --leases                      admit hot clients from batches of tokens leased from the store (exact: the
                                fleet never admits more than the plain path; cold clients keep it)
  --lease-share PERCENT         with --leases: the largest batch, as a share of the burst (default 10)
  --api-key-header NAME         key clients by this metadata entry, hashed (default: the peer IP)
{CONFIG}
  -h, --help                    this text

service: helloworld.Greeter/SayHello, limited per client";

#[derive(Debug)]
struct Config {
    server: flags::ServerFlags,
    /// `--config FILE`: the limits from a policy file.
    policy_file: Option<std::path::PathBuf>,
    observe: flags::ObserveFlags,
    api_key_header: Option<MetadataKey>,
}

impl Config {
    fn parse(args: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let mut config = Self {
            observe: flags::ObserveFlags::default(),
            server: flags::ServerFlags::new(50051),
            policy_file: None,
            api_key_header: None,
        };
        let mut flags = flags::Flags::new(args);
        while let Some(flag) = flags.next_flag() {
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--config" => config.policy_file = Some(flags.value()?.into()),
                "--api-key-header" => {
                    let header = flags
                        .parsed(|v| MetadataKey::metadata(v).map_err(|e| format!("{v:?}: {e}")))?;
                    config.api_key_header = Some(header);
                }
                other if config.server.take(other, &mut flags)? => {}
                other if config.observe.take(other, &mut flags)? => {}
                other => return Err(format!("unknown argument {other:?} (try --help)")),
            }
        }
        config.server.check_leases()?;
        Ok(Some(config))
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

async fn serve<St: Store>(
    config: &Config,
    policy: Policy,
    store: Arc<St>,
    metrics: Option<(
        std::net::SocketAddr,
        metrics_exporter_prometheus::PrometheusHandle,
    )>,
) -> Result<(), String> {
    if let Some(path) = &config.policy_file {
        return serve_from_file(config, path, store, metrics).await;
    }
    let key = config
        .api_key_header
        .clone()
        .map_or(ClientKey::Peer, ClientKey::ApiKey);
    let say_hello = config
        .server
        .rate_limit(RateLimitLayer::new("say-hello", policy, store, key));
    let layer = GrpcLimitLayer::new(
        MethodLimitLayer::new()
            .method("/helloworld.Greeter/SayHello", say_hello)
            .map_err(|e| e.to_string())?,
    );
    let listener = tokio::net::TcpListener::bind(config.server.addr)
        .await
        .map_err(|e| format!("--addr {}: {e}", config.server.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!(
        "listening on {addr}  (SayHello: {} {} per {:?}, burst {}, store {}, on store error {}, deny cache {}, leases {}, key {})",
        policy.algorithm(),
        policy.quota().limit(),
        policy.quota().period(),
        policy.quota().burst(),
        config.server.store_name(),
        config.server.on_store_error,
        config.server.deny_cache_label(),
        config.server.leases_label(),
        config
            .api_key_header
            .as_ref()
            .map_or("peer ip", |k| k.name()),
    );
    if let Some((addr, handle)) = metrics {
        let bound = observe::serve_metrics(addr, handle).await?;
        println!("metrics on http://{bound}/metrics");
    }
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(GreeterServer::new(Hello))
        // SIGTERM or SIGINT: stop serving, then give the leased batches back.
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            flags::stop_signal(),
        )
        .await
        .map_err(|e| e.to_string())?;
    flags::shutdown().await;
    Ok(())
}

/// The service behind a policy file's limits (`--config`), which `SIGHUP` reloads.
async fn serve_from_file<St: Store>(
    config: &Config,
    path: &std::path::Path,
    store: Arc<St>,
    metrics: Option<(
        std::net::SocketAddr,
        metrics_exporter_prometheus::PrometheusHandle,
    )>,
) -> Result<(), String> {
    let (layer, reloader) = tollgate_config::tonic(tollgate_config::Source::file(path), store)
        .map_err(|e| e.to_string())?;
    let names = tollgate_config::PolicyFile::load(path)
        .map(|file| file.limiters().collect::<Vec<_>>().join(", "))
        .map_err(|e| e.to_string())?;
    policy_file::reload_on_sighup(reloader)?;
    let listener = tokio::net::TcpListener::bind(config.server.addr)
        .await
        .map_err(|e| format!("--addr {}: {e}", config.server.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!(
        "listening on {addr}  (policy file {}: {names}; store {}; SIGHUP reloads it)",
        path.display(),
        config.server.store_name()
    );
    if let Some((addr, handle)) = metrics {
        let bound = observe::serve_metrics(addr, handle).await?;
        println!("metrics on http://{bound}/metrics");
    }
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(GreeterServer::new(Hello))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            flags::stop_signal(),
        )
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
        println!(
            "{}\n\nRedis connection:\n{}\n\nobservability:\n{}",
            USAGE.replace("{CONFIG}", policy_file::USAGE),
            flags::REDIS_USAGE,
            flags::ObserveFlags::USAGE
        );
        return Ok(());
    };
    let policy = config.server.policy()?;
    // Before any store or layer is built: they register their metrics once.
    let metrics = observe::install(&config.observe)?;
    match config
        .server
        .redis_store("tollgate-grpc-server", &policy)
        .await?
    {
        None => {
            let store = config.server.memory_store("say-hello");
            serve(&config, policy, Arc::new(store), metrics).await
        }
        Some(store) => serve(&config, policy, Arc::new(store), metrics).await,
    }
}
