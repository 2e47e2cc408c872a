//! An axum server behind tollgate: a demo and a black-box test target.
//!
//! ```text
//! cargo run --example axum_server -- --limit 5 --period 10s
//! curl -i http://127.0.0.1:3000/          # 200 with RateLimit-Policy, RateLimit, X-RateLimit-* headers
//! curl -i http://127.0.0.1:3000/health    # never limited
//!
//! # Stripe's stack: 2 in flight per client, this instance sheds by priority near 64 in flight, the fleet sheds
//! # non-critical requests beyond 80 of 100 in flight (20 % reserved for `x-priority: critical`).
//! cargo run --example axum_server -- --concurrency 2 --worker-capacity 64 \
//!     --fleet-capacity 100 --fleet-reserve 20 --redis-url redis://127.0.0.1:6379
//! curl -i 'http://127.0.0.1:3000/slow?ms=2000' -H 'x-priority: low'
//!
//! # An adaptive concurrency limit (Gradient2; or aimd) beside a worker shedder of capacity 10: a burst of Low
//! # fills 6 of the 10 and no more, so critical requests still get in.
//! cargo run --example axum_server -- --limit 100000 --adaptive gradient2 --worker-capacity 10
//!
//! # The limits from a policy file (tollgate::config), read again on SIGHUP: `kill -HUP <pid>`.
//! cargo run --example axum_server -- --config examples/policy.toml
//! curl -i http://127.0.0.1:3000/ -H 'x-api-key: gold'
//!
//! # Prometheus metrics (decisions by limiter and outcome, near-limit, store latency, circuit) and a log line
//! # per decision; `docs/grafana/tollgate.json` is a dashboard over these series.
//! cargo run --example axum_server -- --metrics-addr 127.0.0.1:9090 --log debug
//! curl http://127.0.0.1:9090/metrics
//! ```
//!
//! `GET /` is limited per client IP (the peer address, or the client behind `--trusted-proxy` networks);
//! `GET /health` is never limited. Run with `--help` for the flags. Without `--redis-url` the limit holds per
//! instance (in-process store); with it, for every instance sharing the Redis.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tollgate::http::HttpLimitLayer;
use tollgate::http::key::{Cidr, ClientIp};
use tollgate::slot::{MemorySlotStore, SlotStore};
use tollgate::tower::RateLimitLayer;
use tollgate::{Policy, Store};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/observe.rs"]
mod observe;
#[path = "common/policy_file.rs"]
mod policy_file;
#[path = "common/server.rs"]
mod server;
#[path = "common/stack.rs"]
mod stack;

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "axum_server",
    about = "An axum server behind tollgate: GET / and GET /slow?ms=N limited per client IP, GET /health never",
    after_help = "priorities (the stack): the x-priority header (critical, high, normal, low), else by method \
                  (writes High, reads Normal)"
)]
struct Config {
    /// Listen address
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:3000")]
    addr: SocketAddr,

    /// A reverse proxy network whose X-Forwarded-For is trusted (repeatable)
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    trusted_proxies: Vec<Cidr>,

    #[command(flatten)]
    server: server::ServerArgs,

    #[command(flatten)]
    stack: stack::StackFlags,
}

impl Config {
    /// What the parser cannot check; the policy the flags describe.
    fn validate(&self) -> Result<Policy, String> {
        self.stack.validate(self.server.uses_redis())?;
        if self.server.config.is_some() && !self.trusted_proxies.is_empty() {
            return Err(
                "with --config, list the trusted proxies in the policy file (trusted-proxies = [...])"
                    .to_owned(),
            );
        }
        self.server.validate()
    }
}

/// `GET /` and `GET /slow` behind the per-client rate limit and the rest of the Stripe stack (`stack::layer`, whose
/// slots live in `slots`); `GET /health` added after them, so never limited.
fn app<St: Store, L: SlotStore>(
    config: &Config,
    policy: Policy,
    store: Arc<St>,
    slots: Arc<L>,
) -> Result<Router, String> {
    let key = ClientIp::trusting(config.trusted_proxies.iter().copied());
    let per_client = config.server.rate_limit(RateLimitLayer::new(
        "per-client",
        policy,
        store,
        key.clone(),
    ));
    let limits = stack::layer(
        &config.stack,
        per_client,
        slots,
        key,
        config.server.on_store_error,
    )?;
    Ok(Router::new()
        .route("/", get(|| async { "hello from tollgate\n" }))
        .route("/slow", get(stack::slow))
        .layer(HttpLimitLayer::new(limits))
        .route("/health", get(|| async { "ok\n" })))
}

/// The same routes behind a policy file's limits (`--config`), which `SIGHUP` reloads.
fn app_from_file<St: Store>(
    path: &std::path::Path,
    store: Arc<St>,
) -> Result<(Router, String), String> {
    let (limits, reloader) = tollgate::config::axum(tollgate::config::Source::file(path), store)
        .map_err(|e| e.to_string())?;
    let names = tollgate::config::PolicyFile::load(path)
        .map(|file| file.limiters().collect::<Vec<_>>().join(", "))
        .map_err(|e| e.to_string())?;
    policy_file::reload_on_sighup(reloader)?;
    let app = Router::new()
        .route("/", get(|| async { "hello from tollgate\n" }))
        .route("/slow", get(stack::slow))
        .layer(limits)
        .route("/health", get(|| async { "ok\n" }));
    Ok((app, names))
}

#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("axum_server: {err}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let config: Config = cli::parse();
    let policy = config.validate().unwrap_or_else(|e| cli::fail(e));
    // Before any store or layer is built: they register their metrics once.
    let metrics = observe::install(&config.server.observe)?;
    if let Some(path) = &config.server.config {
        let (app, names) = match config.server.redis_store(&policy).await? {
            None => app_from_file(path, Arc::new(config.server.memory_store("policy-file")))?,
            Some(store) => app_from_file(path, Arc::new(store))?,
        };
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|e| format!("--addr {}: {e}", config.addr))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!(
            "listening on http://{addr}  (policy file {}: {names}; store {}; SIGHUP reloads it)",
            path.display(),
            config.server.store_name()
        );
        if let Some((addr, handle)) = metrics {
            let bound = observe::serve_metrics(addr, handle).await?;
            println!("metrics on http://{bound}/metrics");
        }
        return axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(server::stop_signal())
        .await
        .map_err(|e| e.to_string());
    }
    let app = match config.server.redis_store(&policy).await? {
        None => app(
            &config,
            policy,
            Arc::new(config.server.memory_store("per-client")),
            Arc::new(MemorySlotStore::new()),
        )?,
        Some(store) => app(&config, policy, Arc::new(store.clone()), Arc::new(store))?,
    };
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("--addr {}: {e}", config.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let store = config.server.store_name();
    println!(
        "listening on http://{addr}  ({} {} per {:?}, burst {}, store {store}, on store error {}, deny cache {}, leases {}, {} trusted proxies)",
        policy.algorithm(),
        policy.quota().limit(),
        policy.quota().period(),
        policy.quota().burst(),
        config.server.on_store_error,
        config.server.deny_cache_label(),
        config.server.leases_label(&policy),
        config.trusted_proxies.len()
    );
    println!("stack: {}", config.stack.describe());
    if let Some((addr, handle)) = metrics {
        let bound = observe::serve_metrics(addr, handle).await?;
        println!("metrics on http://{bound}/metrics");
    }
    // SIGTERM or SIGINT: stop accepting, finish the requests in flight, then give the leased batches back.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(server::stop_signal())
    .await
    .map_err(|e| e.to_string())?;
    server::shutdown().await;
    Ok(())
}
