//! A rate limiter must never be slower or less reliable than the resource it protects: a load harness that shows
//! whether tollgate is, on this machine.
//!
//! `scripts/under-load.sh [SCENARIO ...] [FLAGS]` builds the `axum_server` example and this one (release) and runs
//! this one, which starts a private `redis-server` and, per case, a fresh `axum_server` with a rate limiter and a
//! concurrency limiter whose limits are far above the offered load (so every refusal is the limiter failing), and
//! drives it with keep-alive HTTP/1.1 connections, `GET /` (limited) and `GET /health` (never limited)
//! interleaved on each. Scenarios (default: all):
//!
//! - `one-conn` (a): one connection back to back, `--requests` requests per configuration — the limiters on
//!   Redis, on Redis with `--leases`, and in process — with a CPU hog on every core;
//! - `many-conns` (b): the same on `--connections` connections (64);
//! - `latency` (c): Redis behind a TCP proxy that delays every reply by 1, 5, 20 and 60 ms, or stalls for 100 ms
//!   and 1 s; for 60 ms and the stalls, the recovery once Redis answers on time again;
//! - `redis-busy` (d): Redis kept at 100 % CPU by `redis-benchmark`, then the recovery once it stops.
//!
//! One row per case: requests, 200s, refusals by kind (`429/<limiter>`, `503/<cause>/<limiter>` from the
//! problem+json body; `io/…`, `timeout` for no answer), admitted against the rate limiter's bound, the slots the
//! concurrency limiter still holds 2 s after the load (on Redis: live members of its `…:inflight` sorted sets; in
//! process: its own `RateLimit` count on one probe request), the p50/p99 the limiter adds (`GET /` minus
//! `GET /health`; in a case with a recovery, while Redis was slow), and the recovery. Then the goals, each PASS or
//! FAIL. `--json` prints one JSON object per row instead (the goals go to stderr); `--check` exits 1 when a goal
//! fails. Each case's server log and metrics stay in `--log-dir`.
//!
//! The failure policy is the server's default (`local`) unless `--on-store-error` sets one. A recovery is over once
//! nothing is refused and the server's metrics count no more decisions answered by its failure policy (under
//! `local` or `open` a failing Redis is never a refusal: only that count says when Redis decides again).

#![forbid(unsafe_code)]

#[path = "../common/cli.rs"]
mod cli;
mod client;
mod load;
mod procs;
mod report;
mod scenarios;
mod watch;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use tollgate_testkit::redis::RedisServer;

use crate::procs::Redis;
use crate::report::Row;
use crate::scenarios::Ctx;

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "under_load",
    about = "A rate limiter must never be slower or less reliable than the resource it protects: tollgate's \
             axum_server under load, on a busy machine, a slow Redis and a busy Redis",
    after_help = "scenarios: one-conn (a), many-conns (b), latency (c), redis-busy (d); default: all.\n\
                  Smoke run: under_load --quick"
)]
struct Flags {
    /// Scenarios to run: one-conn, many-conns, latency, redis-busy (or a, b, c, d) [default: all]
    #[arg(value_name = "SCENARIO")]
    scenarios: Vec<String>,

    /// GET / requests per configuration in one-conn and many-conns [default: 100000, --quick 20000]
    #[arg(long, value_name = "N", value_parser = cli::positive)]
    requests: Option<u64>,

    /// Connections of many-conns
    #[arg(long, value_name = "N", default_value = "64", value_parser = cli::positive_usize)]
    connections: usize,

    /// How long Redis is slow or busy in latency and redis-busy [default: 4s, --quick 2s]
    #[arg(long, value_name = "DUR", value_parser = cli::duration)]
    phase: Option<Duration>,

    /// How long the load goes on once Redis is well again (the recovery must show within it) [default: 3s,
    /// --quick 2s]
    #[arg(long, value_name = "DUR", value_parser = cli::duration)]
    recovery_window: Option<Duration>,

    /// A smoke run: fewer requests, shorter phases
    #[arg(long)]
    quick: bool,

    /// A GET /health after every N GET / on each connection
    #[arg(long, value_name = "N", default_value = "1", value_parser = cli::positive)]
    health_every: u64,

    /// The servers' failure policy when Redis fails [default: axum_server's]
    #[arg(long, value_name = "POLICY", value_parser = ["open", "closed", "local"])]
    on_store_error: Option<String>,

