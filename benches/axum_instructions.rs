//! Instructions per HTTP request over real TCP, counted by valgrind: the throughput comparison of
//! `axum_overhead` in a unit that does not depend on how busy the machine is.
//!
//! `cargo bench --bench axum_instructions [-- --requests 4000]` (needs `valgrind`) — for each variant, this
//! binary runs itself under `valgrind --tool=callgrind`: a child serves the variant on a loopback port, warms it
//! up, then sends it `N` requests one after another over a keep-alive connection, client and server on one
//! thread. Only those `N` requests are counted (`--toggle-collect`), so the total over `N` is the cost of one
//! request — client, HTTP parsing, routing, the limiter, the response — and start-up (clock calibration, runtime,
//! first bucket) is left out.
//!
//! "vs bare" is bare axum's instructions per request over the variant's: the throughput ratio a CPU-bound
//! machine would show if the kernel's share (the socket calls, which valgrind does not count and which every
//! variant pays alike) were nothing — so it understates the ratio `axum_overhead` measures, never overstates it.
//! `ONLY=<row index>` counts one row.
//!
//! The last rows are tollgate without header fields in a process that also listens: with a Prometheus
//! recorder installed (every decision counted in it), and with a `tracing` subscriber at `INFO` (decision events are
//! at `DEBUG`: filtered out by the global level) or at `DEBUG` (every decision formatted, into a sink). Their peer
//! is that row, the same limiter with nobody listening: what listening costs a request.

use std::net::SocketAddr;

#[path = "support/axum_variants.rs"]
mod axum_variants;
#[path = "support/http_load.rs"]
mod http_load;

/// The child: serve variant `v`, warm it up, then send it `requests` requests inside [`measured_requests`].
fn child(v: usize, requests: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let plain = axum_variants::variants().len();
    // A listener is installed before the router is built: layers register their counters once, when built.
    let v = match v.checked_sub(plain) {
        Some(observed) => {
            (OBSERVED[observed].1)();
            tollgate_row()
        }
        None => v,
    };
    let router = (axum_variants::variants().swap_remove(v).router)();
    let addr = runtime.block_on(http_load::serve(router));
    // Connections, buckets, caches and lazily built statics: none of it counts.
    load(&runtime, addr, 1_000);
    measured_requests(&runtime, addr, requests);
}

/// The row the observed rows repeat with a listener installed: tollgate without header fields.
fn tollgate_row() -> usize {
    axum_variants::variants()
        .iter()
        .position(|v| v.name == "tollgate (no fields)")
        .expect("the tollgate row")
}

/// The observed rows after the plain ones: a name and what it installs.
const OBSERVED: [(&str, fn()); 3] = [
    ("tollgate + Prometheus", install_prometheus),
    ("tollgate + tracing INFO", || {
        install_tracing(tracing::Level::INFO)
    }),
    ("tollgate + tracing DEBUG", || {
        install_tracing(tracing::Level::DEBUG)
    }),
];

fn install_prometheus() {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder");
}

/// A formatting subscriber at `level`, writing into nothing (the formatting is the cost measured, not a terminal).
fn install_tracing(level: tracing::Level) {
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::sink)
        .init();
}

/// The only code callgrind counts (`--toggle-collect`): everything the runtime runs while this is on the stack,
/// client and server alike.
#[inline(never)]
fn measured_requests(runtime: &tokio::runtime::Runtime, addr: SocketAddr, requests: u64) {
    load(runtime, addr, requests);
}

/// Sends `requests` requests, one after another, over one keep-alive connection.
fn load(runtime: &tokio::runtime::Runtime, addr: SocketAddr, requests: u64) {
    let sent = runtime.block_on(async {
        let mut client = http_load::Client::connect(addr).await?;
        for _ in 0..requests {
            client.request().await?;
        }
        Ok::<_, String>(())
    });
    if let Err(e) = sent {
        eprintln!("axum_instructions: load generator: {e}");
        std::process::exit(1);
    }
}

/// Instructions per request of variant `v`, counted by callgrind over `requests` requests.
fn count(v: usize, requests: u64) -> Result<f64, String> {
    let args = ["--child".to_owned(), v.to_string(), requests.to_string()];
    let total = tollgate_testkit::callgrind::instructions("*measured_requests*", &args)?;
    Ok(total as f64 / requests as f64)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, v, n] = args.as_slice()
        && flag == "--child"
    {
        child(
            v.parse().expect("a variant index"),
            n.parse().expect("a request count"),
        );
        return;
    }
    let mut requests: u64 = 4_000;
    let mut rest = args.iter().filter(|a| *a != "--bench");
    while let Some(flag) = rest.next() {
        match (flag.as_str(), rest.next().map(|v| v.parse())) {
            ("--requests", Some(Ok(n))) if n > 0 => requests = n,
            _ => {
                eprintln!("usage: axum_instructions [--requests N]");
                std::process::exit(2);
            }
        }
    }
    let only: Option<usize> = std::env::var("ONLY").ok().and_then(|v| v.parse().ok());
    // Every row's name and peer: the plain variants, then the observed ones (peer: tollgate without fields).
    let variants: Vec<(&str, usize)> = axum_variants::variants()
        .iter()
        .map(|v| (v.name, v.peer))
        .chain(OBSERVED.iter().map(|(name, _)| (*name, tollgate_row())))
        .collect();
    println!(
        "instructions per HTTP request (callgrind; client + server, one thread, one keep-alive connection, {requests} requests per variant)"
    );
    // The selected row, bare axum and the row's peer (or every row).
    let wanted = |v: usize| only.is_none_or(|o| v == o || v == 0 || v == variants[o].1);
    let per_request: Vec<f64> = (0..variants.len())
        .map(|v| {
            if !wanted(v) {
                return f64::NAN;
            }
            count(v, requests).unwrap_or_else(|e| {
                eprintln!("axum_instructions: {e}");
                std::process::exit(2)
            })
        })
        .collect();
    println!(
        "{:<26} {:>12} {:>8} {:>12} {:>8}  peer",
        "variant", "instr/req", "vs bare", "added (peer)", "vs peer"
    );
    for (i, &(name, peer_row)) in variants.iter().enumerate() {
        if per_request[i].is_nan() {
            continue;
        }
        let peer = per_request[peer_row];
        println!(
            "{:<26} {:>12.0} {:>7.3}x {:>+12.0} {:>7.3}x  {}",
            name,
            per_request[i],
            per_request[0] / per_request[i],
            per_request[i] - peer,
            peer / per_request[i],
            variants[peer_row].0
        );
    }
}
