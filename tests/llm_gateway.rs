//! Token budgets enforced while the response streams, through `examples/llm_gateway --serve` over real TCP, on
//! the in-process store and on a private Redis: a stream cut at the budget, a stream finished and its overdraft
//! owed, a reservation refunded, bad bodies answered with problems, and the simulation's goals.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use tollgate_testkit::examples::{ExampleServer, example};
use tollgate_testkit::http::{self, Reply};
use tollgate_testkit::redis::RedisServer;

/// The content chunks a stream carried (one token each).
fn tokens(answer: &Reply) -> usize {
    answer.body.matches("\"content\"").count()
}

/// Whether a stream was cut: it ends with an SSE error event.
fn cut(answer: &Reply) -> bool {
    answer.body.contains("event: error\ndata: {")
}

/// `POST /v1/chat/completions` with `body` for `key` of the organisation `acme`.
fn post(addr: SocketAddr, key: &str, body: &str) -> Reply {
    post_in(addr, key, "acme", body)
}

/// [`post`] for `key` of the organisation `org`.
fn post_in(addr: SocketAddr, key: &str, org: &str, body: &str) -> Reply {
    let headers = [
        ("x-api-key", key),
        ("x-org", org),
        ("content-type", "application/json"),
    ];
    http::post(addr, "/v1/chat/completions", &headers, body)
}

const STREAM: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn serve(args: &[&str], store: &[&str]) -> ExampleServer {
    let mut all = vec!["--serve", "--period", "1h"];
    // At full speed unless the test paces the stand-in itself.
    if !args.contains(&"--pace") {
        all.extend(["--pace", "0ms"]);
    }
    all.extend_from_slice(args);
    all.extend_from_slice(store);
    ExampleServer::start("llm_gateway", &all)
}

/// The budget is 100 output tokens; a stream of 300 is cut at exactly 100. The next request is refused.
fn cut_at_the_budget(store: &[&str]) {
    let server = serve(
        &[
            "--budget",
            "100",
            "--tokens",
            "300",
            "--batch",
            "10",
            "--on-exhausted",
            "cut",
        ],
        store,
    );
    let answer = post(server.addr(), "alice", STREAM);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(cut(&answer), "not cut: {} tokens", tokens(&answer));
    assert!(
        answer.body.contains("\"limiter\":\"tokens\""),
        "{}",
        answer.body
    );
    // The admission said what was left after the reservation: the instance cuts at exactly the budget, on
    // either store, without waiting for a debit's answer.
    assert_eq!(tokens(&answer), 100);
    assert!(
        !answer.body.contains("[DONE]"),
        "a cut stream ends at its error event"
    );
    let next = post(server.addr(), "alice", STREAM);
    assert_eq!(next.status, 429, "{}", next.body);
    // Another key has its own budget.
    assert_eq!(post(server.addr(), "bob", STREAM).status, 200);
}

#[test]
fn a_stream_is_cut_at_the_budget_in_process() {
    cut_at_the_budget(&[]);
}

#[test]
fn a_stream_is_cut_at_the_budget_on_redis() {
    let redis = RedisServer::start();
    cut_at_the_budget(&["--redis-url", &redis.url()]);
}

/// With `finish` a stream of 300 on a budget of 100 finishes, and the key owes the overdraft: its next request is
/// refused for at least the time the store's largest debt (one budget) takes to repay, an hour here.
#[test]
fn a_finished_stream_owes_its_overdraft() {
    let redis = RedisServer::start();
    let url = redis.url();
    for store in [&[][..], &["--redis-url", &url][..]] {
        let server = serve(
            &[
                "--budget",
                "100",
                "--tokens",
                "300",
                "--batch",
                "10",
                "--on-exhausted",
                "finish",
            ],
            store,
        );
        let answer = post(server.addr(), "carol", STREAM);
        assert_eq!(answer.status, 200);
        assert_eq!(tokens(&answer), 300, "{store:?}");
        assert!(!cut(&answer));
        assert!(answer.body.contains("[DONE]"));
        // On Redis the settle lands just after the stream's end.
        std::thread::sleep(Duration::from_millis(300));
        let next = post(server.addr(), "carol", STREAM);
        assert_eq!(next.status, 429, "{store:?}: {}", next.body);
        let retry: u64 = next
            .header("retry-after")
            .expect("a Retry-After")
            .parse()
            .unwrap();
        assert!(retry >= 3600, "{store:?}: Retry-After {retry}");
    }
}

/// A request reserves its `max_tokens` (80 of 100) up front; the stream ends after 10, and the 70 reserved and
/// not spent are given back: a second request of 80 is admitted, with 10 left after its own reservation (without
/// the refund it would be refused: 20 left).
#[test]
fn what_was_reserved_and_not_spent_is_refunded() {
    let redis = RedisServer::start();
    let url = redis.url();
    for store in [&[][..], &["--redis-url", &url][..]] {
        let server = serve(&["--budget", "100", "--tokens", "10"], store);
        let body = r#"{"model":"m","stream":true,"max_tokens":80,"messages":[]}"#;
        let first = post(server.addr(), "dave", body);
        assert_eq!(first.status, 200);
        assert_eq!(tokens(&first), 10);
        assert!(
            first
                .header("ratelimit")
                .is_some_and(|f| f.contains("r=20")),
            "{:?}",
            first.headers
        );
        std::thread::sleep(Duration::from_millis(300));
        let second = post(server.addr(), "dave", body);
        assert_eq!(second.status, 200, "{store:?}: {}", second.body);
        let field = second.header("ratelimit").unwrap_or_default();
        assert!(field.contains("r=10"), "{store:?}: {field}");
    }
}

