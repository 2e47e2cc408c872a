//! "Your rate limiter says 100 req/s. Your users get 400." — and how shared state fixes it.
//!
//! `cargo run --release --example fleet` starts N real axum instances on loopback ports behind a round-robin
//! load balancer, each wrapped in tollgate with the same "L per second" policy, offers the fleet more load than
//! that, and prints one row per design: token bucket and sliding window, on in-process state and on Redis. The
//! in-process rows admit about N × L (every instance enforces its own limit); the Redis rows admit about L for the
//! whole fleet. `--autoscale` grows the fleet during the run to show the in-process limit growing with it.
//! Each Redis row also counts the script calls its stores made per decision (`RedisStore::script_calls`: the
//! deny cache answers some decisions without one). `--scenario flood` floods the fleet as one client far over
//! its limit and compares the stores' throughput and Redis load with the deny cache on and off (`flood.rs`).
//! `--scenario cluster-faults` fails over, reshards and kills the nodes of a private Redis Cluster under load
//! (`cluster_faults.rs`).

mod args;
#[path = "../common/cli.rs"]
mod cli;
mod cluster_faults;
mod fleet;
mod flood;
mod load;
mod plot;

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tollgate::redis::RedisStore;
use tollgate::{Algorithm, MemoryStore, Policy, Quota, Store};

use args::{Args, Scenario};
use fleet::{Balancer, start_instance};
use load::{Outcome, Progress};

/// The demo measures limits, not timeouts: twice the store's default budget.
pub(crate) const REDIS_TIMEOUT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    None,
    InProcess,
    Redis,
    /// Redis with token leases: hot keys admitted from batches leased from Redis.
    RedisLeases,
}

#[derive(Debug, Clone, Copy)]
struct Design {
    algorithm: Algorithm,
    state: State,
    /// Whether the limiter caches a shared store's denials (a layer's default on Redis; the flood also runs
    /// each Redis design without).
    deny_cache: bool,
}

/// The steady scenario's rows, in order (the flood adds each Redis design without its deny cache). A new design
/// is one more entry here, with its label and colour below.
fn designs(with_redis: bool) -> Vec<Design> {
    let mut designs = vec![Design::new(Algorithm::TokenBucket, State::None)];
    for state in [State::InProcess, State::Redis, State::RedisLeases] {
        if state != State::InProcess && !with_redis {
            continue;
        }
        for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingWindowCounter] {
            designs.push(Design::new(algorithm, state));
        }
    }
    designs
}

impl Design {
    const fn new(algorithm: Algorithm, state: State) -> Self {
        Self {
            algorithm,
            state,
            deny_cache: true,
        }
    }

    /// The design's colour in the chart (`plot::PALETTE`): grey baseline, blue in-process, red Redis, purple and
    /// brown Redis without its deny cache.
    fn colour(&self) -> usize {
        match (self.state, self.algorithm, self.deny_cache) {
            (State::None, _, _) => 0,
            (State::InProcess, Algorithm::TokenBucket, _) => 1,
            (State::InProcess, Algorithm::SlidingWindowCounter, _) => 2,
            (State::Redis, Algorithm::TokenBucket, true) => 3,
            (State::Redis, Algorithm::SlidingWindowCounter, true) => 4,
            (State::Redis, Algorithm::TokenBucket, false) => 5,
            (State::Redis, Algorithm::SlidingWindowCounter, false) => 6,
            (State::RedisLeases, Algorithm::TokenBucket, _) => 7,
            (State::RedisLeases, Algorithm::SlidingWindowCounter, _) => 8,
            // Not among the fleet's designs.
            (_, Algorithm::FixedWindow, _) => 0,
        }
    }

