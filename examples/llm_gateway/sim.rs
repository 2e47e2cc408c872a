//! The simulation: 4 gateway instances on one store, 64 concurrent streaming clients on 4 keys, once with streams
//! cut at the budget and once with streams finished and the overdraft owed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate::redis::RedisStore;
use tollgate::tower::stream_cost::Exhausted;
use tollgate::{MemoryStore, Store};
use tollgate_testkit::redis::RedisServer;

use crate::{Config, gateway, mode_name};

const INSTANCES: usize = 4;
const CLIENTS: usize = 64;
const KEYS: usize = 4;

/// One mode's row.
#[derive(Debug)]
struct Row {
    mode: Exhausted,
    budget: u64,
    /// The most any key was served, in tokens the clients received.
    served: u64,
    /// What the budget refilled during the run, at most (the run's length at the budget's rate).
    refill: u64,
    /// `served − budget − refill` for that key (negative: under).
    over: i64,
    /// What `cut` may overspend: one debit batch per instance.
    slack: u64,
    streams: u64,
    streams_cut: u64,
    tokens: u64,
    store_calls: Option<u64>,
    /// For `finish`: every key in debt refused on its next request, for at least the time to repay it.
    repaid_ok: bool,
    /// The shortest Retry-After of a key's next request (seconds), when refused.
    next_retry_s: Option<u64>,
    seconds: f64,
}

impl Row {
    fn calls_per_1000(&self) -> Option<f64> {
        let calls = self.store_calls?;
        Some(if self.tokens == 0 {
            0.0
        } else {
            calls as f64 * 1000.0 / self.tokens as f64
        })
    }

    /// The goals: with `cut`, served within the budget plus one batch per instance; with `finish`, the debt repaid
    /// before the key is admitted again; on Redis, at most 10 calls per 1 000 tokens.
    fn misses(&self) -> Vec<String> {
        let mut misses = Vec::new();
        if self.served < self.budget {
            misses.push(format!(
                "{}: the run ended ({:.0} s) before any key met its budget: nothing was measured (raise --seconds)",
                mode_name(self.mode),
                self.seconds
            ));
            return misses;
        }
        match self.mode {
            Exhausted::Cut => {
                if self.over > i64::try_from(self.slack).unwrap_or(i64::MAX) {
                    misses.push(format!(
                        "cut: served {} > budget {} + refill {} + one batch per instance {}",
                        self.served, self.budget, self.refill, self.slack
                    ));
                }
            }
            Exhausted::Finish => {
                if !self.repaid_ok {
                    misses.push("finish: a key in debt was admitted before repaying it".to_owned());
                }
            }
        }
        if let Some(calls) = self.calls_per_1000().filter(|c| *c > 10.0) {
            misses.push(format!(
                "{}: {calls:.1} Redis calls per 1 000 tokens > 10",
                mode_name(self.mode)
            ));
        }
        misses
    }
}

/// The store the instances share: the Redis the flags name, else a private redis-server, else one in-process
/// store.
enum Shared {
    Redis(Option<Box<RedisServer>>),
    Memory(Arc<MemoryStore>),
}

