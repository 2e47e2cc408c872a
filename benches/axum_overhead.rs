//! Hello-world axum throughput: bare vs tollgate (in-process store) vs tower-governor, in one run.
//!
//! `cargo bench --bench axum_overhead -- [--rounds 40] [--seconds 0.25] [--connections 32] [--server-threads 1]
//! [--wrk] [--in-process-only] [--in-process-rounds 7] [--calls 200000]`
//!
//! Every server runs in this process on its own loopback port (on a runtime with `--server-threads` workers);
//! a small load generator on a separate runtime keeps `--connections` HTTP/1.1 keep-alive connections per variant
//! open for the whole run, one request in flight per connection, and lets one variant's connections send at a
//! time. The variants take short turns (`--seconds` each), round after round in a rotating order, so that the
//! machine's fast and slow phases fall on all of them alike; the report gives each variant's median requests per
//! second and the median over rounds of its ratio to bare axum (and to its peer) within the round. Limits are set
//! far above the offered load (every request is admitted), so the figures are the cost of deciding, not of
//! rejecting. All limiters key on the peer address. `--wrk` uses `wrk -t1` (a C load generator, if installed) in
//! place of the built-in one, with a fresh run of it per turn (use longer turns). Besides throughput, the report
//! gives the servers' CPU time per request (Linux schedstat of the server threads).
//!
//! Each row is also compared with a peer that sends as many rate-limit fields: tollgate without fields against
//! tower-governor without, tollgate's two IETF fields against tower-governor's two `x-ratelimit-*` fields, and
//! tollgate's default seven fields against bare axum sending seven constant fields of the same length — sending
//! the bytes alone costs a hello-world server about a tenth of its throughput, whoever computes them.
//! `ONLY=<row index>` measures one row (for a profiler); `--in-process-only` skips the network part.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;

#[path = "support/axum_variants.rs"]
mod axum_variants;
#[path = "support/http_load.rs"]
mod http_load;

use axum_variants::variants;

struct Options {
    rounds: usize,
    seconds: f64,
    connections: usize,
    server_threads: usize,
    wrk: bool,
    in_process_only: bool,
    in_process_rounds: usize,
    calls: u32,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        rounds: 40,
        seconds: 0.25,
        connections: 32,
        server_threads: 1,
        wrk: false,
        in_process_only: false,
        in_process_rounds: 7,
        calls: 200_000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--bench" => continue, // passed by `cargo bench`
            "--wrk" => {
                o.wrk = true;
                continue;
            }
            "--in-process-only" => {
                o.in_process_only = true;
                continue;
            }
            _ => {}
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = format!("{flag} {value:?}: expected a positive number");
        match flag.as_str() {
            "--rounds" => o.rounds = value.parse().map_err(|_| bad)?,
            "--seconds" => o.seconds = value.parse().map_err(|_| bad)?,
            "--connections" => o.connections = value.parse().map_err(|_| bad)?,
            "--server-threads" => o.server_threads = value.parse().map_err(|_| bad)?,
            "--calls" => o.calls = value.parse().map_err(|_| bad)?,
            "--in-process-rounds" => o.in_process_rounds = value.parse().map_err(|_| bad)?,
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    if o.rounds == 0
        || o.calls == 0
        || o.connections == 0
        || o.server_threads == 0
        || o.seconds <= 0.0
    {
        return Err("every option must be above 0".to_owned());
    }
    Ok(o)
}

/// Nanoseconds per request when the router is called in-process, with no network or HTTP parsing: the cost
/// of the middleware itself, steady even on a busy machine.
async fn in_process_ns(mut app: Router, calls: u32) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        axum_variants::call(&mut app).await;
    }
    start.elapsed().as_nanos() as f64 / f64::from(calls)
}

