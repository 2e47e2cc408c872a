//! The closed-loop load: each connection sends its next request as soon as the last one is answered, `GET /`
//! (limited) and `GET /health` (never limited) interleaved on the same connection, so that the two latencies are
//! measured under the same conditions and their difference is what the limiter adds. Every request is recorded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::client::{Conn, Reply};

/// A request not answered within this is recorded as `timeout` (and its connection dropped): far above any
/// latency a healthy run sees, short enough that a hung server cannot hang the harness.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection waits before connecting again after a failed attempt.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);

/// One request.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    /// When its answer arrived (or it failed), from the start of the load.
    pub(crate) done: Duration,
    /// From sending it to its answer.
    pub(crate) latency: Duration,
    /// `GET /health` (else `GET /`).
    pub(crate) health: bool,
    /// `None`: answered 200. Otherwise the refusal's kind: `429/<limiter>`, `503/<cause>/<limiter>` (from the
    /// problem+json body), `<status>` for another status, `io/<error>` or `timeout` for no answer; `health/…` in
    /// front for the unlimited route.
    pub(crate) refusal: Option<String>,
}

/// When the load stops.
#[derive(Debug, Clone)]
pub(crate) enum Until {
    /// After this many `GET /` requests in all (the `GET /health` between them come on top).
    Count(u64),
    /// When [`Running::stop`] is called.
    Stopped,
}

/// A load that is running.
#[derive(Debug)]
pub(crate) struct Running {
    /// When the load started: [`Sample::done`] counts from here.
    pub(crate) started: Instant,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Vec<Sample>>>,
}

/// A finished load.
#[derive(Debug)]
pub(crate) struct Load {
    /// Every request, in order of completion.
    pub(crate) samples: Vec<Sample>,
    /// From the start to the last answer.
    pub(crate) elapsed: Duration,
}

/// Starts `connections` connections to `addr`, each sending `GET /` and, after every `health_every`-th of them,
/// `GET /health`, until `until`.
pub(crate) fn start(
    addr: SocketAddr,
    connections: usize,
    until: Until,
    health_every: u64,
) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks = (0..connections)
        .map(|_| {
            let (stop, issued, until) = (Arc::clone(&stop), Arc::clone(&issued), until.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut conn: Option<Conn> = None;
                loop {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = issued.fetch_add(1, Ordering::Relaxed);
                    if let Until::Count(n) = until
                        && i >= n
                    {
                        break;
                    }
                    samples.push(one(addr, &mut conn, "/", started).await);
                    if health_every > 0 && i % health_every == 0 {
                        samples.push(one(addr, &mut conn, "/health", started).await);
                    }
                }
                samples
            })
        })
        .collect();
    Running {
        started,
        stop,
        tasks,
    }
}

impl Running {
    /// Asks every connection to stop after its current request.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for every connection to finish (a count-bound load ends by itself; a [`Until::Stopped`] one needs
    /// [`stop`](Self::stop) first).
    pub(crate) async fn join(self) -> Result<Load, String> {
        let mut samples = Vec::new();
        for task in self.tasks {
            samples.extend(
                task.await
                    .map_err(|e| format!("a load connection failed: {e}"))?,
            );
        }
        let elapsed = samples.iter().map(|s| s.done).max().unwrap_or_default();
        samples.sort_by_key(|s| s.done);
        Ok(Load { samples, elapsed })
    }
}

/// One request on `conn` (connected first if it is not), recorded.
async fn one(addr: SocketAddr, conn: &mut Option<Conn>, path: &str, started: Instant) -> Sample {
    let health = path == "/health";
    let sent = Instant::now();
    let refusal = match send(addr, conn, path).await {
        Ok(reply) if reply.status == 200 => None,
        Ok(reply) => Some(refusal_kind(&reply)),
        Err(kind) => {
            *conn = None;
            Some(kind)
        }
    };
    let refusal = refusal.map(|r| if health { format!("health/{r}") } else { r });
    let now = Instant::now();
    Sample {
        done: now - started,
        latency: now - sent,
        health,
        refusal,
    }
}

