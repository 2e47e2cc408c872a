//! `--scenario flood`: one client far over its limit, as fast as its connections go.
//!
//! Every design of the steady table runs, and each Redis design once more without its deny cache. The client's
//! `--connections` keep-alive connections go straight to the instances (spread evenly, as an L4 balancer would
//! spread them: the HTTP balancer of the steady scenario would be the bottleneck), each sending `GET /` as soon
//! as the previous answer is in. Per row: admitted/s (the limit holds: about L on Redis, N × L in-process),
//! served/s (answers of any kind: what the limiter leaves of the instances' throughput, also as a ratio to the
//! same algorithm in-process) and the Redis script calls the instances' stores made, per second and per decision.

use std::sync::Arc;
use std::time::Duration;

use tollgate::redis::RedisStore;

use crate::args::Args;
use crate::load::{self, Flooded};
use crate::{Design, State, designs, instance, now_nanos, plot_if_asked, redis_skipped};

/// Runs the flood on every design and prints the table (or `--json`, and `--plot`'s chart).
pub(crate) async fn scenario(args: &Args, redis: Result<(), String>) {
    let mut rows: Vec<Design> = Vec::new();
    for design in designs(redis.is_ok()) {
        rows.push(design);
        if design.state == State::Redis {
            rows.push(Design {
                deny_cache: false,
                ..design
            });
        }
    }
    if !args.json {
        println!(
            "tollgate fleet flood: {} instances, each limited to {} req/s; one client on {} connections, as fast as \
             they go, for {:?} (after a {:?} warm-up)\n",
            args.instances, args.limit, args.connections, args.duration, args.warmup
        );
    }
    let mut results = Vec::new();
    for (index, design) in rows.into_iter().enumerate() {
        results.push((design, run(args, design, index).await));
    }
    plot_if_asked(
        args,
        format!(
            "one client flooding {} instances, each limited to {} req/s, on {} connections",
            args.instances, args.limit, args.connections
        ),
        results
            .iter()
            .map(|(design, f)| (*design, f.admitted_per_second.clone())),
        None,
    );
    if args.json {
        println!("{}", json(args, &results, redis.as_ref().err()));
        return;
    }
    print_table(args, &results);
    match redis {
        Ok(()) => println!(
            "\nThe limit holds on every store; without the deny cache every refused request costs a Redis call, with \
             it the store is asked about once per token that accrues."
        ),
        Err(e) => println!("\n{}", redis_skipped(args, &e)),
    }
}

/// Starts the fleet of `design`, floods it, and tears it down.
async fn run(args: &Args, design: Design, index: usize) -> Flooded {
    let namespace = format!(
        "tollgate-fleet-flood:{}:{index}:{}",
        std::process::id(),
        now_nanos()
    );
    let (mut addrs, mut tasks, mut stores) = (Vec::new(), Vec::new(), Vec::<RedisStore>::new());
    for _ in 0..args.instances {
        let (addr, task, store) = instance(args, design, &namespace).await;
        addrs.push(addr);
        tasks.push(task);
        stores.extend(store);
    }
    let stores = Arc::new(stores);
    let flooded = load::flood(&addrs, args.connections, args.warmup, args.duration, || {
        stores.iter().map(RedisStore::script_calls).sum()
    })
    .await;
    for task in tasks {
        task.abort();
    }
    flooded
}

/// Per second of the measured window.
fn per_s(n: u64, duration: Duration) -> f64 {
    n as f64 / duration.as_secs_f64()
}

/// The served rate of the same algorithm's in-process row, the ratio's base.
fn in_process_served(results: &[(Design, Flooded)], design: &Design) -> Option<u64> {
    results
        .iter()
        .find(|(d, _)| d.state == State::InProcess && d.algorithm == design.algorithm)
        .map(|(_, f)| f.served)
}

fn print_table(args: &Args, results: &[(Design, Flooded)]) {
    println!(
        "{:<22} {:<21} {:>6} {:>11} {:>8} {:>10} {:>14} {:>14} {:>16}",
        "design",
        "state",
        "limit",
        "admitted/s",
        "× limit",
        "served/s",
        "vs in-process",
        "Redis calls/s",
        "calls/decision"
    );
    for (design, f) in results {
        let (name, state) = design.label();
        let limited = design.state != State::None;
        let redis = matches!(design.state, State::Redis | State::RedisLeases);
        let dash = || "-".to_owned();
        println!(
            "{:<22} {:<21} {:>6} {:>11.1} {:>8} {:>10.0} {:>14} {:>14} {:>16}",
            name,
            state,
            if limited {
                args.limit.to_string()
            } else {
                dash()
            },
            per_s(f.admitted, args.duration),
            if limited {
                format!(
                    "{:.2}",
                    per_s(f.admitted, args.duration) / args.limit as f64
                )
            } else {
                dash()
            },
            per_s(f.served, args.duration),
            match (limited, in_process_served(results, design)) {
                (true, Some(base)) => format!("{:.3}", f.served as f64 / base.max(1) as f64),
                _ => dash(),
            },
            if redis {
                format!("{:.1}", per_s(f.calls, args.duration))
            } else {
                dash()
            },
            if redis {
                format!(
                    "{:.4}",
                    f.calls as f64 / (f.served - f.failed).max(1) as f64
                )
            } else {
                dash()
            },
        );
        if f.failed > 0 {
            println!(
                "{:<22} ({} answers were neither 200 nor 429, or a connection failed)",
                "", f.failed
            );
        }
    }
}

/// The flood's rows as one JSON object, as `print_table` shows them (rates per second of the measured window).
fn json(
    args: &Args,
    results: &[(Design, Flooded)],
    redis_error: Option<&String>,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|(design, f)| {
            let (name, state) = design.label();
            let redis = matches!(design.state, State::Redis | State::RedisLeases);
            serde_json::json!({
                "design": name,
                "state": state,
                "deny_cache": redis && design.deny_cache,
                "limit": (design.state != State::None).then_some(args.limit),
                "admitted_per_s": per_s(f.admitted, args.duration),
                "served_per_s": per_s(f.served, args.duration),
                "served": f.served,
                "failed": f.failed,
                "redis_calls": redis.then_some(f.calls),
                "redis_calls_per_s": redis.then(|| per_s(f.calls, args.duration)),
                "redis_calls_per_decision": redis.then(|| f.calls as f64 / (f.served - f.failed).max(1) as f64),
            })
        })
        .collect();
    serde_json::json!({
        "scenario": "flood",
        "instances": args.instances,
        "limit": args.limit,
        "connections": args.connections,
        "duration_s": args.duration.as_secs_f64(),
        "warmup_s": args.warmup.as_secs_f64(),
        "redis_error": redis_error,
        "rows": rows,
    })
}
