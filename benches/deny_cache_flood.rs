//! A flood on one blocked key over loopback HTTP: Redis with the deny cache, Redis without it, and the in-process
//! store, in one run.
//!
//! `cargo bench --bench deny_cache_flood -- [--rounds 8] [--seconds 0.5] [--connections 16] [--limit 100]
//! [--period 1s] [--keys hot|cold] [--only 0|1|2] [--requests N] [--check]`
//!
//! Each variant is an axum server (one worker thread) with one token bucket (`--limit` per `--period`) on one key for
//! every request; a load generator on its own thread keeps `--connections` keep-alive connections sending `GET /` back
//! to back, for `--seconds` per turn, variants taking turns in a rotating order. Every turn uses a fresh key (a full
//! bucket), so the admissions of all variants are comparable turn by turn: at most `burst + rate × turn` each. Redis is
//! a private `redis-server` (from the testkit), whose `INFO commandstats` gives the script calls per turn. The report:
//! served req/s (median over turns), its ratio to the in-process store's and to Redis without the cache (medians of
//! per-round ratios), admitted per turn (sum, and the most over the bound), script calls per request and per rejected
//! request ((calls − admitted) / rejected), and script calls per admitted request (for a flooded key, per token
//! that accrued). The machine's load average (`/proc/loadavg`) is printed at the start and at the end.
//!
//! `--only N` runs only variant N (0 in-process, 1 Redis + deny cache, 2 Redis without it) and `--requests N`
//! ends a turn after N requests per connection instead of after `--seconds`: under `valgrind --tool=callgrind`
//! two runs of different lengths give one variant's instructions per request (the difference over the
//! difference in requests; start-up cancels out), a figure a loaded machine does not move.
//!
//! `--check` (CI's smoke run, e.g. `--rounds 2 --seconds 0.3 --check`) exits 1 if any turn admitted more than its
//! bound, or if a variant refused nothing (a flood that never reached the bound tests nothing).
//!
//! `--keys cold` gives every request a key of its own instead (a full bucket each: all admitted, nothing to
//! cache): what the cache costs the requests it cannot help, Redis with it against Redis without it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_http::HttpLimitLayer;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::{KeyError, RateLimitLayer};

#[path = "../examples/common/cli.rs"]
mod cli;

/// The command line (clap); `cargo bench` adds `--bench`, which is accepted and ignored.
#[derive(Debug, clap::Parser)]
#[command(
    name = "deny_cache_flood",
    about = "A flood on one blocked key: Redis with the deny cache, Redis without it, \
                                               and the in-process store"
)]
struct Options {
    /// Rounds: each variant takes one turn per round, in a rotating order
    #[arg(long, default_value = "8", value_parser = cli::positive_usize)]
    rounds: usize,
    /// Seconds per turn
    #[arg(long, default_value = "0.5", value_parser = seconds)]
    seconds: f64,
    /// Keep-alive connections of the load generator
    #[arg(long, default_value = "16", value_parser = cli::positive_usize)]
    connections: usize,
    /// The token bucket's limit per --period
    #[arg(long, default_value = "100", value_parser = cli::positive)]
    limit: u64,
    /// The token bucket's period, e.g. 1s, 1m, 100ms
    #[arg(long, default_value = "1s", value_parser = cli::duration)]
    period: Duration,
    /// hot: one key per turn for every request; cold: a key per request
    #[arg(long, value_enum, default_value = "hot")]
    keys: Keys,
    /// Only variant N (0 in-process, 1 Redis + deny cache, 2 Redis without it)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..3))]
    only: Option<u8>,
    /// End a turn after N requests per connection instead of after --seconds
    #[arg(long, value_name = "N", value_parser = cli::positive)]
    requests: Option<u64>,
    /// Exit 1 unless every variant that ran refused some requests and admitted none over its bound in any turn
    /// (--keys hot only: a key per request has no bound to go over)
    #[arg(long)]
    check: bool,
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Keys {
    Hot,
    Cold,
}

/// Seconds above 0 (a fraction allowed).
fn seconds(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(s),
        _ => Err("expected a number of seconds above 0".to_owned()),
    }
}

