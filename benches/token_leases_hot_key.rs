//! One hot key on a fleet of 4 instances sharing Redis, offered more than its limit: the in-process store, Redis
//! without leases and Redis with token leases, in one run.
//!
//! `cargo bench --bench token_leases_hot_key -- [--limit 20000] [--offered 30000] [--seconds 3] [--warmup 2.5]
//! [--open-loop] [--redis-load CLIENTS] [--check]`
//!
//! Each variant is 4 `RateLimitLayer`s (4 instances: their own store, or their own Redis pool on one private
//! `redis-server` from the testkit), one token bucket of `--limit` per second (burst = limit) on one key. An
//! open-loop generator offers `--offered` req/s in total (a quarter per instance, in 1 ms ticks) for `--warmup`
//! (which spends the burst) and then `--seconds` measured. Reported per variant: offered and admitted req/s,
//! admitted over the measured window against `limit × T + burst` (the plain path's bound) and `limit × T`,
//! Redis script calls per decision (`INFO commandstats`), and the decision latency (p50, p99) through the layer,
//! with the added p50 against the in-process store's.
//!
//! `--open-loop`: each request is a task of its own, sent when the schedule owes it whether or not the earlier
//! ones were answered (no instance falls behind its schedule): when Redis is slower than the offered rate,
//! requests pile up on it — the overloaded case, where what counts is the Redis calls per decision.
//! `--redis-load CLIENTS`: meanwhile `redis-benchmark` (CLIENTS connections, pipelines of 16 SETs on keys of its
//! own) keeps the same Redis busy, so that every call waits behind that load: a slow Redis.
//! `--check` (CI's smoke run, e.g. `--limit 500 --offered 6000 --seconds 1 --warmup 0.5 --check`) exits 1 if a
//! variant admitted more over the whole run than its buckets can give between its first request and its last
//! answer (burst + rate × that span, per bucket: each starts full), or refused nothing in the measured window
//! (a load under the limit tests nothing).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::{BoxError, LeaseConfig, RateLimitLayer, VerdictSink, Verdicts};
use tower::util::BoxCloneService;
use tower::{Service, ServiceExt};

#[path = "../examples/common/cli.rs"]
mod cli;

#[derive(Debug, Default)]
struct Reply(Verdicts);
impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.0
    }
}

type Svc = BoxCloneService<(), Reply, BoxError>;

/// The command line (clap); `cargo bench` adds `--bench`, which is accepted and ignored.
#[derive(Debug, clap::Parser)]
#[command(
    name = "token_leases_hot_key",
    about = "One hot key on 4 instances sharing Redis: in-process, Redis, \
                                                   Redis with token leases"
)]
struct Options {
    /// The token bucket's limit per second (burst = limit)
    #[arg(long, default_value = "20000", value_parser = cli::positive)]
    limit: u64,
    /// Requests per second offered to the fleet (a quarter per instance)
    #[arg(long, default_value = "30000", value_parser = seconds)]
    offered: f64,
    /// Seconds measured
    #[arg(long, default_value = "3", value_parser = seconds)]
    seconds: f64,
    /// Seconds of load before measuring (spends the burst)
    #[arg(long, default_value = "2.5", value_parser = seconds)]
    warmup: f64,
    /// Each request a task of its own, sent when the schedule owes it
    #[arg(long)]
    open_loop: bool,
    /// Keep the Redis busy with redis-benchmark, CLIENTS connections
    #[arg(long, value_name = "CLIENTS", default_value = "0")]
    redis_load: u32,
    /// Exit 1 unless every variant refused some requests and admitted no more than its bound over the span its
    /// counted decisions were made in
    #[arg(long)]
    check: bool,
    #[arg(long, hide = true)]
    bench: bool,
}

/// A number above 0 (a fraction allowed).
fn seconds(v: &str) -> std::result::Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(s),
        _ => Err("expected a number above 0".to_owned()),
    }
}

fn service<St: Store>(store: Arc<St>, policy: Policy, leases: bool) -> Svc {
    let layer = RateLimitLayer::new("hot", policy, store, "api");
    let layer = if leases {
        layer.leases(LeaseConfig::new())
    } else {
        layer
    };
    BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) }),
    )
}

