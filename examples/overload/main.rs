//! Load shedding at the instant of overload: what each design does when offered more than the service can take.
//!
//! `cargo run --release --example overload` starts a real axum service on loopback with a fixed pool of workers
//! and a service time (beyond the pool, requests queue and latency grows), once per design, and offers it an
//! open-loop load of 10 % critical, 30 % normal and 60 % low requests stepped from 0.5× to 3× its capacity. Each
//! client gives up after a deadline. One row per design and step:
//!
//! - **goodput**: requests answered 200 within the deadline per second, as a share of capacity;
//! - **critical**: the share of critical requests answered 200 within the deadline;
//! - **admitted**: the share of requests not turned away at once (503/429);
//! - **p50 / p99** latency of the admitted requests (one past the deadline counts as the deadline).
//!
//! Designs: no protection; a static concurrency limit (twice the pool); the worker shedder (capacity twice the
//! pool); the adaptive limit with Gradient2 and with AIMD. `--json` prints the rows as a JSON array instead (fields
//! `design`, `load`, `goodput`, `critical_success`, `admitted`, `p50_ms`, `p99_ms`, `sent`); `--plot FILE.svg`
//! draws the p99 latency and the adaptive limits over time. Run with `--help` for the flags.

#[path = "../common/cli.rs"]
mod cli;
mod load;
mod plot;
mod service;

use std::io::Write as _;
use std::time::Duration;

use service::{Design, Shape};

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "overload",
    about = "Load shedding at the instant of overload: what each design does when offered more than the service \
             can take",
    after_help = "CI smoke test: overload --steps 0.5,3 --step-duration 1s --json"
)]
struct Flags {
    /// Load steps, × capacity, comma-separated
    #[arg(
        long,
        value_name = "LIST",
        default_value = "0.5,1,1.5,2,3",
        value_delimiter = ',',
        value_parser = loads
    )]
    steps: Vec<f64>,

    /// How long each step lasts: 500ms, 3s …
    #[arg(long, value_name = "DUR", default_value = "3s", value_parser = cli::duration)]
    step_duration: Duration,

    /// The service's worker pool
    #[arg(long, value_name = "N", default_value = "16", value_parser = cli::positive)]
    workers: u64,

    /// Each request's work: capacity = workers / service time
    #[arg(long, value_name = "DUR", default_value = "80ms", value_parser = cli::duration)]
    service_time: Duration,

    /// Clients give up after this
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = cli::duration)]
    deadline: Duration,

    /// Print the rows as a JSON array (progress goes to stderr)
    #[arg(long)]
    json: bool,

    /// Draw latency and the adaptive limits over time
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<String>,
}

#[derive(Debug)]
struct Args {
    loads: Vec<f64>,
    step_duration: Duration,
    shape: Shape,
    deadline: Duration,
    json: bool,
    plot: Option<String>,
}

impl Args {
    fn from_flags(flags: Flags) -> Result<Self, String> {
        let parsed = Self {
            loads: flags.steps,
            step_duration: flags.step_duration,
            shape: Shape {
                workers: flags.workers.min(100_000),
                service_time: flags.service_time,
            },
            deadline: flags.deadline,
            json: flags.json,
            plot: flags.plot,
        };
        if parsed.step_duration > Duration::from_secs(600) {
            return Err("--step-duration: at most 10m".to_owned());
        }
        let rate = parsed.shape.capacity() * parsed.loads.iter().copied().fold(0.0, f64::max);
        if rate > 20_000.0 {
            return Err(format!(
                "the highest step offers {rate:.0} req/s: at most 20000 (fewer --workers or a longer --service-time)"
            ));
        }
        Ok(parsed)
    }
}

/// `0.5,1,3`: loads above 0 and at most 10 × capacity (one value of the list; clap splits at the commas).
fn loads(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(l) if l > 0.0 && l <= 10.0 => Ok(l),
        _ => Err("expected a load above 0 and at most 10 (× capacity)".to_owned()),
    }
}

#[tokio::main]
async fn main() {
    let args = Args::from_flags(cli::parse()).unwrap_or_else(|e| cli::fail(e));
    if let Err(message) = run(&args).await {
        eprintln!("overload: {message}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let capacity = args.shape.capacity();
    let mut out = std::io::stdout();
    let mut say = |line: String| {
        // The table goes to stdout; with --json, stdout is the JSON alone.
        let _ = if args.json {
            writeln!(std::io::stderr(), "{line}")
        } else {
            writeln!(out, "{line}")
        };
    };
    say(format!(
        "overload: {} workers × {:?} per request = capacity {capacity:.0} req/s; load 10 % critical, 30 % normal, \
         60 % low, steps {:?} × capacity, {:?} each; clients give up after {:?}\n",
        args.shape.workers, args.shape.service_time, args.loads, args.step_duration, args.deadline
    ));
    say(format!(
        "{:<26} {:>5} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "design",
        "load",
        "req/s",
        "goodput",
        "critical",
        "admitted",
        "p50 ms",
        "p99 ms",
        "p99/0.5×"
    ));
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for design in Design::ALL {
        let server = service::start(design, args.shape).await?;
        let run = load::offer(
            server.addr,
            capacity,
            &args.loads,
            args.step_duration,
            args.deadline,
            server.limit.as_deref(),
        )
        .await;
        drop(server);
        let design_rows = load::rows(
            design.name(),
            &run,
            &args.loads,
            args.step_duration,
            capacity,
        );
        let uncongested = design_rows.first().map_or(0.0, |r| r.p99_ms);
        for r in &design_rows {
            say(format!(
                "{:<26} {:>4}× {:>8.0} {:>7.0}% {:>8.1}% {:>8.1}% {:>9.1} {:>9.1} {:>9.2}×",
                r.design,
                r.load,
                r.load * capacity,
                r.goodput * 100.0,
                r.critical_success * 100.0,
                r.admitted * 100.0,
                r.p50_ms,
                r.p99_ms,
                if uncongested > 0.0 {
                    r.p99_ms / uncongested
                } else {
                    0.0
                }
            ));
        }
        rows.extend(design_rows);
        runs.push((design.name(), run));
    }
    if args.json {
        let json = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
        let _ = writeln!(std::io::stdout(), "{json}");
    }
    if let Some(path) = &args.plot {
        plot::draw(path, &runs, &args.loads, args.step_duration, args.deadline)
            .map_err(|e| format!("--plot {path:?}: {e}"))?;
        eprintln!("overload: plot written to {path}");
    }
    Ok(())
}
