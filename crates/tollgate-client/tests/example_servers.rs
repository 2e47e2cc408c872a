//! The paced client against the real example servers over TCP: `axum_server` (token bucket and sliding window,
//! in process and on Redis) and `grpc_server`, refusing nobody that follows their fields.
//!
//! Each test's numbers come from the limit under test: a run sends several times the burst, so that it only passes
//! if the layer waited; the assertions are counts (refusals, admissions) and lower bounds on waits, which load on
//! the machine can only make easier to meet.

mod support;

use std::time::Duration;

use support::{bare, get, paced};
use tollgate_client::PaceLayer;
use tollgate_testkit::examples::ExampleServer;
use tollgate_testkit::redis::RedisServer;

/// `callers` concurrent callers send `each` requests apiece through one paced client (one budget for every URL,
/// taken in turn); the statuses.
async fn run(layer: &PaceLayer, urls: &[String], callers: usize, each: usize) -> Vec<u16> {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..callers {
        let (mut client, urls) = (paced(layer), urls.to_vec());
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..each {
                let url = &urls[(c * each + i) % urls.len()];
                statuses.push(
                    get(&mut client, url)
                        .await
                        .expect("an answer")
                        .status
                        .as_u16(),
                );
            }
            statuses
        });
    }
    let mut all = Vec::new();
    while let Some(statuses) = tasks.join_next().await {
        all.extend(statuses.expect("no panic"));
    }
    all
}

fn url(server: &ExampleServer) -> String {
    format!("http://{}/", server.addr())
}

fn one_service() -> PaceLayer {
    PaceLayer::new().scope_by(|_, _| "service".to_owned())
}

/// 4 callers, 5 per second with a burst of 5: 20 requests take at least 3 s, and none is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_bucket_refuses_nobody() {
    let server = ExampleServer::start("axum_server", &["--limit", "5", "--period", "1s"]);
    let started = std::time::Instant::now();
    let statuses = run(&PaceLayer::new(), &[url(&server)], 4, 5).await;
    assert_eq!(statuses, [200; 20], "{statuses:?}");
    assert!(started.elapsed() >= Duration::from_secs(3));
}

/// The same load without the layer is refused: the test above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pacing_the_same_load_is_refused() {
    let server = ExampleServer::start("axum_server", &["--limit", "5", "--period", "1s"]);
    let mut refused = 0;
    for _ in 0..20 {
        let answer = get(&mut bare(), &url(&server)).await.unwrap();
        refused += usize::from(answer.status == 429);
    }
    assert!(refused >= 10, "{refused} of 20 refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sliding_window_refuses_nobody() {
    let server = ExampleServer::start(
        "axum_server",
        &[
            "--limit",
            "5",
            "--period",
            "1s",
            "--algorithm",
            "sliding-window",
        ],
    );
    let statuses = run(&PaceLayer::new(), &[url(&server)], 4, 4).await;
    assert_eq!(statuses, [200; 16], "{statuses:?}");
}

/// Four instances on one Redis behind one limit, reached round robin: one budget, nobody refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_redis_refuses_nobody() {
    // A private Redis: the example servers' keys (the client's IP) are the same in every test that runs them.
    let redis = RedisServer::start();
    let url_of_redis = redis.url();
    let args = [
        "--limit",
        "5",
        "--period",
        "1s",
        "--redis-url",
        &url_of_redis,
    ];
    let fleet: Vec<_> = (0..4)
        .map(|_| ExampleServer::start("axum_server", &args))
        .collect();
    let urls: Vec<String> = fleet.iter().map(url).collect();
    let statuses = run(&one_service(), &urls, 4, 5).await;
    assert_eq!(statuses, [200; 20], "{statuses:?}");
}

