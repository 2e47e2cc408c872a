//! The flags both example servers take (clap), and what they build: the per-client policy, the store (in
//! process, or Redis through [`RedisArgs`]), the rate limiter's failure policy, deny cache and token leases, and the
//! observability flags. Included with `#[path = "common/server.rs"] mod server;` (with `common/cli.rs` as `cli`).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser as _};
use tollgate::redis::RedisStore;
use tollgate::redis::cli::RedisArgs;
use tollgate::tower::{LeaseConfig, RateLimitLayer};
use tollgate::{Algorithm, DEFAULT_MAX_KEYS, FailurePolicy, MemoryStore, Policy, Quota, Store};

use crate::cli;

/// The token leases of every rate limiter [`ServerArgs::rate_limit`] built with `--leases`, each as the shutdown
/// of its layer (of whatever key, store and cost types): [`shutdown`] returns their unspent batches before the
/// process exits.
static LEASES: std::sync::Mutex<Vec<ShutdownLeases>> = std::sync::Mutex::new(Vec::new());

/// A layer's [`RateLimitLayer::leases_shutdown`], on a clone of the layer (the clones share the leases).
type ShutdownLeases =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

/// The flags both example servers take: the per-client policy, the store and the rate limiter's settings, the
/// Redis connection and observability.
#[derive(Debug, clap::Args)]
pub(crate) struct ServerArgs {
    /// Requests per period per client
    #[arg(long, value_name = "N", default_value = "10", value_parser = cli::positive)]
    pub(crate) limit: u64,

    /// The period: 500ms, 1s, 10s, 5m, 1h
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = cli::duration)]
    pub(crate) period: Duration,

    /// Token bucket size (token bucket only) [default: the limit]
    #[arg(long, value_name = "N", value_parser = cli::positive)]
    pub(crate) burst: Option<u64>,

    /// The algorithm
    #[arg(long, value_name = "ALG", default_value = "token-bucket", value_parser = algorithm())]
    pub(crate) algorithm: Algorithm,

    /// When Redis fails: admit (open), refuse (closed) or limit per instance meanwhile (local: each instance
    /// the whole limit, until Redis answers again)
    #[arg(long, value_name = "POLICY", default_value = "local", value_parser = failure_policy())]
    pub(crate) on_store_error: FailurePolicy,

    /// Keys the in-process store tracks; a new key past them evicts one not used lately (CLOCK)
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_KEYS, value_parser = cli::positive_usize)]
    pub(crate) max_keys: usize,

    /// With Redis: refuse a denied client locally until Redis's own retry instant (exact: Redis would refuse it
    /// too) instead of asking Redis again [default: on]
    #[arg(long, value_name = "on|off", value_parser = on_off())]
    pub(crate) deny_cache: Option<bool>,

    /// Admit hot clients from batches of tokens leased from the store (exact: the fleet never admits more than
    /// the plain path; cold clients keep it)
    #[arg(long)]
    pub(crate) leases: bool,

    /// With --leases: the largest batch, as a share of the burst [default: 10]
    #[arg(long, value_name = "PERCENT", value_parser = cli::percent)]
    pub(crate) lease_share: Option<u32>,

    /// With --leases: how long a batch lives (a token bucket's batch is at most what its quota refills in half
    /// of it, so a slow quota leases only with a long one) [default: the period, at least 100ms, at most 10s]
    #[arg(long, value_name = "DUR", value_parser = cli::duration)]
    pub(crate) lease_ttl: Option<Duration>,

    /// The limits from a policy file (TOML; see tollgate::config) instead of --limit/--period/--burst/--algorithm
    /// and the stack flags; read again on SIGHUP (an invalid file keeps the limits in force and says why)
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) redis: RedisArgs,

    #[command(flatten)]
    pub(crate) observe: ObserveArgs,
}

/// `--metrics-addr HOST:PORT` (serve Prometheus metrics at `/metrics` there) and `--log LEVEL` (a `tracing`
/// subscriber on stderr; `debug` shows one event per decision).
#[derive(Debug, Default, clap::Args)]
#[command(next_help_heading = "Observability")]
pub(crate) struct ObserveArgs {
    /// Serve Prometheus metrics at http://HOST:PORT/metrics
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) metrics_addr: Option<SocketAddr>,

    /// Log to stderr: error, warn, info, debug (one line per decision) or trace
    #[arg(long, value_name = "LEVEL", value_parser = log_level())]
    pub(crate) log: Option<tracing::Level>,
}

fn algorithm() -> impl clap::builder::TypedValueParser<Value = Algorithm> {
    PossibleValuesParser::new(["token-bucket", "sliding-window"]).map(|v| match v.as_str() {
        "token-bucket" => Algorithm::TokenBucket,
        _ => Algorithm::SlidingWindowCounter,
    })
}

fn failure_policy() -> impl clap::builder::TypedValueParser<Value = FailurePolicy> {
    PossibleValuesParser::new(["open", "closed", "local"])
        .map(|v| v.parse().expect("each possible value parses"))
}

fn on_off() -> impl clap::builder::TypedValueParser<Value = bool> {
    PossibleValuesParser::new(["on", "off"]).map(|v| v == "on")
}

fn log_level() -> impl clap::builder::TypedValueParser<Value = tracing::Level> {
    PossibleValuesParser::new(["error", "warn", "info", "debug", "trace"])
        .map(|v| v.parse().expect("each possible value parses"))
}

