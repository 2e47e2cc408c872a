//! `examples/axum_server` as a black box: the binary `cargo test` builds, started with each of its flags, asked over
//! real TCP. Redis-backed runs use a private `redis-server` (fresh state, and one the test may kill).

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_testkit::examples::{ExampleServer, example};
use tollgate_testkit::http::{Reply, get};
use tollgate_testkit::redis::RedisServer;

/// `axum_server` running with the test's flags, asked over TCP.
struct Server(ExampleServer);

impl Server {
    fn start(args: &[&str]) -> Self {
        Self(ExampleServer::start("axum_server", args))
    }

    fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        get(self.addr(), path, headers)
    }
}

fn statuses(server: &Server, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    (0..n).map(|_| server.get(path, headers).status).collect()
}

#[test]
fn token_bucket_in_process_answers_429_with_every_header() {
    let server = Server::start(&["--limit", "2", "--period", "1h"]);
    let sent = Instant::now();
    assert_eq!(statuses(&server, "/", &[], 2), [200, 200]);
    let denied = server.get("/", &[]);
    let span = sent.elapsed();
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some(r#""per-client";q=2;w=3600"#)
    );
    // The first token is back 1800 s after the first decision: `t` (rounded up) and `Retry-After` count down from
    // there by the time the third decision came later on the server's real clock, less than the span the client
    // measured: exactly 1800 unless the three requests took a second or more.
    let t = 1800 - span.as_secs()..=1800;
    let (field_t, retry) = (
        denied
            .header("ratelimit")
            .and_then(|v| v.strip_prefix(r#""per-client";r=0;t="#))
            .and_then(|t| t.parse::<u64>().ok()),
        denied
            .header("retry-after")
            .and_then(|s| s.parse::<u64>().ok()),
    );
    assert!(
        field_t.is_some_and(|f| t.contains(&f)) && retry == field_t,
        "{denied:#?}: t and retry-after should be in {t:?} after {span:?}"
    );
    assert_eq!(denied.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(denied.header("x-ratelimit-used"), Some("2"));
    assert_eq!(denied.header("x-ratelimit-resource"), Some("per-client"));
    assert!(denied.header("x-ratelimit-reset").is_some());
    let health = server.get("/health", &[]);
    assert_eq!(health.status, 200);
    assert_eq!(health.header("ratelimit"), None, "/health is never limited");
}

#[test]
fn burst_and_sub_second_period() {
    // 10 per 500 ms with a burst of 1: a second request before the token is back (50 ms) is over. The policy is
    // announced per whole second: 20 per second.
    let server = Server::start(&["--limit", "10", "--period", "500ms", "--burst", "1"]);
    let refill = Duration::from_millis(50);
    // Both decisions fall between the first request's send and the second's reply: within a span shorter than the
    // refill the second must be refused. A longer span (a stall on a loaded machine) proves nothing unless it was
    // refused anyway; the pair is tried again once the bucket is full.
    for _ in 0..100 {
        let sent = Instant::now();
        let first = server.get("/", &[]);
        let second = server.get("/", &[]);
        let span = sent.elapsed();
        assert_eq!(first.status, 200, "{first:#?}");
        assert_eq!(
            first.header("ratelimit-policy"),
            Some(r#""per-client";q=20;w=1"#)
        );
        if span < refill || second.status == 429 {
            assert_eq!(second.status, 429, "admitted {span:?} after the first");
            return;
        }
        std::thread::sleep(refill * 2);
    }
    panic!("no two requests were answered within {refill:?} in 100 tries");
}

#[test]
fn sliding_window_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let args = [
        "--algorithm",
        "sliding-window",
        "--limit",
        "3",
        "--period",
        "10s",
        "--redis-url",
        &url,
    ];
    let server = Server::start(&args);
    assert_eq!(statuses(&server, "/", &[], 4), [200, 200, 200, 429]);
    // A second instance on the same Redis shares the window: the fleet-wide promise.
    let other = Server::start(&args);
    assert_eq!(other.get("/", &[]).status, 429);
}

#[test]
fn forwarded_for_counts_only_through_trusted_proxies() {
    let spoof = |ip| [("x-forwarded-for", ip)];
    let untrusting = Server::start(&["--limit", "1", "--period", "1h"]);
    assert_eq!(untrusting.get("/", &spoof("9.9.9.9")).status, 200);
    assert_eq!(
        untrusting.get("/", &spoof("8.8.8.8")).status,
        429,
        "a spoofed header is no fresh bucket"
    );

    let trusting = Server::start(&[
        "--limit",
        "1",
        "--period",
        "1h",
        "--trusted-proxy",
        "127.0.0.0/8",
    ]);
    assert_eq!(trusting.get("/", &spoof("9.9.9.9")).status, 200);
    assert_eq!(
        trusting.get("/", &spoof("8.8.8.8")).status,
        200,
        "another client behind the proxy"
    );
    assert_eq!(trusting.get("/", &spoof("9.9.9.9")).status, 429);
}

#[test]
fn store_error_policies_when_redis_dies() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let start = |policy| {
        Server::start(&[
            "--limit",
            "2",
            "--period",
            "1h",
            "--redis-url",
            &url,
            "--on-store-error",
            policy,
        ])
    };
    let (open, closed, local) = (start("open"), start("closed"), start("local"));
    assert_eq!(closed.get("/", &[]).status, 200, "Redis is up");
    redis.kill();
    assert_eq!(statuses(&open, "/", &[], 3), [200, 200, 200], "fails open");
    let unavailable = closed.get("/", &[]);
    assert_eq!(unavailable.status, 503, "{unavailable:#?}");
    assert!(unavailable.header("retry-after").is_some());
    assert_eq!(
        statuses(&local, "/", &[], 3),
        [200, 200, 429],
        "the same limit, per instance, while Redis is down"
    );
}

#[test]
fn stack_flags_limit_concurrency() {
    let server = Server::start(&[
        "--limit",
        "1000",
        "--concurrency",
        "1",
        "--worker-capacity",
        "50",
    ]);
    let addr = server.addr();
    // While a slow request holds the client's one lease, another request from the client is turned away. The slow
    // request needs a moment to arrive; give it longer on each attempt rather than guess one delay.
    let mut seen = Vec::new();
    for attempt in 1..=5 {
        let slow = std::thread::spawn(move || get(addr, "/slow?ms=1500", &[]).status);
        std::thread::sleep(Duration::from_millis(150 * attempt));
        let probe = server.get("/slow?ms=1", &[]).status;
        let slow = slow.join().expect("the slow request");
        seen.push((probe, slow));
        if (probe, slow) == (429, 200) {
            break;
        }
    }
    assert_eq!(
        seen.last(),
        Some(&(429, 200)),
        "(probe, slow) per attempt: {seen:?}"
    );
    assert_eq!(
        server.get("/slow?ms=1", &[]).status,
        200,
        "the lease was returned"
    );
}

#[test]
fn decimal_durations_are_exact() {
    let server = Server::start(&["--limit", "1", "--period", "0.5h"]);
    let reply = server.get("/", &[]);
    assert_eq!(reply.status, 200, "{reply:#?}");
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some(r#""per-client";q=1;w=1800"#)
    );
}

#[test]
fn deny_cache_spares_redis_a_flood_and_can_be_switched_off() {
    let redis = RedisServer::start();
    let url = redis.url();
    // One token an hour: none accrues during the test, however slow the machine. With the cache, a call per
    // admission: the third's reply, which empties the bucket, makes the entry that refuses the other 37.
    for (flag, most_calls) in [(None, 3), (Some("off"), 40)] {
        let mut args = vec!["--limit", "3", "--period", "1h", "--redis-url", &url];
        args.extend(flag.map(|f| ["--deny-cache", f]).into_iter().flatten());
        let server = Server::start(&args);
        let before = redis.command_calls("evalsha");
        let statuses = statuses(&server, "/", &[], 40);
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            3,
            "{flag:?}: {statuses:?}"
        );
        let calls = redis.command_calls("evalsha") - before;
        assert_eq!(
            calls, most_calls,
            "--deny-cache {flag:?}: {calls} script calls for 40 requests"
        );
        let _ = redis.cli(&["FLUSHALL"]);
    }
}

#[test]
fn bad_flags_are_clear_errors() {
    for args in [
        &["--limit", "0"][..],
        &["--period", "5x"],
        &["--period", "1.s"],
        &["--period", ".5s"],
        &["--period", "1.2.3s"],
        &["--algorithm", "leaky"],
        &["--on-store-error", "maybe"],
        &["--deny-cache", "maybe"],
        &["--deny-cache"],
        &["--trusted-proxy", "10.0.0.0/33"],
        &["--fleet-capacity", "5"],
        &["--adaptive", "fast"],
        &["--no-such-flag"],
        &["--metrics-addr", "nope"],
        &["--log", "loud"],
    ] {
        let out = Command::new(example("axum_server"))
            .env_remove("REDIS_URL")
            .args(args)
            .output()
            .expect("run the example");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("axum_server: ") && stderr.len() > "axum_server: ".len() + 10,
            "{args:?}: {stderr:?}"
        );
    }
}