struct Result {
    offered: u64,
    admitted: u64,
    latencies: Vec<u32>,
    /// Admitted over the whole run, warm-up included: from a full bucket.
    all_admitted: u64,
    /// When the first request was sent and the last answer came: every decision was made between them.
    span: Option<(Instant, Instant)>,
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

/// Offers `per_ms` requests per millisecond to one instance for `warmup` and then `measured` (wall clock), one
/// request at a time as the schedule owes them (an instance whose decisions are slower than the schedule falls
/// behind: its offered rate is what it reached), or with `open_loop` each as a task of its own. The requests sent
/// in the measured window are counted, with their latencies.
async fn offer(
    mut svc: Svc,
    per_ms: f64,
    warmup: Duration,
    measured: Duration,
    open_loop: bool,
) -> Result {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sent = 0_u64;
    let (mut offered, mut admitted, mut latencies) = (0, 0, Vec::with_capacity(200_000));
    let mut tasks = Vec::new();
    let (mut span, mut all_admitted) = (None, 0);
    loop {
        tick.tick().await;
        let elapsed = start.elapsed();
        if elapsed >= warmup + measured {
            break;
        }
        let due = (elapsed.as_secs_f64() * 1_000.0 * per_ms) as u64;
        while sent < due && start.elapsed() < warmup + measured {
            sent += 1;
            let t = Instant::now();
            let counted = t.duration_since(start) >= warmup;
            if open_loop {
                let mut svc = svc.clone();
                tasks.push((
                    counted,
                    tokio::spawn(async move {
                        let ok = svc.ready().await.unwrap().call(()).await.is_ok();
                        (
                            ok,
                            u32::try_from(t.elapsed().as_nanos()).unwrap_or(u32::MAX),
                            (t, Instant::now()),
                        )
                    }),
                ));
                continue;
            }
            let ok = svc.ready().await.unwrap().call(()).await.is_ok();
            let latency = u32::try_from(t.elapsed().as_nanos()).unwrap_or(u32::MAX);
            span = widen(span, Some((t, Instant::now())));
            all_admitted += u64::from(ok);
            if counted {
                offered += 1;
                admitted += u64::from(ok);
                latencies.push(latency);
            }
        }
    }
    for (counted, task) in tasks {
        let (ok, latency, decided) = task.await.unwrap();
        span = widen(span, Some(decided));
        all_admitted += u64::from(ok);
        if counted {
            offered += 1;
            admitted += u64::from(ok);
            latencies.push(latency);
        }
    }
    Result {
        offered,
        admitted,
        latencies,
        all_admitted,
        span,
    }
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p / 100.0).round() as usize;
    f64::from(sorted[i]) / 1_000.0
}

fn evalsha_calls(redis: &RedisServer) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap_or(0))
}

