//! The result of one case as a table row or a JSON object, and the goals every row is judged by.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

/// The longest recovery allowed: from Redis answering within budget again to the first 200 after which nothing is
/// refused and nothing is answered by the failure policy.
pub(crate) const RECOVERY_GOAL_S: f64 = 1.0;

/// The number of requests per configuration the goals of (a) and (b) ask for.
pub(crate) const GOAL_REQUESTS: u64 = 100_000;

/// One case: a scenario in one configuration.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// `one-conn`, `many-conns`, `latency`, `redis-busy`.
    pub(crate) scenario: &'static str,
    /// The configuration (`redis`, `redis+leases`, `in-process`) or the latency case (`delay 20ms`, `stall 1s`).
    pub(crate) config: String,
    /// `GET /` requests sent (the limited route; the `/health` requests between them are counted apart).
    pub(crate) requests: u64,
    /// `GET /health` requests sent.
    pub(crate) health_requests: u64,
    /// Requests of either route answered 200.
    pub(crate) ok: u64,
    /// Requests of either route not answered 200.
    pub(crate) refused: u64,
    /// The refusals by kind (see `load::Sample::refusal`).
    pub(crate) refusals: BTreeMap<String, u64>,
    /// `GET /` answered 200: what the rate limiter admitted.
    pub(crate) admitted: u64,
    /// The most the rate limiter may admit over the load: a full bucket (the burst) plus what refills meanwhile.
    pub(crate) bound: u64,
    /// The server's `--on-store-error` (its default unless `under_load --on-store-error` set one).
    pub(crate) on_store_error: String,
    /// The concurrency limiter's slots still held 2 s after the load stopped.
    pub(crate) slots_held: Option<u64>,
    /// How `slots_held` was measured.
    pub(crate) slots_by: &'static str,
    /// When slots were held at 2 s: those still held after the slots' TTL (`None`: not needed or not possible).
    pub(crate) slots_past_ttl: Option<u64>,
    /// p50 of `GET /` minus p50 of `GET /health`, in milliseconds. In a case with a recovery, of the requests
    /// answered while Redis was slow (before it was well again).
    pub(crate) added_p50_ms: f64,
    /// p99 of `GET /` minus p99 of `GET /health`, in milliseconds.
    pub(crate) added_p99_ms: f64,
    /// p50 and p99 of `GET /` and of `GET /health`, in milliseconds.
    pub(crate) p50_ms: f64,
    /// See `p50_ms`.
    pub(crate) p99_ms: f64,
    /// See `p50_ms`.
    pub(crate) health_p50_ms: f64,
    /// See `p50_ms`.
    pub(crate) health_p99_ms: f64,
    /// Seconds of load.
    pub(crate) duration_s: f64,
    /// Seconds from Redis answering within budget again to the first 200 after which nothing was refused
    /// (`None`: no recovery measured in this case, or none happened: see `recovered`).
    pub(crate) recover_s: Option<f64>,
    /// Whether a recovery was due and happened within the load (`None`: not applicable).
    pub(crate) recovered: Option<bool>,
    /// The server's stdout and stderr.
    pub(crate) log: PathBuf,
    /// What to say about the case (e.g. how busy Redis was).
    pub(crate) note: String,
}

/// One goal on one row.
#[derive(Debug)]
pub(crate) struct Goal {
    /// What is demanded, and what was seen.
    pub(crate) what: String,
    /// Whether it holds.
    pub(crate) pass: bool,
    /// The row it is about (for the log lines of a failing one).
    pub(crate) row: usize,
}

/// A number of milliseconds as the table shows it.
fn ms(v: f64) -> String {
    format!("{v:.3}")
}

/// `1234567890` as `1.23e9` when too wide for the column.
fn compact(n: u64) -> String {
    if n < 10_000_000_000 {
        n.to_string()
    } else {
        format!("{:.2e}", n as f64)
    }
}

/// The table's header line.
pub(crate) fn header() -> String {
    format!(
        "{:<10} {:<16} {:>8} {:>8} {:>7} {:>22} {:>6} {:>8} {:>8} {:>8}  refusals",
        "scenario",
        "config",
        "requests",
        "200",
        "refused",
        "admitted <= bound",
        "slots",
        "+p50 ms",
        "+p99 ms",
        "recover"
    )
}

