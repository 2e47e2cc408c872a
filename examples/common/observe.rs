//! Seeing what the limiters do, in the example servers — and the way to wire it in your own service:
//!
//! 1. install a Prometheus recorder (`metrics-exporter-prometheus`, no default features: no listener or push
//!    gateway of its own) **before building the layers**, which register their counters once;
//! 2. serve its rendering at `GET /metrics` on a listener of your own (here a second axum router, so the scrape
//!    endpoint is never behind the rate limit), and run its upkeep now and then;
//! 3. optionally install a `tracing` subscriber: at `DEBUG` on the target `tollgate::decision` it gets one event per
//!    decision (limiter, algorithm, store, outcome, remaining, store latency).
//!
//! Included with `#[path = "common/observe.rs"] mod observe;`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Histogram buckets of every `*_seconds` series (store latency): 50 µs to 2.5 s, so that p50 and p99 of a loopback
/// Redis (≈ 0.1–1 ms) and of a struggling one (the 250 ms timeout) both fall between bounds.
pub(crate) const SECONDS_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    2.5,
];

/// How often the exporter's upkeep runs (it drains histogram samples into their buckets).
const UPKEEP: Duration = Duration::from_secs(5);

/// Installs the global Prometheus recorder with [`SECONDS_BUCKETS`] for latencies.
pub(crate) fn install_prometheus() -> Result<PrometheusHandle, String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("metrics: {e}"))
}

/// Serves `handle`'s rendering at `GET /metrics` on `addr` (a port of 0 picks one), and runs its upkeep; the
/// address it listens on.
pub(crate) async fn serve_metrics(
    addr: SocketAddr,
    handle: PrometheusHandle,
) -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP).await;
            upkeep.run_upkeep();
        }
    });
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                // Drain pending histogram samples first, so a scrape sees every request answered before it.
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
            eprintln!("metrics endpoint failed: {e}");
        }
    });
    Ok(bound)
}

/// A `tracing` subscriber on stderr at `level`.
pub(crate) fn install_log(level: tracing::Level) -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .try_init()
        .map_err(|e| format!("--log: {e}"))
}

/// Sets up what `flags` ask for, before any layer is built: the log subscriber and the Prometheus recorder. Serve
/// the returned handle with [`serve_metrics`] once the server listens.
pub(crate) fn install(
    flags: &crate::server::ObserveArgs,
) -> Result<Option<(SocketAddr, PrometheusHandle)>, String> {
    if let Some(level) = flags.log {
        install_log(level)?;
    }
    flags
        .metrics_addr
        .map(|addr| install_prometheus().map(|handle| (addr, handle)))
        .transpose()
}
