//! What building the store on a user's deadpool-redis pool costs, next to the built-in pool, in one run against
//! the same private server: decisions per second at 1 and 64 concurrent callers, and the commands the server
//! received per decision (deadpool-redis's manager pipelines `UNWATCH` + `PING` on every checkout).
//!
//! ```text
//! cargo run --release -p tollgate-redis --features deadpool-redis --example deadpool_checkout [-- --decisions 20000 --rounds 3]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{Policy, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;

/// The command line.
#[derive(clap::Parser)]
#[command(about = "The deadpool-redis pool's cost beside the built-in pool, on one private server")]
struct Flags {
    /// Decisions per measured run
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    decisions: u64,

    /// Alternating rounds (the median is printed)
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
}

/// Commands the clients sent (the script's own commands and this program's bookkeeping left out).
fn client_commands(server: &RedisServer) -> u64 {
    let internal = [
        "time",
        "hmget",
        "hset",
        "pexpire",
        "info",
        "config|resetstat",
    ];
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| !internal.contains(name))
        .filter_map(|(_, rest)| {
            rest.split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn run(store: Arc<RedisStore>, decisions: u64, callers: u64) -> Duration {
    let policy = Policy::token_bucket(Quota::per_second(1_000_000_000).expect("a valid quota"));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for i in 0..decisions / callers {
                    let key = format!("k{}", (c * 7_919 + i) % 10_000);
                    store.check(&key, &policy, 1).await.expect("Redis decides");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a caller finished");
    }
    started.elapsed()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Flags { decisions, rounds } = clap::Parser::parse();
    let server = RedisServer::start();
    let builtin = Arc::new(
        RedisStore::builder(server.url())
            .namespace("builtin")
            .timeout(Duration::from_secs(5))
            .build()
            .await?,
    );
    let pool = deadpool_redis::Config::from_url(server.url())
        .builder()?
        .max_size(8)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()?;
    let deadpool = Arc::new(
        RedisStore::from_deadpool(pool)
            .namespace("deadpool")
            .timeout(Duration::from_secs(5))
            .build()
            .await?,
    );
    println!("{decisions} decisions per run, median of {rounds} rounds, private redis-server");
    println!(
        "{:>8} {:>12} {:>14} {:>14} {:>8} {:>18}",
        "callers", "pool", "decisions/s", "µs/decision", "ratio", "commands/decision"
    );
    for callers in [1, 64] {
        let mut results = Vec::new();
        for (name, store) in [("built-in", &builtin), ("deadpool", &deadpool)] {
            // Warm up the pool's connections, then count from zero.
            run(Arc::clone(store), 1_000, callers).await;
            let mut times = Vec::new();
            let mut commands = 0;
            for _ in 0..rounds {
                let _ = server.cli(&["CONFIG", "RESETSTAT"]);
                times.push(run(Arc::clone(store), decisions, callers).await);
                commands = client_commands(&server);
            }
            times.sort();
            let median = times[times.len() / 2];
            results.push((name, median, commands));
        }
        let base = results[0].1.as_secs_f64();
        for (name, median, commands) in results {
            let per_second = decisions as f64 / median.as_secs_f64();
            println!(
                "{callers:>8} {name:>12} {per_second:>14.0} {:>14.1} {:>8.2} {:>18.2}",
                median.as_secs_f64() * 1e6 / decisions as f64,
                median.as_secs_f64() / base,
                commands as f64 / decisions as f64
            );
        }
    }
    Ok(())
}
