//! Accuracy study: how far the sliding window counter (and the token bucket) stray from an exact rolling window.
//!
//! Generates a reproducible synthetic trace (heavy-tailed clients, clients near the limit, clients bursting at
//! window edges), replays it through `sliding_window`, `token_bucket` and the exact `SlidingLog` from
//! `tollgate-core`, and prints the results next to Cloudflare's published figures.
//!
//! ```text
//! cargo run --release --example accuracy
//! cargo run --release --example accuracy -- --seed 7 --requests 4000000 --clients 200000 --limit 50 --period 10s
//! cargo run --release --example accuracy -- --json
//! ```

#[path = "../common/cli.rs"]
mod cli;
mod json;
mod replay;
mod report;
mod sliding_log;
mod tally;
mod trace;

use std::io::{ErrorKind, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::replay::Limiters;
use crate::tally::Tally;
use crate::trace::TraceConfig;

/// The most requests a run may hold in memory (16 bytes each, plus per-client logs).
const MAX_REQUESTS: u64 = 100_000_000;
/// The trace starts at this instant, rounded down to a window boundary (about November 2023).
const ORIGIN_US: u64 = 1_700_000_000_000_000;

#[derive(Debug, Clone, PartialEq)]
struct Args {
    trace: TraceConfig,
    json: bool,
}

impl Default for Args {
    fn default() -> Self {
        let trace = TraceConfig {
            seed: 42,
            requests: 2_000_000,
            clients: 100_000,
            limit: 100,
            period_us: 60_000_000,
            windows: 10,
        };
        Self { trace, json: false }
    }
}

/// The command line as given.
#[derive(Debug, clap::Parser)]
#[command(
    name = "accuracy",
    about = "How far the sliding window counter (and the token bucket) stray from an exact rolling window"
)]
struct Flags {
    /// PRNG seed; the same flags always give the same trace
    #[arg(long, value_name = "N", default_value = "42", value_parser = number)]
    seed: u64,

    /// Requests in the trace
    #[arg(long, value_name = "N", default_value = "2000000", value_parser = number)]
    requests: u64,

    /// Distinct clients
    #[arg(long, value_name = "N", default_value = "100000", value_parser = clients)]
    clients: u32,

    /// Requests admitted per period
    #[arg(long, value_name = "N", default_value = "100", value_parser = number)]
    limit: u64,

    /// The period: 60, 60s, 1500ms, 2m or 1h
    #[arg(long, value_name = "D", default_value = "60s", value_parser = period)]
    period: u64,

    /// Length of the trace in periods, at least 2
    #[arg(long, value_name = "N", default_value = "10", value_parser = number)]
    windows: u64,

    /// Print one JSON object instead of the tables
    #[arg(long)]
    json: bool,
}

/// The arguments (without the program name) as [`Args`]; `--help` is an error of kind `DisplayHelp`, as clap has
/// it.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, clap::Error> {
    use clap::Parser as _;
    let flags = Flags::try_parse_from(std::iter::once("accuracy".to_owned()).chain(args))?;
    let parsed = Args {
        trace: TraceConfig {
            seed: flags.seed,
            requests: flags.requests,
            clients: flags.clients,
            limit: flags.limit,
            period_us: flags.period,
            windows: flags.windows,
        },
        json: flags.json,
    };
    check(&parsed)
        .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, e + "\n"))?;
    Ok(parsed)
}

/// What the parser cannot check: the flags together.
fn check(parsed: &Args) -> Result<(), String> {
    let t = &parsed.trace;
    if t.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    if t.requests < u64::from(t.clients) {
        return Err(format!(
            "--requests ({}) must be at least --clients ({}): every client sends",
            t.requests, t.clients
        ));
    }
    if t.requests > MAX_REQUESTS {
        return Err(format!(
            "--requests: at most {MAX_REQUESTS} (the trace is held in memory)"
        ));
    }
    if t.windows < 2 {
        return Err("--windows must be at least 2: the counter needs a previous window".into());
    }
    // At least one edge-burst and one near-limit client always exist and send about 2.3 × limit per window.
    if t.limit.saturating_mul(t.windows).saturating_mul(3) > t.requests {
        return Err(
            "--limit × --windows × 3 must not exceed --requests: the edge-burst and near-limit \
                    clients alone send about 2.3 × limit per window"
                .into(),
        );
    }
    if t.period_us
        .checked_mul(t.windows)
        .is_none_or(|d| d > ORIGIN_US)
    {
        return Err("--period × --windows is too long".into());
    }
    Ok(())
}

