//! The open-loop load: requests leave on schedule whatever the answers (as real clients do), 10 % `Critical`,
//! 30 % `Normal`, 60 % `Low`, stepped through multiples of the service's capacity; and the tally per step.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::tower::Priority;

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// 200 within the client's deadline.
    Ok,
    /// Turned away at once (503 or 429).
    Rejected,
    /// Admitted, but no answer within the deadline (the client gave up), or an error.
    Late,
}

/// One request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record {
    pub(crate) step: usize,
    pub(crate) priority: Priority,
    /// When it was sent, from the start of the run.
    pub(crate) sent: Duration,
    pub(crate) outcome: Outcome,
    /// Until the answer, or the deadline for `Late`.
    pub(crate) latency: Duration,
}

/// The priority of the `i`-th request: 1 in 10 `Critical`, 3 `Normal`, 6 `Low`, evenly interleaved.
pub(crate) fn priority(i: u64) -> Priority {
    match i % 10 {
        0 => Priority::Critical,
        3 | 6 | 9 => Priority::Normal,
        _ => Priority::Low,
    }
}

/// What one design's run observed.
pub(crate) struct Run {
    pub(crate) records: Vec<Record>,
    /// The adaptive limit every 100 ms, from the start of the run.
    pub(crate) limits: Vec<(Duration, u64)>,
}

/// Offers `load × capacity` requests per second to `addr` for `step_duration` per step of `loads`; each request
/// gives up after `deadline`. `limit`, when given, is sampled for the plot.
pub(crate) async fn offer(
    addr: SocketAddr,
    capacity: f64,
    loads: &[f64],
    step_duration: Duration,
    deadline: Duration,
    limit: Option<&(dyn Fn() -> u64 + Send + Sync)>,
) -> Run {
    let client: Client<_, Body> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build_http();
    let uri: http::Uri = format!("http://{addr}/work")
        .parse()
        .expect("a loopback URI");
    let records = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut limits = Vec::new();
    let mut next_sample = Duration::ZERO;
    let mut tasks = Vec::new();
    let mut i = 0_u64;
    for (step, load) in loads.iter().enumerate() {
        let step_start = step_duration * step as u32;
        let interval = Duration::from_secs_f64(1.0 / (load * capacity));
        for k in 0.. {
            let offset = interval * k;
            if offset >= step_duration {
                break;
            }
            let due = step_start + offset;
            if let Some(limit) = limit {
                while next_sample <= due {
                    limits.push((next_sample, limit()));
                    next_sample += Duration::from_millis(100);
                }
            }
            tokio::time::sleep_until((start + due).into()).await;
            let priority = priority(i);
            i += 1;
            let req = http::Request::get(uri.clone())
                .header("x-priority", priority.as_str())
                .body(Body::empty())
                .expect("a valid request");
            let (client, records) = (client.clone(), records.clone());
            tasks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let answer = tokio::time::timeout(deadline, async {
                    let response = client.request(req).await?;
                    let status = response.status();
                    response.into_body().collect().await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(status)
                })
                .await;
                let (outcome, latency) = match answer {
                    Ok(Ok(status)) if status == http::StatusCode::OK => {
                        (Outcome::Ok, sent.elapsed())
                    }
                    Ok(Ok(status))
                        if status == http::StatusCode::SERVICE_UNAVAILABLE
                            || status == http::StatusCode::TOO_MANY_REQUESTS =>
                    {
                        (Outcome::Rejected, sent.elapsed())
                    }
                    _ => (Outcome::Late, deadline),
                };
                records.lock().expect("records").push(Record {
                    step,
                    priority,
                    sent: sent - start,
                    outcome,
                    latency,
                });
            }));
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    let records = std::mem::take(&mut *records.lock().expect("records"));
    Run { records, limits }
}

/// One row of the report: a design at one load step.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Row {
    pub(crate) design: &'static str,
    /// Offered load, × capacity.
    pub(crate) load: f64,
    /// Successful requests (200 within the deadline) answered per second during the step, as a share of
    /// capacity.
    pub(crate) goodput: f64,
    /// Share of critical requests that succeeded.
    pub(crate) critical_success: f64,
    /// Share of requests not turned away (admitted, whatever came of them).
    pub(crate) admitted: f64,
    /// Latency of admitted requests (a request past the deadline counts as the deadline).
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) sent: usize,
}

/// The rows of one run, one per step.
pub(crate) fn rows(
    design: &'static str,
    run: &Run,
    loads: &[f64],
    step_duration: Duration,
    capacity: f64,
) -> Vec<Row> {
    loads
        .iter()
        .enumerate()
        .map(|(step, &load)| {
            let of_step: Vec<&Record> = run.records.iter().filter(|r| r.step == step).collect();
            let share = |n: usize, of: usize| if of == 0 { 1.0 } else { n as f64 / of as f64 };
            // Goodput by when the answers came (during the step), not when the requests left: a queue's backlog
            // answers long after.
            let window = step_duration * step as u32..step_duration * (step as u32 + 1);
            let ok = run
                .records
                .iter()
                .filter(|r| r.outcome == Outcome::Ok && window.contains(&(r.sent + r.latency)))
                .count();
            let critical: Vec<_> = of_step
                .iter()
                .filter(|r| r.priority == Priority::Critical)
                .collect();
            let critical_ok = critical.iter().filter(|r| r.outcome == Outcome::Ok).count();
            let mut latencies: Vec<Duration> = of_step
                .iter()
                .filter(|r| r.outcome != Outcome::Rejected)
                .map(|r| r.latency)
                .collect();
            latencies.sort_unstable();
            Row {
                design,
                load,
                goodput: ok as f64 / step_duration.as_secs_f64() / capacity,
                critical_success: share(critical_ok, critical.len()),
                admitted: share(latencies.len(), of_step.len()),
                p50_ms: percentile(&latencies, 0.50),
                p99_ms: percentile(&latencies, 0.99),
                sent: of_step.len(),
            }
        })
        .collect()
}

/// The `q`-quantile of sorted `latencies`, in milliseconds (0 when there are none).
pub(crate) fn percentile(latencies: &[Duration], q: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    let rank = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len());
    latencies[rank - 1].as_secs_f64() * 1e3
}