pub(crate) async fn run(config: &Config) -> i32 {
    let budget = config.budget.unwrap_or(20_000);
    let policy = match config.policy(budget) {
        Ok(policy) => policy,
        Err(e) => crate::cli::fail(e),
    };
    let shared = if config.redis.is_set() {
        Shared::Redis(None)
    } else if tollgate_testkit::redis::installed("redis-server") {
        Shared::Redis(Some(Box::new(RedisServer::start())))
    } else {
        Shared::Memory(Arc::new(MemoryStore::new()))
    };
    let on = match &shared {
        Shared::Redis(None) => format!("Redis {}", config.redis.target().unwrap_or_default()),
        Shared::Redis(Some(server)) => format!("a private redis-server ({})", server.url()),
        Shared::Memory(_) => "one in-process store (no redis-server found)".to_owned(),
    };
    println!(
        "llm_gateway: {INSTANCES} instances on {on}, {CLIENTS} streaming clients on {KEYS} keys; budget {budget} \
         output tokens per {:?} per key; streams of {} tokens every {:?}, {} reserved, debits every {} tokens or {:?}",
        config.period,
        config.tokens,
        config.pace,
        config.reserve,
        config.batch,
        config.batch_interval
    );
    let mut rows = Vec::new();
    for mode in [Exhausted::Cut, Exhausted::Finish] {
        let row = match &shared {
            Shared::Redis(server) => {
                let mut args = config.redis.clone();
                if let Some(server) = server {
                    args.redis_url = Some(server.url());
                }
                let mut stores = Vec::new();
                for _ in 0..INSTANCES {
                    match args.build(|b| b).await {
                        Ok(Some(store)) => stores.push(Arc::new(store)),
                        Ok(None) => unreachable!("a Redis URL is set"),
                        Err(e) => crate::cli::fail(e),
                    }
                }
                let calls = |stores: &[Arc<RedisStore>]| {
                    stores.iter().map(|s| s.script_calls()).sum::<u64>()
                };
                let before = calls(&stores);
                let mut row = one_mode(config, policy, &stores, mode, budget).await;
                row.store_calls = Some(calls(&stores) - before);
                row
            }
            Shared::Memory(store) => {
                let stores = vec![store.clone(); INSTANCES];
                one_mode(config, policy, &stores, mode, budget).await
            }
        };
        rows.push(row);
    }
    print_table(&rows);
    let misses: Vec<String> = rows.iter().flat_map(Row::misses).collect();
    if config.json {
        for row in &rows {
            println!("{}", json(row));
        }
    }
    for miss in &misses {
        eprintln!("llm_gateway: goal missed: {miss}");
    }
    i32::from(config.check && !misses.is_empty())
}

/// Runs the clients against fresh instances with fresh keys until every client was refused or the run's time is
/// up, then asks once more per key.
async fn one_mode<St: Store>(
    config: &Config,
    policy: tollgate::Policy,
    stores: &[Arc<St>],
    mode: Exhausted,
    budget: u64,
) -> Row {
    let mut addrs = Vec::new();
    let mut servers = Vec::new();
    for store in stores {
        let app = match gateway(config, policy, store.clone(), mode) {
            Ok(app) => app,
            Err(e) => crate::cli::fail(e),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a local port");
        addrs.push(listener.local_addr().expect("a bound address"));
        servers.push(tokio::spawn(
            async move { axum::serve(listener, app).await },
        ));
    }
    let run = std::process::id() as u64 * 1_000_000
        + u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_micros(),
        );
    let keys: Vec<String> = (0..KEYS)
        .map(|k| format!("{}-{run}-{k}", mode_name(mode)))
        .collect();
    let served: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let streams = Arc::new(AtomicU64::new(0));
    let cut = Arc::new(AtomicU64::new(0));
    let client: Client<HttpConnector, Full<axum::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let started = Instant::now();
    let deadline = started + config.seconds;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let key = c % KEYS;
        let addr = addrs[(c / KEYS) % addrs.len()];
        let (client, served, streams, cut, name) = (
            client.clone(),
            served.clone(),
            streams.clone(),
            cut.clone(),
            keys[key].clone(),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                match stream_once(&client, addr, &name).await {
                    Some((tokens, was_cut)) => {
                        served[key].fetch_add(tokens, Ordering::Relaxed);
                        streams.fetch_add(1, Ordering::Relaxed);
                        cut.fetch_add(u64::from(was_cut), Ordering::Relaxed);
                    }
                    None => break,
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Let the last settles land before the keys are asked again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refill = (budget as f64 * seconds / config.period.as_secs_f64()).ceil() as u64;
    let served: Vec<u64> = served.iter().map(|s| s.load(Ordering::Relaxed)).collect();
    let tokens = served.iter().sum();
    let (worst, most) = served
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|(_, s)| *s)
        .unwrap_or((0, 0));
    // Each key asked once more: in debt it must be refused, for at least the time the debt takes to repay.
    let rate = budget as f64 / config.period.as_secs_f64();
    let mut repaid_ok = true;
    let mut next_retry_s: Option<u64> = None;
    for (k, key) in keys.iter().enumerate() {
        let debt = served[k] as f64 - budget as f64 - refill as f64;
        let answer = next_request(&client, addrs[0], key).await;
        if let Some(retry) = answer {
            next_retry_s = Some(next_retry_s.map_or(retry, |r| r.min(retry)));
        }
        if debt > 0.0 {
            // The store keeps a debt of at most one budget; repaying it takes that long at the budget's rate.
            let owed_s = (debt.min(budget as f64) / rate).floor() as u64;
            if answer.is_none_or(|retry| retry + 1 < owed_s) {
                repaid_ok = false;
            }
        }
        let _ = worst;
    }
    for server in servers {
        server.abort();
    }
    Row {
        mode,
        budget,
        served: most,
        refill,
        over: most as i64 - budget as i64 - refill as i64,
        slack: config.batch * stores.len() as u64,
        streams: streams.load(Ordering::Relaxed),
        streams_cut: cut.load(Ordering::Relaxed),
        tokens,
        store_calls: None,
        repaid_ok,
        next_retry_s,
        seconds,
    }
}

fn request(addr: SocketAddr, key: &str) -> http::Request<Full<axum::body::Bytes>> {
    let body = r#"{"model":"stand-in","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}"#;
    http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("x-api-key", key)
        // Every key of a run is in one organisation (read with --org-budget).
        .header("x-org", key.rsplit_once('-').map_or(key, |(run, _)| run))
        .header("content-type", "application/json")
        .body(Full::new(axum::body::Bytes::from_static(body.as_bytes())))
        .expect("a valid request")
}

/// One streamed completion: the content tokens received and whether it was cut; `None` when refused.
async fn stream_once(
    client: &Client<HttpConnector, Full<axum::body::Bytes>>,
    addr: SocketAddr,
    key: &str,
) -> Option<(u64, bool)> {
    let response = client.request(request(addr, key)).await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let mut body = response.into_body();
    let (mut tokens, mut cut, mut rest) = (0u64, false, Vec::new());
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        rest.extend_from_slice(data);
        while let Some(end) = rest.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = rest.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            if event.starts_with("event: error") {
                cut = true;
            } else if event.contains("\"content\"") {
                tokens += 1;
            }
        }
    }
    Some((tokens, cut))
}

