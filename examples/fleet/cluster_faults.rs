//! `--scenario cluster-faults`: a private Redis Cluster of 3 primaries, each with a replica, faulted while the
//! fleet decides on it.
//!
//! Each of `--instances` axum instances has its own Cluster client (`RedisStore::cluster_builder`) and, in
//! front of `GET /`, a concurrency limiter on the Cluster, a rate limiter with token leases and a rate limiter with
//! its deny cache ("fleet": `--limit` per second, bursts of `--limit`, per `x-client`), all failing closed (503)
//! while the store cannot answer. Clients send one hot key far over its limit and cycle through 10 000 cold keys
//! that stay under theirs. While that traffic flows, three faults in turn, each on the node that holds the hot
//! key's slot:
//!
//! - `failover`: `CLUSTER FAILOVER` on its replica (the old primary is demoted under live connections);
//! - `reshard`: the hot key's slot moved to another primary key by key (`ASK` while it moves, `MOVED` after),
//!   and 500 more slots of cold keys with `redis-cli --cluster reshard`;
//! - `kill`: the primary SIGKILLed; its replica takes over after the node timeout; the killed node is started
//!   again and rejoins as a replica.
//!
//! Per fault: how long until every hot request was decided again (`resume_s`, from the fault to the last 503),
//! the answers by kind, and what the hot key admitted against the most its bucket can give over the phase
//! (`bound`: the burst plus the rate over the phase's span, plus one more burst for a killed primary, whose
//! writes not yet replicated are lost with it: the promoted replica may hold the key as it was up to one
//! replication lag earlier, at most a full bucket).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderName, Request};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::http::HttpLimitLayer;
use tollgate::http::key::HeaderKey;
use tollgate::redis::RedisStore;
use tollgate::stack::ConcurrencyLimitLayer;
use tollgate::tower::{LeaseConfig, RateLimitLayer};
use tollgate::{FailurePolicy, Policy, Quota};
use tollgate_testkit::redis::{self, CLUSTER_NODE_TIMEOUT, RedisCluster};

use crate::args::Args;

const COLD_KEYS: usize = 10_000;
/// When the cold keys start: until then the hot key is the only one, whose slot is read meanwhile.
const COLD_AFTER: Duration = Duration::from_secs(1);
/// Traffic before the first fault and after each one has settled.
const CALM: Duration = Duration::from_secs(2);

/// One answer: when (since the start), whether for the hot key, and its status (0: no answer from the instance).
#[derive(Clone, Copy)]
struct Answer {
    at: Duration,
    hot: bool,
    status: u16,
}

/// One fault's phase and what was answered in it.
struct Phase {
    fault: &'static str,
    from: Duration,
    injected: Duration,
    to: Duration,
    /// When the replica took over the hot slot, for a fault that makes it do so.
    promoted: Option<Duration>,
    /// The hot key's state may be lost with the node (a killed primary).
    lossy: bool,
}

struct Row {
    fault: &'static str,
    resume_s: f64,
    promoted_s: Option<f64>,
    /// From the fault to the phase's end (the cluster settled, then [`CALM`]).
    phase_s: f64,
    admitted: u64,
    bound: u64,
    limited: u64,
    unavailable: u64,
    errors: u64,
    cold_errors: u64,
}

pub(crate) async fn scenario(args: &Args) {
    if !(redis::installed("redis-server") && redis::installed("redis-cli")) {
        crate::cli::fail(
            "--scenario cluster-faults starts a private Redis Cluster: redis-server and redis-cli are needed \
             (apt-get install redis-server)",
        );
    }
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(3))
        .await
        .expect("the cluster starts");
    let urls = cluster.urls();
    let mut instances = Vec::new();
    for _ in 0..args.instances {
        instances.push(start_instance(&urls, args.limit).await);
    }
    if !args.json {
        println!(
            "tollgate on a Redis Cluster under faults: {} instances, a private cluster of 3 primaries and 3 replicas \
             (node timeout {:?}); one hot key over its limit of {} req/s and {COLD_KEYS} cold keys\n",
            args.instances, CLUSTER_NODE_TIMEOUT, args.limit
        );
    }
    let answers = Arc::new(Mutex::new(Vec::<Answer>::new()));
    let start = Instant::now();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn(traffic(
        instances.clone(),
        Arc::clone(&answers),
        start,
        Arc::clone(&stop),
    ));
    let hot_slot = slot_of_hot_key(&cluster).await;

    let mut phases = Vec::new();
    let mut from = start.elapsed();
    tokio::time::sleep(CALM).await;
    for fault in ["failover", "reshard", "kill"] {
        let injected = start.elapsed();
        let (back, promoted) = tokio::task::spawn_blocking(move || {
            let promoted = inject(&mut cluster, fault, hot_slot, start);
            (cluster, promoted)
        })
        .await
        .expect("the fault is injected");
        cluster = back;
        tokio::time::sleep(CALM).await;
        let to = start.elapsed();
        phases.push(Phase {
            fault,
            from,
            injected,
            to,
            promoted,
            lossy: fault == "kill",
        });
        from = to;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = load.await;
    let answers = answers.lock().expect("answers").clone();
    let rows: Vec<Row> = phases
        .iter()
        .map(|p| row(p, &answers, args.limit))
        .collect();
    report(args, &rows);
    drop(cluster);
}