/// A whole number (`_` allowed between digits).
fn number(value: &str) -> Result<u64, String> {
    value
        .replace('_', "")
        .parse()
        .map_err(|_| "not a whole number".to_owned())
}

/// `--clients`: a whole number that fits 32 bits.
fn clients(value: &str) -> Result<u32, String> {
    u32::try_from(number(value)?).map_err(|_| format!("at most {}", u32::MAX))
}

/// `60` (seconds), `60s`, `1500ms`, `2m`, `1h` → µs.
fn period(value: &str) -> Result<u64, String> {
    let bad = || "not a duration like 60s, 1500ms, 2m or 1h".to_owned();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let scale = match unit {
        "" | "s" => 1_000_000,
        "ms" => 1_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(scale).filter(|&us| us > 0).ok_or_else(bad)
}

fn run(args: &Args) -> Result<String, String> {
    let t = &args.trace;
    let period = Duration::from_micros(t.period_us);
    let limiters = Limiters::new(t.limit, period, t.requests).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let trace = trace::generate(t);
    let origin = ORIGIN_US - ORIGIN_US % t.period_us;
    let classes = replay::replay(&trace, &limiters, origin);
    let mut total = Tally::default();
    for (_, tally) in &classes {
        total.absorb(tally);
    }
    let setup = report::Setup {
        seed: t.seed,
        limit: t.limit,
        period_us: t.period_us,
        windows: t.windows,
        trace: &trace,
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok(if args.json {
        json::render(&setup, &classes, &total)
    } else {
        report::text(&setup, &classes, &total)
    })
}

fn main() -> ExitCode {
    let args = parse_args(std::env::args().skip(1)).unwrap_or_else(|e| cli::exit(&e));
    match run(&args) {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Ok(out) => match writeln!(std::io::stdout().lock(), "{out}") {
            Err(e) if e.kind() != ErrorKind::BrokenPipe => {
                eprintln!("accuracy: cannot write the report: {e}");
                ExitCode::FAILURE
            }
            _ => ExitCode::SUCCESS,
        },
        Err(e) => {
            eprintln!("accuracy: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::error::ErrorKind as Kind;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        parse_args(args.iter().map(|s| (*s).to_owned()))
    }

    /// The error `args` give: its kind and its text.
    fn error(args: &[&str]) -> (Kind, String) {
        let e = parse(args).unwrap_err();
        (e.kind(), e.to_string())
    }

    #[test]
    fn flags_override_the_defaults() {
        let args = parse(&[
            "--seed",
            "7",
            "--requests=3_000",
            "--clients",
            "30",
            "--limit",
            "5",
            "--period",
            "1500ms",
            "--json",
        ])
        .unwrap();
        let t = args.trace;
        assert_eq!(
            (
                t.seed,
                t.requests,
                t.clients,
                t.limit,
                t.period_us,
                t.windows
            ),
            (7, 3_000, 30, 5, 1_500_000, 10)
        );
        assert!(args.json);
        assert_eq!(parse(&[]).unwrap(), Args::default());
        assert_eq!(error(&["--help"]).0, Kind::DisplayHelp);
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        let (kind, text) = error(&["--limit"]);
        assert_eq!(kind, Kind::InvalidValue);
        assert!(
            text.contains("a value is required for '--limit <N>'"),
            "{text}"
        );
        let (kind, text) = error(&["--limit", "ten"]);
        assert_eq!(kind, Kind::ValueValidation);
        assert!(
            text.contains("invalid value 'ten' for '--limit <N>': not a whole number"),
            "{text}"
        );
        assert!(error(&["--period", "5 weeks"]).1.contains("not a duration"));
        assert!(error(&["--period", "0s"]).1.contains("not a duration"));
        assert!(
            error(&["--requests", "10", "--clients", "20"])
                .1
                .contains("at least --clients")
        );
        assert!(error(&["--windows", "1"]).1.contains("at least 2"));
        let (kind, text) = error(&["--fast"]);
        assert_eq!(kind, Kind::UnknownArgument);
        assert!(text.contains("unexpected argument '--fast'"), "{text}");
        let zero = Args {
            trace: TraceConfig {
                limit: 0,
                ..Args::default().trace
            },
            json: false,
        };
        assert_eq!(
            run(&zero).unwrap_err(),
            "a quota's limit must be at least 1"
        );
    }

    #[test]
    fn a_small_run_reports_every_section() {
        let args = parse(&[
            "--requests",
            "20000",
            "--clients",
            "500",
            "--limit",
            "20",
            "--period",
            "10s",
        ])
        .unwrap();
        let text = run(&args).unwrap();
        for needle in [
            "1. Cloudflare's method",
            "2. tollgate enforcing",
            "3. By client class",
            "4. Token bucket",
            "0.003 %",
            "Definitions",
        ] {
            assert!(text.contains(needle), "missing {needle}");
        }
        let json = run(&Args { json: true, ..args }).unwrap();
        assert!(
            json.starts_with("{\"seed\":42,") && json.ends_with("}}"),
            "{json}"
        );
        assert!(
            json.contains("\"total\":{\"clients\":500,\"requests\":20000,"),
            "{json}"
        );

        // The figures, recomputed on the same trace by other means: the stores themselves (MemoryStore at each
        // request's instant) for the counter and the bucket, and a naive exact log.
        let expected = Figures::recompute(&args);
        let line = |label: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(label))
                .unwrap_or_else(|| panic!("no line {label:?} in\n{text}"))
                .to_owned()
        };
        let (log, counter, bucket) = (
            thousands(expected.log),
            thousands(expected.counter),
            thousands(expected.bucket),
        );
        assert!(
            line("admitted, counter vs log").contains(&format!(" {counter} vs {log} ")),
            "{counter} vs {log}: {text}"
        );
        assert!(
            line("admitted, bucket vs log").contains(&format!(" {bucket} vs {log}")),
            "{bucket} vs {log}: {text}"
        );
        assert!(
            line("most bucket-admitted requests in one rolling period")
                .contains(&format!(" {} = ", expected.bucket_peak)),
            "bucket peak {}: {text}",
            expected.bucket_peak
        );
        let total = &json[json.find("\"total\":").expect("a total")..];
        for (name, value) in [
            ("log_allowed", expected.log),
            ("counter_allowed", expected.counter),
            ("bucket_allowed", expected.bucket),
            ("bucket_peak", expected.bucket_peak),
        ] {
            assert!(
                total.contains(&format!("\"{name}\":{value},"))
                    || total.contains(&format!("\"{name}\":{value}}}")),
                "{name} = {value} in {total}"
            );
        }
    }

    /// Admissions recomputed independently of `replay`.
    struct Figures {
        log: u64,
        counter: u64,
        bucket: u64,
        bucket_peak: u64,
    }

    impl Figures {
        fn recompute(args: &Args) -> Self {
            use tollgate::{MemoryStore, Policy, Quota, Timestamp};

            let t = &args.trace;
            let trace = trace::generate(t);
            let origin = ORIGIN_US - ORIGIN_US % t.period_us;
            let quota = Quota::new(t.limit, Duration::from_micros(t.period_us)).unwrap();
            let (window, bucket) = (
                Policy::sliding_window(quota).unwrap(),
                Policy::token_bucket(quota),
            );
            let store = MemoryStore::new();
            let clients = trace.classes.len();
            let mut logs: Vec<Vec<u64>> = vec![Vec::new(); clients];
            let mut buckets: Vec<Vec<u64>> = vec![Vec::new(); clients];
            let mut figures = Self {
                log: 0,
                counter: 0,
                bucket: 0,
                bucket_peak: 0,
            };
            // In the rolling period (now - period, now].
            let in_period = |times: &[u64], now: u64| {
                times.iter().filter(|&&at| at + t.period_us > now).count() as u64
            };
            for r in &trace.requests {
                let now = origin + r.at;
                let at = Timestamp::from_micros(now);
                let c = r.client as usize;
                if in_period(&logs[c], now) < t.limit {
                    logs[c].push(now);
                    figures.log += 1;
                }
                let key = format!("window:{}", r.client);
                if store.check_at(&key, &window, 1, at).unwrap().is_allowed() {
                    figures.counter += 1;
                }
                let key = format!("bucket:{}", r.client);
                if store.check_at(&key, &bucket, 1, at).unwrap().is_allowed() {
                    figures.bucket += 1;
                    buckets[c].push(now);
                    figures.bucket_peak = figures.bucket_peak.max(in_period(&buckets[c], now));
                }
            }
            figures
        }
    }

    /// `15707` → `15,707`, as the report writes counts.
    fn thousands(n: u64) -> String {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, d) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(d);
        }
        out
    }
}