    fn label(&self) -> (&'static str, &'static str) {
        let algorithm = match (self.state, self.algorithm) {
            (State::None, _) => "no limiter (baseline)",
            (_, Algorithm::TokenBucket) => "token bucket",
            (_, Algorithm::SlidingWindowCounter) => "sliding window",
            (_, Algorithm::FixedWindow) => "fixed window",
        };
        let state = match (self.state, self.deny_cache) {
            (State::None, _) => "-",
            (State::InProcess, _) => "in-process",
            (State::Redis, true) => "Redis",
            (State::Redis, false) => "Redis, no deny cache",
            (State::RedisLeases, _) => "Redis + leases",
        };
        (algorithm, state)
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if args.scenario == Scenario::ClusterFaults {
        cluster_faults::scenario(&args).await;
        return;
    }
    let redis = redis_reachable(&args).await;
    if args.scenario == Scenario::Flood {
        flood::scenario(&args, redis).await;
        return;
    }
    if args.autoscale {
        autoscale(&args, redis.is_ok()).await;
        return;
    }
    if !args.json {
        println!(
            "tollgate fleet simulation: {} instances, each limited to {} req/s; {} req/s offered for {:?} (after a {:?} warm-up)\n",
            args.instances, args.limit, args.offered, args.duration, args.warmup
        );
    }
    let designs = designs(redis.is_ok());
    let mut rows = Vec::new();
    for (i, design) in designs.iter().enumerate() {
        let outcome = run(&args, *design, args.instances, i, designs.len()).await;
        rows.push((*design, outcome));
    }
    clear_progress();
    plot_if_asked(
        &args,
        format!(
            "{} instances, each limited to {} req/s, {} req/s offered",
            args.instances, args.limit, args.offered
        ),
        rows.iter()
            .map(|(design, o)| (*design, o.admitted_per_second.clone())),
        None,
    );
    if args.json {
        println!("{}", rows_json(&args, &rows, redis.as_ref().err()));
        return;
    }
    print_table(&args, &rows);
    match redis {
        Ok(()) => println!(
            "\nIn-process state: every instance enforces its own {} req/s, so the fleet admits about {} × {}.\n\
             Redis state: one bucket (or window) for the fleet, so it admits about {} req/s whatever the instance count.",
            args.limit, args.instances, args.limit, args.limit
        ),
        Err(e) => println!("\n{}", redis_skipped(&args, &e)),
    }
}

/// Why the Redis rows are missing, and how to add them.
fn redis_skipped(args: &Args, error: &str) -> String {
    format!(
        "Redis rows skipped: no Redis at {} ({error}).\n\
         Start one (`redis-server`, or `apt-get install redis-server`) or pass --redis-url redis://HOST:PORT to add them.",
        redis_target(args)
    )
}

/// The Redis the shared-state rows use, as the user named it.
fn redis_target(args: &Args) -> String {
    match &args.redis_cluster {
        Some(nodes) => format!("the Redis Cluster of {}", nodes.join(",")),
        None => args.redis_url.clone(),
    }
}

/// A store on the Redis the shared-state rows use (a Cluster when `--redis-cluster` names one), its keys under
/// `namespace`.
async fn redis_store(args: &Args, namespace: &str) -> Result<RedisStore, String> {
    let builder = match &args.redis_cluster {
        Some(nodes) => RedisStore::cluster_builder(nodes.iter().cloned()),
        None => RedisStore::builder(&args.redis_url),
    };
    builder
        .namespace(namespace)
        .timeout(REDIS_TIMEOUT)
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// Whether a Redis at `url` decides: a store builds even while Redis is down (it would apply its failure policy),
/// so ask it for a real decision, one that consumes nothing.
async fn redis_reachable(args: &Args) -> Result<(), String> {
    let probe = async {
        let store = redis_store(args, "tollgate").await?;
        let policy = Policy::token_bucket(Quota::per_second(1).map_err(|e| e.to_string())?);
        store
            .check("fleet-probe", &policy, 0)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(3), probe).await {
        Ok(result) => result,
        Err(_) => Err("no answer within 3 s".into()),
    }
}

/// Builds a fleet of `instances` for `design`, offers the load, and tears it down.
async fn run(args: &Args, design: Design, instances: usize, index: usize, total: usize) -> Outcome {
    let lb = Balancer::new();
    let mut tasks = Vec::new();
    let namespace = format!(
        "tollgate-fleet:{}:{index}:{}",
        std::process::id(),
        now_nanos()
    );
    let mut stores = Vec::new();
    for _ in 0..instances {
        let (addr, task, store) = instance(args, design, &namespace).await;
        lb.add(addr);
        tasks.push(task);
        stores.extend(store);
    }
    let calls = || stores.iter().map(RedisStore::script_calls).sum::<u64>();
    let calls_before = calls();
    let (lb_addr, lb_task) = lb.start().await;
    tasks.push(lb_task);

    let progress = Arc::new(Progress::default());
    let (name, state) = design.label();
    // The progress line redraws in place on a terminal; into a file or a pipe it would only be noise.
    let ticker = std::io::stderr().is_terminal().then(|| {
        let progress = progress.clone();
        let total_time = args.warmup + args.duration;
        tokio::spawn(async move {
            let start = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                eprint!(
                    "\r[{}/{}] {name}, {state}: {:.1}s of {:.1}s, {} sent, {} admitted   ",
                    index + 1,
                    total,
                    start.elapsed().as_secs_f64().min(total_time.as_secs_f64()),
                    total_time.as_secs_f64(),
                    progress.sent.load(Ordering::Relaxed),
                    progress.admitted.load(Ordering::Relaxed)
                );
                let _ = std::io::stderr().flush();
            }
        })
    });
    let outcome = if args.autoscale {
        // Grow from one instance to `args.instances`, evenly over the measured window.
        let grow = {
            let (lb, namespace) = (lb.clone(), namespace.clone());
            let step = args.duration / args.instances as u32;
            let first = args.warmup;
            let (args, design) = (args.clone(), design);
            tokio::spawn(async move {
                tokio::time::sleep(first).await;
                let mut grown = Vec::new();
                for _ in 1..args.instances {
                    tokio::time::sleep(step).await;
                    let (addr, task, _) = instance(&args, design, &namespace).await;
                    lb.add(addr);
                    grown.push(task);
                }
                grown
            })
        };
        let outcome =
            load::offer(lb_addr, args.offered, args.warmup, args.duration, progress).await;
        tasks.extend(grow.await.expect("grow task"));
        outcome
    } else {
        load::offer(lb_addr, args.offered, args.warmup, args.duration, progress).await
    };
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    for task in tasks {
        task.abort();
    }
    let mut outcome = outcome;
    // Under --autoscale the grown instances' stores are not counted: the column is not shown there.
    if matches!(design.state, State::Redis | State::RedisLeases) && !args.autoscale {
        outcome.redis_calls = Some(calls() - calls_before);
    }
    outcome
}

/// One instance of `design`; its Redis store too, when it has one (for its call count).
async fn instance(
    args: &Args,
    design: Design,
    namespace: &str,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<()>,
    Option<RedisStore>,
) {
    let quota = Quota::per_second(args.limit).expect("--limit is validated");
    let policy =
        Policy::new(design.algorithm, quota).expect("a per-second quota suits both algorithms");
    let (addr, task) = match design.state {
        State::None => start_instance(Arc::new(MemoryStore::new()), None, false, false).await,
        State::InProcess => {
            start_instance(Arc::new(MemoryStore::new()), Some(policy), false, false).await
        }
        State::Redis | State::RedisLeases => {
            // Each instance has its own connection pool, as separate processes would.
            let store = redis_store(args, namespace)
                .await
                .expect("Redis answered a moment ago");
            let (addr, task) = start_instance(
                Arc::new(store.clone()),
                Some(policy),
                design.deny_cache,
                design.state == State::RedisLeases,
            )
            .await;
            return (addr, task, Some(store));
        }
    };
    (addr, task, None)
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn print_table(args: &Args, rows: &[(Design, Outcome)]) {
    let secs = args.duration.as_secs_f64();
    let baseline = rows
        .iter()
        .find(|(d, _)| d.state == State::None)
        .map(|(_, o)| (o.percentile(50.0), o.percentile(99.0)));
    println!(
        "{:<22} {:<20} {:>6} {:>11} {:>8} {:>11} {:>9} {:>9} {:>9} {:>9} {:>14}",
        "design",
        "state",
        "limit",
        "admitted/s",
        "× limit",
        "rejected/s",
        "p50",
        "p99",
        "added p50",
        "added p99",
        "Redis calls/dec"
    );
    for (design, o) in rows {
        let (name, state) = design.label();
        let admitted = o.admitted as f64 / secs;
        let (p50, p99) = (o.percentile(50.0), o.percentile(99.0));
        let limited = design.state != State::None;
        let added = |p: Duration, base: Duration| {
            if limited {
                format!("{:+.2}ms", (p.as_secs_f64() - base.as_secs_f64()) * 1e3)
            } else {
                "-".into()
            }
        };
        let (b50, b99) = baseline.unwrap_or_default();
        println!(
            "{:<22} {:<20} {:>6} {:>11.1} {:>8} {:>11.1} {:>7.2}ms {:>7.2}ms {:>9} {:>9} {:>14}",
            name,
            state,
            if limited {
                args.limit.to_string()
            } else {
                "-".into()
            },
            admitted,
            if limited {
                format!("{:.2}", admitted / args.limit as f64)
            } else {
                "-".into()
            },
            o.rejected as f64 / secs,
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            added(p50, b50),
            added(p99, b99),
            o.calls_per_decision()
                .map_or_else(|| "-".into(), |c| format!("{c:.3}")),
        );
        if o.failed + o.not_sent > 0 {
            println!(
                "{:<22} ({} failed with a 5xx or a connection error, {} not sent because of the generator's in-flight cap)",
                "", o.failed, o.not_sent
            );
        }
    }
}

/// The table's rows as one JSON object: the settings, why the Redis rows are missing (if they are), and per row
/// the measured counts (per second of the measured window) and latencies.
fn rows_json(
    args: &Args,
    rows: &[(Design, Outcome)],
    redis_error: Option<&String>,
) -> serde_json::Value {
    let secs = args.duration.as_secs_f64();
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|(design, o)| {
            let (name, state) = design.label();
            serde_json::json!({
                "design": name,
                "state": state,
                "limit": (design.state != State::None).then_some(args.limit),
                "admitted_per_s": o.admitted as f64 / secs,
                "rejected_per_s": o.rejected as f64 / secs,
                "failed": o.failed,
                "not_sent": o.not_sent,
                "p50_ms": o.percentile(50.0).as_secs_f64() * 1e3,
                "p99_ms": o.percentile(99.0).as_secs_f64() * 1e3,
                "deny_cache": matches!(design.state, State::Redis | State::RedisLeases) && design.deny_cache,
                "decided": o.decided,
                "redis_calls": o.redis_calls,
                "redis_calls_per_decision": o.calls_per_decision(),
            })
        })
        .collect();
    serde_json::json!({
        "scenario": "steady",
        "instances": args.instances,
        "limit": args.limit,
        "offered_per_s": args.offered,
        "duration_s": secs,
        "warmup_s": args.warmup.as_secs_f64(),
        "redis_error": redis_error,
        "rows": rows,
    })
}

async fn autoscale(args: &Args, with_redis: bool) {
    println!(
        "tollgate fleet simulation, autoscaling from 1 to {} instances, each limited to {} req/s; {} req/s offered\n",
        args.instances, args.limit, args.offered
    );
    let mut columns = Vec::new();
    let states: &[State] = if with_redis {
        &[State::InProcess, State::Redis]
    } else {
        &[State::InProcess]
    };
    for (i, &state) in states.iter().enumerate() {
        let design = Design::new(Algorithm::TokenBucket, state);
        columns.push((design, run(args, design, 1, i, states.len()).await));
    }
    clear_progress();
    print!("{:>6} {:>10}", "second", "instances");
    for (design, _) in &columns {
        let (name, state) = design.label();
        print!(" {:>26}", format!("{name}, {state}"));
    }
    println!();
    for second in 0..args.duration.as_secs() as usize {
        print!("{:>6} {:>10}", second + 1, instances_at(args, second));
        for (_, outcome) in &columns {
            print!(
                " {:>21} req/s",
                outcome
                    .admitted_per_second
                    .get(second)
                    .copied()
                    .unwrap_or(0)
            );
        }
        println!();
    }
    let instances = (0..args.duration.as_secs() as usize)
        .map(|second| instances_at(args, second) as u64)
        .collect();
    plot_if_asked(
        args,
        format!(
            "autoscaling from 1 to {} instances, each limited to {} req/s, {} req/s offered",
            args.instances, args.limit, args.offered
        ),
        columns
            .iter()
            .map(|(design, o)| (*design, o.admitted_per_second.clone())),
        Some(instances),
    );
    if with_redis {
        println!(
            "\nThe in-process limit grows with every instance added; the Redis limit holds at {} req/s.",
            args.limit
        );
    } else {
        println!(
            "\nRedis column skipped: no Redis at {}; pass --redis-url to add it.",
            redis_target(args)
        );
    }
}

/// Instances serving during measured second `second` of an `--autoscale` run (at its middle): one more every
/// `duration / instances`.
fn instances_at(args: &Args, second: usize) -> usize {
    let step = args.duration.as_secs_f64() / args.instances as f64;
    (((second as f64 + 0.5) / step).floor() as usize + 1).min(args.instances)
}

/// Clears the progress line (drawn on a terminal only).
fn clear_progress() {
    if std::io::stderr().is_terminal() {
        eprint!("\r{:100}\r", "");
    }
}

/// Writes `--plot`'s chart, if asked: a line per design (`rows`: admitted per second), the instances under
/// `--autoscale`.
fn plot_if_asked(
    args: &Args,
    title: String,
    rows: impl Iterator<Item = (Design, Vec<u64>)>,
    instances: Option<Vec<u64>>,
) {
    let Some(path) = &args.plot else {
        return;
    };
    let chart = plot::Chart {
        title: format!("tollgate fleet simulation: {title}"),
        limit: args.limit,
        series: rows
            .map(|(design, per_second)| {
                let (name, state) = design.label();
                plot::Series {
                    colour: design.colour(),
                    label: if design.state == State::None {
                        name.to_owned()
                    } else {
                        format!("{name}, {state}")
                    },
                    per_second,
                }
            })
            .collect(),
        instances,
    };
    match plot::write(path, &chart) {
        Ok(()) => println!("\nchart: {}", path.display()),
        Err(e) => {
            eprintln!("fleet: {e}");
            std::process::exit(1);
        }
    }
}