/// Sends `path` on `conn`, connecting first if needed; a failure as its refusal kind.
async fn send(addr: SocketAddr, conn: &mut Option<Conn>, path: &str) -> Result<Reply, String> {
    let attempt = async {
        if conn.is_none() {
            match Conn::connect(addr).await {
                Ok(c) => *conn = Some(c),
                Err(e) => {
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    return Err(format!("connect/{:?}", e.kind()));
                }
            }
        }
        let Some(c) = conn.as_mut() else {
            return Err("io/no connection".to_owned());
        };
        c.get(path).await.map_err(|e| format!("io/{:?}", e.kind()))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
        Err(_) => Err("timeout".to_owned()),
        Ok(Err(kind)) => Err(kind),
        Ok(Ok(reply)) => {
            if reply.closing {
                *conn = None;
            }
            Ok(reply)
        }
    }
}

/// `429/<limiter>` or `503/<cause>/<limiter>` from a rejection's problem+json body (`limiter`, `kind`), else the
/// status alone.
pub(crate) fn refusal_kind(reply: &Reply) -> String {
    let problem: Option<serde_json::Value> = serde_json::from_slice(&reply.body).ok();
    let field = |name: &str| {
        problem
            .as_ref()
            .and_then(|p| p.get(name))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    match (reply.status, field("limiter"), field("kind")) {
        (429, Some(limiter), _) => format!("429/{limiter}"),
        (503, Some(limiter), Some(kind)) => format!("503/{kind}/{limiter}"),
        (status, _, _) => status.to_string(),
    }
}

/// The `p`-th percentile (0 to 100) of `sorted`, nearest rank; zero when empty.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The latencies of one route, sorted (every answer counts, refused or not: what a client waits for; requests
/// with no answer are left out).
pub(crate) fn latencies(samples: &[Sample], health: bool) -> Vec<Duration> {
    let mut out: Vec<Duration> = samples
        .iter()
        .filter(|s| s.health == health)
        .filter(|s| {
            !s.refusal.as_deref().is_some_and(|r| {
                r.contains("io/") || r.contains("timeout") || r.contains("connect/")
            })
        })
        .map(|s| s.latency)
        .collect();
    out.sort_unstable();
    out
}

/// The recovery after `restored` (Redis answering within budget again, from the start of the load): the time to
/// the first request answered 200 after which no request is refused, both routes counted. `None` when the load
/// ended refused, or with no 200 after `restored` at all.
pub(crate) fn recovery(samples: &[Sample], restored: Duration) -> Option<Duration> {
    let after: Vec<&Sample> = samples.iter().filter(|s| s.done >= restored).collect();
    let last_refused = after.iter().rposition(|s| s.refusal.is_some());
    let from = last_refused.map_or(0, |i| i + 1);
    after[from..]
        .iter()
        .find(|s| s.refusal.is_none())
        .map(|s| s.done - restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ms: u64, refused: bool) -> Sample {
        Sample {
            done: Duration::from_millis(ms),
            latency: Duration::from_millis(1),
            health: false,
            refusal: refused.then(|| "503/store_unavailable/x".to_owned()),
        }
    }

    #[test]
    fn recovery_counts_to_the_first_success_after_the_last_refusal() {
        let run = [
            sample(900, true),
            sample(1_000, true),
            sample(1_100, false),
            sample(1_200, true),
            sample(1_300, false),
            sample(1_400, false),
        ];
        assert_eq!(
            recovery(&run, Duration::from_millis(1_000)),
            Some(Duration::from_millis(300))
        );
        assert_eq!(
            recovery(&run, Duration::from_millis(1_250)),
            Some(Duration::from_millis(50))
        );
        assert_eq!(recovery(&run[..4], Duration::from_millis(1_000)), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sorted, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&sorted, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&[], 99.0), Duration::ZERO);
    }
}
