//! Drives the example servers through one paced client (`tollgate::client`) and prints what it achieved.
//!
//! ```text
//! cargo run --release --example axum_server -- --limit 20 --period 1s &
//! cargo run --release --example paced_client -- --url http://127.0.0.1:3000/ --concurrency 16 --duration 10s
//! cargo run --release --example paced_client -- --url http://127.0.0.1:3000/ --concurrency 16 --duration 10s --no-pacing
//!
//! cargo run --release --example grpc_server -- --limit 20 --period 1s &
//! cargo run --release --example paced_client -- --url http://127.0.0.1:50051 --grpc --concurrency 16 --duration 10s
//! ```
//!
//! `--concurrency` callers send requests one after another until `--duration` is over, each to the next `--url` in
//! turn (round robin, as a client behind a load balancer would: every URL is one service, so they share one
//! budget). Each run prints one row: `sent`, `ok`, `refused` (429 or `RESOURCE_EXHAUSTED`), `achieved_per_s` (ok per
//! second), `limit_per_s` (the first `RateLimit-Policy` member's `q / w`, as the server announced it) and
//! `p99_wait_ms` (the 99th percentile of the time a request waited in the pacing layer); `--json` prints the same
//! as one JSON object. `--no-pacing` sends without the layer, for the refusals beside it.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Mutex;
use tollgate::client::fields::Observation;
use tollgate::client::{PaceLayer, Waited};
use tower::{Service, ServiceExt as _};

#[path = "common/cli.rs"]
mod cli;

/// The code generated from `crates/tollgate-grpc/proto/helloworld.proto`.
#[allow(unreachable_pub, missing_docs)]
mod helloworld {
    include!("../crates/tollgate-grpc/proto/helloworld.rs");
}

/// Drives servers through one paced client and prints what it achieved.
#[derive(Debug, Parser)]
#[command(name = "paced_client")]
struct Args {
    /// A server: requests go to each in turn (repeatable).
    #[arg(long = "url", required = true, value_parser = cli::absolute_url)]
    urls: Vec<http::Uri>,
    /// Call `helloworld.Greeter/SayHello` over gRPC instead of `GET`.
    #[arg(long)]
    grpc: bool,
    /// Callers sending at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// How long to send: 500ms, 10s, 1m.
    #[arg(long, default_value = "10s", value_parser = cli::duration)]
    duration: Duration,
    /// Send without the pacing layer.
    #[arg(long)]
    no_pacing: bool,
    /// Print the row as one JSON object.
    #[arg(long)]
    json: bool,
}

/// One run's numbers.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    ok: u64,
    refused: u64,
    /// Every request's wait in the layer, in µs.
    waits: Vec<u64>,
    /// `q / w` of the first policy the server announced.
    limit_per_s: Option<f64>,
}

impl Tally {
    fn answered(&mut self, ok: bool, refused: bool, waited: Duration, observation: &Observation) {
        self.sent += 1;
        self.ok += u64::from(ok);
        self.refused += u64::from(refused);
        self.waits
            .push(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX));
        if self.limit_per_s.is_none()
            && let Some(p) = observation.policies.first()
            && let Some(w) = p.window
        {
            self.limit_per_s = Some(p.quota as f64 / w.as_secs_f64());
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Args = cli::parse();
    let layer = PaceLayer::new()
        // Every URL is one service behind one limit: one budget.
        .scope_by(|_, _| "service".to_owned())
        .max_wait(Duration::from_secs(60));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let result = if args.grpc {
        grpc(&args, &layer, &tally).await
    } else {
        http(&args, &layer, &tally).await
    };
    if let Err(e) = result {
        eprintln!("paced_client: {e}");
        std::process::exit(1);
    }
    let elapsed = started.elapsed().max(args.duration);
    let tally = tally.lock().await;
    print_row(&args, &tally, elapsed);
}

/// Runs `concurrency` callers of `call` until the duration is over.
async fn callers<F, Fut>(args: &Args, call: F) -> Result<(), String>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let deadline = tokio::time::Instant::now() + args.duration;
    let next = Arc::new(AtomicUsize::new(0));
    let urls = args.urls.len();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let (call, next) = (call.clone(), next.clone());
        tasks.spawn(async move {
            while tokio::time::Instant::now() < deadline {
                let url = next.fetch_add(1, Ordering::Relaxed) % urls;
                // A request still waiting at the end is not counted: the run is over.
                match tokio::time::timeout_at(deadline, call(url)).await {
                    Ok(result) => result?,
                    Err(_) => break,
                }
            }
            Ok::<_, String>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| e.to_string())??;
    }
    Ok(())
}

async fn http(args: &Args, layer: &PaceLayer, tally: &Arc<Mutex<Tally>>) -> Result<(), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let urls: Arc<[http::Uri]> = args.urls.iter().cloned().collect();
    if args.no_pacing {
        http_with(args, client, urls, tally).await
    } else {
        http_with(args, tower::Layer::layer(layer, client), urls, tally).await
    }
}