/// Like [`measure`], with `wrk` (one thread) as the load generator instead of the built-in one.
fn measure_wrk(addr: SocketAddr, connections: usize, seconds: f64) -> Result<(f64, f64), String> {
    let start_cpu = thread_cpu_ns(SERVER_THREAD);
    let out = std::process::Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{}s", seconds.ceil() as u64),
        ])
        .arg(format!("http://{addr}/"))
        .output()
        .map_err(|e| {
            format!("cannot run wrk ({e}); install it (apt-get install wrk) or drop --wrk")
        })?;
    let cpu = thread_cpu_ns(SERVER_THREAD) - start_cpu;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("Non-2xx") {
        return Err(format!("wrk saw non-2xx responses:\n{text}"));
    }
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(str::trim)
            .map(str::to_owned)
    };
    let rps: f64 = field("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no Requests/sec in:\n{text}"))?;
    let total: f64 = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no request count in:\n{text}"))?;
    Ok((rps, cpu as f64 / 1_000.0 / total.max(1.0)))
}

/// CPU time (ns) consumed so far by this process's threads named `name` (Linux schedstat; 0 elsewhere).
fn thread_cpu_ns(name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

const SERVER_THREAD: &str = "bench-server";

/// No variant is sending.
const IDLE: usize = usize::MAX;

/// The built-in load generator: `connections` keep-alive connections per variant, opened once and kept; only the
/// active variant's connections send. Turns can therefore be short (a fraction of a second), so that the variants
/// share the machine's fast and slow phases instead of each landing in one.
struct Load {
    active: Arc<AtomicUsize>,
    wake: tokio::sync::watch::Sender<usize>,
    done: Vec<Arc<AtomicU64>>,
    connections: Vec<tokio::task::JoinHandle<Result<(), String>>>,
}

impl Load {
    /// Opens the connections (on the current runtime).
    async fn start(addrs: &[SocketAddr], connections: usize) -> Self {
        let active = Arc::new(AtomicUsize::new(IDLE));
        let (wake, _) = tokio::sync::watch::channel(IDLE);
        let done: Vec<_> = addrs.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
        let mut tasks = Vec::new();
        for (v, &addr) in addrs.iter().enumerate() {
            for _ in 0..connections {
                let (active, mut woken, done) = (active.clone(), wake.subscribe(), done[v].clone());
                tasks.push(tokio::spawn(async move {
                    let result = async {
                        let mut client = http_load::Client::connect(addr).await?;
                        loop {
                            if woken.wait_for(|a| *a == v).await.is_err() {
                                return Ok(()); // the load generator is gone
                            }
                            while active.load(Ordering::Relaxed) == v {
                                client.request().await?;
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    .await;
                    if let Err(e) = &result {
                        eprintln!("axum_overhead: load generator: {e}");
                    }
                    result
                }));
            }
        }
        Self {
            active,
            wake,
            done,
            connections: tasks,
        }
    }

    /// Lets variant `v` send for `seconds`: its requests per second and the servers' CPU time per request (µs).
    async fn turn(&self, v: usize, seconds: f64) -> Result<(f64, f64), String> {
        let (count, cpu) = (
            self.done[v].load(Ordering::Relaxed),
            thread_cpu_ns(SERVER_THREAD),
        );
        let start = Instant::now();
        self.active.store(v, Ordering::Relaxed);
        self.wake.send_replace(v);
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        self.active.store(IDLE, Ordering::Relaxed);
        self.wake.send_replace(IDLE);
        let elapsed = start.elapsed().as_secs_f64();
        let count = self.done[v].load(Ordering::Relaxed) - count;
        let cpu = thread_cpu_ns(SERVER_THREAD) - cpu;
        if self
            .connections
            .iter()
            .any(tokio::task::JoinHandle::is_finished)
        {
            return Err("a load-generator connection stopped (its error is above)".into());
        }
        Ok((
            count as f64 / elapsed,
            cpu as f64 / 1_000.0 / count.max(1) as f64,
        ))
    }
}

fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

fn fail(e: &str) -> ! {
    eprintln!("axum_overhead: {e}");
    std::process::exit(1)
}

fn selected(v: usize) -> bool {
    std::env::var("ONLY").map_or(true, |only| only == v.to_string())
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("axum_overhead: {e}");
            std::process::exit(2);
        }
    };
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.server_threads)
        .thread_name(SERVER_THREAD)
        .enable_all()
        .build()
        .expect("a server runtime");
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a client runtime");
    let variants = variants();
    let n = variants.len();
    println!(
        "in-process router calls (no network), {} rounds x {} calls per variant",
        o.in_process_rounds, o.calls
    );
    let mut ns = vec![Vec::new(); n];
    for round in 0..o.in_process_rounds {
        for i in 0..n {
            let v = (i + round) % n;
            if !selected(v) {
                continue;
            }
            // `with_state` turns handlers into routes once, as `axum::serve` does for each connection.
            let router = (variants[v].router)().with_state(());
            ns[v].push(client.block_on(in_process_ns(router, o.calls)));
        }
    }
    let ns: Vec<f64> = ns.iter().map(|v| median(v)).collect();
    println!(
        "{:<26} {:>10} {:>14} {:>26}",
        "variant", "ns/request", "added vs bare", "added vs peer"
    );
    for (i, v) in variants.iter().enumerate() {
        let peer = &variants[v.peer];
        println!(
            "{:<26} {:>10.0} {:>13.0}ns {:>13.0}ns ({})",
            v.name,
            ns[i],
            ns[i] - ns[0],
            ns[i] - ns[v.peer],
            peer.name
        );
    }
    println!();
    if o.in_process_only {
        return;
    }

    let addrs: Vec<SocketAddr> = servers.block_on(async {
        let mut addrs = Vec::new();
        for v in &variants {
            addrs.push(http_load::serve((v.router)()).await);
        }
        addrs
    });
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "axum hello world, {} rounds x {} s per variant, {} keep-alive connections ({}), {} server thread(s), {} cores",
        o.rounds,
        o.seconds,
        o.connections,
        if o.wrk {
            "wrk -t1"
        } else {
            "built-in load generator"
        },
        o.server_threads,
        cores
    );
    let mut rps = vec![Vec::new(); n];
    let mut cpu = vec![Vec::new(); n];
    let load = (!o.wrk).then(|| {
        client.block_on(async {
            let load = Load::start(&addrs, o.connections).await;
            // Connections open, buckets created, caches warm: one unmeasured turn each.
            for v in (0..n).filter(|&v| selected(v)) {
                load.turn(v, 0.2).await.unwrap_or_else(|e| fail(&e));
            }
            load
        })
    });
    for round in 0..o.rounds {
        // Rotate the order each round so no variant always runs first or last.
        for i in 0..n {
            let v = (i + round) % n;
            if !selected(v) {
                continue;
            }
            let (r, c) = match &load {
                Some(load) => client.block_on(load.turn(v, o.seconds)),
                None => measure_wrk(addrs[v], o.connections, o.seconds),
            }
            .unwrap_or_else(|e| fail(&e));
            rps[v].push(r);
            cpu[v].push(c);
        }
        if (round + 1) % 10 == 0 || round + 1 == o.rounds {
            eprintln!("round {}/{} done", round + 1, o.rounds);
        }
    }
    // Ratios are taken within each round (the variants ran back to back), then the median over rounds: the
    // machine's speed drifts between rounds more than the variants differ.
    let ratio = |m: &[Vec<f64>], i: usize, j: usize| {
        let per_round: Vec<f64> = m[i].iter().zip(&m[j]).map(|(a, b)| a / b).collect();
        median(&per_round)
    };
    println!(
        "{:<26} {:>12} {:>8} {:>8} {:>14} {:>8} {:>8}  peer",
        "variant", "median req/s", "vs bare", "vs peer", "server us/req", "vs bare", "vs peer"
    );
    for (i, v) in variants.iter().enumerate() {
        println!(
            "{:<26} {:>12.0} {:>7.3}x {:>7.3}x {:>14.2} {:>7.3}x {:>7.3}x  {}",
            v.name,
            median(&rps[i]),
            ratio(&rps, i, 0),
            ratio(&rps, i, v.peer),
            median(&cpu[i]),
            ratio(&cpu, i, 0),
            ratio(&cpu, i, v.peer),
            variants[v.peer].name
        );
    }
    let rounded = |v: &Vec<Vec<f64>>, scale: f64| {
        v.iter()
            .map(|r| {
                r.iter()
                    .map(|x| (x * scale).round() / scale)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    println!("per-round req/s: {:?}", rounded(&rps, 1.0));
    println!("per-round server us/req: {:?}", rounded(&cpu, 100.0));
}
