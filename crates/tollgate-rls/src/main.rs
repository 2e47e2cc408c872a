//! `tollgate-rls`: the Envoy rate limit service (RLS v3) on tollgate. `tollgate-rls --help` lists every flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tollgate_core::{FailurePolicy, MemoryStore, Store};
use tollgate_http::headers::HeaderSet;
use tollgate_redis::cli::RedisArgs;
use tollgate_rls::config::{Algorithm, ConfigDir, Loader};
use tollgate_rls::{OnStoreError, Options, RateLimitService, Reloader};
use tollgate_tower::{DenyCacheConfig, LeaseConfig, LeasedStore};

/// Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService) on tollgate: envoyproxy/ratelimit's
/// YAML, tollgate's algorithms, in-process or Redis state.
#[derive(Debug, Parser)]
#[command(name = "tollgate-rls", version)]
struct Cli {
    /// Address to serve gRPC (the rate limit service and grpc.health.v1.Health) on.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8081")]
    listen: SocketAddr,

    /// Directory of envoyproxy/ratelimit configuration files (*.yaml, *.yml; hidden entries skipped), reloaded
    /// when they change.
    #[arg(long, value_name = "DIR", env = "TOLLGATE_RLS_CONFIG_DIR")]
    config_dir: PathBuf,

    /// The algorithm of limits that name none (in their rate_limit or at their file's top, `algorithm:`).
    #[arg(long, value_enum, default_value_t = AlgorithmArg::SlidingWindow)]
    algorithm: AlgorithmArg,

    /// Merge files that name the same domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG) instead of refusing
    /// them.
    #[arg(long)]
    merge_domains: bool,

    /// How often the configuration directory is read for changes (a SIGHUP reads it at once).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration)]
    reload_interval: Duration,

    /// Redis for limits shared by every replica (without it, state is in-process).
    #[command(flatten)]
    redis: RedisArgs,

    /// Decide every descriptor on Redis, its denials included (by default a descriptor Redis refused is refused
    /// here, without a Redis call, until Redis's own retry instant: the deny cache).
    #[arg(long)]
    no_deny_cache: bool,

    /// Token leases: a hot descriptor is admitted from batches of tokens leased from Redis instead of a round trip
    /// each (exact: the replicas together never admit more than without; fixed windows keep the plain path).
    #[arg(long)]
    leases: bool,

    /// With --leases: the largest batch, as a share of the limit's burst [default: 10]
    #[arg(long, value_name = "PERCENT", requires = "leases", value_parser = clap::value_parser!(u32).range(1..=100))]
    lease_share: Option<u32>,

    /// With --leases: how long a batch lives (a token bucket's batch is at most what its limit refills in half of
    /// it) [default: the limit's period, at least 100ms, at most 10s]
    #[arg(long, value_name = "DURATION", requires = "leases", value_parser = duration)]
    lease_ttl: Option<Duration>,

    /// Most descriptors the in-process store tracks (at the bound a decayed one, else one not used lately, is evicted).
    #[arg(long, value_name = "N", default_value_t = tollgate_core::DEFAULT_MAX_KEYS)]
    max_keys: usize,

    /// What a store error makes of a descriptor: `error` answers UNAVAILABLE (Envoy's failure_mode_deny decides),
    /// `open` admits, `closed` refuses, `local` decides on an in-process store.
    #[arg(long, value_enum, default_value_t = OnError::Error)]
    on_store_error: OnError,

    /// Rate-limit header fields for Envoy to add to responses: the IETF RateLimit-Policy / RateLimit fields
    /// (`ietf`), X-RateLimit-* (`x-ratelimit`), both (`all`) or none.
    #[arg(long, value_enum, default_value_t = Headers::None)]
    response_headers: Headers,

    /// Answer every request OK, still counting what would have been refused (envoyproxy/ratelimit's
    /// SHADOW_MODE).
    #[arg(long)]
    shadow_mode: bool,

    /// A refused request spends nothing: when the answer is OVER_LIMIT, the descriptors that admitted it get their
    /// hits back (envoyproxy/ratelimit, and the default, count every descriptor's hits whatever the others answer).
    #[arg(long)]
    all_or_nothing: bool,

    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,

    /// Log level: error, warn, info, debug or trace.
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    log: tracing::Level,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum AlgorithmArg {
    SlidingWindow,
    TokenBucket,
    FixedWindow,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OnError {
    Error,
    Open,
    Closed,
    Local,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Headers {
    None,
    Ietf,
    XRatelimit,
    All,
}

/// `500ms`, `2s`, `1m`, `1h`.
fn duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 2s, 1m)"))?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3_600),
        _ => return Err(format!("{s:?} is not a duration (e.g. 500ms, 2s, 1m)")),
    })
}