/// One row of the table.
pub(crate) fn line(r: &Row) -> String {
    let slots = r
        .slots_held
        .map_or_else(|| "?".to_owned(), |n| n.to_string());
    let recover = match (r.recover_s, r.recovered) {
        (Some(s), _) => format!("{s:.3}s"),
        (None, Some(false)) => "never".to_owned(),
        (None, _) => "-".to_owned(),
    };
    let refusals = if r.refusals.is_empty() {
        "-".to_owned()
    } else {
        r.refusals
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "{:<10} {:<16} {:>8} {:>8} {:>7} {:>22} {:>6} {:>8} {:>8} {:>8}  {refusals}",
        r.scenario,
        r.config,
        r.requests,
        r.ok,
        r.refused,
        format!("{} <= {}", r.admitted, compact(r.bound)),
        slots,
        ms(r.added_p50_ms),
        ms(r.added_p99_ms),
        recover,
    )
}

/// The goals of every row, in row order.
pub(crate) fn goals(rows: &[Row], requests: u64) -> Vec<Goal> {
    let mut goals = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let mut goal = |what: String, pass: bool| goals.push(Goal { what, pass, row: i });
        let case = format!("{} {}", r.scenario, r.config);
        match r.scenario {
            "one-conn" | "many-conns" => {
                let asked = if requests < GOAL_REQUESTS {
                    format!("{requests} requests (a short run: the goal is >= {GOAL_REQUESTS})")
                } else {
                    format!(">= {GOAL_REQUESTS} requests")
                };
                goal(
                    format!(
                        "{case}: zero refusals in {asked}: {} refused of {}",
                        r.refused, r.requests
                    ),
                    r.refused == 0 && r.requests >= requests,
                );
            }
            _ => {
                if r.recovered.is_none() {
                    goal(
                        format!(
                            "{case}: zero refusals: {} refused of {}",
                            r.refused,
                            r.requests + r.health_requests
                        ),
                        r.refused == 0,
                    );
                } else {
                    let seen = r.recover_s.map_or_else(
                        || "never within the run".to_owned(),
                        |s| format!("{s:.3} s"),
                    );
                    goal(
                        format!("{case}: recovers within {RECOVERY_GOAL_S} s: {seen}"),
                        r.recover_s.is_some_and(|s| s <= RECOVERY_GOAL_S),
                    );
                }
                goal(
                    format!(
                        "{case}: admits no more than the bound: {} <= {}",
                        r.admitted, r.bound
                    ),
                    r.admitted <= r.bound,
                );
                let (pass, seen) = match (r.slots_held, r.slots_past_ttl) {
                    (Some(0), _) => (true, "none held 2 s after the load".to_owned()),
                    (Some(n), Some(0)) => (true, format!("{n} held at 2 s, none past the TTL")),
                    (Some(n), Some(m)) => (false, format!("{n} held at 2 s, {m} past the TTL")),
                    (Some(n), None) => {
                        (false, format!("{n} held at 2 s, not counted past the TTL"))
                    }
                    (None, _) => (false, "could not be counted".to_owned()),
                };
                goal(format!("{case}: holds no slot past its TTL: {seen}"), pass);
            }
        }
    }
    goals
}

/// The lines of a failing case's log worth reading (warnings, errors) and its store-error metrics, at most
/// `max` of each, distinct, in order.
pub(crate) fn evidence(row: &Row, max: usize) -> Vec<String> {
    let mut out = vec![format!("log: {}", row.log.display())];
    let text = std::fs::read_to_string(&row.log).unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    for l in text.lines() {
        let upper = l.to_ascii_uppercase();
        if !(upper.contains("WARN") || upper.contains("ERROR")) {
            continue;
        }
        // Lines differ by their timestamps: keep one of each message.
        let message = l.split_once(": ").map_or(l, |(_, m)| m);
        if seen.insert(message.to_owned()) {
            out.push(format!("  {l}"));
            if seen.len() >= max {
                break;
            }
        }
    }
    if seen.is_empty() {
        out.push("  (no warning or error in the log)".to_owned());
    }
    let metrics = std::fs::read_to_string(row.log.with_extension("metrics")).unwrap_or_default();
    let failing: Vec<&str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.contains("store_error")
                || l.starts_with("tollgate_store_errors_total")
                || l.starts_with("tollgate_circuit")
        })
        .filter(|l| l.rsplit(' ').next().is_some_and(|v| v != "0"))
        .take(max)
        .collect();
    for l in failing {
        out.push(format!("  metric {l}"));
    }
    out
}