/// A defect as it was found (critical requests shed behind low ones): `--worker-capacity 10`, 20 `Low` requests at once, then `Critical` ones. The
/// server let all 20 `Low` in and shed `Critical`; now `Low` stops at its line (6) at arrival and `Critical` passes.
#[test]
fn a_burst_of_low_leaves_the_capacity_to_critical() {
    let server = Server::start(&[
        "--limit",
        "100000",
        "--period",
        "1s",
        "--worker-capacity",
        "10",
    ]);
    let addr = server.addr();
    let (tx, answers) = std::sync::mpsc::channel();
    for _ in 0..20 {
        let tx = tx.clone();
        // Held for a minute (until the server is killed): the admitted ones never answer during the test.
        std::thread::spawn(move || {
            let _ = tx.send(get(addr, "/slow?ms=60000", &[("x-priority", "low")]).status);
        });
    }
    let mut shed = Vec::new();
    while shed.len() < 14 {
        match answers.recv_timeout(Duration::from_secs(10)) {
            Ok(status) => shed.push(status),
            Err(_) => panic!(
                "only {} of 20 Low requests answered: {shed:?} (the rest were admitted)",
                shed.len()
            ),
        }
    }
    assert_eq!(shed, [503; 14]);
    assert!(
        answers.recv_timeout(Duration::from_millis(300)).is_err(),
        "more than 14 Low requests shed"
    );
    // Six Low are in flight: Critical has the other four, and Low still meets its line.
    for _ in 0..4 {
        assert_eq!(
            server
                .get("/slow?ms=1", &[("x-priority", "critical")])
                .status,
            200
        );
    }
    assert_eq!(
        server.get("/slow?ms=1", &[("x-priority", "low")]).status,
        503
    );
}

#[test]
fn adaptive_flag_builds_the_limit() {
    for algorithm in ["gradient2", "aimd"] {
        let server = Server::start(&["--limit", "1000", "--adaptive", algorithm]);
        assert_eq!(server.get("/", &[]).status, 200, "{algorithm}");
        assert_eq!(
            server.get("/slow?ms=1", &[("x-priority", "low")]).status,
            200
        );
    }
}
