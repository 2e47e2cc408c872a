//! What a rate limiter costs a tonic stream, per call and per message: bare tonic beside tollgate's gRPC adapter
//! (a token bucket on the in-process store that admits everything, with its default `ratelimit` field) around a
//! server stream (`Countdown/Count`: the server sends `n` messages) and a client stream (`Tally/Sum`: the client
//! sends `n`), over real loopback TCP, one call after another on one HTTP/2 connection, client and server on one
//! thread.
//!
//! `cargo bench -p tollgate-grpc --bench stream_overhead [-- --messages 1000 --calls 40 --rounds 9]`
//! - instructions (callgrind, deterministic; this binary reruns itself as the child, counting only the measured
//!   calls; skipped when valgrind is missing): per call of 1 message and of `--messages`, and per message the
//!   difference between the two divided by the extra messages — what each message costs once a call is admitted;
//! - time: interleaved rounds of `--calls` calls of `--messages` per variant, the median of the per-round ratios
//!   of time per message to bare tonic's, with their quartiles.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures_util::{Stream, StreamExt};
use tollgate_core::{MemoryStore, Policy, Quota};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

#[allow(
    dead_code,
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic
)]
mod countdown {
    include!("../proto/countdown.rs");
}

use countdown::countdown_client::CountdownClient;
use countdown::countdown_server::{Countdown, CountdownServer};
use countdown::tally_client::TallyClient;
use countdown::tally_server::{Tally, TallyServer};
use countdown::{CountReply, CountRequest};

/// The limiter around the services, or none.
const LIMITERS: [&str; 2] = ["bare tonic", "tollgate"];
/// Which way the messages go.
const SHAPES: [&str; 2] = ["server stream", "client stream"];

/// Both streaming methods, answering at once.
struct Streams;

#[tonic::async_trait]
impl Countdown for Streams {
    type CountStream = Pin<Box<dyn Stream<Item = Result<CountReply, Status>> + Send>>;

    async fn count(
        &self,
        req: Request<CountRequest>,
    ) -> Result<Response<Self::CountStream>, Status> {
        let n = req.into_inner().from;
        let replies = futures_util::stream::iter((0..n).map(|value| Ok(CountReply { value })));
        Ok(Response::new(Box::pin(replies)))
    }

    async fn ping(&self, req: Request<CountRequest>) -> Result<Response<CountReply>, Status> {
        Ok(Response::new(CountReply {
            value: req.into_inner().from,
        }))
    }
}

#[tonic::async_trait]
impl Tally for Streams {
    async fn sum(
        &self,
        req: Request<Streaming<CountRequest>>,
    ) -> Result<Response<CountReply>, Status> {
        let mut stream = req.into_inner();
        let mut value = 0_u32;
        while let Some(message) = stream.message().await? {
            value = value.wrapping_add(message.from);
        }
        Ok(Response::new(CountReply { value }))
    }
}

/// Serves both methods, bare (`limited` false) or behind tollgate, on a loopback port from a task of the current
/// runtime.
async fn serve(limited: bool) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let routes = tonic::service::Routes::new(CountdownServer::new(Streams))
        .add_service(TallyServer::new(Streams));
    if limited {
        let policy = Policy::token_bucket(Quota::per_second(1_000_000_000).unwrap());
        let limiter = tollgate_tower::RateLimitLayer::new(
            "bench",
            policy,
            Arc::new(MemoryStore::new()),
            "client",
        );
        let server = tonic::transport::Server::builder()
            .layer(tollgate_grpc::GrpcLimitLayer::new(limiter))
            .add_routes(routes);
        tokio::spawn(server.serve_with_incoming(incoming));
    } else {
        let server = tonic::transport::Server::builder().add_routes(routes);
        tokio::spawn(server.serve_with_incoming(incoming));
    }
    addr
}

/// One connection's clients of both methods.
struct Clients {
    count: CountdownClient<Channel>,
    sum: TallyClient<Channel>,
}

async fn connect(addr: SocketAddr) -> Clients {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Clients {
        count: CountdownClient::new(channel.clone()),
        sum: TallyClient::new(channel),
    }
}

/// `calls` calls of `messages` messages each, in `shape`.
async fn calls(clients: &mut Clients, shape: usize, messages: u32, calls: u64) {
    for _ in 0..calls {
        if shape == 0 {
            let mut stream = clients
                .count
                .count(CountRequest { from: messages })
                .await
                .expect("a stream")
                .into_inner();
            let mut n = 0;
            while let Some(reply) = stream.next().await {
                reply.expect("a message");
                n += 1;
            }
            assert_eq!(n, messages);
        } else {
            let requests =
                futures_util::stream::iter((0..messages).map(|from| CountRequest { from }));
            let reply = clients.sum.sum(requests).await.expect("an answer");
            let expected = (0..messages).fold(0_u32, u32::wrapping_add);
            assert_eq!(reply.get_ref().value, expected);
        }
    }
}

