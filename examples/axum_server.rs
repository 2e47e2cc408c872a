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
//! ```
//!
//! `GET /` is limited per client IP (the peer address, or the client behind `--trusted-proxy` networks);
//! `GET /health` is never limited. Run with `--help` for the flags. Without `--redis-url` the limit holds per
//! instance (in-process store); with it, for every instance sharing the Redis.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tollgate_core::lease::{LeaseStore, MemoryLeaseStore};
use tollgate_core::{Algorithm, FailurePolicy, MemoryStore, Policy, Quota, Store};
use tollgate_http::HttpLimitLayer;
use tollgate_http::key::{Cidr, ClientIp};
use tollgate_redis::RedisStore;
use tollgate_tower::RateLimitLayer;

#[path = "common/stack.rs"]
mod stack;

const USAGE: &str = "\
usage: axum_server [options]

  --addr HOST:PORT              listen address (default 127.0.0.1:3000)
  --limit N                     requests per period per client (default 10)
  --period DUR                  the period: 500ms, 1s, 10s, 5m, 1h (default 1s)
  --burst N                     token bucket size (default: the limit; token bucket only)
  --algorithm ALG               token-bucket | sliding-window (default token-bucket)
  --redis-url URL               share the limit through Redis (default: in-process store)
  --on-store-error POLICY       open | closed | local: when Redis fails (default closed)
  --trusted-proxy CIDR          a reverse proxy network whose X-Forwarded-For is trusted (repeatable)
  -h, --help                    this text

routes: GET / and GET /slow?ms=N (limited per client IP), GET /health (never limited)";

/// The command line. Later flags (concurrency, load shedding) add a field here and an arm in `Config::parse`.
#[derive(Debug)]
struct Config {
    addr: SocketAddr,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
    algorithm: Algorithm,
    redis_url: Option<String>,
    on_store_error: FailurePolicy,
    trusted_proxies: Vec<Cidr>,
    stack: stack::StackFlags,
}

impl Config {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let mut config = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            limit: 10,
            period: Duration::from_secs(1),
            burst: None,
            algorithm: Algorithm::TokenBucket,
            redis_url: None,
            on_store_error: FailurePolicy::Closed,
            trusted_proxies: Vec::new(),
            stack: stack::StackFlags::default(),
        };
        while let Some(flag) = args.next() {
            let (flag, inline) = match flag.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
                _ => (flag, None),
            };
            if flag == "-h" || flag == "--help" {
                return Ok(None);
            }
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag.as_str() {
                "--addr" => {
                    let v = value()?;
                    config.addr = v.parse().map_err(|_| {
                        format!("--addr {v:?}: expected HOST:PORT, e.g. 127.0.0.1:3000")
                    })?;
                }
                "--limit" => config.limit = positive(&flag, &value()?)?,
                "--period" => {
                    config.period =
                        parse_duration(&value()?).map_err(|e| format!("--period: {e}"))?
                }
                "--burst" => config.burst = Some(positive(&flag, &value()?)?),
                "--algorithm" => {
                    config.algorithm = match value()?.as_str() {
                        "token-bucket" => Algorithm::TokenBucket,
                        "sliding-window" => Algorithm::SlidingWindowCounter,
                        other => {
                            return Err(format!(
                                "--algorithm {other:?}: expected token-bucket or sliding-window"
                            ));
                        }
                    }
                }
                "--redis-url" => config.redis_url = Some(value()?),
                "--on-store-error" => {
                    config.on_store_error = value()?
                        .parse()
                        .map_err(|e| format!("--on-store-error: {e}"))?;
                }
                "--trusted-proxy" => {
                    config.trusted_proxies.push(
                        value()?
                            .parse()
                            .map_err(|e| format!("--trusted-proxy: {e}"))?,
                    );
                }
                other if stack::StackFlags::is_flag(other) => config.stack.set(other, &value()?)?,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        config.stack.validate(config.redis_url.is_some())?;
        Ok(Some(config))
    }

    fn policy(&self) -> Result<Policy, String> {
        let quota =
            Quota::new(self.limit, self.period).map_err(|e| format!("--limit/--period: {e}"))?;
        let quota = match self.burst {
            Some(burst)
                if self.algorithm == Algorithm::SlidingWindowCounter && burst != self.limit =>
            {
                return Err("--burst applies to --algorithm token-bucket only".to_owned());
            }
            Some(burst) => quota
                .with_burst(burst)
                .map_err(|e| format!("--burst: {e}"))?,
            None => quota,
        };
        Policy::new(self.algorithm, quota).map_err(|e| e.to_string())
    }
}