/// One variant's server: its store's limiter on the key `turn-<n>`, `n` set before each turn (with `cold`,
/// `turn-<n>-<request>`: a key per request).
fn app<St: Store>(
    store: Arc<St>,
    policy: Policy,
    turn: Arc<AtomicU64>,
    cache: bool,
    cold: bool,
) -> Router {
    let requests = Arc::new(AtomicU64::new(0));
    let key = move |_: &http::Request<axum::body::Body>, key: &mut String| {
        key.push_str("turn-");
        key.push_str(&turn.load(Ordering::Relaxed).to_string());
        if cold {
            key.push('-');
            key.push_str(&requests.fetch_add(1, Ordering::Relaxed).to_string());
        }
        Ok::<_, KeyError>(())
    };
    let layer = RateLimitLayer::new("flood", policy, store, key).deny_cache(cache);
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(HttpLimitLayer::new(layer))
}

async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    addr
}

/// Sends `GET /` on one keep-alive connection until `until`, or `requests` times: (responses, 200s).
async fn flood(addr: SocketAddr, until: Instant, requests: Option<u64>) -> (u64, u64) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (mut served, mut admitted) = (0, 0);
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0_u8; 8192];
    while requests.map_or(Instant::now() < until, |n| served < n) {
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n")
            .await
            .expect("write");
        let (head, body) = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end]).expect("utf-8 head");
                let len = head
                    .split("\r\n")
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                admitted += u64::from(head.starts_with("HTTP/1.1 200"));
                break (end + 4, len);
            }
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "connection closed");
            buf.extend_from_slice(&chunk[..n]);
        };
        while buf.len() < head + body {
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "connection closed");
            buf.extend_from_slice(&chunk[..n]);
        }
        buf.drain(..head + body);
        served += 1;
    }
    (served, admitted)
}

fn script_calls(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("calls"))
}

