//! Decisions per second through `RedisStore` next to `redis-benchmark` running `EVALSHA` of the same script, at
//! the same concurrency, against the same server, in one run.
//!
//! ```text
//! cargo run --release -p tollgate-redis --example vs_redis_benchmark [-- --requests 60000 --rounds 3 --url redis://… --current-thread]
//! ```
//!
//! Without `--url` it starts a private `redis-server` (so `INFO commandstats` counts only this run and other
//! load on the machine's shared Redis does not skew the comparison). Every request is admitted (the limit is
//! huge), so each one runs the whole script including its writes, on 100 000 random keys, like
//! `redis-benchmark -r 100000`.
//!
//! The `leases dec/s` column is the same concurrency of clients deciding through a `RateLimitLayer` with token
//! leases on 16 hot keys (a batch per key is one `EVALSHA` of `lua/token_bucket_lease.lua`; decisions in between
//! are local), beside `redis-benchmark -P 16` of the plain script: the ceiling of one Redis without leases.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{Policy, Quota, Store};
use tollgate_redis::{RedisStore, TOKEN_BUCKET_LUA};
use tollgate_testkit::redis::{RedisServer, binary, cli_url};

const KEYSPACE: u64 = 100_000;
const PIPELINE: usize = 16;

/// The command line.
#[derive(clap::Parser)]
#[command(
    about = "RedisStore's decisions per second beside redis-benchmark running the same script"
)]
struct Flags {
    /// Requests per run (a quarter at concurrency 1)
    #[arg(long, value_name = "N", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    requests: u64,

    /// Alternating rounds (the median is printed)
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(usize))]
    rounds: usize,

    /// A Redis to measure on [default: a private redis-server, so that INFO commandstats counts only this run]
    #[arg(long, value_name = "URL")]
    url: Option<String>,

    /// The client on tokio's single-threaded runtime (no cross-thread wake-ups per reply)
    #[arg(long)]
    current_thread: bool,
}

