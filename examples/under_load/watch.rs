//! The server's degraded decisions over time: those its failure policy answered because Redis could not
//! (`tollgate_decisions_total{outcome="store_error_…"}`), read off its metrics page every few milliseconds. A
//! `local` or `open` policy refuses nothing while Redis is out, so the refusals alone cannot say when the server
//! decides on Redis again; these counts can.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::client;

/// How often the metrics page is read: the resolution of the time back on Redis.
const EVERY: Duration = Duration::from_millis(25);

/// A watch that is running.
#[derive(Debug)]
pub(crate) struct Watch {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<(Duration, u64)>>,
}

/// Reads the degraded decisions of the server whose metrics are at `metrics`, from `started` on.
pub(crate) fn start(metrics: SocketAddr, started: Instant) -> Watch {
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        while !stopping.load(Ordering::Relaxed) {
            if let Ok(reply) = client::get_once(metrics, "/metrics").await {
                let page = String::from_utf8_lossy(&reply.body);
                seen.push((started.elapsed(), degraded(&page)));
            }
            tokio::time::sleep(EVERY).await;
        }
        seen
    });
    Watch { stop, task }
}

impl Watch {
    /// Stops it: the counts read, each with when it was read (from the start of the load).
    pub(crate) async fn stop(self) -> Vec<(Duration, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// The degraded decisions a Prometheus page counts, every limiter together.
fn degraded(page: &str) -> u64 {
    page.lines()
        .filter(|line| {
            line.starts_with("tollgate_decisions_total{") && line.contains("store_error_")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|n| n as u64)
        .sum()
}

/// How long after `restored` the server still answered by its failure policy: the time of the last reading
/// whose count had grown (zero when none grew after `restored`); `None` when it was still growing at the end.
pub(crate) fn back_on_redis(seen: &[(Duration, u64)], restored: Duration) -> Option<Duration> {
    let last_growth = seen
        .windows(2)
        .rposition(|pair| pair[1].1 > pair[0].1)
        .map(|i| i + 1);
    match last_growth {
        Some(i) if i + 1 == seen.len() => None,
        Some(i) => Some(seen[i].0.saturating_sub(restored)),
        None => Some(Duration::ZERO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_degraded_outcomes_count() {
        let page = "# TYPE tollgate_decisions_total counter\n\
            tollgate_decisions_total{limiter=\"per-client\",outcome=\"allowed\"} 900\n\
            tollgate_decisions_total{limiter=\"per-client\",outcome=\"store_error_local\"} 40\n\
            tollgate_decisions_total{limiter=\"concurrency\",outcome=\"store_error_closed\"} 2\n\
            tollgate_store_errors_total{limiter=\"per-client\",kind=\"timeout\"} 7\n";
        assert_eq!(degraded(page), 42);
    }

    #[test]
    fn back_on_redis_is_the_last_growth_after_the_restore() {
        let ms = Duration::from_millis;
        let seen = [
            (ms(0), 0),
            (ms(100), 5),
            (ms(200), 9),
            (ms(300), 9),
            (ms(400), 9),
        ];
        assert_eq!(back_on_redis(&seen, ms(150)), Some(ms(50)));
        assert_eq!(back_on_redis(&seen, ms(250)), Some(ms(0)));
        assert_eq!(
            back_on_redis(&seen[..3], ms(150)),
            None,
            "still degraded at the end"
        );
        assert_eq!(
            back_on_redis(&[(ms(0), 0), (ms(25), 0)], ms(10)),
            Some(ms(0))
        );
    }
}