#[derive(Default)]
struct Totals {
    rates: Vec<f64>,
    ratios: Vec<f64>,
    /// Per round, served req/s over the cache-less Redis variant's.
    vs_plain: Vec<f64>,
    served: u64,
    admitted: u64,
    calls: u64,
    over_bound: i64,
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` gives them ("-" where there is none).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "-".into(),
        |l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// The median; NaN for none (a variant `--only` left out).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let o: Options = cli::parse();
    if o.check && o.keys == Keys::Cold {
        cli::fail(
            "--check needs --keys hot: with a key per request every request is admitted, there is no bound",
        );
    }
    let cold = o.keys == Keys::Cold;
    let only = o.only.map(usize::from);
    let load_before = load_average();
    let redis = RedisServer::start();
    let policy = Policy::token_bucket(Quota::new(o.limit, o.period).expect("a valid quota"));
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let load = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let turn = Arc::new(AtomicU64::new(0));
    let url = redis.url();
    let names = [
        "in-process (MemoryStore)",
        "Redis + deny cache",
        "Redis, no deny cache",
    ];
    let addrs: Vec<SocketAddr> = servers.block_on(async {
        let store = |ns: &'static str| {
            let url = url.clone();
            async move {
                Arc::new(
                    RedisStore::builder(url)
                        .namespace(ns)
                        .build()
                        .await
                        .expect("private Redis"),
                )
            }
        };
        vec![
            serve(app(
                Arc::new(MemoryStore::new()),
                policy,
                turn.clone(),
                false,
                cold,
            ))
            .await,
            serve(app(store("cached").await, policy, turn.clone(), true, cold)).await,
            serve(app(store("plain").await, policy, turn.clone(), false, cold)).await,
        ]
    });
    let mut totals: Vec<Totals> = names.iter().map(|_| Totals::default()).collect();
    let turn_len = Duration::from_secs_f64(o.seconds);
    let bound = |elapsed: Duration| {
        let q = policy.quota();
        q.burst() + (elapsed.as_micros() as u64 * q.limit()) / q.period_micros() + 1
    };
    for round in 0..o.rounds {
        let mut rates = [0.0; 3];
        for k in 0..3 {
            let v = (round + k) % 3;
            if only.is_some_and(|only| only != v) {
                continue;
            }
            turn.fetch_add(1, Ordering::Relaxed);
            let before = script_calls(&redis);
            let start = Instant::now();
            let until = start + turn_len;
            let (served, admitted) = load.block_on(async {
                let tasks: Vec<_> = (0..o.connections)
                    .map(|_| tokio::spawn(flood(addrs[v], until, o.requests)))
                    .collect();
                let mut sum = (0, 0);
                for t in tasks {
                    let (s, a) = t.await.expect("load task");
                    sum = (sum.0 + s, sum.1 + a);
                }
                sum
            });
            let elapsed = start.elapsed();
            let calls = script_calls(&redis) - before;
            let t = &mut totals[v];
            rates[v] = served as f64 / elapsed.as_secs_f64();
            t.rates.push(rates[v]);
            t.served += served;
            t.admitted += admitted;
            t.calls += calls;
            if !cold {
                t.over_bound = t.over_bound.max(admitted as i64 - bound(elapsed) as i64);
            }
        }
        // With `--only`, the other variants did not run: no ratios.
        for v in 0..3 {
            if rates[v] > 0.0 && rates[0] > 0.0 {
                totals[v].ratios.push(rates[v] / rates[0]);
            }
            if rates[v] > 0.0 && rates[2] > 0.0 {
                totals[v].vs_plain.push(rates[v] / rates[2]);
            }
        }
    }
    println!(
        "flood on {}: token bucket {} per {:?}, {} connections, {} rounds of {} s turns; Redis {}",
        if cold {
            "a new key per request"
        } else {
            "one key"
        },
        o.limit,
        o.period,
        o.connections,
        o.rounds,
        o.seconds,
        redis.url()
    );
    println!(
        "load average (1, 5, 15 min): {load_before} at the start, {} at the end",
        load_average()
    );
    println!(
        "{:<26} {:>10} {:>9} {:>9} {:>10} {:>10} {:>12} {:>14} {:>14}",
        "variant",
        "served/s",
        "vs mem",
        "vs plain",
        "admitted",
        "over bound",
        "calls/req",
        "calls/rejected",
        "calls/admitted"
    );
    for (name, t) in names.iter().zip(&mut totals) {
        if t.rates.is_empty() {
            continue;
        }
        let rejected = t.served - t.admitted;
        println!(
            "{:<26} {:>10.0} {:>8.3}x {:>8.3}x {:>10} {:>10} {:>12.4} {:>14.4} {:>14.3}",
            name,
            median(&mut t.rates),
            median(&mut t.ratios),
            median(&mut t.vs_plain),
            t.admitted,
            t.over_bound.max(0),
            t.calls as f64 / t.served as f64,
            t.calls.saturating_sub(t.admitted) as f64 / rejected.max(1) as f64,
            t.calls as f64 / t.admitted.max(1) as f64,
        );
    }
    if o.check {
        check(&names, &totals);
    }
}

/// `--check`: every variant that ran must have refused requests (else the flood never reached the bound and
/// nothing was tested) and admitted no turn more than `burst + rate × turn` (what one fresh bucket can give).
fn check(names: &[&str], totals: &[Totals]) {
    let mut failed = false;
    for (name, t) in names.iter().zip(totals) {
        if t.rates.is_empty() {
            continue;
        }
        let verdict = if t.over_bound > 0 {
            failed = true;
            format!("FAILED: a turn admitted {} over its bound", t.over_bound)
        } else if t.admitted == 0 || t.admitted == t.served {
            failed = true;
            format!(
                "FAILED: {} of {} admitted, the flood did not test the bound",
                t.admitted, t.served
            )
        } else {
            "ok".to_owned()
        };
        println!(
            "check: {name:<26} {} admitted of {} served, none over the bound: {verdict}",
            t.admitted, t.served
        );
    }
    if failed {
        std::process::exit(1);
    }
}