fn evalsha_calls(url: &str) -> u64 {
    let info = cli_url(url, &["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Client commands other than the script's own and this program's bookkeeping.
fn client_calls(url: &str) -> u64 {
    let internal = [
        "time",
        "hmget",
        "hset",
        "pexpire",
        "info",
        "config|resetstat",
        "script|load",
    ];
    cli_url(url, &["INFO", "commandstats"])
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| !internal.contains(name))
        .filter_map(|(_, rest)| {
            rest.split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn store_rate(url: &str, policy: Policy, concurrency: usize, requests: u64) -> (f64, u64) {
    let store = Arc::new(
        RedisStore::builder(url)
            .namespace("bench")
            .pool_size(concurrency)
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("store builds"),
    );
    // Warm up: load the script and open the connections.
    let mut warm = Vec::new();
    for i in 0..concurrency {
        let store = store.clone();
        warm.push(tokio::spawn(async move {
            store
                .check(&format!("warm{i}"), &policy, 1)
                .await
                .map(|_| ())
        }));
    }
    for w in warm {
        w.await.unwrap().expect("warm-up decision");
    }
    assert_eq!(cli_url(url, &["CONFIG", "RESETSTAT"]), "OK");
    let per_task = requests / concurrency as u64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ (t as u64 + 1);
            let mut errors = 0_u64;
            for _ in 0..per_task {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = format!("{:012}", x % KEYSPACE);
                if store.check(&key, &policy, 1).await.is_err() {
                    errors += 1;
                }
            }
            errors
        }));
    }
    let mut errors = 0;
    for t in tasks {
        errors += t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let done = per_task * concurrency as u64;
    assert_eq!(errors, 0, "{errors} decisions failed");
    let commands = client_calls(url);
    (done as f64 / elapsed, commands * 1_000 / done.max(1))
}

/// Hot keys: each client task decides on one of these through a layer with token leases.
const HOT_KEYS: u64 = 16;

/// A reply the layer can put its verdict in.
#[derive(Debug, Default)]
struct Reply(tollgate_tower::Verdicts);
impl tollgate_tower::VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut tollgate_tower::Verdicts {
        &mut self.0
    }
}

/// Decisions per second through a `RateLimitLayer` with token leases on Redis, `concurrency` client tasks on
/// `HOT_KEYS` keys; and the lease script calls per decision.
async fn leases_rate(url: &str, policy: Policy, concurrency: usize, requests: u64) -> (f64, f64) {
    use tower::{Service, ServiceExt};
    let store = Arc::new(
        RedisStore::builder(url)
            .namespace("bench-leases")
            .pool_size(concurrency.min(16))
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("store builds"),
    );
    let by_key = |k: &u64, key: &mut String| {
        key.push_str(&k.to_string());
        Ok::<_, tollgate_tower::KeyError>(())
    };
    let layer = tollgate_tower::RateLimitLayer::new("hot", policy, store, by_key)
        .leases(tollgate_tower::LeaseConfig::new());
    let leases = layer.clone(); // shares the leases
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: u64| async { Ok::<_, tollgate_tower::BoxError>(Reply::default()) });
    // Warm up: every key hot, its first batch in hand.
    for round in 0..50 {
        for k in 0..HOT_KEYS {
            let _ = svc.clone().ready().await.unwrap().call(k).await;
        }
        if round % 10 == 0 {
            leases.leases_settled().await;
        }
    }
    let before = evalsha_calls(url);
    let per_task = requests / concurrency as u64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let mut svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let mut refused = 0_u64;
            for i in 0..per_task {
                let key = (t as u64 + i) % HOT_KEYS;
                if svc.ready().await.unwrap().call(key).await.is_err() {
                    refused += 1;
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for t in tasks {
        refused += t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(refused, 0, "{refused} refused under a huge limit");
    let done = per_task * concurrency as u64;
    let calls = evalsha_calls(url) - before;
    leases.leases_shutdown().await;
    (done as f64 / elapsed, calls as f64 / done as f64)
}

fn redis_benchmark_rate(
    host: &str,
    port: &str,
    sha: &str,
    policy: &Policy,
    concurrency: usize,
    requests: u64,
    pipeline: usize,
) -> f64 {
    let quota = policy.quota();
    let out = Command::new(binary("redis-benchmark"))
        .args([
            "-h",
            host,
            "-p",
            port,
            "-c",
            &concurrency.to_string(),
            "-n",
            &requests.to_string(),
        ])
        .args([
            "-r",
            &KEYSPACE.to_string(),
            "-P",
            &pipeline.to_string(),
            "--csv",
        ])
        .args(["EVALSHA", sha, "1", "bench:{__rand_int__}:tb"])
        .args(
            [
                quota.token_bucket_token(),
                quota.token_bucket_rate(),
                quota.burst(),
                1,
            ]
            .map(|n| n.to_string()),
        )
        .arg("")
        .output()
        .expect("redis-benchmark runs");
    let text = String::from_utf8_lossy(&out.stdout);
    // --csv: a header line, then "name","rps",...
    text.lines()
        .filter_map(|l| l.split(',').nth(1))
        .find_map(|f| f.trim_matches('"').parse::<f64>().ok())
        .unwrap_or_else(|| {
            panic!(
                "cannot parse redis-benchmark output: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let flags: Flags = clap::Parser::parse();
    let (requests, rounds) = (flags.requests, flags.rounds.max(1));
    let private = flags.url.is_none().then(RedisServer::start);
    let url = flags
        .url
        .unwrap_or_else(|| private.as_ref().map(RedisServer::url).expect("started"));
    let hostport = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let (host, port) = hostport.rsplit_once(':').unwrap_or((&hostport, "6379"));
    let sha = cli_url(&url, &["SCRIPT", "LOAD", TOKEN_BUCKET_LUA]);
    assert_eq!(sha.len(), 40, "SCRIPT LOAD answered {sha}");
    // Effectively unlimited: every request is admitted and writes its state.
    let policy = Policy::token_bucket(Quota::per_second(1_000_000_000).unwrap());
    let current_thread = flags.current_thread;
    let rt = if current_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
    };

    println!(
        "RedisStore vs redis-benchmark (EVALSHA lua/token_bucket.lua), {requests} requests per run (a quarter at \
         concurrency 1), median of {rounds} alternating runs, {url}, tokio {} runtime",
        if current_thread {
            "current-thread"
        } else {
            "multi-thread"
        }
    );
    println!(
        "{:>11} | {:>16} | {:>12} | {:>16} | {:>9} | {:>17} | {:>15} | {:>15} | {:>13} | {:>16}",
        "concurrency",
        "RedisStore dec/s",
        "cmds/decision",
        "redis-bench rps",
        "ratio",
        "redis-bench -P16",
        "ratio vs -P16",
        "leases dec/s",
        "calls/decision",
        "leases vs -P16"
    );
    for concurrency in [1_usize, 16, 64] {
        let n = if concurrency == 1 {
            requests / 4
        } else {
            requests
        };
        // Alternate the contenders and keep each one's median, so a burst of other load on the machine hits
        // both rather than one.
        let (mut rb, mut ours, mut rb_pipelined, mut commands) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut leased, mut lease_calls) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            rb.push(redis_benchmark_rate(
                host,
                port,
                &sha,
                &policy,
                concurrency,
                n,
                1,
            ));
            let (rate, per_decision) = rt.block_on(store_rate(&url, policy, concurrency, n));
            ours.push(rate);
            commands.push(per_decision);
            rb_pipelined.push(redis_benchmark_rate(
                host,
                port,
                &sha,
                &policy,
                concurrency,
                n,
                PIPELINE,
            ));
            let (rate, calls) = rt.block_on(leases_rate(&url, policy, concurrency, n));
            leased.push(rate);
            lease_calls.push(calls);
        }
        let (rb, ours, rb_pipelined) = (median(rb), median(ours), median(rb_pipelined));
        let (leased, lease_calls) = (median(leased), median(lease_calls));
        let millicommands = commands.into_iter().max().unwrap_or(0);
        println!(
            "{concurrency:>11} | {ours:>16.0} | {:>12.3} | {rb:>16.0} | {:>8.2}x | {rb_pipelined:>17.0} | {:>14.2}x | {leased:>15.0} | {lease_calls:>13.4} | {:>15.2}x",
            millicommands as f64 / 1_000.0,
            ours / rb,
            ours / rb_pipelined,
            leased / rb_pipelined
        );
    }
    println!(
        "evalsha calls on the server in total: {}",
        evalsha_calls(&url)
    );
}
