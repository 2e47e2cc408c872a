//! `ShouldRateLimit` decisions per second over loopback TCP, 64 requests in flight, beside the tollgate axum
//! layer's decisions per second on the same machine, in interleaved rounds.
//!
//! `cargo bench -p tollgate-rls --bench rls_throughput [-- --seconds 3 --rounds 3]` (Redis at `REDIS_URL`, default
//! `redis://127.0.0.1:6379`; every run under a namespace of its own). Rows:
//! - `rls in-process 1` / `4`: the service on the in-process store, one or four descriptors per request (a
//!   decision is one descriptor decided), over 8 HTTP/2 connections (Envoy multiplexes its calls);
//! - `rls redis 1` / `4`: the same on Redis (a request's descriptors are decided concurrently);
//! - `rls leases 1` / `4`: the same on Redis with token leases (`tollgate-rls --leases`: the hot descriptors are
//!   admitted from batches leased from Redis);
//! - `axum in-process` / `axum redis` / `axum leases`: an axum app behind the tollgate rate limiter
//!   (`HttpLimitLayer`; with token leases for the last), 64 HTTP/1.1 keep-alive connections, one decision per
//!   request.
//!
//! Server and load generator share the process (and the machine's cores). Every limit is high enough to admit
//! everything: the figure is the cost of deciding, not of refusing. Medians of the rounds, with their range; the
//! load average is printed beside them (the machine may be shared: rerun on a quiet one for publication).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_rls::config::Loader;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_rls::{Options, RateLimitService};
use tollgate_tower::LeaseConfig;

#[path = "../../../benches/support/http_load.rs"]
#[allow(dead_code)]
mod http_load;

const IN_FLIGHT: usize = 64;
const CONNECTIONS: usize = 8;

/// Admits everything: 100 million per second per descriptor.
const CONFIG: &str = "domain: bench
descriptors:
  - key: d0
    rate_limit: { unit: second, requests_per_unit: 100000000 }
  - key: d1
    rate_limit: { unit: second, requests_per_unit: 100000000 }
  - key: d2
    rate_limit: { unit: second, requests_per_unit: 100000000 }
  - key: d3
    rate_limit: { unit: second, requests_per_unit: 100000000 }
";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    InProcess,
    Redis,
    /// Redis with token leases.
    Leases,
}

#[derive(Clone, Copy)]
enum Row {
    Rls(Backend, usize),
    Axum(Backend),
}

impl Row {
    fn name(self) -> String {
        let b = |b| match b {
            Backend::InProcess => "in-process",
            Backend::Redis => "redis",
            Backend::Leases => "leases",
        };
        match self {
            Self::Rls(backend, n) => format!("rls {} {n}", b(backend)),
            Self::Axum(backend) => format!("axum {}", b(backend)),
        }
    }
}