    /// The axum_server example's binary
    #[arg(
        long,
        value_name = "PATH",
        default_value = "target/release/examples/axum_server"
    )]
    server: PathBuf,

    /// The servers' --log level (their logs stay in --log-dir)
    #[arg(long, value_name = "LEVEL", default_value = "warn", value_parser = ["error", "warn", "info", "debug"])]
    server_log: String,

    /// Where each case's server log and metrics go [default: a new directory in the temp dir]
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,

    /// One JSON object per row on stdout instead of the table
    #[arg(long)]
    json: bool,

    /// Exit 1 when a goal fails
    #[arg(long)]
    check: bool,
}

/// A scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scenario {
    OneConn,
    ManyConns,
    Latency,
    RedisBusy,
}

impl Scenario {
    const ALL: [Self; 4] = [
        Self::OneConn,
        Self::ManyConns,
        Self::Latency,
        Self::RedisBusy,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::OneConn => "one-conn",
            Self::ManyConns => "many-conns",
            Self::Latency => "latency",
            Self::RedisBusy => "redis-busy",
        }
    }

    fn parse(word: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .zip(["a", "b", "c", "d"])
            .find(|(s, letter)| word == s.name() || word == *letter)
            .map(|(s, _)| s)
            .ok_or_else(|| {
                format!("unknown scenario {word:?} (expected one-conn, many-conns, latency or redis-busy)")
            })
    }
}

/// The run the flags describe.
#[derive(Debug)]
struct Args {
    scenarios: Vec<Scenario>,
    requests: u64,
    connections: usize,
    phase: Duration,
    window: Duration,
    health_every: u64,
    on_store_error: Option<String>,
    server: PathBuf,
    server_log: String,
    log_dir: Option<PathBuf>,
    json: bool,
    check: bool,
}

impl Args {
    /// Checks what the parser cannot; `--quick` sets the defaults of the flags not given.
    fn from_flags(flags: Flags) -> Result<Self, String> {
        let mut scenarios = flags
            .scenarios
            .iter()
            .map(|w| Scenario::parse(w))
            .collect::<Result<Vec<_>, _>>()?;
        if scenarios.is_empty() {
            scenarios = Scenario::ALL.to_vec();
        }
        scenarios.sort_unstable();
        scenarios.dedup();
        let quick = flags.quick;
        let args = Self {
            scenarios,
            requests: flags
                .requests
                .unwrap_or(if quick { 20_000 } else { 100_000 }),
            connections: flags.connections,
            phase: flags
                .phase
                .unwrap_or(Duration::from_secs(if quick { 2 } else { 4 })),
            window: flags
                .recovery_window
                .unwrap_or(Duration::from_secs(if quick { 2 } else { 3 })),
            health_every: flags.health_every,
            on_store_error: flags.on_store_error,
            server: flags.server,
            server_log: flags.server_log,
            log_dir: flags.log_dir,
            json: flags.json,
            check: flags.check,
        };
        if args.requests > 10_000_000 {
            return Err("--requests: at most 10000000".to_owned());
        }
        if args.connections > 512 {
            // All connections are one client: more than the concurrency limit (1000) would be refused by design.
            return Err("--connections: at most 512".to_owned());
        }
        if args.phase < Duration::from_millis(200) || args.phase > Duration::from_secs(60) {
            return Err("--phase: from 200ms to 60s".to_owned());
        }
        if args.window < Duration::from_secs(1) || args.window > Duration::from_secs(60) {
            return Err("--recovery-window: from 1s (the goal) to 60s".to_owned());
        }
        Ok(args)
    }
}

#[tokio::main]
async fn main() {
    let args = Args::from_flags(cli::parse()).unwrap_or_else(|e| cli::fail(e));
    for tool in ["redis-server", "redis-cli"] {
        if !procs::runnable(tool) {
            cli::fail(format!(
                "{tool} is not on PATH (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"
            ));
        }
    }
    if args.scenarios.contains(&Scenario::RedisBusy) && !procs::runnable("redis-benchmark") {
        cli::fail(
            "redis-benchmark is not on PATH (it comes with redis-server: apt-get install redis-server)",
        );
    }
    if !args.server.is_file() {
        cli::fail(format!(
            "--server {}: no such file (build it: cargo build --release --example axum_server)",
            args.server.display()
        ));
    }
    // Ctrl-C or SIGTERM drops the run, and with it every child's guard: nothing is left spinning.
    let code = tokio::select! {
        result = run(&args) => match result {
            Ok(passed) => i32::from(args.check && !passed),
            Err(e) => {
                eprintln!("under_load: {e}");
                1
            }
        },
        () = interrupted() => {
            eprintln!("under_load: interrupted; its children are stopped");
            130
        }
    };
    std::process::exit(code);
}

