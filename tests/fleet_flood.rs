//! `examples/fleet` as a black box, on a private Redis: the steady table's "Redis calls / decision" column and
//! `--scenario flood` (one client far over its limit, the deny cache on and off), read from `--json`.

use std::process::Command;

use serde_json::Value;
use tollgate_testkit::examples::{example, run_example};
use tollgate_testkit::redis::RedisServer;

/// Runs the fleet with `args` on a private Redis; its `--json` output.
fn fleet_json(args: &[&str]) -> Value {
    let redis = RedisServer::start();
    let url = redis.url();
    let args = args.iter().copied().chain(["--redis-url", &url, "--json"]);
    let stdout = String::from_utf8_lossy(&run_example("fleet", args).stdout).into_owned();
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn num(row: &Value, field: &str) -> f64 {
    row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} in {row}"))
}

/// The rows' (design, state) pairs.
fn labels(run: &Value) -> Vec<(String, String)> {
    run["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["design"].as_str().unwrap().to_owned(),
                r["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The flood: every store holds the limit; without the deny cache each decision is one script call (to within the
/// requests in flight at the window's two ends), with it a small share of one; in-process rows make none.
#[test]
fn the_flood_holds_the_limit_and_the_deny_cache_spares_redis() {
    let (instances, limit, connections) = (2.0, 50.0, 8.0);
    let run = fleet_json(&[
        "--scenario",
        "flood",
        "--instances",
        "2",
        "--limit",
        "50",
        "--connections",
        "8",
        "--duration",
        "2s",
        // A whole window: the sliding window's first window, which the warm-up's burst filled, is over before the
        // measured span begins (with a shorter warm-up the span starts in that window and admits nothing there).
        "--warmup",
        "1s",
    ]);
    assert_eq!(run["scenario"], "flood");
    let pairs = |names: &[(&str, &str)]| -> Vec<(String, String)> {
        names
            .iter()
            .map(|(d, s)| ((*d).to_owned(), (*s).to_owned()))
            .collect()
    };
    assert_eq!(
        labels(&run),
        pairs(&[
            ("no limiter (baseline)", "-"),
            ("token bucket", "in-process"),
            ("sliding window", "in-process"),
            ("token bucket", "Redis"),
            ("token bucket", "Redis, no deny cache"),
            ("sliding window", "Redis"),
            ("sliding window", "Redis, no deny cache"),
            ("token bucket", "Redis + leases"),
            ("sliding window", "Redis + leases"),
        ])
    );
    let seconds = 2.0;
    for row in run["rows"].as_array().unwrap() {
        let state = row["state"].as_str().unwrap();
        assert_eq!(row["failed"], 0, "{row}");
        let admitted = num(row, "admitted_per_s");
        let served = num(row, "served_per_s");
        // The burst was spent in the warm-up; the rate is what the limit lets through (±25 %: a window-aligned
        // counter over 2 s and the window's edges).
        let expected = match state {
            "-" => served,
            "in-process" => instances * limit,
            _ => limit,
        };
        // A sliding window's leased slots are spent in their window or lost to it: each instance may lose its
        // batch (at most 10 % of the limit, `LeaseConfig`'s default share) at a window's end, and its unreturned
        // leftovers weigh on the next window's estimate until its next call gives them back.
        let lost = if state == "Redis + leases" && row["design"] == "sliding window" {
            2.0 * instances * (limit * 0.1).ceil()
        } else {
            0.0
        };
        assert!(
            admitted <= 1.25 * expected && admitted >= 0.75 * expected - lost,
            "{row}: admitted {admitted}/s, expected about {expected}/s (less at most {lost} lost to leases)"
        );
        if state != "-" {
            assert!(served > 2.0 * admitted, "far over its limit: {row}");
        }
        let decided = num(row, "served") - num(row, "failed");
        match state {
            "-" | "in-process" => assert!(row["redis_calls"].is_null(), "{row}"),
            "Redis, no deny cache" => {
                let calls = num(row, "redis_calls");
                assert!(
                    (calls - decided).abs() <= 2.0 * connections,
                    "one call per decision: {calls} calls for {decided} decisions"
                );
            }
            "Redis + leases" => {
                // Admissions come from leased batches, refusals from the batch's book or the deny cache.
                let calls = num(row, "redis_calls");
                assert!(calls > 0.0, "{row}: leases are fetched from Redis");
                assert!(
                    num(row, "redis_calls_per_decision") <= 0.5,
                    "leases and the deny cache answered few decisions: {row}"
                );
            }
            _ => {
                let calls = num(row, "redis_calls");
                // Every admission is a store call; refusals are mostly answered by the cache.
                assert!(
                    calls >= admitted * seconds - connections,
                    "{row}: fewer calls than admissions"
                );
                assert!(
                    num(row, "redis_calls_per_decision") <= 0.5,
                    "the deny cache answered few refusals: {row}"
                );
            }
        }
    }
}

/// `--rounds`: every row has each round's own figures, no round admitted more than its limiters can give over
/// its span (a token bucket's burst plus what accrues, per bucket: tight enough that one request more fails), and
/// the medians lie within their spread.
#[test]
fn the_flood_in_rounds_holds_every_round_to_its_bound() {
    let run = fleet_json(&[
        "--scenario",
        "flood",
        "--instances",
        "2",
        "--limit",
        "50",
        "--connections",
        "4",
        "--duration",
        "500ms",
        "--warmup",
        "500ms",
        "--rounds",
        "2",
    ]);
    assert_eq!(run["rounds"], 2);
    for row in run["rows"].as_array().unwrap() {
        let rounds = row["per_round"].as_array().expect("per_round");
        assert_eq!(rounds.len(), 2, "{row}");
        let (low, median, high) = (
            num(row, "served_per_s_lowest"),
            num(row, "served_per_s"),
            num(row, "served_per_s_highest"),
        );
        assert!(low <= median && median <= high, "{row}");
        if row["state"] == "-" {
            assert!(
                row["over_bound"].is_null() && row["vs_in_process"].is_null(),
                "{row}"
            );
            continue;
        }
        assert_eq!(row["over_bound"], 0, "{row}");
        for round in rounds {
            let (admitted, most) = (num(round, "admitted_in_run"), num(round, "most_admissible"));
            assert!(admitted > 0.0 && admitted <= most, "{row}");
            if row["design"] == "token bucket" {
                // From a full bucket of 50 (per instance in-process) plus 50/s for a run of about a second.
                let buckets = if row["state"] == "in-process" {
                    2.0
                } else {
                    1.0
                };
                assert!(most <= buckets * (50.0 + 50.0 * 1.5 + 1.0), "{row}");
            }
        }
        if row["state"] == "in-process" {
            assert_eq!(row["vs_in_process"], 1.0, "{row}");
        } else {
            assert!(num(row, "vs_in_process") > 0.0, "{row}");
        }
    }
}

/// The steady table's column: in-process rows make no Redis calls; a Redis row makes one per admission at least
/// and at most one per decision (the deny cache answers the rest), counted over the whole run; a lease row some,
/// at most one per decision.
#[test]
fn the_steady_table_counts_redis_calls_per_decision() {
    let run = fleet_json(&[
        "--instances",
        "2",
        "--limit",
        "20",
        "--duration",
        "1s",
        "--warmup",
        "500ms",
    ]);
    assert_eq!(run["scenario"], "steady");
    let (mut redis_rows, mut lease_rows) = (0, 0);
    for row in run["rows"].as_array().unwrap() {
        let leases = row["state"] == "Redis + leases";
        if row["state"] != "Redis" && !leases {
            assert!(row["redis_calls_per_decision"].is_null(), "{row}");
            continue;
        }
        assert_eq!(row["deny_cache"], true, "the default on Redis: {row}");
        let (calls, decided) = (num(row, "redis_calls"), num(row, "decided"));
        assert!(decided > 0.0 && calls <= decided, "{row}");
        assert!(
            (num(row, "redis_calls_per_decision") - calls / decided).abs() < 1e-9,
            "{row}"
        );
        if leases {
            // A batch is one call for several admissions: only some call is certain.
            lease_rows += 1;
            assert!(calls > 0.0, "{row}");
            continue;
        }
        redis_rows += 1;
        // Admissions of the measured window alone, a lower bound for the whole run's.
        assert!(calls >= num(row, "admitted_per_s"), "{row}");
    }
    assert_eq!(lease_rows, 2, "{run}");
    assert_eq!(redis_rows, 2, "{run}");
}

/// Flags that do not go with the flood are refused before anything runs.
#[test]
fn the_flood_refuses_flags_it_does_not_take() {
    for args in [
        &["--scenario", "flood", "--offered", "500"][..],
        &["--scenario", "flood", "--autoscale"],
        &["--scenario", "storm"],
        &["--rounds", "2"],
        &["--redis-cluster", ","],
    ] {
        let out = Command::new(example("fleet"))
            .args(args)
            .output()
            .expect("run the fleet");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing measured");
        assert!(!out.stderr.is_empty(), "{args:?}: a message");
    }
}
