//! The paced client's benchmark: the example servers behind a limit of 20 per second, 16 callers for 10 s through
//! one client, paced and not — in process, on a fleet of 4 instances sharing one Redis, and over gRPC.
//!
//! ```text
//! cargo build --release --example axum_server --example grpc_server --example paced_client
//! cargo run --release -p tollgate-client --example paced_bench [-- --duration 10s --concurrency 16 --limit 20]
//! ```
//!
//! Each row is one `paced_client --json` run against servers started fresh for it (a private `redis-server` for
//! the fleet rows), so that no row inherits another's spent bucket. It prints a Markdown table, the commit and the
//! load average before and after (the machine may be shared: the achieved rates are wall-clock figures).

use std::process::Command;

use tollgate_testkit::examples::{ExampleServer, example};
use tollgate_testkit::redis::RedisServer;

struct Run {
    name: &'static str,
    grpc: bool,
    instances: usize,
    redis: bool,
}

const RUNS: [Run; 4] = [
    Run {
        name: "axum_server, in process",
        grpc: false,
        instances: 1,
        redis: false,
    },
    Run {
        name: "4 axum_server on one Redis",
        grpc: false,
        instances: 4,
        redis: true,
    },
    Run {
        name: "grpc_server, in process",
        grpc: true,
        instances: 1,
        redis: false,
    },
    Run {
        name: "4 grpc_server on one Redis",
        grpc: true,
        instances: 4,
        redis: true,
    },
];

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let (mut duration, mut concurrency, mut limit) =
        ("10s".to_owned(), "16".to_owned(), "20".to_owned());
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        match flag.as_str() {
            "--duration" => duration = value,
            "--concurrency" => concurrency = value,
            "--limit" => limit = value,
            _ => {
                eprintln!("usage: paced_bench [--duration D] [--concurrency N] [--limit N]");
                std::process::exit(2);
            }
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!("commit {commit}; load average before: {}", load_average());
    println!(
        "limit {limit} per 1s per client; {concurrency} callers for {duration} through one client\n"
    );
    println!(
        "| servers | pacing | sent | ok | refused | achieved_per_s | limit_per_s | p99_wait_ms | ok ≥ 0.95 × limit |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
    for run in &RUNS {
        for pacing in [true, false] {
            let row = measure(run, pacing, &limit, &concurrency, &duration);
            let field = |k: &str| {
                row.get(k)
                    .map_or_else(|| "-".to_owned(), ToString::to_string)
            };
            let ok_rate = row["achieved_per_s"].as_f64().unwrap_or(0.0);
            let limit_rate = row["limit_per_s"].as_f64().unwrap_or(f64::NAN);
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                run.name,
                if pacing { "paced" } else { "--no-pacing" },
                field("sent"),
                field("ok"),
                field("refused"),
                field("achieved_per_s"),
                field("limit_per_s"),
                field("p99_wait_ms"),
                if ok_rate >= 0.95 * limit_rate {
                    "yes"
                } else {
                    "no"
                },
            );
        }
    }
    println!("\nload average after: {}", load_average());
}

fn measure(
    run: &Run,
    pacing: bool,
    limit: &str,
    concurrency: &str,
    duration: &str,
) -> serde_json::Value {
    let redis = run.redis.then(RedisServer::start);
    let redis_url = redis.as_ref().map(RedisServer::url);
    let mut server_args = vec!["--limit", limit, "--period", "1s"];
    if let Some(url) = &redis_url {
        server_args.extend(["--redis-url", url]);
    }
    let server = if run.grpc {
        "grpc_server"
    } else {
        "axum_server"
    };
    let fleet: Vec<_> = (0..run.instances)
        .map(|_| ExampleServer::start(server, &server_args))
        .collect();
    let mut client = Command::new(example("paced_client"));
    for s in &fleet {
        let scheme_path = if run.grpc { "" } else { "/" };
        client.args(["--url", &format!("http://{}{scheme_path}", s.addr())]);
    }
    client.args([
        "--concurrency",
        concurrency,
        "--duration",
        duration,
        "--json",
    ]);
    if run.grpc {
        client.arg("--grpc");
    }
    if !pacing {
        client.arg("--no-pacing");
    }
    let out = client.output().expect("run paced_client");
    assert!(
        out.status.success(),
        "paced_client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim()).expect("one JSON object")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}