/// The first SIGINT or SIGTERM.
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without handlers the default action (exit) stays; the guards cannot run then.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Runs the scenarios, printing each row as it is done and the goals at the end; whether every goal passed.
async fn run(args: &Args) -> Result<bool, String> {
    let log_dir = match &args.log_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("under-load-{}", std::process::id())),
    };
    std::fs::create_dir_all(&log_dir).map_err(|e| format!("{}: {e}", log_dir.display()))?;
    let server = std::panic::catch_unwind(RedisServer::start)
        .map_err(|_| "the private redis-server did not start (see the message above)".to_owned())?;
    let redis = Redis { server };
    let version = redis
        .server
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("redis_version:").map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned());
    let ctx = Ctx {
        server_bin: args.server.clone(),
        server_log: args.server_log.clone(),
        log_dir: log_dir.clone(),
        redis,
        requests: args.requests,
        connections: args.connections,
        phase: args.phase,
        window: args.window,
        health_every: args.health_every,
        on_store_error: args.on_store_error.clone(),
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    // The table and the goals go to stdout; with --json, stdout is the rows alone and the rest goes to stderr.
    let say = |line: &str| {
        let _ = if args.json {
            writeln!(std::io::stderr(), "{line}")
        } else {
            writeln!(std::io::stdout(), "{line}")
        };
    };
    say(&format!(
        "under_load: {} on a private Redis {version}; {cores} cores; limits {} per 1s (token bucket) and {} in flight \
         per client, far above the load; on store error {}; a GET /health after every {} GET /; \
         {cores} CPU hogs during one-conn and many-conns; logs in {}",
        args.server.display(),
        scenarios::LIMIT,
        scenarios::CONCURRENCY,
        args.on_store_error
            .as_deref()
            .unwrap_or("as the server's default (see its start-up line)"),
        args.health_every,
        log_dir.display()
    ));
    say(
        "slots: on Redis, the live members of the concurrency limiter's <ns>:{<key>}:inflight sets (score above \
         the server's TIME); in process, the limiter's own count, limit - r - 1, from the RateLimit field of one \
         probe GET /",
    );
    say(
        "+p50/+p99: GET / minus GET /health on the same connections; in a case with a recovery, of the requests \
         answered while Redis was slow; recover: from Redis well again to the first 200 after which none is refused",
    );
    say("");
    say(&report::header());
    let mut rows: Vec<Row> = Vec::new();
    // Each row is printed as soon as its case is done.
    let mut emit = |row: Row| -> Result<(), String> {
        if args.json {
            let json = serde_json::to_string(&row).map_err(|e| e.to_string())?;
            let _ = writeln!(std::io::stdout(), "{json}");
        } else {
            say(&report::line(&row));
        }
        if !row.note.is_empty() {
            eprintln!("  {} {}: {}", row.scenario, row.config, row.note);
        }
        rows.push(row);
        Ok(())
    };
    for scenario in &args.scenarios {
        match scenario {
            Scenario::OneConn => {
                ctx.connections(Scenario::OneConn.name(), 1, &mut emit)
                    .await?
            }
            Scenario::ManyConns => {
                ctx.connections(Scenario::ManyConns.name(), ctx.connections, &mut emit)
                    .await?;
            }
            Scenario::Latency => ctx.latency(&mut emit).await?,
            Scenario::RedisBusy => ctx.redis_busy(&mut emit).await?,
        }
    }
    say("");
    let policies: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r.on_store_error.as_str()).collect();
    let policies: Vec<&str> = policies.into_iter().collect();
    say(&format!(
        "goals (the servers' --on-store-error: {}):",
        policies.join(", ")
    ));
    let goals = report::goals(&rows, args.requests);
    for goal in &goals {
        say(&format!(
            "  {}  {}",
            if goal.pass { "PASS" } else { "FAIL" },
            goal.what
        ));
    }
    let failed: Vec<usize> = {
        let mut rows: Vec<usize> = goals.iter().filter(|g| !g.pass).map(|g| g.row).collect();
        rows.dedup();
        rows
    };
    if !failed.is_empty() {
        say("");
        say("failing cases, from their server logs:");
        for i in failed {
            say(&format!("  {} {}:", rows[i].scenario, rows[i].config));
            for line in report::evidence(&rows[i], 8) {
                say(&format!("    {line}"));
            }
        }
    }
    let passed = goals.iter().all(|g| g.pass);
    say(&format!(
        "\n{} of {} goals pass",
        goals.iter().filter(|g| g.pass).count(),
        goals.len()
    ));
    Ok(passed)
}