/// The HTTP callers, through `service` (paced or bare).
async fn http_with<S, B>(
    args: &Args,
    service: S,
    urls: Arc<[http::Uri]>,
    tally: &Arc<Mutex<Tally>>,
) -> Result<(), String>
where
    S: Service<http::Request<Empty<Bytes>>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Display,
    B: hyper::body::Body + Send,
    B::Data: Send,
    B::Error: std::fmt::Display,
{
    let tally = tally.clone();
    callers(args, move |url| {
        let (mut service, urls, tally) = (service.clone(), urls.clone(), tally.clone());
        async move {
            let request = http::Request::get(urls[url].clone())
                .body(Empty::new())
                .map_err(|e| e.to_string())?;
            let response = service
                .ready()
                .await
                .map_err(|e| e.to_string())?
                .call(request)
                .await
                .map_err(|e| e.to_string())?;
            let (parts, body) = response.into_parts();
            // Read to the end: the connection goes back to the pool.
            body.collect().await.map_err(|e| e.to_string())?;
            let waited = parts
                .extensions
                .get::<Waited>()
                .map_or(Duration::ZERO, |w| w.0);
            let observation = Observation::read(parts.status, &parts.headers);
            tally.lock().await.answered(
                parts.status.is_success(),
                parts.status == http::StatusCode::TOO_MANY_REQUESTS,
                waited,
                &observation,
            );
            Ok(())
        }
    })
    .await
}

async fn grpc(args: &Args, layer: &PaceLayer, tally: &Arc<Mutex<Tally>>) -> Result<(), String> {
    let mut channels = Vec::new();
    for url in &args.urls {
        let channel = tonic::transport::Endpoint::from(url.clone())
            .connect()
            .await
            .map_err(|e| format!("--url {url}: {e}"))?;
        channels.push(channel);
    }
    if args.no_pacing {
        grpc_with(args, channels, tally).await
    } else {
        let paced = channels
            .into_iter()
            .map(|c| tower::Layer::layer(layer, c))
            .collect();
        grpc_with(args, paced, tally).await
    }
}

/// The gRPC callers, each call on the next of `channels` (paced or bare).
async fn grpc_with<T>(
    args: &Args,
    channels: Vec<T>,
    tally: &Arc<Mutex<Tally>>,
) -> Result<(), String>
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    T::Future: Send,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::ResponseBody: hyper::body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as hyper::body::Body>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    use helloworld::HelloRequest;
    use helloworld::greeter_client::GreeterClient;
    let channels = Arc::new(channels);
    let tally = tally.clone();
    callers(args, move |url| {
        let (channels, tally) = (channels.clone(), tally.clone());
        async move {
            let mut client = GreeterClient::new(channels[url].clone());
            let request = HelloRequest {
                name: "paced".into(),
            };
            let (ok, refused, metadata, waited) = match client.say_hello(request).await {
                Ok(response) => {
                    let waited = response.extensions().get::<Waited>().map(|w| w.0);
                    (true, false, response.metadata().clone(), waited)
                }
                Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                    (false, true, status.metadata().clone(), None)
                }
                Err(status) => return Err(format!("{status}")),
            };
            let observation = Observation::read(http::StatusCode::OK, &metadata.into_headers());
            tally.lock().await.answered(
                ok,
                refused,
                waited.unwrap_or(Duration::ZERO),
                &observation,
            );
            Ok(())
        }
    })
    .await
}

fn print_row(args: &Args, tally: &Tally, elapsed: Duration) {
    let mut waits = tally.waits.clone();
    waits.sort_unstable();
    let p99_wait_ms = waits
        .get((waits.len() * 99).div_ceil(100).saturating_sub(1))
        .map_or(0.0, |&us| us as f64 / 1000.0);
    let achieved_per_s = tally.ok as f64 / elapsed.as_secs_f64();
    let limit_per_s = tally.limit_per_s;
    if args.json {
        let row = serde_json::json!({
            "sent": tally.sent,
            "ok": tally.ok,
            "refused": tally.refused,
            "achieved_per_s": round2(achieved_per_s),
            "limit_per_s": limit_per_s.map(round2),
            "p99_wait_ms": round2(p99_wait_ms),
        });
        println!("{row}");
    } else {
        println!(
            "{:>8} {:>8} {:>8} {:>15} {:>12} {:>12}",
            "sent", "ok", "refused", "achieved_per_s", "limit_per_s", "p99_wait_ms"
        );
        let limit = limit_per_s.map_or_else(|| "-".to_owned(), |l| format!("{l:.2}"));
        println!(
            "{:>8} {:>8} {:>8} {:>15.2} {:>12} {:>12.2}",
            tally.sent, tally.ok, tally.refused, achieved_per_s, limit, p99_wait_ms
        );
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