/// `gradient2` or `aimd`: the adaptive limiter's algorithm, with its default settings (limit 20 to 200).
pub(crate) fn adaptive()
-> impl clap::builder::TypedValueParser<Value = tollgate::tower::limit::adaptive::Control> {
    use tollgate::tower::limit::adaptive::Control;
    PossibleValuesParser::new(["gradient2", "aimd"]).map(|v| match v.as_str() {
        "gradient2" => Control::gradient2(),
        _ => Control::aimd(),
    })
}

impl ServerArgs {
    /// Checks what the parser cannot: `--lease-share` is a setting of `--leases`, the Redis flags name one store,
    /// the policy flags make a policy. The policy, when they do.
    pub(crate) fn validate(&self) -> Result<Policy, String> {
        if self.lease_share.is_some() && !self.leases {
            return Err(
                "--lease-share sets the token leases' batch size: it needs --leases".to_owned(),
            );
        }
        if self.lease_ttl.is_some() && !self.leases {
            return Err(
                "--lease-ttl sets how long a leased batch lives: it needs --leases".to_owned(),
            );
        }
        self.redis.builder().map_err(|e| e.to_string())?;
        self.policy()
    }

    /// The policy `--algorithm`, `--limit`, `--period` and `--burst` describe.
    pub(crate) fn policy(&self) -> Result<Policy, String> {
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

    /// Whether a Redis store is configured (`--redis-url`, `REDIS_URL` or `--redis-sentinel`).
    pub(crate) fn uses_redis(&self) -> bool {
        self.redis.is_set()
    }

    /// What the store is, for the start-up line.
    pub(crate) fn store_name(&self) -> String {
        self.redis
            .target()
            .unwrap_or_else(|| "in-process".to_owned())
    }

    /// The Redis store the flags describe, or `None` for the in-process store.
    ///
    /// A configuration error (a wrong password, an untrusted certificate, `NOPERM`, …) is an `Err` with one line
    /// naming the cause, which the servers print before exiting non-zero. A Redis that does not answer yet is a
    /// warning: the store is built and its errors reach the layer, whose `--on-store-error` answers them.
    pub(crate) async fn redis_store(&self, policy: &Policy) -> Result<Option<RedisStore>, String> {
        let Some(store) = self
            .redis
            .build(|builder| builder)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        if let Err(e) = store.check("startup-probe", policy, 0).await {
            eprintln!(
                "warning: Redis ({}) is not answering ({e}); --on-store-error {} applies until it does",
                self.store_name(),
                self.on_store_error
            );
        }
        Ok(Some(store))
    }

    /// The in-process store: `--max-keys` keys at most, evicting one not used lately (CLOCK) at the bound, its
    /// evictions counted under `name` (the limiter it serves).
    pub(crate) fn memory_store(&self, name: &'static str) -> MemoryStore {
        MemoryStore::builder()
            .max_keys(self.max_keys)
            .name(name)
            .build()
    }

    /// `layer` with the failure policy `--on-store-error`, on Redis the deny cache `--deny-cache` asks for (the
    /// layer's default, on for Redis, when not given), and the token leases of `--leases`.
    pub(crate) fn rate_limit<K, St, C>(
        &self,
        layer: RateLimitLayer<K, St, C>,
    ) -> RateLimitLayer<K, St, C>
    where
        K: Clone + Send + Sync + 'static,
        St: Store,
        C: Clone + Send + Sync + 'static,
    {
        let layer = layer.on_store_error(self.on_store_error);
        let layer = match self.deny_cache {
            Some(on) if self.uses_redis() => layer.deny_cache(on),
            _ => layer,
        };
        match self.lease_config() {
            Some(config) => {
                let layer = layer.leases(config);
                let leases = layer.clone();
                LEASES
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Box::new(move || {
                        Box::pin(async move { leases.leases_shutdown().await })
                    }));
                layer
            }
            None => layer,
        }
    }

    /// The token lease configuration `--leases`, `--lease-share` and `--lease-ttl` ask for.
    pub(crate) fn lease_config(&self) -> Option<LeaseConfig> {
        let mut config = LeaseConfig::new();
        if let Some(ttl) = self.lease_ttl {
            config = config.ttl(ttl);
        }
        self.leases.then(|| match self.lease_share {
            // Checked when parsed (1 to 100).
            Some(share) => config.clone().share_percent(share).unwrap_or(config),
            None => config,
        })
    }

    /// How token leases are set for `policy`, for the start-up line.
    pub(crate) fn leases_label(&self, policy: &Policy) -> String {
        let Some(config) = self.lease_config() else {
            return "off".to_owned();
        };
        let share = self.lease_share.unwrap_or(10);
        match config.largest_batch(policy) {
            0 => "on, but none leased: this token bucket refills less than a token in half a lease's life (a \
                  longer --lease-ttl leases)"
                .to_owned(),
            batch => format!("on (batches up to {batch}: {share} % of the burst at most)"),
        }
    }

    /// How the deny cache is set, for the start-up line.
    pub(crate) fn deny_cache_label(&self) -> &'static str {
        match (self.uses_redis(), self.deny_cache) {
            (false, _) => "n/a",
            (true, Some(false)) => "off",
            (true, _) => "on",
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT (ctrl-c): the signal to stop serving and [`shutdown`].
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            // Without the handlers the default action (exit) stays: nothing to wait for.
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Returns every leased batch to the store (each limiter's [`RateLimitLayer::leases_shutdown`]): an instance that exits
/// this way takes no tokens from the fleet with it (one that crashes loses at most its batches, which expire).
pub(crate) async fn shutdown() {
    let leases = std::mem::take(&mut *LEASES.lock().unwrap_or_else(|p| p.into_inner()));
    for shutdown in leases {
        shutdown().await;
    }
}