/// The Retry-After (seconds) of a refused request, `None` when admitted.
async fn next_request(
    client: &Client<HttpConnector, Full<axum::body::Bytes>>,
    addr: SocketAddr,
    key: &str,
) -> Option<u64> {
    let response = client.request(request(addr, key)).await.ok()?;
    if response.status().is_success() {
        let _ = response.into_body().collect().await;
        return None;
    }
    response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .or(Some(0))
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "{:<7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>8} {:>12} {:>13} {:>8}",
        "mode",
        "budget",
        "served",
        "refill",
        "over",
        "streams",
        "cut",
        "calls/1000",
        "next retry s",
        "seconds"
    );
    for row in rows {
        let calls = row
            .calls_per_1000()
            .map_or_else(|| "-".to_owned(), |c| format!("{c:.1}"));
        let retry = row
            .next_retry_s
            .map_or_else(|| "admitted".to_owned(), |r| r.to_string());
        println!(
            "{:<7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>8} {:>12} {:>13} {:>8.1}",
            mode_name(row.mode),
            row.budget,
            row.served,
            row.refill,
            row.over,
            row.streams,
            row.streams_cut,
            calls,
            retry,
            row.seconds
        );
    }
    println!();
    println!(
        "served: the most tokens any key received; over: served - budget - refill (cut's goal: at most one debit \
         batch per instance, {}); next retry: the keys' next request (finish's goal: refused until the debt is repaid)",
        rows.first().map_or(0, |r| r.slack)
    );
}

fn json(row: &Row) -> String {
    serde_json::json!({
        "mode": mode_name(row.mode),
        "budget": row.budget,
        "served": row.served,
        "refill": row.refill,
        "over": row.over,
        "bound": row.budget + row.refill + row.slack,
        "streams": row.streams,
        "streams_cut": row.streams_cut,
        "tokens": row.tokens,
        "redis_calls_per_1000_tokens": row.calls_per_1000(),
        "next_retry_s": row.next_retry_s,
        "repaid_before_admitted": row.repaid_ok,
        "seconds": row.seconds,
        "goals_met": row.misses().is_empty(),
    })
    .to_string()
}