/// Runs `fault` on the node that holds `slot` (blocking: the cluster is driven with redis-cli); when a replica was
/// promoted, the instant (since `start`) it said so.
fn inject(cluster: &mut RedisCluster, fault: &str, slot: u16, start: Instant) -> Option<Duration> {
    let owner = cluster.owner_of_slot(slot);
    match fault {
        "failover" => {
            let replica = cluster
                .replica_of(owner)
                .expect("the hot slot's primary has a replica");
            cluster.failover(replica);
            let promoted = start.elapsed();
            cluster.wait_settled();
            Some(promoted)
        }
        "reshard" => {
            let to = (0..6)
                .find(|&i| {
                    i != owner
                        && cluster.node(i).pid().is_some()
                        && cluster.node(i).cli(&["ROLE"]).starts_with("master")
                })
                .expect("another primary");
            cluster.move_slot(slot, to, 10);
            cluster.wait_settled();
            cluster.reshard(owner, to, 500);
            None
        }
        "kill" => {
            let replica = cluster
                .replica_of(owner)
                .expect("the hot slot's primary has a replica");
            cluster.node_mut(owner).kill();
            cluster.node(replica).wait_until("promotion", || {
                cluster.node(replica).cli(&["ROLE"]).starts_with("master")
            });
            let promoted = start.elapsed();
            cluster.wait_settled();
            // The node comes back empty and rejoins as its successor's replica: no restart of the fleet.
            cluster.node_mut(owner).restart();
            cluster.wait_settled();
            Some(promoted)
        }
        _ => unreachable!("the faults are listed above"),
    }
}

/// The slot of the hot key's bucket, as the instances' first requests wrote it (before any cold key's).
async fn slot_of_hot_key(cluster: &RedisCluster) -> u16 {
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..6 {
        let node = cluster.node(i);
        // Only the hot key has been decided on yet (the cold keys start later): the one "fleet" bucket.
        let keys = node.cli(&["--scan", "--pattern", "cluster-faults:{fleet:*"]);
        if let Some(key) = keys.lines().find(|k| !k.is_empty()) {
            return node
                .cli(&["CLUSTER", "KEYSLOT", key])
                .parse()
                .expect("CLUSTER KEYSLOT answers a number");
        }
    }
    crate::cli::fail("the hot key was not written to the cluster: no instance decided on it")
}

async fn start_instance(urls: &[String], limit: u64) -> SocketAddr {
    let store = Arc::new(
        RedisStore::cluster_builder(urls.to_vec())
            .namespace("cluster-faults")
            .timeout(crate::REDIS_TIMEOUT)
            .build()
            .await
            .unwrap_or_else(|e| crate::cli::fail(format!("the cluster store: {e}"))),
    );
    let client = HeaderKey::new(HeaderName::from_static("x-client"));
    let quota = Quota::per_second(limit).expect("a nonzero limit");
    let fleet = RateLimitLayer::new(
        "fleet",
        Policy::token_bucket(quota),
        Arc::clone(&store),
        client.clone(),
    )
    .on_store_error(FailurePolicy::Closed);
    // Leases on a limit far above the traffic: every instance takes the hot key's tokens in batches.
    let generous = Quota::per_second(100 * limit).expect("a nonzero limit");
    let leased = RateLimitLayer::new(
        "leased",
        Policy::token_bucket(generous),
        Arc::clone(&store),
        client,
    )
    .leases(LeaseConfig::new())
    .on_store_error(FailurePolicy::Closed);
    let concurrency = ConcurrencyLimitLayer::new("in-flight", 10_000, store, "api")
        .expect("a nonzero limit")
        .on_store_error(FailurePolicy::Closed);
    let limiters = tower::ServiceBuilder::new()
        .layer(concurrency)
        .layer(leased)
        .layer(fleet);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(HttpLimitLayer::new(limiters));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    addr
}