/// A refusal's `Retry-After` holds the scope: another client spends the bucket, the paced one is refused once,
/// and its next request waits the delay and is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_after_a_refusal() {
    // One token per 1.5 s: `Retry-After: 2`.
    let server = ExampleServer::start("axum_server", &["--limit", "2", "--period", "3s"]);
    let layer = PaceLayer::new();
    let mut client = paced(&layer);
    assert_eq!(get(&mut client, &url(&server)).await.unwrap().status, 200);
    // Someone else takes the last token.
    assert_eq!(get(&mut bare(), &url(&server)).await.unwrap().status, 200);
    let refused = get(&mut client, &url(&server)).await.unwrap();
    if refused.status == 429 {
        let retry: u64 = refused.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let next = get(&mut client, &url(&server)).await.unwrap();
        assert_eq!(next.status, 200);
        assert!(
            next.waited >= Duration::from_secs(retry),
            "{:?}",
            next.waited
        );
    } else {
        // The paced client knew the bucket was spent from its own answer and waited instead of being refused.
        assert_eq!(refused.status, 200);
        assert!(
            refused.waited >= Duration::from_secs(1),
            "{:?}",
            refused.waited
        );
    }
}

/// The gRPC server's `RESOURCE_EXHAUSTED` is never seen by a paced tonic channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refuses_nobody() {
    let server = ExampleServer::start("grpc_server", &["--limit", "5", "--period", "1s"]);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let layer = PaceLayer::new();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let mut client = grpc::GreeterClient::new(tower::Layer::layer(&layer, channel.clone()));
        tasks.spawn(async move {
            let mut codes = Vec::new();
            for _ in 0..4 {
                let reply = client
                    .say_hello(grpc::HelloRequest { name: "p".into() })
                    .await;
                codes.push(reply.map_or_else(|s| s.code(), |_| tonic::Code::Ok));
            }
            codes
        });
    }
    let mut codes = Vec::new();
    while let Some(c) = tasks.join_next().await {
        codes.extend(c.unwrap());
    }
    assert_eq!(codes, [tonic::Code::Ok; 16], "{codes:?}");
}

/// After a `RESOURCE_EXHAUSTED` with a `RetryInfo`, the next call waits its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_retry_info_is_honoured() {
    let server = ExampleServer::start("grpc_server", &["--limit", "1", "--period", "2s"]);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // Someone else spends the token.
    let mut other = grpc::GreeterClient::new(channel.clone());
    other
        .say_hello(grpc::HelloRequest { name: "o".into() })
        .await
        .unwrap();
    let mut client = grpc::GreeterClient::new(tower::Layer::layer(&PaceLayer::new(), channel));
    let refused = client
        .say_hello(grpc::HelloRequest { name: "p".into() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    let started = std::time::Instant::now();
    client
        .say_hello(grpc::HelloRequest { name: "p".into() })
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

/// The code generated from `crates/tollgate-grpc/proto/helloworld.proto`.
#[allow(unreachable_pub, missing_docs, clippy::all)]
mod grpc {
    include!("../../tollgate-grpc/proto/helloworld.rs");
    pub use greeter_client::GreeterClient;
}

/// The `paced_client` binary as a user runs it: `--json` prints one object with exactly the documented keys, a
/// paced run is refused nowhere, and a URL that is not an absolute http(s) URL is refused at parse time.
#[test]
fn the_paced_client_binary_prints_its_row_and_checks_its_urls() {
    let server = ExampleServer::start("axum_server", &["--limit", "5", "--period", "1s"]);
    let out = std::process::Command::new(tollgate_testkit::examples::example("paced_client"))
        .args([
            "--url",
            &url(&server),
            "--concurrency",
            "4",
            "--duration",
            "2s",
            "--json",
        ])
        .output()
        .expect("paced_client runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let mut keys: Vec<&str> = row
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "achieved_per_s",
            "limit_per_s",
            "ok",
            "p99_wait_ms",
            "refused",
            "sent"
        ]
    );
    assert_eq!(row["refused"], 0, "{row}");
    assert!(row["ok"].as_u64().expect("a count") >= 5, "{row}");
    assert_eq!(row["limit_per_s"], 5.0, "{row}");

    let bad = std::process::Command::new(tollgate_testkit::examples::example("paced_client"))
        .args(["--url", "nope"])
        .output()
        .expect("paced_client runs");
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("absolute http:// or https:// URL"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
