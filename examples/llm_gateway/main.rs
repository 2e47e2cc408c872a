//! An OpenAI-compatible streaming stand-in behind tollgate: token budgets enforced while the response streams.
//!
//! ```text
//! # Serve it: 20 000 output tokens an hour per x-api-key, streams cut at the budget.
//! cargo run --example llm_gateway -- --serve --addr 127.0.0.1:3000 --budget 20000 --period 1h --on-exhausted cut
//! curl -N http://127.0.0.1:3000/v1/chat/completions -H 'x-api-key: alice' \
//!     -d '{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}'
//!
//! # The simulation: 4 instances on one Redis, 64 concurrent streaming clients, with `cut` and with `finish`.
//! cargo run --release --example llm_gateway -- --redis-url redis://127.0.0.1:6379
//! cargo run --release --example llm_gateway -- --json --check
//! ```
//!
//! Each request reserves its body's `max_tokens` (or `--reserve` when it names none) before it is passed on; the
//! stream's chunks are counted as they leave (its `usage` when it states one), debited to the key in batches of
//! `--batch` tokens, and settled to the real total at the end. Without a Redis flag the server keeps its state in
//! process, and the simulation starts a private redis-server (or, with none installed, shares one in-process
//! store between its instances).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use tollgate::http::HttpLimitLayer;
use tollgate::http::key::HeaderKey;
use tollgate::http::stream::{MaxTokensLayer, OpenAiSse, Reserve, StreamCostLayer};
use tollgate::redis::cli::RedisArgs;
use tollgate::tower::limit::rate::RateLimitSetLayer;
use tollgate::tower::stream_cost::{Exhausted, Streamed, Tokens};
use tollgate::tower::{CostAfter, RateLimitLayer};
use tollgate::{MemoryStore, Policy, Quota, Store};

#[path = "../common/cli.rs"]
mod cli;
mod sim;
mod upstream;

use upstream::Upstream;

/// The command line.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "llm_gateway",
    about = "An OpenAI-compatible streaming stand-in behind tollgate's streamed token budgets: --serve serves it, \
             without it the 4-instance simulation prints its table"
)]
pub(crate) struct Config {
    /// Serve the gateway instead of running the simulation
    #[arg(long)]
    serve: bool,

    /// Listen address (with --serve)
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:3000")]
    addr: SocketAddr,

    /// Output tokens per key per period
    #[arg(long, value_name = "N", value_parser = cli::positive)]
    budget: Option<u64>,

    /// Also a budget of total (input and output) tokens per day per x-org header, decided with the key's as one
    /// (a request then needs the header)
    #[arg(long, value_name = "N", value_parser = cli::positive)]
    org_budget: Option<u64>,

    /// The budget's period (500ms, 1m, 1h, ...)
    #[arg(long, value_name = "DUR", default_value = "1h", value_parser = cli::duration)]
    period: Duration,

    /// At the budget mid-stream: cut the stream, or let it finish and owe the overdraft (with --serve; the
    /// simulation runs both)
    #[arg(long, value_name = "MODE", default_value = "cut", value_parser = exhausted)]
    on_exhausted: Exhausted,

    /// Tokens reserved up front for a request that names no max_tokens
    #[arg(long, value_name = "N", default_value_t = 16)]
    reserve: u64,

    /// Debit every N tokens streamed beyond the reservation (or every --batch-interval)
    #[arg(long, value_name = "N", default_value_t = 250, value_parser = cli::positive)]
    batch: u64,

    /// The longest time between two debits of a key's streams
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = cli::duration)]
    batch_interval: Duration,

    /// Tokens the stand-in streams (fewer when the request's max_tokens says so)
    #[arg(long, value_name = "N", default_value_t = 500)]
    tokens: u64,

    /// The stand-in's time between two tokens
    #[arg(long, value_name = "DUR", default_value = "2ms", value_parser = cli::duration_or_zero)]
    pace: Duration,

    /// The simulation's longest run per mode (it ends when every client was refused)
    #[arg(long, value_name = "DUR", default_value = "60s", value_parser = cli::duration)]
    seconds: Duration,

    /// Also print one JSON line per row (simulation)
    #[arg(long)]
    json: bool,

    /// Exit 1 when a goal is missed (simulation)
    #[arg(long)]
    check: bool,

    #[command(flatten)]
    redis: RedisArgs,
}