/// The only code callgrind counts.
#[inline(never)]
fn measured_calls(
    runtime: &tokio::runtime::Runtime,
    clients: &mut Clients,
    shape: usize,
    messages: u32,
    n: u64,
) {
    runtime.block_on(calls(clients, shape, messages, n));
}

fn child(limited: bool, shape: usize, messages: u32, n: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = runtime.block_on(serve(limited));
    let mut clients = runtime.block_on(connect(addr));
    runtime.block_on(calls(&mut clients, shape, messages, 20));
    measured_calls(&runtime, &mut clients, shape, messages, n);
}

/// Instructions per call of `messages` messages, counted by callgrind in a child process.
fn instructions(limited: bool, shape: usize, messages: u32, n: u64) -> Result<f64, String> {
    let args = [
        "--child".to_owned(),
        limited.to_string(),
        shape.to_string(),
        messages.to_string(),
        n.to_string(),
    ];
    let total = tollgate_testkit::callgrind::instructions("*measured_calls*", &args)?;
    Ok(total as f64 / n as f64)
}

/// The command line: `--messages N --calls N --rounds N` (and `--bench`, which `cargo bench` adds).
struct Options {
    messages: u32,
    calls: u64,
    rounds: usize,
}

fn options(args: &[String]) -> Options {
    let mut o = Options {
        messages: 1_000,
        calls: 40,
        rounds: 9,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next().and_then(|v| v.parse::<u64>().ok())) {
            ("--messages", Some(n)) if (2..=1_000_000).contains(&n) => o.messages = n as u32,
            ("--calls", Some(n)) if n > 0 => o.calls = n,
            ("--rounds", Some(n)) if n > 0 => o.rounds = n as usize,
            _ => {
                eprintln!(
                    "usage: stream_overhead [--messages 2..=1000000] [--calls N] [--rounds N]"
                );
                std::process::exit(2);
            }
        }
    }
    o
}

fn print_instructions(o: &Options) -> Result<(), String> {
    println!(
        "instructions (callgrind; client + server, one thread): per call of 1 and of {} messages, per message",
        o.messages
    );
    println!(
        "{:<14} {:<11} {:>12} {:>14} {:>12}",
        "shape", "variant", "1 message", "per call", "per message"
    );
    for (shape, name) in SHAPES.iter().enumerate() {
        let mut per_message = [0.0; 2];
        for (v, limiter) in LIMITERS.iter().enumerate() {
            let one = instructions(v == 1, shape, 1, 200)?;
            let many = instructions(v == 1, shape, o.messages, 10)?;
            per_message[v] = (many - one) / f64::from(o.messages - 1);
            println!(
                "{name:<14} {limiter:<11} {one:>12.0} {many:>14.0} {:>12.1}",
                per_message[v]
            );
        }
        println!(
            "{name:<14} tollgate adds {:+.1} instructions per message ({:.4} x bare's)",
            per_message[1] - per_message[0],
            per_message[1] / per_message[0]
        );
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if let [flag, limited, shape, messages, n] = args.as_slice()
        && flag == "--child"
    {
        child(
            limited == "true",
            shape.parse().unwrap(),
            messages.parse().unwrap(),
            n.parse().unwrap(),
        );
        return;
    }
    let o = options(&args);
    if let Err(e) = print_instructions(&o) {
        println!("instructions: skipped ({e})");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut clients: Vec<Clients> = Vec::new();
    for v in 0..LIMITERS.len() {
        let addr = runtime.block_on(serve(v == 1));
        let mut c = runtime.block_on(connect(addr));
        for shape in 0..SHAPES.len() {
            runtime.block_on(calls(&mut c, shape, o.messages, 5));
        }
        clients.push(c);
    }
    println!(
        "time: {} interleaved rounds of {} calls of {} messages per variant",
        o.rounds, o.calls, o.messages
    );
    println!(
        "{:<14} {:>16} {:>16} {:>9} {:>15}",
        "shape", "bare ns/message", "tollgate", "× bare", "quartiles"
    );
    for (shape, name) in SHAPES.iter().enumerate() {
        let mut times = [Vec::new(), Vec::new()];
        for round in 0..o.rounds {
            for j in 0..LIMITERS.len() {
                let v = (round + j) % LIMITERS.len();
                let start = Instant::now();
                runtime.block_on(calls(&mut clients[v], shape, o.messages, o.calls));
                let messages = o.calls as f64 * f64::from(o.messages);
                times[v].push(start.elapsed().as_nanos() as f64 / messages);
            }
        }
        let mut ratios: Vec<f64> = times[1].iter().zip(&times[0]).map(|(t, b)| t / b).collect();
        ratios.sort_by(f64::total_cmp);
        for t in &mut times {
            t.sort_by(f64::total_cmp);
        }
        let n = ratios.len();
        println!(
            "{name:<14} {:>16.0} {:>16.0} {:>9.3} {:>7.3}–{:<7.3}",
            times[0][n / 2],
            times[1][n / 2],
            ratios[n / 2],
            ratios[n / 4],
            ratios[(3 * n) / 4]
        );
    }
}
