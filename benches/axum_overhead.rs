//! Hello-world axum throughput: bare vs tollgate (in-process store) vs tower-governor, in one run.
//!
//! `cargo bench --bench axum_overhead -- [--rounds 5] [--seconds 2] [--connections 32] [--server-threads 1] [--wrk]`
//!
//! Every server runs in this process on its own loopback port (on a runtime with `--server-threads` workers);
//! a small load generator on a separate runtime keeps `--connections` HTTP/1.1 keep-alive connections busy, one
//! request in flight per connection. The variants take turns, round after round, so background noise hits them
//! alike; the report gives each variant's median requests per second and its ratio to bare axum. Limits are set
//! far above the offered load (every request is admitted), so the figures are the cost of deciding, not of
//! rejecting. All limiters key on the peer address. `--wrk` uses `wrk -t1` (a C load generator, if installed) in
//! place of the built-in one. Besides throughput, the report gives the servers' CPU time per request (Linux
//! schedstat of the server threads), which is steadier than throughput on a busy machine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_http::key::PeerIp;
use tollgate_http::{HeaderSet, HttpLimitLayer};
use tollgate_tower::RateLimitLayer;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

struct Options {
    rounds: usize,
    seconds: f64,
    connections: usize,
    server_threads: usize,
    wrk: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        rounds: 5,
        seconds: 2.0,
        connections: 32,
        server_threads: 1,
        wrk: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--bench" => continue, // passed by `cargo bench`
            "--wrk" => {
                o.wrk = true;
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
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    if o.rounds == 0 || o.connections == 0 || o.server_threads == 0 || o.seconds <= 0.0 {
        return Err("every option must be above 0".to_owned());
    }
    Ok(o)
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

fn tollgate(headers: HeaderSet) -> Router {
    let policy = Policy::token_bucket(Quota::per_second(1_000_000_000).expect("a valid quota"));
    let layer = RateLimitLayer::new("bench", policy, Arc::new(MemoryStore::new()), PeerIp);
    hello().layer(HttpLimitLayer::new(layer).headers(headers))
}

fn governor() -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .finish()
        .expect("a valid governor config");
    hello().layer(GovernorLayer::new(config))
}

async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("a local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    addr
}

/// One keep-alive connection sending `GET /` until `stop`; counts 200 responses (anything else is fatal).
async fn connection(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Result<(), String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let request = b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n";
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        stream.write_all(request).await.map_err(|e| e.to_string())?;
        // Read one response: the head, then `content-length` bytes of body.
        let (head_len, body_len) = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end]).map_err(|e| e.to_string())?;
                if !head.starts_with("HTTP/1.1 200") {
                    return Err(format!("unexpected response: {head}"));
                }
                let len = content_length(head).ok_or("no content-length")?;
                break (end + 4, len);
            }
            let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        while buf.len() < head_len + body_len {
            let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        buf.drain(..head_len + body_len);
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Nanoseconds per request when the router is called in-process, with no network or HTTP parsing: the cost
/// of the middleware itself, steady even on a busy machine.
async fn in_process_ns(mut app: Router, calls: u32) -> f64 {
    use tower::{Service, ServiceExt};
    let peer = ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40_000)));
    let start = Instant::now();
    for _ in 0..calls {
        let mut req = Request::new(Body::empty());
        req.extensions_mut().insert(peer);
        let ready = ServiceExt::<Request>::ready(&mut app)
            .await
            .expect("the router is always ready");
        let response = ready.call(req).await.expect("axum routers are infallible");
        assert!(response.status().is_success(), "every request is admitted");
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

/// The `content-length` of a response head, without allocating (the client must stay cheaper than the servers).
fn content_length(head: &str) -> Option<usize> {
    head.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
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

/// Requests per second against `addr` over `seconds`, with `connections` connections, and the servers' CPU time
/// per request in microseconds.
async fn measure(addr: SocketAddr, connections: usize, seconds: f64) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(connection(addr, stop.clone(), done.clone())))
        .collect();
    // Warm up (connections, caches), then count.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start_count = done.load(Ordering::Relaxed);
    let start_cpu = thread_cpu_ns(SERVER_THREAD);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let count = done.load(Ordering::Relaxed) - start_count;
    let cpu = thread_cpu_ns(SERVER_THREAD) - start_cpu;
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        if let Ok(Err(e)) = task.await {
            eprintln!("load generator: {e}");
            std::process::exit(1);
        }
    }
    (
        count as f64 / elapsed,
        cpu as f64 / 1_000.0 / count.max(1) as f64,
    )
}

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
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
    let routers: Vec<(&str, Router)> = vec![
        ("bare axum", hello()),
        ("tollgate (all headers)", tollgate(HeaderSet::ALL)),
        ("tollgate (no headers)", tollgate(HeaderSet::NONE)),
        ("tower-governor 0.8", governor()),
    ];
    println!(
        "in-process router calls (no network), {} rounds x 200000 calls per variant",
        o.rounds
    );
    let mut ns = vec![Vec::new(); routers.len()];
    for round in 0..o.rounds {
        for i in 0..routers.len() {
            let v = (i + round) % routers.len();
            // `with_state` turns handlers into routes once, as `axum::serve` does for each connection.
            let router = routers[v].1.clone().with_state(());
            ns[v].push(client.block_on(in_process_ns(router, 200_000)));
        }
    }
    let (bare_ns, gov_ns) = (median(&ns[0]), median(&ns[routers.len() - 1]));
    println!(
        "{:<24} {:>10} {:>14} {:>14}",
        "variant", "ns/request", "added vs bare", "vs governor"
    );
    for (i, (name, _)) in routers.iter().enumerate() {
        let m = median(&ns[i]);
        println!(
            "{name:<24} {m:>10.0} {:>13.0}ns {:>13.0}ns",
            m - bare_ns,
            m - gov_ns
        );
    }
    println!();

    let variants: Vec<(&str, SocketAddr)> = servers.block_on(async {
        vec![
            ("bare axum", serve(hello()).await),
            (
                "tollgate (all headers)",
                serve(tollgate(HeaderSet::ALL)).await,
            ),
            (
                "tollgate (no headers)",
                serve(tollgate(HeaderSet::NONE)).await,
            ),
            ("tower-governor 0.8", serve(governor()).await),
        ]
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
    let mut rps = vec![Vec::new(); variants.len()];
    let mut cpu = vec![Vec::new(); variants.len()];
    for round in 0..o.rounds {
        // Rotate the order each round so no variant always runs first or last.
        for i in 0..variants.len() {
            let v = (i + round) % variants.len();
            let (r, c) = if o.wrk {
                measure_wrk(variants[v].1, o.connections, o.seconds).unwrap_or_else(|e| {
                    eprintln!("axum_overhead: {e}");
                    std::process::exit(1)
                })
            } else {
                client.block_on(measure(variants[v].1, o.connections, o.seconds))
            };
            rps[v].push(r);
            cpu[v].push(c);
        }
        eprintln!("round {}/{} done", round + 1, o.rounds);
    }
    let last = variants.len() - 1;
    let (bare_rps, gov_rps) = (median(&rps[0]), median(&rps[last]));
    let (bare_cpu, gov_cpu) = (median(&cpu[0]), median(&cpu[last]));
    println!(
        "{:<24} {:>12} {:>8} {:>8} {:>14} {:>8} {:>8}",
        "variant", "median req/s", "vs bare", "vs gov", "server us/req", "vs bare", "vs gov"
    );
    for (i, (name, _)) in variants.iter().enumerate() {
        let (r, c) = (median(&rps[i]), median(&cpu[i]));
        println!(
            "{name:<24} {r:>12.0} {:>7.3}x {:>7.3}x {c:>14.2} {:>7.3}x {:>7.3}x",
            r / bare_rps,
            r / gov_rps,
            c / bare_cpu,
            c / gov_cpu
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
