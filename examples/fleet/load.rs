//! An open-loop load generator: requests leave at the offered rate whatever the answers, as real clients do.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{Mutex, Semaphore};

/// Most requests in flight at once: past this, the generator counts a request as not sent rather than queueing
/// without bound.
const MAX_IN_FLIGHT: usize = 1_024;

/// What one run observed during its measured window.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) admitted: u64,
    pub(crate) rejected: u64,
    pub(crate) failed: u64,
    pub(crate) not_sent: u64,
    /// Latencies of measured requests, in µs.
    pub(crate) latencies: Vec<u64>,
    /// Admitted requests per whole second of the measured window.
    pub(crate) admitted_per_second: Vec<u64>,
}

impl Outcome {
    pub(crate) fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
        Duration::from_micros(sorted[rank])
    }
}

/// Live counters for the progress line.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub(crate) sent: AtomicU64,
    pub(crate) admitted: AtomicU64,
}

/// Offers `rate` requests per second to `target` for `warmup + duration`, measuring only after the warm-up.
pub(crate) async fn offer(
    target: SocketAddr,
    rate: u64,
    warmup: Duration,
    duration: Duration,
    progress: Arc<Progress>,
) -> Outcome {
    let client: Client<_, Body> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(512)
        .build_http();
    let uri: http::Uri = format!("http://{target}/").parse().expect("target URI");
    let outcome = Arc::new(Mutex::new(Outcome {
        admitted_per_second: vec![0; duration.as_secs().max(1) as usize],
        ..Outcome::default()
    }));
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let start = Instant::now();
    let measure_from = start + warmup;
    let total = warmup + duration;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut handles = Vec::new();
    for i in 0.. {
        let due = start + interval * i;
        if due >= start + total {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let measured = due >= measure_from;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if measured {
                outcome.lock().await.not_sent += 1;
            }
            continue;
        };
        progress.sent.fetch_add(1, Ordering::Relaxed);
        let (client, uri, outcome, progress) = (
            client.clone(),
            uri.clone(),
            outcome.clone(),
            progress.clone(),
        );
        handles.push(tokio::spawn(async move {
            let sent = Instant::now();
            let status = client.get(uri).await.map(|r| r.status());
            let latency = sent.elapsed();
            drop(permit);
            if status.as_ref().is_ok_and(|s| s.is_success()) {
                progress.admitted.fetch_add(1, Ordering::Relaxed);
            }
            if !measured {
                return;
            }
            let mut o = outcome.lock().await;
            match status {
                Ok(s) if s.is_success() => {
                    o.admitted += 1;
                    let second = (due - measure_from).as_secs() as usize;
                    if let Some(slot) = o.admitted_per_second.get_mut(second) {
                        *slot += 1;
                    }
                }
                Ok(s) if s == http::StatusCode::TOO_MANY_REQUESTS => o.rejected += 1,
                _ => o.failed += 1,
            }
            o.latencies.push(latency.as_micros() as u64);
        }));
    }
    for handle in handles {
        handle.await.expect("request task");
    }
    Arc::try_unwrap(outcome)
        .expect("all tasks done")
        .into_inner()
}
