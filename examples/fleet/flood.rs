//! `--scenario flood`: one client far over its limit, as fast as its connections go.
//!
//! Every design of the steady table runs, and each Redis design once more without its deny cache. The client's
//! `--connections` keep-alive connections go straight to the instances (spread evenly, as an L4 balancer would
//! spread them: the HTTP balancer of the steady scenario would be the bottleneck), each sending `GET /` as soon
//! as the previous answer is in. Per row: admitted/s (the limit holds: about L on Redis, N × L in-process),
//! served/s (answers of any kind: what the limiter leaves of the instances' throughput, also as a ratio to the
//! same algorithm in-process, in the same round) and the Redis script calls the instances' stores made, per
//! second and per decision. `--rounds N` runs every design N times in interleaved rounds (each round in a rotated
//! order, so a slow spell of a shared machine falls on every design alike) and prints medians with the lowest and
//! highest round. Every run is also held to what its limiters can admit at most over the span of its decisions
//! (`over bound`: any admission past it is a limiter admitting too much, whatever the machine's load).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::redis::RedisStore;
use tollgate::{Algorithm, Quota};

use crate::args::Args;
use crate::load::{self, Flooded};
use crate::{Design, State, designs, instance, now_nanos, plot_if_asked, redis_skipped};

/// One run of one design.
struct Run {
    flooded: Flooded,
    /// What the design's limiters can admit at most over the run's span (none for the baseline).
    most: Option<u64>,
    /// Served over the same algorithm's in-process served, in the same round.
    vs_in_process: Option<f64>,
}

impl Run {
    /// Admissions past `most`, 0 if none.
    fn over_bound(&self) -> Option<u64> {
        self.most
            .map(|most| self.flooded.admitted_in_run.saturating_sub(most))
    }
}

/// Runs the flood on every design, `--rounds` times interleaved, and prints the table (or `--json`, and
/// `--plot`'s chart of the first round).
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
             they go, for {:?} (after a {:?} warm-up); {} round{}\n",
            args.instances,
            args.limit,
            args.connections,
            args.duration,
            args.warmup,
            args.rounds,
            if args.rounds == 1 {
                ""
            } else {
                "s, interleaved"
            }
        );
    }
    let n = rows.len();
    let mut runs: Vec<Vec<Run>> = (0..n).map(|_| Vec::new()).collect();
    for round in 0..args.rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let flooded = run(args, rows[i], i).await;
            let most = most_admissible(args, &rows[i], flooded.span);
            runs[i].push(Run {
                flooded,
                most,
                vs_in_process: None,
            });
        }
        for i in 0..n {
            let Some(base) = rows
                .iter()
                .position(|d| d.state == State::InProcess && d.algorithm == rows[i].algorithm)
            else {
                continue;
            };
            if rows[i].state == State::None {
                continue;
            }
            let base = runs[base][round].flooded.served;
            let this = &mut runs[i][round];
            this.vs_in_process = Some(this.flooded.served as f64 / base.max(1) as f64);
        }
    }
    let results: Vec<(Design, Vec<Run>)> = rows.into_iter().zip(runs).collect();
    plot_if_asked(
        args,
        format!(
            "one client flooding {} instances, each limited to {} req/s, on {} connections",
            args.instances, args.limit, args.connections
        ),
        results
            .iter()
            .map(|(design, runs)| (*design, runs[0].flooded.admitted_per_second.clone())),
        None,
    );
    if args.json {
        println!("{}", json(args, &results, redis.as_ref().err()));
        return;
    }
    print_table(args, &results);
    let over: Vec<String> = results
        .iter()
        .filter_map(|(design, runs)| {
            let most = runs.iter().filter_map(Run::over_bound).max()?;
            let (name, state) = design.label();
            (most > 0).then(|| format!("{name}, {state}: {most} over"))
        })
        .collect();
    println!(
        "\nadmitted/s, served/s, Redis calls/s and calls/decision: medians of the rounds; (lowest–highest) is their \
         spread. vs in-process: served/s over the same algorithm's in-process served/s in the same round, median of \
         the rounds: a spread that takes in 1.000 shows no difference. over bound: the most any run admitted past \
         what its limiters could give over the span of its decisions."
    );
    if args.rounds == 1 {
        println!(
            "One round: no spread to judge a served/s difference by (the machine's load moves it); --rounds N, N \
             of 3 or more, gives one."
        );
    }
    if !over.is_empty() {
        println!("\nADMITTED OVER THE BOUND: {}", over.join("; "));
    }
    match redis {
        Ok(()) if over.is_empty() => println!(
            "\nNo run admitted over its bound; without the deny cache every refused request costs a Redis call, \
             with it the store is asked about once per token that accrues."
        ),
        Ok(()) => {}
        Err(e) => println!("\n{}", redis_skipped(args, &e)),
    }
}

