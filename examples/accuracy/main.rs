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

mod json;
mod replay;
mod report;
mod tally;
mod trace;

use std::io::{ErrorKind, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::replay::Limiters;
use crate::tally::Tally;
use crate::trace::TraceConfig;

const USAGE: &str = "\
usage: accuracy [--seed N] [--requests N] [--clients N] [--limit N] [--period D] [--windows N] [--json]

  --seed N       PRNG seed; the same flags always give the same trace    (default 42)
  --requests N   requests in the trace                                    (default 2000000)
  --clients N    distinct clients                                         (default 100000)
  --limit N      requests admitted per period                             (default 100)
  --period D     the period: 60, 60s, 1500ms, 2m or 1h                     (default 60s)
  --windows N    length of the trace in periods, at least 2               (default 10)
  --json         print one JSON object instead of the tables";

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

/// `None` when help was asked for.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<Args>, String> {
    let mut parsed = Args::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
            None => (arg, None),
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--json" if inline.is_none() => parsed.json = true,
            "--seed" | "--requests" | "--clients" | "--limit" | "--period" | "--windows" => {
                let value = inline
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{flag} needs a value"))?;
                let t = &mut parsed.trace;
                match flag.as_str() {
                    "--seed" => t.seed = number(&flag, &value)?,
                    "--requests" => t.requests = number(&flag, &value)?,
                    "--clients" => {
                        t.clients = u32::try_from(number(&flag, &value)?)
                            .map_err(|_| format!("--clients: at most {}", u32::MAX))?;
                    }
                    "--limit" => t.limit = number(&flag, &value)?,
                    "--period" => t.period_us = period(&value)?,
                    _ => t.windows = number(&flag, &value)?,
                }
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
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
    Ok(Some(parsed))
}

fn number(flag: &str, value: &str) -> Result<u64, String> {
    value
        .replace('_', "")
        .parse()
        .map_err(|_| format!("{flag}: `{value}` is not a whole number"))
}

/// `60` (seconds), `60s`, `1500ms`, `2m`, `1h` → µs.
fn period(value: &str) -> Result<u64, String> {
    let bad = || format!("--period: `{value}` is not a duration like 60s, 1500ms, 2m or 1h");
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
    match parse_args(std::env::args().skip(1)) {
        Ok(None) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Some(args)) => match run(&args) {
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
        },
        Err(e) => {
            eprintln!("accuracy: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Args>, String> {
        parse_args(args.iter().map(|s| (*s).to_owned()))
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
        .unwrap()
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
        assert_eq!(parse(&[]).unwrap().unwrap(), Args::default());
        assert_eq!(parse(&["--help"]).unwrap(), None);
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        assert_eq!(parse(&["--limit"]).unwrap_err(), "--limit needs a value");
        assert_eq!(
            parse(&["--limit", "ten"]).unwrap_err(),
            "--limit: `ten` is not a whole number"
        );
        assert!(
            parse(&["--period", "5 weeks"])
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(
            parse(&["--period", "0s"])
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(
            parse(&["--requests", "10", "--clients", "20"])
                .unwrap_err()
                .contains("at least --clients")
        );
        assert!(
            parse(&["--windows", "1"])
                .unwrap_err()
                .contains("at least 2")
        );
        assert_eq!(parse(&["--fast"]).unwrap_err(), "unknown argument `--fast`");
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
        .unwrap()
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
            use tollgate_core::{MemoryStore, Policy, Quota, Timestamp};

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