/// A start-up failure: the one line printed, and the exit status.
struct Fatal(u8, String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_max_level(cli.log)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tollgate-rls: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fatal(code, message)) => {
            eprintln!("tollgate-rls: {}", message.replace(['\n', '\r'], " "));
            ExitCode::from(code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Fatal> {
    if cli.leases && !cli.redis.is_set() {
        return Err(Fatal(
            2,
            "--leases leases tokens from Redis: it needs --redis-url (or --redis-sentinel, --redis-cluster)".into(),
        ));
    }
    let metrics = match cli.metrics_addr {
        Some(addr) => Some(serve_metrics(addr).await?),
        None => None,
    };
    let algorithm = match cli.algorithm {
        AlgorithmArg::SlidingWindow => Algorithm::SlidingWindowCounter,
        AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
        AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
    };
    let loader = Loader::new()
        .default_algorithm(algorithm)
        .merge_domains(cli.merge_domains);
    let reloader = Reloader::load(ConfigDir::new(&cli.config_dir, loader))
        .map_err(|e| Fatal(2, e.to_string()))?;
    let options = Options::new()
        .headers(match cli.response_headers {
            Headers::None => HeaderSet::NONE,
            Headers::Ietf => HeaderSet::IETF,
            Headers::XRatelimit => HeaderSet::GITHUB,
            Headers::All => HeaderSet::ALL,
        })
        .shadow_mode(cli.shadow_mode)
        .all_or_nothing(cli.all_or_nothing)
        .override_algorithm(algorithm)
        .on_store_error(match cli.on_store_error {
            OnError::Error => OnStoreError::Error,
            OnError::Open => OnStoreError::Policy(FailurePolicy::Open),
            OnError::Closed => OnStoreError::Policy(FailurePolicy::Closed),
            OnError::Local => OnStoreError::Policy(FailurePolicy::Local),
        });
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| Fatal(1, format!("--listen {}: {e}", cli.listen)))?;
    let addr = listener.local_addr().map_err(|e| Fatal(1, e.to_string()))?;
    let config = reloader.config();
    let summary = {
        let loaded = config.load();
        format!(
            "{} domains from {} files in {}",
            loaded.domains().len(),
            loaded.files(),
            cli.config_dir.display()
        )
    };
    let interval = cli.reload_interval;
    tokio::spawn(reloader.run(interval, sighup()));
    let redis = cli
        .redis
        .build(|builder| builder)
        .await
        .map_err(|e| Fatal(2, e.to_string()))?;
    let served = match redis {
        Some(store) => {
            let target = cli.redis.target().unwrap_or_default();
            let leases = lease_config(&cli)?;
            let label = format!(
                "redis {target}; deny cache {}; leases {}",
                if cli.no_deny_cache { "off" } else { "on" },
                if leases.is_some() { "on" } else { "off" }
            );
            announce(addr, &label, &summary, metrics);
            match (cli.no_deny_cache, leases) {
                (true, None) => {
                    serve(listener, RateLimitService::new(store, config, options)).await
                }
                (false, None) => {
                    let store = DenyCacheConfig::new().around(NAME, store);
                    serve(listener, RateLimitService::new(store, config, options)).await
                }
                (true, Some(leases)) => {
                    serve_leased(listener, leases.around(NAME, store), config, options).await
                }
                (false, Some(leases)) => {
                    let store = leases.around(NAME, DenyCacheConfig::new().around(NAME, store));
                    serve_leased(listener, store, config, options).await
                }
            }
        }
        None => {
            let store = MemoryStore::builder()
                .max_keys(cli.max_keys)
                .name(NAME)
                .build();
            announce(addr, "in-process", &summary, metrics);
            serve(listener, RateLimitService::new(store, config, options)).await
        }
    };
    if served.is_ok() {
        println!("tollgate-rls stopped");
    }
    served
}

/// The name the service's stores count under (evictions, deny cache hits, token leases).
const NAME: &str = "tollgate-rls";

/// The token leases `--leases`, `--lease-share` and `--lease-ttl` ask for.
fn lease_config(cli: &Cli) -> Result<Option<LeaseConfig>, Fatal> {
    if !cli.leases {
        return Ok(None);
    }
    let mut config = LeaseConfig::new();
    if let Some(share) = cli.lease_share {
        config = config
            .share_percent(share)
            .map_err(|e| Fatal(2, format!("--lease-share: {e}")))?;
    }
    if let Some(ttl) = cli.lease_ttl {
        config = config.ttl(ttl);
    }
    Ok(Some(config))
}

/// Serves on leased state, then returns every unspent batch to Redis once the requests in flight are answered.
async fn serve_leased<S: Store>(
    listener: tokio::net::TcpListener,
    store: LeasedStore<S>,
    config: std::sync::Arc<arc_swap::ArcSwap<tollgate_rls::config::RateLimitConfig>>,
    options: Options,
) -> Result<(), Fatal> {
    let leases = store.clone(); // shares the leases
    let served = serve(listener, RateLimitService::new(store, config, options)).await;
    leases.shutdown().await;
    served
}

fn announce(addr: SocketAddr, store: &str, summary: &str, metrics: Option<SocketAddr>) {
    // The first line names the address (tests and scripts read it when --listen has port 0).
    println!("tollgate-rls listening on {addr} (store: {store}; {summary})");
    if let Some(metrics) = metrics {
        println!("metrics on http://{metrics}/metrics");
    }
}

async fn serve<S: Store>(
    listener: tokio::net::TcpListener,
    service: RateLimitService<S>,
) -> Result<(), Fatal> {
    tollgate_rls::serve(listener, service, stop_signal())
        .await
        .map_err(|e| Fatal(1, format!("serving failed: {e}")))?;
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// A future that completes at each SIGHUP.
fn sighup() -> impl FnMut() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let hup = std::sync::Arc::new(tokio::sync::Mutex::new(
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .expect("install the SIGHUP handler"),
    ));
    move || {
        let hup = std::sync::Arc::clone(&hup);
        Box::pin(async move {
            if hup.lock().await.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        })
    }
}

async fn serve_metrics(addr: SocketAddr) -> Result<SocketAddr, Fatal> {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Fatal(1, format!("metrics: {e}")))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Fatal(1, format!("--metrics-addr {addr}: {e}")))?;
    let bound = listener.local_addr().map_err(|e| Fatal(1, e.to_string()))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move {
                handle.run_upkeep();
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    handle.render(),
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics endpoint failed");
        }
    });
    Ok(bound)
}