/// Hot requests (400 a second) and, from [`COLD_AFTER`], cold ones (800 a second: each cold key once per
/// 12.5 s), round robin over the instances, until `stop`.
async fn traffic(
    instances: Vec<SocketAddr>,
    answers: Arc<Mutex<Vec<Answer>>>,
    start: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
    let mut tasks = Vec::new();
    for task in 0..8_usize {
        let (client, instances, answers, stop) = (
            client.clone(),
            instances.clone(),
            Arc::clone(&answers),
            Arc::clone(&stop),
        );
        let hot = task < 4;
        tasks.push(tokio::spawn(async move {
            if !hot {
                tokio::time::sleep(COLD_AFTER).await;
            }
            let mut tick = tokio::time::interval(Duration::from_millis(if hot { 10 } else { 5 }));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = task;
            let mut mine = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                n += 1;
                let key = if hot {
                    "hot".to_owned()
                } else {
                    format!("cold-{}", (n * 4 + task) % COLD_KEYS)
                };
                let addr = instances[n % instances.len()];
                let request = Request::get(format!("http://{addr}/"))
                    .header("x-client", key)
                    .body(Body::empty())
                    .expect("a request");
                let status =
                    match tokio::time::timeout(Duration::from_secs(5), client.request(request))
                        .await
                    {
                        Ok(Ok(response)) => response.status().as_u16(),
                        _ => 0,
                    };
                mine.push(Answer {
                    at: start.elapsed(),
                    hot,
                    status,
                });
            }
            answers.lock().expect("answers").extend(mine);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

fn row(phase: &Phase, answers: &[Answer], limit: u64) -> Row {
    let within: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.at >= phase.from && a.at < phase.to)
        .collect();
    let hot = || within.iter().filter(|a| a.hot);
    let count = |status: u16| hot().filter(|a| a.status == status).count() as u64;
    let last_failure = within
        .iter()
        .filter(|a| a.at >= phase.injected && !matches!(a.status, 200 | 429))
        .map(|a| a.at)
        .max();
    let span = (phase.to - phase.from).as_secs_f64();
    let lost = if phase.lossy { limit } else { 0 };
    Row {
        fault: phase.fault,
        resume_s: last_failure.map_or(0.0, |at| (at - phase.injected).as_secs_f64()),
        phase_s: (phase.to - phase.injected).as_secs_f64(),
        promoted_s: phase
            .promoted
            .map(|at| (at.saturating_sub(phase.injected)).as_secs_f64()),
        admitted: count(200),
        bound: limit + (limit as f64 * span).ceil() as u64 + lost,
        limited: count(429),
        unavailable: count(503),
        errors: hot().filter(|a| !matches!(a.status, 200 | 429)).count() as u64,
        cold_errors: within.iter().filter(|a| !a.hot && a.status != 200).count() as u64,
    }
}

fn report(args: &Args, rows: &[Row]) {
    if args.json {
        for r in rows {
            println!(
                "{}",
                serde_json::json!({
                    "scenario": "cluster-faults",
                    "fault": r.fault,
                    "resume_s": (r.resume_s * 1000.0).round() / 1000.0,
                    "promoted_s": r.promoted_s.map(|s| (s * 1000.0).round() / 1000.0),
                    "admitted": r.admitted,
                    "bound": r.bound,
                    "errors": r.errors,
                    "cold_errors": r.cold_errors,
                    "answers": { "200": r.admitted, "429": r.limited, "503": r.unavailable },
                    "phase_s": (r.phase_s * 1000.0).round() / 1000.0,
                    "node_timeout_s": CLUSTER_NODE_TIMEOUT.as_secs_f64(),
                })
            );
        }
        return;
    }
    println!(
        "{:<10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>11}",
        "fault",
        "promoted_s",
        "resume_s",
        "admitted",
        "bound",
        "200",
        "429",
        "503",
        "errors",
        "cold errors"
    );
    for r in rows {
        println!(
            "{:<10} {:>10} {:>9.3} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>11}",
            r.fault,
            r.promoted_s
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.3}")),
            r.resume_s,
            r.admitted,
            r.bound,
            r.admitted,
            r.limited,
            r.unavailable,
            r.errors,
            r.cold_errors
        );
    }
    println!(
        "\npromoted_s: from the fault until the replica said it was the primary; resume_s: from the fault to the last hot request the store could not decide (503: the limiters fail \
         closed); admitted/bound: the hot key over the phase; errors: hot requests not decided (503, or no answer); \
         cold errors: cold requests not admitted."
    );
}
