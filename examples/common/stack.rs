//! The Stripe-stack part of the example servers: the flags `--concurrency`, `--worker-capacity`,
//! `--fleet-capacity`, `--fleet-reserve`, `--adaptive` (clap), the `GET /slow?ms=N` handler, and the
//! [`StackLayer`] they configure.
//!
//! Included with `#[path = "common/stack.rs"] mod stack;`. A limiter whose flag is absent is built switched off
//! (`Mode::Off`: no store call, no rejection), so the stack has one type whatever the flags.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tollgate::FailurePolicy;
use tollgate::http::priority::HeaderPriority;
use tollgate::slot::SlotStore;
use tollgate::tower::Mode;
use tollgate::tower::limit::adaptive::Control;
use tollgate::tower::{
    AdaptiveLimitLayer, ConcurrencyLimitLayer, FleetShedLayer, StackLayer, WorkerShedLayer,
};

/// The longest `/slow` sleep, so a typo cannot hold a connection for hours.
pub(crate) const MAX_SLOW_MS: u64 = 60_000;

/// The stack's flags.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "The Stripe stack")]
pub(crate) struct StackFlags {
    /// At most N requests in flight per client on limited routes (429 beyond)
    #[arg(long, value_name = "N", value_parser = crate::cli::positive)]
    pub(crate) concurrency: Option<u64>,

    /// This instance's capacity in requests in flight (503 beyond): each class is admitted only below its share
    /// of it (Low 60 %, Normal 75 %, High 90 %, Critical 100 %), and sheds more below those lines while
    /// utilization stays high
    #[arg(long, value_name = "N", value_parser = crate::cli::positive)]
    pub(crate) worker_capacity: Option<u64>,

    /// Requests in flight across every instance sharing the Redis (503 beyond the non-reserved share for
    /// non-critical requests)
    #[arg(long, value_name = "N", value_parser = crate::cli::positive)]
    pub(crate) fleet_capacity: Option<u64>,

    /// Share of --fleet-capacity reserved for critical requests [default: 20]
    #[arg(long, value_name = "PERCENT", value_parser = reserve)]
    pub(crate) fleet_reserve: Option<u8>,

    /// This instance's concurrency limit follows the latency of its requests (from 20 to 200 in flight; 503
    /// beyond), each class guaranteed a share of it (Critical 50 %, High 20 %, Normal 20 %, Low 10 %)
    #[arg(long, value_name = "ALG", value_parser = crate::server::adaptive())]
    pub(crate) adaptive: Option<Control>,
}

/// `--fleet-reserve`: a percentage from 0 to 100.
fn reserve(v: &str) -> Result<u8, String> {
    v.trim_end_matches('%')
        .parse::<u8>()
        .ok()
        .filter(|p| *p <= 100)
        .ok_or_else(|| "expected a percentage from 0 to 100".to_owned())
}

impl StackFlags {
    /// Checks the combination: the fleet shedder counts across instances, so it needs Redis.
    pub(crate) fn validate(&self, has_redis: bool) -> Result<(), String> {
        if self.fleet_reserve.is_some() && self.fleet_capacity.is_none() {
            return Err("--fleet-reserve needs --fleet-capacity".to_owned());
        }
        if self.fleet_capacity.is_some() && !has_redis {
            return Err(
                "--fleet-capacity and --fleet-reserve need --redis-url: the fleet's in-flight requests are counted \
                 in Redis"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// A one-line summary for the start-up message.
    pub(crate) fn describe(&self) -> String {
        let show = |v: Option<u64>| v.map_or_else(|| "off".to_owned(), |n| n.to_string());
        format!(
            "concurrency {}, worker capacity {}, fleet capacity {} (reserve {} %), adaptive limit {}",
            show(self.concurrency),
            show(self.worker_capacity),
            show(self.fleet_capacity),
            self.fleet_reserve.unwrap_or(20),
            self.adaptive.as_ref().map_or("off", Control::as_str)
        )
    }
}

/// The layer [`layer`] builds: worker shedder, adaptive limiter, rate limiter `R`, concurrency limiter, fleet
/// shedder.
pub(crate) type Stack<R, K, L> = StackLayer<
    WorkerShedLayer<HeaderPriority>,
    R,
    ConcurrencyLimitLayer<K, L>,
    FleetShedLayer<HeaderPriority, L>,
    AdaptiveLimitLayer<HeaderPriority>,
>;

/// The stack of the limited routes: worker shedder → adaptive limiter → `rate` → concurrency limiter (per client `key`) → fleet
/// shedder, the slots counted in `slots` (Redis with `--redis-url`, else in process). The concurrency limiter
/// answers a failing store with `on_store_error`; the fleet shedder fails open (shedding protects the service:
/// rejecting everything while Redis is down would cause the outage it is there to prevent).
pub(crate) fn layer<R, K: Clone, L: SlotStore>(
    flags: &StackFlags,
    rate: R,
    slots: Arc<L>,
    key: K,
    on_store_error: FailurePolicy,
) -> Result<Stack<R, K, L>, String> {
    let on = |flag: Option<u64>| {
        if flag.is_some() {
            Mode::Enforce
        } else {
            Mode::Off
        }
    };
    let worker = WorkerShedLayer::new(flags.worker_capacity.unwrap_or(1), HeaderPriority::new())
        .map_err(|e| e.to_string())?
        .mode(on(flags.worker_capacity));
    let concurrency = ConcurrencyLimitLayer::new(
        "concurrency",
        flags.concurrency.unwrap_or(1),
        slots.clone(),
        key,
    )
    .map_err(|e| e.to_string())?
    .on_store_error(on_store_error)
    .mode(on(flags.concurrency));
    let fleet = FleetShedLayer::new(
        flags.fleet_capacity.unwrap_or(1),
        slots,
        HeaderPriority::new(),
    )
    .and_then(|f| f.reserve_percent(flags.fleet_reserve.unwrap_or(20)))
    .map_err(|e| e.to_string())?
    .mode(on(flags.fleet_capacity));
    let adaptive = AdaptiveLimitLayer::new(
        flags.adaptive.unwrap_or_else(Control::gradient2),
        HeaderPriority::new(),
    )
    .map_err(|e| e.to_string())?
    .mode(if flags.adaptive.is_some() {
        Mode::Enforce
    } else {
        Mode::Off
    });
    Ok(StackLayer::new()
        .worker_shedder(worker)
        .adaptive_limit(adaptive)
        .rate_limit(rate)
        .concurrency_limit(concurrency)
        .fleet_shedder(fleet))
}

/// `GET /slow?ms=N`: sleeps N milliseconds (at most a minute), then answers; a bad `ms` is a 400.
pub(crate) async fn slow(uri: axum::http::Uri) -> Result<String, (axum::http::StatusCode, String)> {
    let ms = match uri
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|p| p.strip_prefix("ms="))
    {
        None => 0,
        Some(v) => v.parse::<u64>().map_err(|_| {
            (
                axum::http::StatusCode::BAD_REQUEST,
                format!("ms={v:?}: expected a whole number of milliseconds\n"),
            )
        })?,
    }
    .min(MAX_SLOW_MS);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(format!("slept {ms} ms\n"))
}
