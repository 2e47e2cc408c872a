//! Command-line flags of the fleet simulation (clap).

use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser as _};

use crate::cli;

/// What load the fleet gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// The offered rate, open loop, through the load balancer.
    Steady,
    /// One client as fast as its connections go, closed loop, straight to the instances.
    Flood,
    /// A private Redis Cluster of 3 primaries and 3 replicas, faulted under load (`cluster_faults.rs`).
    ClusterFaults,
}

/// The command line as given.
#[derive(Debug, clap::Parser)]
#[command(
    name = "fleet",
    about = "fleet: N instances of one service, each \"limited to L per second\", behind a round-robin load \
             balancer",
    after_help = "usage: cargo run --release --example fleet -- [flags]"
)]
struct Flags {
    /// Instances in the fleet
    #[arg(long, value_name = "N", default_value = "4", value_parser = at_most(64))]
    instances: u64,

    /// The limit each instance is configured with, per second
    #[arg(long, value_name = "L", default_value = "100", value_parser = at_most(100_000))]
    limit: u64,

    /// Requests per second offered to the fleet [default: 6 × limit]
    #[arg(long, value_name = "R", value_parser = at_most(MAX_OFFERED))]
    offered: Option<u64>,

    /// Measured time per design, e.g. 5s, 1500ms
    #[arg(long, value_name = "D", default_value = "5s", value_parser = cli::duration)]
    duration: Duration,

    /// Load before measuring, so each instance's first burst is spent [default: long enough for that at the
    /// offered rate, at least 1s]
    #[arg(long, value_name = "D", value_parser = cli::duration)]
    warmup: Option<Duration>,

    /// Redis for the shared-state rows
    #[arg(
        long,
        value_name = "URL",
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis_url: String,

    /// A Redis Cluster for the shared-state rows instead, given some of its nodes (the one client key lives on
    /// one shard: spread keys are what spread a Cluster's load)
    #[arg(long, value_name = "URL,URL,...", value_parser = nodes)]
    redis_cluster: Option<Vec<String>>,

    /// steady: the offered load through the load balancer, one row per design; flood: one client far over its
    /// limit, --connections keep-alive connections sending back to back straight to the instances; per store
    /// admitted/s, served/s and Redis calls/s, with the deny cache on and off (--offered does not apply);
    /// cluster-faults: a private Redis Cluster of 3 primaries and 3 replicas failed over, resharded and a primary
    /// killed under load, one row per fault (needs redis-server; --instances and --limit apply)
    #[arg(long, value_name = "S", default_value = "steady", value_parser = scenario())]
    scenario: Scenario,

    /// The flood's connections, spread over the instances
    #[arg(long, value_name = "C", default_value = "32", value_parser = at_most(1_024))]
    connections: u64,

    /// The flood only: run every design N times, in interleaved rounds (each round in a rotated order), and
    /// print medians with their spread (lowest–highest) [default: 1]
    #[arg(long, value_name = "N", value_parser = at_most(100))]
    rounds: Option<u64>,

    /// Grow the fleet from 1 to N instances during the run and print the admitted rate per second
    #[arg(long)]
    autoscale: bool,

    /// Print the table's rows as one JSON object instead (for scripts such as CI's check)
    #[arg(long)]
    json: bool,

    /// Also draw admitted req/s per second of every design (and the instances under --autoscale)
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
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
    /// Interleaved rounds of the flood.
    pub(crate) rounds: usize,
    pub(crate) autoscale: bool,
    pub(crate) json: bool,
    pub(crate) plot: Option<std::path::PathBuf>,
}

impl Args {
    /// The process's flags; `--help` and a bad flag exit (0 and 2) as every example does.
    pub(crate) fn parse() -> Self {
        let flags: Flags = cli::parse();
        Self::from_flags(flags).unwrap_or_else(|e| cli::fail(e))
    }

