//! Command-line flags of the fleet simulation.

use std::time::Duration;

pub(crate) const USAGE: &str = "\
fleet: N instances of one service, each \"limited to L per second\", behind a round-robin load balancer.

usage: cargo run --release --example fleet -- [flags]
  --instances N     instances in the fleet (default 4)
  --limit L         the limit each instance is configured with, per second (default 100)
  --offered R       requests per second offered to the fleet (default 6 × limit)
  --duration D      measured time per design, e.g. 5s, 1500ms (default 5s)
  --warmup D        load before measuring, so each instance's first burst is spent (default: long
                    enough for that at the offered rate, at least 1s)
  --redis-url URL   Redis for the shared-state rows (default $REDIS_URL, else redis://127.0.0.1:6379)
  --autoscale       grow the fleet from 1 to N instances during the run and print the admitted rate per second
  --help            this text";

/// The simulation's settings.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) instances: usize,
    pub(crate) limit: u64,
    pub(crate) offered: u64,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) redis_url: String,
    pub(crate) autoscale: bool,
}

impl Args {
    pub(crate) fn parse(mut argv: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut args = Self {
            instances: 4,
            limit: 100,
            offered: 0,
            duration: Duration::from_secs(5),
            warmup: Duration::ZERO,
            redis_url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
            autoscale: false,
        };
        while let Some(flag) = argv.next() {
            let mut value = || argv.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--instances" => args.instances = number(&flag, &value()?, 1, 64)? as usize,
                "--limit" => args.limit = number(&flag, &value()?, 1, 100_000)?,
                "--offered" => args.offered = number(&flag, &value()?, 1, 200_000)?,
                "--duration" => args.duration = duration(&flag, &value()?)?,
                "--warmup" => args.warmup = duration(&flag, &value()?)?,
                "--redis-url" => args.redis_url = value()?,
                "--autoscale" => args.autoscale = true,
                "--help" | "-h" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown flag {other}\n\n{USAGE}")),
            }
        }
        if args.offered == 0 {
            args.offered = 6 * args.limit;
        }
        if args.warmup.is_zero() {
            // An instance starts with a full bucket of `limit` tokens and receives `offered / instances` per
            // second: the bucket is spent after limit ÷ (offered/instances − limit) seconds.
            let per_instance = args.offered as f64 / args.instances as f64;
            let spend = if per_instance > args.limit as f64 {
                args.limit as f64 / (per_instance - args.limit as f64)
            } else {
                1.0
            };
            args.warmup = Duration::from_secs_f64((spend + 0.5).clamp(1.0, 10.0));
        }
        if args.duration < Duration::from_millis(500) {
            return Err("--duration must be at least 500ms".into());
        }
        Ok(args)
    }
}

fn number(flag: &str, value: &str, min: u64, max: u64) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("{flag} takes a whole number from {min} to {max}, not {value:?}")),
    }
}

/// `1500ms`, `5s`, `2m`.
pub(crate) fn duration(flag: &str, value: &str) -> Result<Duration, String> {
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("{flag} takes a duration like 500ms, 5s or 1m, not {value:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{flag} takes a duration like 500ms, 5s or 1m, not {value:?}")),
    }
}