fn exhausted(value: &str) -> Result<Exhausted, String> {
    match value {
        "cut" => Ok(Exhausted::Cut),
        "finish" => Ok(Exhausted::Finish),
        _ => Err(format!("expected cut or finish, not {value:?}")),
    }
}

/// The name of a mode, as the flag and the table write it.
pub(crate) fn mode_name(mode: Exhausted) -> &'static str {
    match mode {
        Exhausted::Cut => "cut",
        Exhausted::Finish => "finish",
    }
}

impl Config {
    pub(crate) fn upstream(&self) -> Upstream {
        Upstream {
            tokens: self.tokens,
            pace: self.pace,
        }
    }

    pub(crate) fn policy(&self, budget: u64) -> Result<Policy, String> {
        Quota::new(budget, self.period)
            .map(Policy::token_bucket)
            .map_err(|e| format!("--budget {budget} --period {:?}: {e}", self.period))
    }
}

/// The gateway: the stand-in upstream behind a budget of `policy` output tokens per `x-api-key` (and, with
/// `--org-budget`, of total tokens per day per `x-org`, decided with it as one), reserved up front, debited as the
/// response streams, cut or owed at the budget as `mode` says.
pub(crate) fn gateway<St: Store>(
    config: &Config,
    policy: Policy,
    store: Arc<St>,
    mode: Exhausted,
) -> Result<Router, String> {
    let budget = |name: &'static str, policy: Policy, header: &'static str, tokens: Tokens| {
        let streamed = Streamed::new(tokens)
            .on_exhausted(mode)
            .batch(config.batch, config.batch_interval);
        let key = HeaderKey::new(axum::http::HeaderName::from_static(header));
        RateLimitLayer::new(name, policy, store.clone(), key)
            .cost(Reserve::new(tokens, config.reserve))
            .cost_after(CostAfter::Streamed(streamed))
    };
    let mut limits = vec![(budget("tokens", policy, "x-api-key", Tokens::Output), true)];
    if let Some(org_budget) = config.org_budget {
        let per_day = Quota::new(org_budget, Duration::from_secs(86_400))
            .map(Policy::token_bucket)
            .map_err(|e| format!("--org-budget {org_budget}: {e}"))?;
        limits.push((budget("org", per_day, "x-org", Tokens::Total), true));
    }
    let upstream = config.upstream();
    Ok(Router::new()
        .route(
            "/v1/chat/completions",
            post(move |body: Bytes| upstream.complete(body)),
        )
        .layer(
            tower::ServiceBuilder::new()
                .layer(MaxTokensLayer::new(64 * 1024))
                .layer(StreamCostLayer::new(OpenAiSse::new()))
                .layer(HttpLimitLayer::new(RateLimitSetLayer::new(limits))),
        ))
}

#[tokio::main]
async fn main() {
    let config: Config = cli::parse();
    if config.serve {
        if let Err(e) = serve(&config).await {
            cli::fail(e);
        }
        return;
    }
    std::process::exit(sim::run(&config).await);
}

async fn serve(config: &Config) -> Result<(), String> {
    let budget = config.budget.unwrap_or(20_000);
    let policy = config.policy(budget)?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| format!("--addr {}: {e}", config.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mode = mode_name(config.on_exhausted);
    let app = match config.redis.build(|b| b).await.map_err(|e| e.to_string())? {
        Some(store) => {
            println!(
                "listening on http://{addr}/v1/chat/completions ({budget} output tokens per {:?} \
                 per x-api-key, {mode} at the budget, on Redis {})",
                config.period,
                config.redis.target().unwrap_or_default()
            );
            gateway(config, policy, Arc::new(store), config.on_exhausted)?
        }
        None => {
            println!(
                "listening on http://{addr}/v1/chat/completions ({budget} output tokens per {:?} \
                 per x-api-key, {mode} at the budget, in process)",
                config.period
            );
            gateway(
                config,
                policy,
                Arc::new(MemoryStore::new()),
                config.on_exhausted,
            )?
        }
    };
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}
