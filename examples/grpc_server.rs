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

#[path = "common/cli.rs"]
mod cli;
#[path = "common/observe.rs"]
mod observe;
#[path = "common/policy_file.rs"]
mod policy_file;
#[path = "common/server.rs"]
mod server;

use std::sync::Arc;

use tollgate::grpc::key::{MetadataKey, PeerIp};
use tollgate::grpc::{GrpcLimitLayer, MethodLimitLayer};
use tollgate::tower::{KeyError, KeyExtractor, RateLimitLayer};
use tollgate::{Policy, Store};
use tonic::{Request, Response, Status};

/// The code generated from `crates/tollgate-grpc/proto/helloworld.proto` (see `proto/check.sh` there).
#[allow(unreachable_pub)]
mod helloworld {
    include!("../crates/tollgate-grpc/proto/helloworld.rs");
}

use helloworld::greeter_server::{Greeter, GreeterServer};
use helloworld::{HelloReply, HelloRequest};

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "grpc_server",
    about = "The gRPC Greeter behind tollgate: helloworld.Greeter/SayHello limited per client"
)]
struct Config {
    /// Listen address
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50051")]
    addr: std::net::SocketAddr,

    /// Key clients by this metadata entry, hashed [default: the peer IP]
    #[arg(long, value_name = "NAME", value_parser = api_key_header)]
    api_key_header: Option<MetadataKey>,

    #[command(flatten)]
    server: server::ServerArgs,
}

/// `--api-key-header`: a metadata name.
fn api_key_header(v: &str) -> Result<MetadataKey, String> {
    MetadataKey::metadata(v).map_err(|e| e.to_string())
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
    if let Some(path) = &config.server.config {
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
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("--addr {}: {e}", config.addr))?;
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
        config.server.leases_label(&policy),
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
            server::stop_signal(),
        )
        .await
        .map_err(|e| e.to_string())?;
    server::shutdown().await;
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
    let (layer, reloader) = tollgate::config::tonic(tollgate::config::Source::file(path), store)
        .map_err(|e| e.to_string())?;
    let names = tollgate::config::PolicyFile::load(path)
        .map(|file| file.limiters().collect::<Vec<_>>().join(", "))
        .map_err(|e| e.to_string())?;
    policy_file::reload_on_sighup(reloader)?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("--addr {}: {e}", config.addr))?;
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
            server::stop_signal(),
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
    let config: Config = cli::parse();
    let policy = config.server.validate().unwrap_or_else(|e| cli::fail(e));
    // Before any store or layer is built: they register their metrics once.
    let metrics = observe::install(&config.server.observe)?;
    match config.server.redis_store(&policy).await? {
        None => {
            let store = config.server.memory_store("say-hello");
            serve(&config, policy, Arc::new(store), metrics).await
        }
        Some(store) => serve(&config, policy, Arc::new(store), metrics).await,
    }
}
