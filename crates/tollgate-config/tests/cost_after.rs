//! `cost-after` in a policy file, over real TCP on both stores: the difference between the real cost a response
//! states (a header, or the `FinalCost` extension) and the cost charged up front is charged or refunded once the
//! response is ready, by a limiter alone or beside others in the file's set.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

mod common;

use axum::Router;
use axum::extract::Request;
use axum::routing::get;
use tollgate_config::Source;
use tollgate_core::{MemoryStore, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::FinalCost;

/// Serves `/gen` behind `policy` on `store`: it answers with the real cost the request header `x-want` asks for,
/// in the header `x-cost` and in the `FinalCost` extension.
fn serve<St: Store>(policy: &str, store: Arc<St>) -> SocketAddr {
    let (limits, _reloader) =
        tollgate_config::axum(Source::text(policy, "policy.toml"), store).expect("a valid policy");
    let app = Router::new()
        .route(
            "/gen",
            get(|req: Request| async move {
                let want: u64 = req.headers()["x-want"].to_str().unwrap().parse().unwrap();
                (
                    [("x-cost", want.to_string())],
                    axum::Extension(FinalCost(want)),
                    "generated",
                )
            }),
        )
        .layer(limits);
    common::serve_router(app)
}

/// A response's status and its headers (names lower-cased).
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn num(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.headers))
            .parse()
            .unwrap()
    }
}

/// `GET /gen` with API key `key`, asking for a real cost of `want`.
fn get_gen(addr: SocketAddr, key: &str, want: u64) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a timeout");
    write!(
        stream,
        "GET /gen HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-api-key: {key}\r\nx-want: {want}\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let head = response.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {response:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply { status, headers }
}

/// Sends requests of real cost `want` to `key` until `done` says so, bounded: a shared store's charge runs as a
/// task after the response, so a request may arrive before it lands. Returns the reply, and how many were admitted
/// before it.
fn until(
    addr: SocketAddr,
    key: &str,
    want: u64,
    what: &str,
    mut done: impl FnMut(&Reply) -> bool,
) -> (Reply, u64) {
    for before in 0..300 {
        let reply = get_gen(addr, key, want);
        if done(&reply) {
            return (reply, before);
        }
        assert_eq!(reply.status, 200, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("never {what}");
}

/// After a request of real cost 15 on a full bucket of 10 an hour (1 up front, 14 after) and `admitted` more of
/// cost 1 before the charge landed, the key owes 5 + `admitted` tokens and needs one more: the denial's
/// `Retry-After` is 6 + `admitted` tokens of 6 minutes (less what passed since, under a minute). Without the
/// charge it would be one token's 6 minutes.
fn assert_in_debt(denied: &Reply, admitted: u64) {
    assert_eq!(denied.status, 429);
    assert_eq!(denied.num("x-ratelimit-remaining"), 0);
    let expected = (6 + admitted) * 360;
    let retry = denied.num("retry-after");
    assert!(
        retry <= expected && retry + 60 >= expected,
        "Retry-After {retry}, expected {expected} ({admitted} admitted before the charge landed)"
    );
}

fn limiter(name: &str, source: &str) -> String {
    format!(
        "[[limiter]]\nname = \"{name}\"\nkey = \"header:x-api-key\"\nlimit = 10\nperiod = \"1h\"\ncost-after = \"{source}\"\n"
    )
}

/// 10 an hour: a request that turns out to cost 15 overdraws its key's bucket, which then waits for the debt; a
/// request that costs 0 is refunded.
fn charged_and_refunded(addr: SocketAddr, limiter: &str) {
    let big = get_gen(addr, "ann", 15);
    assert_eq!(big.status, 200);
    // The admission's numbers with the charge taken: nothing left, and the bucket full once 15 tokens of 6 minutes
    // accrue.
    assert_eq!(big.num("x-ratelimit-remaining"), 0);
    assert_eq!(
        big.header("ratelimit"),
        Some(format!("\"{limiter}\";r=0;t=5400").as_str())
    );
    let (denied, admitted) = until(addr, "ann", 1, "denied after the charge", |r| {
        r.status == 429
    });
    assert_in_debt(&denied, admitted);
    assert_eq!(denied.header("x-ratelimit-resource"), Some(limiter));
    // Another key, refunded: once the first request's refund landed, the next one finds the bucket full again
    // (without refunds, 9, 8, … and a 429 after ten).
    assert_eq!(get_gen(addr, "bob", 0).num("x-ratelimit-remaining"), 9);
    until(addr, "bob", 0, "refunded", |r| {
        r.num("x-ratelimit-remaining") == 9
    });
}

fn from_a_header<St: Store>(store: Arc<St>) {
    let addr = serve(&limiter("tokens", "header:x-cost"), store);
    charged_and_refunded(addr, "tokens");
}

fn from_the_extension<St: Store>(store: Arc<St>) {
    let addr = serve(&limiter("tokens", "extension"), store);
    charged_and_refunded(addr, "tokens");
}

/// Beside a limiter that charges up front only: both are listed in the headers, only one is charged after.
fn beside_another<St: Store>(store: Arc<St>) {
    let policy = format!(
        "[[limiter]]\nname = \"everyone\"\nkey = \"global\"\nlimit = 1000\nperiod = \"1h\"\n\n{}",
        limiter("tokens", "header:x-cost")
    );
    let addr = serve(&policy, store);
    let first = get_gen(addr, "ann", 15);
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"everyone\";q=1000;w=3600, \"tokens\";q=10;w=3600")
    );
    // The charge shows in its own limiter's member only.
    assert_eq!(
        first.header("ratelimit"),
        Some("\"everyone\";r=999;t=3597, \"tokens\";r=0;t=5400")
    );
    let (denied, admitted) = until(addr, "ann", 1, "denied after the charge", |r| {
        r.status == 429
    });
    assert_in_debt(&denied, admitted);
    assert_eq!(denied.header("x-ratelimit-resource"), Some("tokens"));
    // `everyone` charged 1 a request, never after: the set decides as one, so the denied request spent nothing of
    // it (what it admitted was given back), and the charge after is not its own.
    let everyone: u64 = denied
        .header("ratelimit")
        .and_then(|v| v.split("\"everyone\";r=").nth(1))
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("everyone's remaining in {:?}", denied.header("ratelimit")));
    assert_eq!(
        everyone,
        1000 - 1 - admitted,
        "1 a request served, nothing after, nothing for the refusal"
    );
}

fn private_redis() -> (RedisServer, Arc<RedisStore>) {
    let redis = RedisServer::start();
    let store = common::redis_store(&redis);
    (redis, Arc::new(store))
}

#[test]
fn cost_after_a_header_in_process() {
    from_a_header(Arc::new(MemoryStore::new()));
}

#[test]
fn cost_after_a_header_on_redis() {
    let (_redis, store) = private_redis();
    from_a_header(store);
}

#[test]
fn cost_after_the_extension_in_process() {
    from_the_extension(Arc::new(MemoryStore::new()));
}

#[test]
fn cost_after_the_extension_on_redis() {
    let (_redis, store) = private_redis();
    from_the_extension(store);
}

#[test]
fn cost_after_beside_another_limiter_in_process() {
    beside_another(Arc::new(MemoryStore::new()));
}

#[test]
fn cost_after_beside_another_limiter_on_redis() {
    let (_redis, store) = private_redis();
    beside_another(store);
}