/// What `design`'s limiters can admit at most between the first request written and the last answer read
/// (`span`), from fresh keys: per bucket, its burst plus what accrues over the span (token bucket; leased tokens
/// hold a shared bucket below its capacity, so leases add nothing), or the limit per window the span touches
/// (sliding window counter: a window's count never exceeds the limit, and windows are aligned to multiples of
/// the period since the epoch). In-process, every instance has a limiter of its own.
fn most_admissible(args: &Args, design: &Design, span: Option<(Instant, Instant)>) -> Option<u64> {
    let limiters = match design.state {
        State::None => return None,
        State::InProcess => args.instances as u64,
        State::Redis | State::RedisLeases => 1,
    };
    let Some((from, to)) = span else {
        return Some(0);
    };
    let quota = Quota::per_second(args.limit).expect("--limit is validated");
    let period = quota.period_micros();
    let per_limiter = match design.algorithm {
        Algorithm::SlidingWindowCounter => {
            // The stores' clocks and this one are the same host's, but read at other moments: a window boundary
            // within a few ms of either end may fall on either side, so the span is widened by 10 ms each way.
            let epoch_us = |at: Instant| {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                now.saturating_sub(at.elapsed()).as_micros() as u64
            };
            let (start, end) = (epoch_us(from) - 10_000, epoch_us(to) + 10_000);
            quota.limit() * (end / period - start / period + 1)
        }
        _ => {
            let span_us = to.duration_since(from).as_micros() as u64;
            quota.burst() + span_us * quota.limit() / period + 1
        }
    };
    Some(limiters * per_limiter)
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

/// The median of `values` and their spread (lowest, highest); `None` for none.
fn stats(values: impl Iterator<Item = f64>) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    let median = match v.len() {
        0 => return None,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    Some((median, v[0], v[v.len() - 1]))
}

/// A row's per-round figures.
struct Figures {
    admitted: (f64, f64, f64),
    served: (f64, f64, f64),
    vs_in_process: Option<(f64, f64, f64)>,
    calls_per_s: Option<(f64, f64, f64)>,
    calls_per_decision: Option<(f64, f64, f64)>,
    over_bound: Option<u64>,
}

fn figures(args: &Args, design: &Design, runs: &[Run]) -> Figures {
    let redis = matches!(design.state, State::Redis | State::RedisLeases);
    let of = |f: &dyn Fn(&Run) -> f64| stats(runs.iter().map(f)).expect("a run per round");
    Figures {
        admitted: of(&|r| per_s(r.flooded.admitted, args.duration)),
        served: of(&|r| per_s(r.flooded.served, args.duration)),
        vs_in_process: stats(runs.iter().filter_map(|r| r.vs_in_process)),
        calls_per_s: redis.then(|| of(&|r| per_s(r.flooded.calls, args.duration))),
        calls_per_decision: redis.then(|| {
            of(&|r| r.flooded.calls as f64 / (r.flooded.served - r.flooded.failed).max(1) as f64)
        }),
        over_bound: runs.iter().filter_map(Run::over_bound).max(),
    }
}

fn print_table(args: &Args, results: &[(Design, Vec<Run>)]) {
    let spread = |(_, low, high): (f64, f64, f64), decimals: usize| {
        if args.rounds == 1 {
            "-".to_owned()
        } else {
            format!("{low:.decimals$}–{high:.decimals$}")
        }
    };
    println!(
        "{:<22} {:<21} {:>6} {:>11} {:>8} {:>10} {:>10} {:>17} {:>13} {:>17} {:>14} {:>15}",
        "design",
        "state",
        "limit",
        "admitted/s",
        "× limit",
        "over bound",
        "served/s",
        "(lowest–highest)",
        "vs in-process",
        "(lowest–highest)",
        "Redis calls/s",
        "calls/decision"
    );
    for (design, runs) in results {
        let (name, state) = design.label();
        let limited = design.state != State::None;
        let f = figures(args, design, runs);
        let dash = || "-".to_owned();
        println!(
            "{:<22} {:<21} {:>6} {:>11.1} {:>8} {:>10} {:>10.0} {:>17} {:>13} {:>17} {:>14} {:>15}",
            name,
            state,
            if limited {
                args.limit.to_string()
            } else {
                dash()
            },
            f.admitted.0,
            if limited {
                format!("{:.2}", f.admitted.0 / args.limit as f64)
            } else {
                dash()
            },
            f.over_bound.map_or_else(dash, |n| n.to_string()),
            f.served.0,
            spread(f.served, 0),
            f.vs_in_process.map_or_else(dash, |v| format!("{:.3}", v.0)),
            f.vs_in_process.map_or_else(dash, |v| spread(v, 3)),
            f.calls_per_s.map_or_else(dash, |v| format!("{:.1}", v.0)),
            f.calls_per_decision
                .map_or_else(dash, |v| format!("{:.4}", v.0)),
        );
        let failed: u64 = runs.iter().map(|r| r.flooded.failed).sum();
        if failed > 0 {
            println!(
                "{:<22} ({failed} answers were neither 200 nor 429, or a connection failed)",
                ""
            );
        }
    }
}

/// The flood's rows as one JSON object, as `print_table` shows them (rates per second of the measured window,
/// medians of the rounds; counts summed over them), with every round's own figures under `per_round`.
fn json(
    args: &Args,
    results: &[(Design, Vec<Run>)],
    redis_error: Option<&String>,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|(design, runs)| {
            let (name, state) = design.label();
            let redis = matches!(design.state, State::Redis | State::RedisLeases);
            let f = figures(args, design, runs);
            let sum = |g: fn(&Flooded) -> u64| runs.iter().map(|r| g(&r.flooded)).sum::<u64>();
            serde_json::json!({
                "design": name,
                "state": state,
                "deny_cache": redis && design.deny_cache,
                "limit": (design.state != State::None).then_some(args.limit),
                "admitted_per_s": f.admitted.0,
                "served_per_s": f.served.0,
                "served_per_s_lowest": f.served.1,
                "served_per_s_highest": f.served.2,
                "vs_in_process": f.vs_in_process.map(|v| v.0),
                "vs_in_process_lowest": f.vs_in_process.map(|v| v.1),
                "vs_in_process_highest": f.vs_in_process.map(|v| v.2),
                "served": sum(|f| f.served),
                "failed": sum(|f| f.failed),
                "redis_calls": redis.then(|| sum(|f| f.calls)),
                "redis_calls_per_s": f.calls_per_s.map(|v| v.0),
                "redis_calls_per_decision": f.calls_per_decision.map(|v| v.0),
                "over_bound": f.over_bound,
                "per_round": runs.iter().map(|r| serde_json::json!({
                    "admitted_per_s": per_s(r.flooded.admitted, args.duration),
                    "served_per_s": per_s(r.flooded.served, args.duration),
                    "vs_in_process": r.vs_in_process,
                    "admitted_in_run": r.flooded.admitted_in_run,
                    "most_admissible": r.most,
                })).collect::<Vec<_>>(),
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
        "rounds": args.rounds,
        "redis_error": redis_error,
        "rows": rows,
    })
}
