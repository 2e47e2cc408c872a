//! What a rate limiter costs a tonic unary service: bare tonic, tollgate's gRPC adapter around it (a token bucket
//! on the in-process store that admits everything; with its rate-limit metadata, then without, as
//! tower-governor answers) and tower-governor around it (its global key, likewise), over
//! real loopback TCP, one unary call after another on one HTTP/2 connection, client and server on one thread.
//!
//! `cargo bench -p tollgate-rls --bench tonic_overhead [-- --requests 4000 --rounds 9 --timed 20000]`
//! - instructions: each variant counted by `valgrind --tool=callgrind` (this binary reruns itself as the child;
//!   only the measured calls are collected, `--toggle-collect`), the deterministic figure — skipped when valgrind
//!   is missing;
//! - time: interleaved rounds of `--timed` calls per variant (each round starting with the next variant), the
//!   median of the per-round ratios to bare with their quartiles and range; the load average beside it.
//!
//! The unary service is `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` answering `OK` at once (the
//! generated code of this crate), so the figure is tonic's own per-call cost plus the limiter's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use tollgate_rls::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

const VARIANTS: [&str; 5] = [
    "bare tonic",
    "tollgate",
    "tollgate (no fields)",
    "tollgate (every field)",
    "tower-governor",
];

/// The unary service: `OK`, at once.
struct Answer;

#[tonic::async_trait]
impl RateLimitService for Answer {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..RateLimitResponse::default()
        }))
    }
}

/// Serves variant `v` on a loopback port from a task of the current runtime.
async fn serve(v: usize) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = RateLimitServiceServer::new(Answer);
    match v {
        0 => {
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(incoming),
            );
        }
        1..=3 => {
            let policy = Policy::token_bucket(Quota::per_second(1_000_000_000).unwrap());
            let limiter = tollgate_tower::RateLimitLayer::new(
                "bench",
                policy,
                Arc::new(MemoryStore::new()),
                "client",
            );
            let mut layer = tollgate_grpc::GrpcLimitLayer::new(limiter);
            if v == 2 {
                // As tower-governor answers an admitted call: no rate-limit metadata.
                layer = layer.headers(tollgate_http::HeaderSet::NONE);
            }
            if v == 3 {
                layer = layer.headers(tollgate_http::HeaderSet::ALL);
            }
            tokio::spawn(
                tonic::transport::Server::builder()
                    .layer(layer)
                    .add_service(service)
                    .serve_with_incoming(incoming),
            );
        }
        _ => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .key_extractor(tower_governor::key_extractor::GlobalKeyExtractor)
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .unwrap();
            let layer = tower_governor::GovernorLayer::new(config);
            tokio::spawn(
                tonic::transport::Server::builder()
                    .layer(layer)
                    .add_service(service)
                    .serve_with_incoming(incoming),
            );
        }
    }
    addr
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<tonic::transport::Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

async fn calls(client: &mut RateLimitServiceClient<tonic::transport::Channel>, n: u64) {
    for _ in 0..n {
        let reply = client
            .should_rate_limit(RateLimitRequest::default())
            .await
            .expect("an answer");
        assert_eq!(reply.get_ref().overall_code, Code::Ok as i32);
    }
}

/// The only code callgrind counts.
#[inline(never)]
fn measured_calls(
    runtime: &tokio::runtime::Runtime,
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    n: u64,
) {
    runtime.block_on(calls(client, n));
}

fn child(v: usize, n: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = runtime.block_on(serve(v));
    let mut c = runtime.block_on(client(addr));
    runtime.block_on(calls(&mut c, 1_000));
    measured_calls(&runtime, &mut c, n);
}

fn instructions(v: usize, n: u64) -> Result<f64, String> {
    let args = ["--child".to_owned(), v.to_string(), n.to_string()];
    let total = tollgate_testkit::callgrind::instructions("*measured_calls*", &args)?;
    Ok(total as f64 / n as f64)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if let [flag, v, n] = args.as_slice()
        && flag == "--child"
    {
        child(v.parse().unwrap(), n.parse().unwrap());
        return;
    }
    let (mut requests, mut rounds, mut timed) = (4_000_u64, 9_usize, 20_000_u64);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next().and_then(|v| v.parse::<u64>().ok())) {
            ("--requests", Some(n)) if n > 0 => requests = n,
            ("--rounds", Some(n)) if n > 0 => rounds = n as usize,
            ("--timed", Some(n)) if n > 0 => timed = n,
            _ => {
                eprintln!("usage: tonic_overhead [--requests N] [--rounds N] [--timed N]");
                std::process::exit(2);
            }
        }
    }
    match (0..VARIANTS.len())
        .map(|v| instructions(v, requests))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(counts) => {
            println!(
                "instructions per unary call (callgrind; client + server, one thread, {requests} calls)"
            );
            println!("{:<22} {:>12} {:>9}", "variant", "instr/call", "bare ÷");
            for (name, c) in VARIANTS.iter().zip(&counts) {
                println!("{name:<22} {c:>12.0} {:>8.3}x", counts[0] / c);
            }
        }
        Err(e) => println!("instructions: skipped ({e})"),
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut clients = Vec::new();
    for v in 0..VARIANTS.len() {
        let addr = runtime.block_on(serve(v));
        let mut c = runtime.block_on(client(addr));
        runtime.block_on(calls(&mut c, 2_000));
        clients.push(c);
    }
    println!(
        "time: {rounds} interleaved rounds of {timed} calls per variant; load average before: {}",
        load_average()
    );
    let mut rates = vec![Vec::new(); VARIANTS.len()];
    for round in 0..rounds {
        // Each round starts with the next variant, so that no variant always runs first (or right after another).
        for j in 0..VARIANTS.len() {
            let v = (round + j) % VARIANTS.len();
            let start = Instant::now();
            runtime.block_on(calls(&mut clients[v], timed));
            rates[v].push(timed as f64 / start.elapsed().as_secs_f64());
        }
    }
    println!(
        "{:<22} {:>12} {:>9} {:>15} {:>15}",
        "variant", "calls/s", "÷ bare", "quartiles", "range"
    );
    for v in 0..VARIANTS.len() {
        let mut ratios: Vec<f64> = rates[v].iter().zip(&rates[0]).map(|(r, b)| r / b).collect();
        ratios.sort_by(f64::total_cmp);
        let mut r = rates[v].clone();
        r.sort_by(f64::total_cmp);
        let n = ratios.len();
        println!(
            "{:<22} {:>12.0} {:>9.3} {:>7.3}–{:<7.3} {:>7.3}–{:<7.3}",
            VARIANTS[v],
            r[n / 2],
            ratios[n / 2],
            ratios[n / 4],
            ratios[(3 * n) / 4],
            ratios[0],
            ratios[n - 1]
        );
    }
    println!("load average after: {}", load_average());
}
