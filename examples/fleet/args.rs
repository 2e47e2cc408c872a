//! Command-line flags of the fleet simulation.

use std::time::Duration;

use crate::flags::{Flags, duration, positive};

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
  --redis-cluster URL,URL,...
                    a Redis Cluster for the shared-state rows instead, given some of its nodes (the one
                    client key lives on one shard: spread keys are what spread a Cluster's load)
  --scenario S      steady (default): the offered load through the load balancer, one row per design;
                    flood: one client far over its limit, --connections keep-alive connections sending
                    back to back straight to the instances; per store admitted/s, served/s and Redis
                    calls/s, with the deny cache on and off (--offered does not apply)
  --connections C   the flood's connections, spread over the instances (default 32)
  --autoscale       grow the fleet from 1 to N instances during the run and print the admitted rate per second
  --json            print the table's rows as one JSON object instead (for scripts such as CI's check)
  --plot FILE.svg   also draw admitted req/s per second of every design (and the instances under --autoscale)
  --help            this text";

/// What load the fleet gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// The offered rate, open loop, through the load balancer.
    Steady,
    /// One client as fast as its connections go, closed loop, straight to the instances.
    Flood,
}

/// The simulation's settings.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) instances: usize,
    pub(crate) limit: u64,
    pub(crate) offered: u64,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) redis_url: String,
    /// Seed nodes of a Redis Cluster, when the shared-state rows use one instead of `redis_url`.
    pub(crate) redis_cluster: Option<Vec<String>>,
    pub(crate) scenario: Scenario,
    pub(crate) connections: usize,
    pub(crate) autoscale: bool,
    pub(crate) json: bool,
    pub(crate) plot: Option<std::path::PathBuf>,
}

impl Args {
    pub(crate) fn parse(argv: impl Iterator<Item = String>) -> Result<Self, String> {
        let mut args = Self {
            instances: 4,
            limit: 100,
            offered: 0,
            duration: Duration::from_secs(5),
            warmup: Duration::ZERO,
            // An empty REDIS_URL is unset, as for the tests.
            redis_url: std::env::var("REDIS_URL")
                .ok()
                .filter(|url| !url.is_empty())
                .unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
            redis_cluster: None,
            scenario: Scenario::Steady,
            connections: 32,
            autoscale: false,
            json: false,
            plot: None,
        };
        let mut offered_given = false;
        let mut flags = Flags::new(argv);
        while let Some(flag) = flags.next_flag() {
            match flag.as_str() {
                "--instances" => args.instances = flags.parsed(|v| at_most(v, 64))? as usize,
                "--limit" => args.limit = flags.parsed(|v| at_most(v, 100_000))?,
                "--offered" => {
                    args.offered = flags.parsed(|v| at_most(v, MAX_OFFERED))?;
                    offered_given = true;
                }
                "--scenario" => {
                    args.scenario = match flags.value()?.as_str() {
                        "steady" => Scenario::Steady,
                        "flood" => Scenario::Flood,
                        other => {
                            return Err(format!(
                                "--scenario {other:?}: steady or flood\n\n{USAGE}"
                            ));
                        }
                    }
                }
                "--connections" => {
                    args.connections = flags.parsed(|v| at_most(v, 1_024))? as usize;
                }
                "--duration" => args.duration = flags.parsed(duration)?,
                "--warmup" => args.warmup = flags.parsed(duration)?,
                "--redis-url" => args.redis_url = flags.value()?,
                "--redis-cluster" => {
                    let nodes: Vec<String> = flags
                        .value()?
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                        .collect();
                    if nodes.is_empty() {
                        return Err("--redis-cluster needs at least one node URL".into());
                    }
                    args.redis_cluster = Some(nodes);
                }
                "--autoscale" => args.autoscale = true,
                "--json" => args.json = true,
                "--plot" => args.plot = Some(flags.value()?.into()),
                "--help" | "-h" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown flag {other}\n\n{USAGE}")),
            }
        }
        if args.offered == 0 {
            args.offered = 6 * args.limit;
        }
        if args.offered > MAX_OFFERED {
            return Err(format!(
                "an offered load of {} req/s (6 × --limit unless --offered says) is more than {MAX_OFFERED}",
                args.offered
            ));
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
        if args.scenario == Scenario::Flood && (offered_given || args.autoscale) {
            return Err(
                "--scenario flood sends as fast as its connections go: --offered and --autoscale do not apply"
                    .into(),
            );
        }
        if args.json && args.autoscale {
            return Err("--json prints the table's rows: it does not go with --autoscale".into());
        }
        if let Some(dir) = args.plot.as_deref().and_then(std::path::Path::parent)
            && !dir.as_os_str().is_empty()
            && !dir.is_dir()
        {
            // Found out now, not after a minute of measuring.
            return Err(format!("--plot: {} is not a directory", dir.display()));
        }
        if args.duration < Duration::from_millis(500) {
            return Err("--duration must be at least 500ms".into());
        }
        // The run keeps every request's latency: an hour at the highest load is already gigabytes.
        for (flag, value) in [("--duration", args.duration), ("--warmup", args.warmup)] {
            if value > MAX_TIME {
                return Err(format!("{flag} must be at most {MAX_TIME:?}"));
            }
        }
        Ok(args)
    }
}

/// The highest offered load, in requests per second.
const MAX_OFFERED: u64 = 200_000;

/// The longest measured time or warm-up.
const MAX_TIME: Duration = Duration::from_secs(3_600);

fn at_most(v: &str, max: u64) -> Result<u64, String> {
    match positive(v)? {
        n if n <= max => Ok(n),
        _ => Err(format!("{v:?}: at most {max}")),
    }
}