fn positive(flag: &str, v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} {v:?}: expected a whole number above 0")),
    }
}

/// `500ms`, `1s`, `10s`, `5m`, `1h` (also `us`; a number needs its unit).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: expected a number and a unit, e.g. 500ms, 1s, 1h"))?;
    let d = match unit {
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        "" => return Err(format!("{s:?}: add a unit (us, ms, s, m or h)")),
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (use us, ms, s, m or h)"
            ));
        }
    };
    if d.is_zero() {
        return Err(format!("{s:?}: must be longer than zero"));
    }
    Ok(d)
}

/// `GET /` and `GET /slow` behind the per-client rate limit and the rest of the Stripe stack (`stack::layer`, whose
/// leases live in `leases`); `GET /health` added after them, so never limited.
fn app<St: Store, L: LeaseStore>(
    config: &Config,
    policy: Policy,
    store: Arc<St>,
    leases: Arc<L>,
) -> Result<Router, String> {
    let key = ClientIp::trusting(config.trusted_proxies.iter().copied());
    let per_client = RateLimitLayer::new("per-client", policy, store, key.clone())
        .on_store_error(config.on_store_error);
    let limits = stack::layer(
        &config.stack,
        per_client,
        leases,
        key,
        config.on_store_error,
    )?;
    Ok(Router::new()
        .route("/", get(|| async { "hello from tollgate\n" }))
        .route("/slow", get(stack::slow))
        .layer(HttpLimitLayer::new(limits))
        .route("/health", get(|| async { "ok\n" })))
}

#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("axum_server: {err}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let Some(config) = Config::parse(std::env::args().skip(1))? else {
        // Ignore a closed pipe (`--help | head`).
        let _ = writeln!(
            std::io::stdout(),
            "{USAGE}\n\nthe Stripe stack:\n{}",
            stack::USAGE
        );
        return Ok(());
    };
    let policy = config.policy()?;
    let app = match &config.redis_url {
        None => app(
            &config,
            policy,
            Arc::new(MemoryStore::new()),
            Arc::new(MemoryLeaseStore::new()),
        )?,
        Some(url) => {
            let store = RedisStore::builder(url.clone())
                .namespace("tollgate-axum-server")
                .build()
                .await
                .map_err(|e| format!("--redis-url {url:?}: {e}"))?;
            if let Err(e) = store.try_check("startup-probe", &policy, 0).await {
                eprintln!(
                    "warning: Redis at {url} is not answering ({e}); --on-store-error {} applies",
                    config.on_store_error
                );
            }
            app(
                &config,
                policy,
                // No store failure policy: Redis errors reach the layer, whose --on-store-error answers.
                Arc::new(store.clone()),
                Arc::new(store),
            )?
        }
    };
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("--addr {}: {e}", config.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let store = config.redis_url.as_deref().unwrap_or("in-process");
    println!(
        "listening on http://{addr}  ({} {} per {:?}, burst {}, store {store}, on store error {}, {} trusted proxies)",
        policy.algorithm(),
        policy.quota().limit(),
        policy.quota().period(),
        policy.quota().burst(),
        config.on_store_error,
        config.trusted_proxies.len()
    );
    println!("stack: {}", config.stack.describe());
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .map_err(|e| e.to_string())
}