    fn from_flags(flags: Flags) -> Result<Self, String> {
        let offered = flags.offered.unwrap_or(6 * flags.limit);
        if offered > MAX_OFFERED {
            return Err(format!(
                "an offered load of {offered} req/s (6 × --limit unless --offered says) is more than {MAX_OFFERED}"
            ));
        }
        let (instances, limit) = (flags.instances, flags.limit);
        let warmup = flags.warmup.unwrap_or_else(|| {
            // An instance starts with a full bucket of `limit` tokens and receives `offered / instances` per
            // second: the bucket is spent after limit ÷ (offered/instances − limit) seconds.
            let per_instance = offered as f64 / instances as f64;
            let spend = if per_instance > limit as f64 {
                limit as f64 / (per_instance - limit as f64)
            } else {
                1.0
            };
            Duration::from_secs_f64((spend + 0.5).clamp(1.0, 10.0))
        });
        if flags.scenario == Scenario::Flood && (flags.offered.is_some() || flags.autoscale) {
            return Err(
                "--scenario flood sends as fast as its connections go: --offered and --autoscale do not apply"
                    .into(),
            );
        }
        if flags.scenario == Scenario::ClusterFaults
            && (flags.redis_cluster.is_some()
                || flags.offered.is_some()
                || flags.autoscale
                || flags.plot.is_some())
        {
            return Err(
                "--scenario cluster-faults starts and faults its own Redis Cluster at its own load: \
                 --redis-cluster, --offered, --autoscale and --plot do not apply"
                    .into(),
            );
        }
        if flags.scenario != Scenario::Flood && flags.rounds.is_some() {
            return Err("--rounds is the flood's: it goes with --scenario flood".into());
        }
        if flags.json && flags.autoscale {
            return Err("--json prints the table's rows: it does not go with --autoscale".into());
        }
        if let Some(dir) = flags.plot.as_deref().and_then(std::path::Path::parent)
            && !dir.as_os_str().is_empty()
            && !dir.is_dir()
        {
            // Found out now, not after a minute of measuring.
            return Err(format!("--plot: {} is not a directory", dir.display()));
        }
        if flags.duration < Duration::from_millis(500) {
            return Err("--duration must be at least 500ms".into());
        }
        // The run keeps every request's latency: an hour at the highest load is already gigabytes.
        for (flag, value) in [("--duration", flags.duration), ("--warmup", warmup)] {
            if value > MAX_TIME {
                return Err(format!("{flag} must be at most {MAX_TIME:?}"));
            }
        }
        Ok(Self {
            instances: instances as usize,
            limit,
            offered,
            duration: flags.duration,
            warmup,
            // An empty REDIS_URL is unset, as for the tests.
            redis_url: Some(flags.redis_url)
                .filter(|url| !url.is_empty())
                .unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
            redis_cluster: flags.redis_cluster,
            scenario: flags.scenario,
            connections: flags.connections as usize,
            rounds: flags.rounds.unwrap_or(1) as usize,
            autoscale: flags.autoscale,
            json: flags.json,
            plot: flags.plot,
        })
    }
}

/// The highest offered load, in requests per second.
const MAX_OFFERED: u64 = 200_000;

/// The longest measured time or warm-up.
const MAX_TIME: Duration = Duration::from_secs(3_600);

/// A whole number from 1 to `max`.
fn at_most(max: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |v| match cli::positive(v)? {
        n if n <= max => Ok(n),
        _ => Err(format!("at most {max}")),
    }
}

/// `--redis-cluster`: at least one node URL, comma-separated.
fn nodes(v: &str) -> Result<Vec<String>, String> {
    let nodes: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    if nodes.is_empty() {
        return Err("needs at least one node URL".into());
    }
    Ok(nodes)
}

fn scenario() -> impl clap::builder::TypedValueParser<Value = Scenario> {
    PossibleValuesParser::new(["steady", "flood", "cluster-faults"]).map(|v| match v.as_str() {
        "flood" => Scenario::Flood,
        "cluster-faults" => Scenario::ClusterFaults,
        _ => Scenario::Steady,
    })
}
