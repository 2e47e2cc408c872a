//! The load generators: open loop (requests leave at the offered rate whatever the answers, as real clients do)
//! and the flood (one client's connections sending back to back).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
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
    /// Requests decided (admitted or refused) over the whole run, warm-up included: what the store calls of the
    /// same span are divided by.
    pub(crate) decided: u64,
    /// Script calls the instances' Redis stores made over the whole run (set by the caller, for Redis rows).
    pub(crate) redis_calls: Option<u64>,
}

impl Outcome {
    /// Redis script calls per decision over the whole run, for a Redis row.
    pub(crate) fn calls_per_decision(&self) -> Option<f64> {
        self.redis_calls
            .map(|calls| calls as f64 / self.decided.max(1) as f64)
    }

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
    /// Admitted or refused (200 or 429), over the whole run.
    pub(crate) decided: AtomicU64,
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
            if status
                .as_ref()
                .is_ok_and(|s| s.is_success() || *s == http::StatusCode::TOO_MANY_REQUESTS)
            {
                progress.decided.fetch_add(1, Ordering::Relaxed);
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
    let mut outcome = Arc::try_unwrap(outcome)
        .expect("all tasks done")
        .into_inner();
    outcome.decided = progress.decided.load(Ordering::Relaxed);
    outcome
}

/// What a flood observed during its measured window.
#[derive(Debug, Default)]
pub(crate) struct Flooded {
    /// Responses of any kind.
    pub(crate) served: u64,
    pub(crate) admitted: u64,
    /// Responses that were neither a 200 nor a 429.
    pub(crate) failed: u64,
    /// Store calls, by `calls`, over the window.
    pub(crate) calls: u64,
    pub(crate) admitted_per_second: Vec<u64>,
    /// Admitted over the whole run, warm-up included: what the limiter gave from its first decision on.
    pub(crate) admitted_in_run: u64,
    /// When the first request was written and the last answer read, over the whole run: every decision was made
    /// between them.
    pub(crate) span: Option<(Instant, Instant)>,
}

/// The union of two spans.
fn widen(
    a: Option<(Instant, Instant)>,
    b: Option<(Instant, Instant)>,
) -> Option<(Instant, Instant)> {
    match (a, b) {
        (Some((a0, a1)), Some((b0, b1))) => Some((a0.min(b0), a1.max(b1))),
        (a, None) => a,
        (None, b) => b,
    }
}

/// One client flooding the fleet: `connections` keep-alive connections, spread over `targets`, each sending
/// `GET /` as soon as the previous answer is in, for `warmup + duration`. `calls` reads the store calls made so
/// far; its difference over the measured window is reported (each connection has at most one request in flight
/// at either end of the window, so the window's calls and decisions align to within `connections`).
pub(crate) async fn flood(
    targets: &[SocketAddr],
    connections: usize,
    warmup: Duration,
    duration: Duration,
    calls: impl Fn() -> u64,
) -> Flooded {
    let start = Instant::now();
    let (measure_from, until) = (start + warmup, start + warmup + duration);
    let seconds = duration.as_secs().max(1) as usize;
    // The window is the span between the two call counts, whenever this task wakes to take them: responses
    // count while `phase` is MEASURING, so a late wake-up on a loaded machine shifts both counts alike.
    let phase = Arc::new(AtomicU8::new(WARMING));
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            tokio::spawn(flood_one(
                targets[i % targets.len()],
                phase.clone(),
                measure_from,
                seconds,
            ))
        })
        .collect();
    tokio::time::sleep_until(measure_from.into()).await;
    let calls_before = calls();
    phase.store(MEASURING, Ordering::SeqCst);
    tokio::time::sleep_until(until.into()).await;
    phase.store(DONE, Ordering::SeqCst);
    let mut total = Flooded {
        calls: calls() - calls_before,
        admitted_per_second: vec![0; seconds],
        ..Flooded::default()
    };
    for task in tasks {
        let one = task.await.expect("flood task");
        total.served += one.served;
        total.admitted += one.admitted;
        total.failed += one.failed;
        total.admitted_in_run += one.admitted_in_run;
        total.span = widen(total.span, one.span);
        for (sum, n) in total
            .admitted_per_second
            .iter_mut()
            .zip(one.admitted_per_second)
        {
            *sum += n;
        }
    }
    total
}

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const DONE: u8 = 2;

/// One connection of the flood (HTTP/1.1 by hand: the generator must not be what limits the rate).
async fn flood_one(
    target: SocketAddr,
    phase: Arc<AtomicU8>,
    measure_from: Instant,
    seconds: usize,
) -> Flooded {
    let mut out = Flooded {
        admitted_per_second: vec![0; seconds],
        ..Flooded::default()
    };
    let Ok(mut stream) = TcpStream::connect(target).await else {
        out.failed += 1;
        return out;
    };
    let _ = stream.set_nodelay(true);
    let (mut buf, mut chunk) = (Vec::with_capacity(8192), vec![0_u8; 8192]);
    loop {
        if phase.load(Ordering::SeqCst) == DONE {
            return out;
        }
        let sent = Instant::now();
        if stream
            .write_all(b"GET / HTTP/1.1\r\nhost: fleet\r\n\r\n")
            .await
            .is_err()
        {
            out.failed += 1;
            return out;
        }
        let Some(status) = read_response(&mut stream, &mut buf, &mut chunk).await else {
            out.failed += 1;
            return out;
        };
        let done = Instant::now();
        out.span = widen(out.span, Some((sent, done)));
        out.admitted_in_run += u64::from(status == 200);
        if phase.load(Ordering::SeqCst) != MEASURING {
            continue;
        }
        out.served += 1;
        match status {
            200 => {
                out.admitted += 1;
                let second = done.saturating_duration_since(measure_from).as_secs() as usize;
                if let Some(slot) = out.admitted_per_second.get_mut(second) {
                    *slot += 1;
                }
            }
            429 => {}
            _ => out.failed += 1,
        }
    }
}

/// Reads one response (head and `content-length` body) into `buf`, consumes it, and returns its status.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>, chunk: &mut [u8]) -> Option<u16> {
    let (status, head, body) = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let status = head.get(9..12)?.parse().ok()?;
            let len = head
                .split("\r\n")
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            break (status, end + 4, len);
        }
        let n = stream.read(chunk).await.ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    while buf.len() < head + body {
        let n = stream.read(chunk).await.ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..head + body);
    Some(status)
}