fn main() {
    let o: Options = cli::parse();
    let (limit, offered, seconds, open_loop) = (o.limit, o.offered, o.seconds, o.open_loop);
    let warmup = Duration::from_secs_f64(o.warmup);
    let measured = Duration::from_secs_f64(seconds);
    let instances: u32 = 4;
    let redis = RedisServer::start();
    let load = o.redis_load;
    let mut loader = (load > 0).then(|| {
        let port = redis
            .url()
            .rsplit(':')
            .next()
            .unwrap_or("6379")
            .trim_end_matches('/')
            .to_owned();
        std::process::Command::new("redis-benchmark")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-c",
                &load.to_string(),
                "-P",
                "16",
            ])
            .args(["-n", "2000000000", "-t", "set", "-r", "100000", "-q"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-benchmark for --redis-load")
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let policy = Policy::token_bucket(Quota::per_second(limit).unwrap());
    println!(
        "one hot key, {instances} instances, token bucket {limit}/s (burst {limit}), {offered} req/s offered{}, \
         {warmup:?} warm-up then {seconds} s measured",
        if open_loop { " open loop" } else { "" }
    );
    if load > 0 {
        println!("Redis kept busy by redis-benchmark, {load} clients × pipelines of 16 SETs");
    }
    println!(
        "{:<22} {:>10} {:>11} {:>10} {:>16} {:>15} {:>9} {:>9} {:>10}",
        "variant",
        "offered/s",
        "admitted/s",
        "admitted",
        "÷(limit×T+burst)",
        "calls/decision",
        "p50",
        "p99",
        "added p50"
    );
    let mut base_p50 = None;
    let mut checks = Vec::new();
    for (name, kind) in [
        ("in-process (per instance)", 0),
        ("Redis", 1),
        ("Redis + leases", 2),
    ] {
        let namespace = format!("hot-bench-{kind}-{}", std::process::id());
        let results = runtime.block_on(async {
            let mut svcs = Vec::new();
            for _ in 0..instances {
                svcs.push(match kind {
                    0 => service(Arc::new(MemoryStore::new()), policy, false),
                    _ => {
                        let store = RedisStore::builder(redis.url())
                            .namespace(namespace.clone())
                            .timeout(Duration::from_secs(1))
                            .build()
                            .await
                            .unwrap();
                        service(Arc::new(store), policy, kind == 2)
                    }
                });
            }
            let before = evalsha_calls(&redis);
            let _ = before;
            let calls_at_measure = Arc::new(AtomicU64::new(0));
            let probe = {
                let calls = calls_at_measure.clone();
                let url = redis.url();
                tokio::spawn(async move {
                    tokio::time::sleep(warmup).await;
                    let n = tollgate_testkit::redis::cli_url(&url, &["INFO", "commandstats"]);
                    let n = n
                        .lines()
                        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                        .and_then(|rest| rest.split(',').next())
                        .map_or(0, |n| n.parse().unwrap_or(0));
                    calls.store(n, Ordering::Relaxed);
                })
            };
            let per_ms = offered / f64::from(instances) / 1_000.0;
            let tasks: Vec<_> = svcs
                .into_iter()
                .map(|svc| tokio::spawn(offer(svc, per_ms, warmup, measured, open_loop)))
                .collect();
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await.unwrap());
            }
            probe.await.unwrap();
            (results, calls_at_measure.load(Ordering::Relaxed))
        });
        let (results, calls_before) = results;
        let calls = evalsha_calls(&redis).saturating_sub(calls_before);
        let offered_n: u64 = results.iter().map(|r| r.offered).sum();
        let admitted: u64 = results.iter().map(|r| r.admitted).sum();
        let all_admitted: u64 = results.iter().map(|r| r.all_admitted).sum();
        let span = results.iter().fold(None, |span, r| widen(span, r.span));
        // What the buckets under test can give over the whole run: each starts full (a fresh key), so the
        // burst plus the rate × the span of every decision (leased tokens hold a shared bucket below its
        // capacity, so leases add nothing). In-process, each instance has a bucket of its own.
        let buckets = if kind == 0 { u64::from(instances) } else { 1 };
        let span_us = span.map_or(0, |(from, to)| to.duration_since(from).as_micros() as u64);
        let quota = policy.quota();
        let most = buckets * (quota.burst() + span_us * quota.limit() / quota.period_micros() + 1);
        checks.push((name, offered_n, admitted, all_admitted, most));
        let mut latencies: Vec<u32> = results.into_iter().flat_map(|r| r.latencies).collect();
        latencies.sort_unstable();
        let (p50, p99) = (percentile(&latencies, 50.0), percentile(&latencies, 99.0));
        let base = *base_p50.get_or_insert(p50);
        let bound = limit as f64 * seconds + limit as f64;
        println!(
            "{:<22} {:>10.0} {:>11.0} {:>10} {:>16.3} {:>15} {:>7.1}µs {:>7.1}µs {:>+8.1}µs",
            name,
            offered_n as f64 / seconds,
            admitted as f64 / seconds,
            admitted,
            admitted as f64 / bound,
            if kind == 0 {
                "-".to_owned()
            } else {
                format!("{:.4}", calls as f64 / offered_n.max(1) as f64)
            },
            p50,
            p99,
            p50 - base,
        );
    }
    if let Some(loader) = &mut loader {
        let _ = loader.kill();
        let _ = loader.wait();
    }
    println!(
        "(in-process: each instance its own {limit}/s, so the fleet admits up to {instances}× — the latency baseline; \
         the Redis rows share one bucket: ÷(limit×T+burst) ≤ 1.02 is the goal, ≈ limit×T/(limit×T+burst) = {:.3} when exact)",
        seconds / (seconds + 1.0)
    );
    if o.check {
        check(&checks);
    }
}

/// `--check`: per variant (name, offered and admitted in the measured window, admitted over the whole run, its
/// bound), every variant must have refused some requests in the measured window (a load under the limit tests
/// nothing) and admitted no more over the whole run than its bound.
fn check(rows: &[(&str, u64, u64, u64, u64)]) {
    let mut failed = false;
    for &(name, offered, admitted, all_admitted, most) in rows {
        let verdict = if all_admitted > most {
            failed = true;
            format!("FAILED: {} over the bound", all_admitted - most)
        } else if admitted == 0 || admitted == offered {
            failed = true;
            format!("FAILED: {admitted} of {offered} admitted, the load did not test the bound")
        } else {
            "ok".to_owned()
        };
        println!(
            "check: {name:<25} {all_admitted} admitted over the run (bound {most}), {admitted} of {offered} measured: \
             {verdict}"
        );
    }
    if failed {
        std::process::exit(1);
    }
}