fn request(descriptors: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: (0..descriptors)
            .map(|i| RateLimitDescriptor {
                entries: vec![Entry {
                    key: format!("d{i}"),
                    value: "client".into(),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn redis_store(namespace: &str) -> RedisStore {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    RedisStore::builder(url)
        .namespace(namespace)
        .pool_size(IN_FLIGHT)
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("a Redis at REDIS_URL")
}

/// Serves the rate limit service on `store` on a loopback port.
async fn serve_rls<S: Store>(store: S) -> SocketAddr {
    let config = Loader::new()
        .load([("bench.yaml", CONFIG)])
        .expect("the config");
    let service = RateLimitService::new(
        store,
        Arc::new(ArcSwap::from_pointee(config)),
        Options::new(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(tollgate_rls::serve(
        listener,
        service,
        std::future::pending(),
    ));
    addr
}

fn axum_app<S: Store>(store: S, leases: bool) -> axum::Router {
    let policy = Policy::sliding_window(Quota::per_second(100_000_000).unwrap()).unwrap();
    let mut limiter =
        tollgate_tower::RateLimitLayer::new("bench", policy, Arc::new(store), "client");
    if leases {
        limiter = limiter.leases(LeaseConfig::new());
    }
    axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(tollgate_http::HttpLimitLayer::new(limiter))
}

/// Decisions per second of `row` over `seconds`.
async fn run(row: Row, seconds: Duration, namespace: &str) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + seconds;
    let mut tasks = Vec::new();
    match row {
        Row::Rls(backend, descriptors) => {
            let addr = match backend {
                Backend::InProcess => serve_rls(MemoryStore::new()).await,
                Backend::Redis => serve_rls(redis_store(namespace).await).await,
                Backend::Leases => {
                    let store = redis_store(namespace).await;
                    serve_rls(LeaseConfig::new().around("bench", store)).await
                }
            };
            let mut channels = Vec::new();
            for _ in 0..CONNECTIONS {
                channels.push(
                    RateLimitServiceClient::connect(format!("http://{addr}"))
                        .await
                        .unwrap(),
                );
            }
            let r = request(descriptors);
            for i in 0..IN_FLIGHT {
                let mut client = channels[i % CONNECTIONS].clone();
                let (r, done) = (r.clone(), Arc::clone(&done));
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < deadline {
                        let reply = client
                            .should_rate_limit(r.clone())
                            .await
                            .expect("an answer");
                        assert_eq!(reply.get_ref().statuses.len(), descriptors);
                        assert_eq!(reply.get_ref().overall_code, 1, "admitted (OK)");
                        done.fetch_add(descriptors as u64, Ordering::Relaxed);
                    }
                }));
            }
        }
        Row::Axum(backend) => {
            let app = match backend {
                Backend::InProcess => axum_app(MemoryStore::new(), false),
                Backend::Redis => axum_app(redis_store(namespace).await, false),
                Backend::Leases => axum_app(redis_store(namespace).await, true),
            };
            let addr = http_load::serve(app).await;
            for _ in 0..IN_FLIGHT {
                let done = Arc::clone(&done);
                tasks.push(tokio::spawn(async move {
                    let mut client = http_load::Client::connect(addr).await.unwrap();
                    while Instant::now() < deadline {
                        client.request().await.expect("a 200");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
    }
    let started = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let (mut seconds, mut rounds) = (3_u64, 3_usize);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next().and_then(|v| v.parse::<u64>().ok())) {
            ("--seconds", Some(n)) if n > 0 => seconds = n,
            ("--rounds", Some(n)) if n > 0 => rounds = n as usize,
            _ => {
                eprintln!("usage: rls_throughput [--seconds N] [--rounds N]");
                std::process::exit(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rows = [
        Row::Rls(Backend::InProcess, 1),
        Row::Rls(Backend::InProcess, 4),
        Row::Axum(Backend::InProcess),
        Row::Rls(Backend::Redis, 1),
        Row::Rls(Backend::Redis, 4),
        Row::Axum(Backend::Redis),
        Row::Rls(Backend::Leases, 1),
        Row::Rls(Backend::Leases, 4),
        Row::Axum(Backend::Leases),
    ];
    println!(
        "decisions/s, {IN_FLIGHT} requests in flight, {seconds} s per row, {rounds} interleaved rounds; load average before: {}",
        load_average()
    );
    let mut figures = vec![Vec::new(); rows.len()];
    for round in 0..rounds {
        for (i, row) in rows.iter().enumerate() {
            let namespace = format!("rls-bench-{}-{round}-{i}", std::process::id());
            let rate = runtime.block_on(run(*row, Duration::from_secs(seconds), &namespace));
            figures[i].push(rate);
        }
    }
    println!("{:<18} {:>12} {:>22}", "row", "median", "range");
    for (row, mut f) in rows.iter().zip(figures) {
        f.sort_by(f64::total_cmp);
        println!(
            "{:<18} {:>12.0} {:>10.0} – {:<10.0}",
            row.name(),
            f[f.len() / 2],
            f[0],
            f[f.len() - 1]
        );
    }
    println!("load average after: {}", load_average());
}
