//! Decisions per second with 1, 2, 3 and 4 limits per request, in process and on Redis: the limits as one
//! `RateLimitSetLayer` (decided as one, all or nothing) beside the same limits as separate `RateLimitLayer`s
//! stacked one inside the other, in interleaved rounds.
//!
//! `cargo bench --bench several_limits -- [--rounds 7] [--memory-requests 100000] [--redis-requests 2000]`
//!
//! Every limiter is a token bucket no request reaches (10^9 a second), on 1 000 keys in turn: what is measured is
//! the admission path, one request at a time (closed loop, one task). Each round runs every variant once, in a
//! rotated order; reported per variant: the median time per request over the rounds with its range, and the
//! median over the rounds of its ratio to the 1-limit variant on the same store in the same round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::limit::rate::RateLimitSetLayer;
use tollgate_tower::{BoxError, RateLimitLayer, VerdictSink, Verdicts};
use tower::util::BoxCloneService;
use tower::{Service, ServiceBuilder, ServiceExt};

#[path = "../examples/common/cli.rs"]
mod cli;

#[derive(Debug, Default)]
struct Reply(Verdicts);
impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.0
    }
}

type Svc = BoxCloneService<u32, Reply, BoxError>;

/// The command line (clap); `cargo bench` adds `--bench`, which is accepted and ignored.
#[derive(Debug, clap::Parser)]
#[command(
    name = "several_limits",
    about = "1, 2 and 4 limits per request: a set against stacked layers"
)]
struct Options {
    /// Interleaved rounds
    #[arg(long, default_value = "7", value_parser = cli::positive)]
    rounds: u64,
    /// Requests per variant per round, in process
    #[arg(long, default_value = "100000", value_parser = cli::positive)]
    memory_requests: u64,
    /// Requests per variant per round, on Redis
    #[arg(long, default_value = "2000", value_parser = cli::positive)]
    redis_requests: u64,
    #[arg(long, hide = true)]
    bench: bool,
}

/// `n` limiters named `l0`, `l1`, … on `store`, keyed by the request's number modulo 1 000.
type Key = fn(&u32, &mut String) -> Result<(), tollgate_tower::KeyError>;

fn limiters<St: Store>(store: &Arc<St>, n: usize) -> Vec<RateLimitLayer<Key, St>> {
    let policy = Policy::token_bucket(Quota::per_second(1_000_000_000).expect("a valid quota"));
    (0..n)
        .map(|i| {
            let key: Key = |req, key| {
                use std::fmt::Write;
                let _ = write!(key, "k{}", req % 1000);
                Ok(())
            };
            RateLimitLayer::new(format!("l{i}"), policy, store.clone(), key)
        })
        .collect()
}

fn inner() -> BoxCloneService<u32, Reply, BoxError> {
    BoxCloneService::new(tower::service_fn(|_: u32| async {
        Ok::<_, BoxError>(Reply::default())
    }))
}

fn as_set<St: Store>(store: &Arc<St>, n: usize) -> Svc {
    let set = RateLimitSetLayer::new(limiters(store, n).into_iter().map(|l| (l, true)));
    BoxCloneService::new(ServiceBuilder::new().layer(set).service(inner()))
}

fn stacked<St: Store>(store: &Arc<St>, n: usize) -> Svc {
    let mut svc = inner();
    for layer in limiters(store, n).into_iter().rev() {
        svc = BoxCloneService::new(ServiceBuilder::new().layer(layer).service(svc));
    }
    svc
}

struct Variant {
    store: &'static str,
    shape: &'static str,
    limits: usize,
    svc: Svc,
    requests: u64,
    /// Nanoseconds per request, one per round.
    times: Vec<f64>,
}

async fn run(svc: &mut Svc, requests: u64) -> f64 {
    let started = Instant::now();
    for i in 0..requests {
        let reply = svc.ready().await.expect("ready").call(i as u32).await;
        assert!(reply.is_ok(), "a limit no request reaches refused one");
    }
    started.elapsed().as_nanos() as f64 / requests as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let options: Options = cli::parse();
    let server = RedisServer::start();
    let redis = Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("the private redis-server"),
    );
    let memory = Arc::new(MemoryStore::new());
    let mut variants = Vec::new();
    for limits in [1, 2, 3, 4] {
        for (shape, set) in [("set", true), ("stacked", false)] {
            if limits == 1 && !set {
                continue;
            }
            let svc = if set {
                as_set(&memory, limits)
            } else {
                stacked(&memory, limits)
            };
            variants.push(Variant {
                store: "memory",
                shape,
                limits,
                svc,
                requests: options.memory_requests,
                times: vec![],
            });
            let svc = if set {
                as_set(&redis, limits)
            } else {
                stacked(&redis, limits)
            };
            variants.push(Variant {
                store: "redis",
                shape,
                limits,
                svc,
                requests: options.redis_requests,
                times: vec![],
            });
        }
    }
    // Warm every variant once (connections, scripts, keys).
    for v in &mut variants {
        run(&mut v.svc, v.requests.min(1000)).await;
    }
    let count = variants.len();
    for round in 0..options.rounds as usize {
        for k in 0..count {
            let v = &mut variants[(k + round) % count];
            let t = run(&mut v.svc, v.requests).await;
            v.times.push(t);
        }
    }
    println!(
        "several_limits: {} rounds, {} requests per variant per round in process, {} on Redis ({})",
        options.rounds,
        options.memory_requests,
        options.redis_requests,
        server.url()
    );
    println!();
    println!(
        "{:<7} {:<8} {:>6} {:>14} {:>20} {:>16} {:>22}",
        "store", "shape", "limits", "ns/request", "range", "decisions/s", "× 1 limit (range)"
    );
    for v in &variants {
        let base = variants
            .iter()
            .find(|b| b.store == v.store && b.limits == 1)
            .expect("the 1-limit variant");
        let ratios: Vec<f64> = v
            .times
            .iter()
            .zip(&base.times)
            .map(|(t, b)| t / b)
            .collect();
        let lo = v.times.iter().copied().fold(f64::MAX, f64::min);
        let hi = v.times.iter().copied().fold(0.0, f64::max);
        let rlo = ratios.iter().copied().fold(f64::MAX, f64::min);
        let rhi = ratios.iter().copied().fold(0.0, f64::max);
        let t = median(v.times.clone());
        println!(
            "{:<7} {:<8} {:>6} {:>14.0} {:>20} {:>16.0} {:>22}",
            v.store,
            v.shape,
            v.limits,
            t,
            format!("{lo:.0} – {hi:.0}"),
            1e9 / t,
            format!("{:.2} ({rlo:.2} – {rhi:.2})", median(ratios.clone()))
        );
    }
}