/// Bad bodies: each a problem, never a reservation: after them the key still has its whole budget.
#[test]
fn bad_bodies_are_problems_and_reserve_nothing() {
    let server = serve(
        &["--budget", "100", "--tokens", "5", "--reserve", "16"],
        &[],
    );
    let addr = server.addr();
    for (body, status, says) in [
        ("not json".to_owned(), 400, "not JSON"),
        (r#"{"max_tokens": -1}"#.to_owned(), 400, "whole number"),
        (
            r#"{"max_tokens": 99999999999999}"#.to_owned(),
            400,
            "whole number",
        ),
        (
            format!(r#"{{"pad": "{}"}}"#, "x".repeat(70 * 1024)),
            413,
            "over 65536 bytes",
        ),
    ] {
        let answer = post(addr, "erin", &body);
        assert_eq!(answer.status, status, "{}", answer.body);
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        assert!(answer.body.contains(says), "{}", answer.body);
    }
    // No max_tokens: the default reservation, 16.
    let answer = post(addr, "erin", STREAM);
    assert_eq!(answer.status, 200);
    let field = answer.header("ratelimit").unwrap_or_default();
    assert!(field.contains("r=84"), "{field}");
}

/// The simulation (4 instances on a private Redis, 64 streaming clients) meets its goals and prints its JSON
/// rows.
#[test]
fn the_simulation_meets_its_goals() {
    let redis = RedisServer::start();
    let output = Command::new(example("llm_gateway"))
        .env_remove("REDIS_URL")
        // At full speed: a key's streams on an instance then fill a batch well within the interval, on a loaded
        // machine too (slower streams are debited by the interval: more calls per token).
        .args(["--redis-url", &redis.url(), "--pace", "0ms"])
        .args(["--json", "--check"])
        .output()
        .expect("run llm_gateway");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for (row, mode) in rows.iter().zip(["cut", "finish"]) {
        assert_eq!(row["mode"], mode);
        for key in [
            "budget",
            "served",
            "over",
            "streams_cut",
            "redis_calls_per_1000_tokens",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        assert_eq!(row["budget"], 20000);
    }
    assert!(rows[0]["streams_cut"].as_u64().unwrap() > 0, "{stdout}");
    assert_eq!(rows[1]["streams_cut"], 0);
}

/// Two budgets on one request, decided as one and each debited as the stream goes: 1 000 output tokens an hour
/// per key, and 150 total tokens (input and output) a day per organisation. A stream of 300 is cut when the
/// organisation's total reaches 150 (its input estimate is the body's size over 4); another key of the same
/// organisation is then refused, a key of another one served.
#[test]
fn an_organisation_budget_beside_the_key_budget() {
    let redis = RedisServer::start();
    let url = redis.url();
    for store in [&[][..], &["--redis-url", &url][..]] {
        let mut args = vec!["--budget", "1000", "--org-budget", "150", "--tokens", "300"];
        args.extend(["--batch", "10", "--on-exhausted", "cut"]);
        let server = serve(&args, store);
        let input = STREAM.len().div_ceil(4);
        let first = post_in(server.addr(), "frank", "acme", STREAM);
        assert_eq!(first.status, 200);
        assert!(cut(&first), "{store:?}");
        assert!(first.body.contains("\"limiter\":\"org\""), "{}", first.body);
        assert_eq!(tokens(&first), 150 - input, "{store:?}");
        assert_eq!(post_in(server.addr(), "grace", "acme", STREAM).status, 429);
        let other = post_in(server.addr(), "heidi", "globex", STREAM);
        assert_eq!(other.status, 200);
        assert!(
            cut(&other),
            "the other organisation's own budget cuts it too"
        );
    }
}

/// A client that goes away mid-stream: the stream is settled at what it streamed, not at nothing (the
/// reservation) and not at what it would have streamed (300).
#[test]
fn a_client_that_goes_away_is_charged_what_streamed() {
    use std::io::{Read, Write};
    let server = serve(
        &["--budget", "1000", "--tokens", "300", "--pace", "5ms"],
        &[],
    );
    let mut stream = std::net::TcpStream::connect(server.addr()).expect("connect");
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: example\r\nx-api-key: ivan\r\nx-org: acme\r\n\
         content-length: {}\r\n\r\n{STREAM}",
        STREAM.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    let (mut seen, mut buf) = (String::new(), [0u8; 4096]);
    while seen.matches("\"content\"").count() < 50 {
        let n = stream.read(&mut buf).expect("read");
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    drop(stream);
    std::thread::sleep(Duration::from_millis(300));
    let next = post(server.addr(), "ivan", STREAM);
    assert_eq!(next.status, 200);
    // 1 000 less what streamed (at least the 50 read) and this request's own 16.
    let left = next.remaining().expect("a RateLimit field");
    assert!((700..=934).contains(&left), "{left} left");
}
