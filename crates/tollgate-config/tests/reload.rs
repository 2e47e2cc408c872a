//! Reloading a policy under load, over real TCP, on both stores: no request fails while the set is swapped, a key
//! whose policy is unchanged keeps its state, an invalid policy keeps the old set. And client-address keys matched
//! against networks.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

mod common;

use axum::Router;
use axum::routing::get;
use tollgate_config::{Reloader, Source};
use tollgate_core::{MemoryStore, Store};
use tollgate_testkit::http::{Reply, get as testkit_get};
use tollgate_testkit::redis::RedisServer;

/// Serves `/` behind `policy` on `store` on a loopback port, on a runtime of its own (dropped with the process).
fn serve<St: Store>(policy: &str, store: Arc<St>) -> (SocketAddr, Reloader<St>) {
    let (limits, reloader) =
        tollgate_config::axum(Source::text(policy, "policy.toml"), store).expect("a valid policy");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        // States its real cost as 0: a limiter charging after the response refunds the request.
        .route("/refund", get(|| async { ([("x-cost", "0")], "free") }))
        .layer(limits);
    let addr = common::serve_router(app);
    (addr, reloader)
}

/// The status of `GET /` with API key `key`, or why there was none.
fn status(addr: SocketAddr, key: &str) -> Result<u16, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-api-key: {key}\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {response:?}"))
}

/// The issue's limiter with hour-long periods (nothing refills during the test), `gold` at `gold`, and `extra`.
fn policy(gold: u64, extra: &str) -> String {
    format!(
        r#"
[[limiter]]
name = "per-key"
key = "header:x-api-key"
limit = 3
period = "1h"
exempt = ["internal"]

[[limiter.override]]
key = "gold"
limit = {gold}
{extra}"#
    )
}

const EVERYONE: &str = r#"
[[limiter]]
name = "everyone"
key = "global"
limit = 1000000
period = "1h"
"#;

fn reload_under_load<St: Store>(store: Arc<St>) {
    let (addr, reloader) = serve(&policy(6, ""), store);
    assert_eq!(
        (0..4)
            .map(|_| status(addr, "spent"))
            .collect::<Result<Vec<_>, _>>(),
        Ok(vec![200, 200, 200, 429])
    );

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..3)
        .map(|client| {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let key = match i % 3 {
                        0 => format!("client-{client}-{}", i % 7),
                        1 => "gold".to_owned(),
                        _ => "internal".to_owned(),
                    };
                    statuses.push((key.clone(), status(addr, &key)));
                    sent.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                statuses
            })
        })
        .collect();

    // Reload while requests are in flight: each reload waits for a few more requests to have been answered.
    let mut seen = 0;
    for round in 0..24 {
        while sent.load(Ordering::Relaxed) < seen + 6 {
            std::thread::yield_now();
        }
        seen = sent.load(Ordering::Relaxed);
        match round % 3 {
            0 => {
                let report = reloader
                    .reload_from(Source::text(&policy(8, EVERYONE), "policy.toml"))
                    .expect("a valid policy");
                assert_eq!(report.changed, ["per-key"]);
                assert_eq!(report.added, ["everyone"]);
            }
            1 => {
                let err = reloader
                    .reload_from(Source::text(
                        &policy(8, EVERYONE).replace("1000000", "-1"),
                        "policy.toml",
                    ))
                    .expect_err("an invalid policy");
                assert_eq!(
                    err.to_string(),
                    "policy.toml:16:9: invalid value: integer `-1`, expected u64"
                );
            }
            _ => {
                let report = reloader
                    .reload_from(Source::text(&policy(6, ""), "policy.toml"))
                    .expect("a valid policy");
                assert_eq!(report.removed, ["everyone"]);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let statuses: Vec<_> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("a client"))
        .collect();
    assert!(statuses.len() >= 24 * 6, "{} requests", statuses.len());
    for (key, status) in &statuses {
        match (key.as_str(), status) {
            ("internal", Ok(200)) => {}
            ("internal", other) => panic!("an exempt key got {other:?}"),
            (_, Ok(200 | 429)) => {}
            (key, other) => panic!("{key}: a request failed during the reloads: {other:?}"),
        }
    }
    // The limiter's own policy never changed: the key spent before the reloads is still spent.
    assert_eq!(status(addr, "spent"), Ok(429));
    // And a fresh key still gets exactly the limiter's 3.
    assert_eq!(
        (0..4)
            .map(|_| status(addr, "fresh"))
            .collect::<Result<Vec<_>, _>>(),
        Ok(vec![200, 200, 200, 429])
    );
}

#[test]
fn reload_under_load_in_process() {
    reload_under_load(Arc::new(MemoryStore::new()));
}

#[test]
fn reload_under_load_on_redis() {
    let redis = RedisServer::start();
    let store = common::redis_store(&redis);
    reload_under_load(Arc::new(store));
}

fn client_ip_networks<St: Store>(store: Arc<St>) {
    let policy = r#"
[[limiter]]
name = "per-client"
key = "client-ip"
limit = 1
period = "1h"

[[limiter.override]]
key = "127.0.0.0/8"
limit = 3

[[limiter]]
name = "loopback-exempt"
key = "client-ip"
limit = 1
period = "1h"
exempt = ["127.0.0.1"]
"#;
    let (addr, _reloader) = serve(policy, store);
    // 127.0.0.1 is in 127.0.0.0/8 (3 an hour, not 1) and exempt from the second limiter.
    assert_eq!(
        (0..4)
            .map(|_| status(addr, "any"))
            .collect::<Result<Vec<_>, _>>(),
        Ok(vec![200, 200, 200, 429])
    );
}

#[test]
fn client_ip_networks_in_process() {
    client_ip_networks(Arc::new(MemoryStore::new()));
}

#[test]
fn client_ip_networks_on_redis() {
    let redis = RedisServer::start();
    let store = common::redis_store(&redis);
    client_ip_networks(Arc::new(store));
}

/// The status and `Retry-After` of `GET /` with API key `key`.
fn retry_after(addr: SocketAddr, key: &str) -> (u16, Option<u64>) {
    let reply = ask(addr, "/", key, &[]);
    let retry = reply.header("retry-after").and_then(|v| v.parse().ok());
    (reply.status, retry)
}

fn lockout<St: Store>(store: Arc<St>) {
    // Tokens come back every 100 ms, but a denial locks the key out for an hour.
    let policy = "[[limiter]]\nname = \"login\"\nkey = \"header:x-api-key\"\nlimit = 1\nperiod = \"100ms\"\nlockout = \"1h\"\n";
    let (addr, _reloader) = serve(policy, store);
    let denied = (0..50).find(|_| retry_after(addr, "mallory").0 == 429);
    assert!(
        denied.is_some(),
        "a key sending 50 requests at once is denied once"
    );
    // Well past the period: without the lockout a token would be back.
    std::thread::sleep(Duration::from_millis(300));
    let (status, retry) = retry_after(addr, "mallory");
    assert_eq!(status, 429, "locked out");
    assert!(
        retry.is_some_and(|r| (3500..=3600).contains(&r)),
        "Retry-After tells the lockout's end: {retry:?}"
    );
    assert_eq!(
        retry_after(addr, "alice").0,
        200,
        "another key is not locked out"
    );
}

#[test]
fn lockout_from_the_file_in_process() {
    lockout(Arc::new(MemoryStore::new()));
}

#[test]
fn lockout_from_the_file_on_redis() {
    let redis = RedisServer::start();
    let store = common::redis_store(&redis);
    lockout(Arc::new(store));
}

/// `GET path` with API key `key` (and `extra` header fields).
fn ask(addr: SocketAddr, path: &str, key: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![("x-api-key", key)];
    headers.extend_from_slice(extra);
    testkit_get(addr, path, &headers)
}

/// The statuses of `n` requests for `/` with API key `key`.
fn statuses(addr: SocketAddr, key: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| ask(addr, "/", key, &[]).status).collect()
}

/// One limiter `l` of 1 an hour keyed by `x-api-key`, with `fields` added to its table (and `top` above it).
fn one(top: &str, fields: &str) -> String {
    format!(
        "{top}\n[[limiter]]\nname = \"l\"\nkey = \"header:x-api-key\"\nlimit = 1\nperiod = \"1h\"\n{fields}\n"
    )
}

/// Reloads `text`, which changes limiter `l` only.
fn reload_changes_l<St: Store>(reloader: &Reloader<St>, text: &str) {
    let report = reloader
        .reload_from(Source::text(text, "policy.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.changed, ["l"], "{report}");
}

/// Every field of a limiter takes effect on reload, over TCP: the key, routes, mode, exempt, overrides, cost,
/// cost-after and lockout (the limit and period with them); a key whose policy is unchanged keeps its state
/// through the key, routes, mode and exempt changes.
///
/// `scripts` counts the scripts the store's server has run (`u64::MAX` for the in-process store, whose charges land
/// before the response does): a refund on Redis is a task of its own, which the next request must not outrun.
fn every_field_takes_effect<St: Store>(store: Arc<St>, scripts: impl Fn() -> u64) {
    let (addr, reloader) = serve(&one("", ""), store);
    assert_eq!(statuses(addr, "spent", 2), [200, 429]);

    // key: one bucket for everyone now.
    reload_changes_l(
        &reloader,
        &one("", "").replace("header:x-api-key", "global"),
    );
    assert_eq!(statuses(addr, "k1", 1), [200]);
    assert_eq!(statuses(addr, "k2", 1), [429], "the global key is shared");
    reload_changes_l(&reloader, &one("", ""));
    assert_eq!(
        statuses(addr, "spent", 1),
        [429],
        "back: the key kept its state"
    );

    // routes: the limiter leaves `/` alone, then decides it again.
    reload_changes_l(&reloader, &one("", "routes = [\"/other/*\"]"));
    assert_eq!(statuses(addr, "spent", 3), [200; 3]);
    reload_changes_l(&reloader, &one("", "routes = [\"/\"]"));
    assert_eq!(statuses(addr, "spent", 1), [429]);

    // mode: shadow and off admit, enforce refuses again.
    reload_changes_l(&reloader, &one("", "mode = \"shadow\""));
    assert_eq!(statuses(addr, "spent", 2), [200; 2]);
    reload_changes_l(&reloader, &one("", "mode = \"off\""));
    assert_eq!(statuses(addr, "spent", 2), [200; 2]);
    reload_changes_l(&reloader, &one("", "mode = \"enforce\""));
    assert_eq!(statuses(addr, "spent", 1), [429]);

    // exempt: the key is free while exempt.
    reload_changes_l(&reloader, &one("", "exempt = [\"spent\"]"));
    assert_eq!(statuses(addr, "spent", 3), [200; 3]);
    reload_changes_l(&reloader, &one("", ""));
    assert_eq!(statuses(addr, "spent", 1), [429]);

    // overrides: the key's own plan (3 an hour, a new policy: fresh), the others' unchanged.
    reload_changes_l(
        &reloader,
        &one("", "[[limiter.override]]\nkey = \"spent\"\nlimit = 3"),
    );
    assert_eq!(statuses(addr, "spent", 4), [200, 200, 200, 429]);
    assert_eq!(statuses(addr, "other", 2), [200, 429]);

    // cost: 2 a request out of 4 admits two (the limit changes too: a new policy, fresh keys).
    reload_changes_l(
        &reloader,
        &one("", "cost = 2").replace("limit = 1", "limit = 4"),
    );
    assert_eq!(statuses(addr, "costly", 3), [200, 200, 429]);
    reload_changes_l(&reloader, &one("", "").replace("limit = 1", "limit = 4"));
    assert_eq!(statuses(addr, "cheap", 5), [200, 200, 200, 200, 429]);

    // cost-after: `/refund` states a cost of 0, so each request is refunded. (A key's state across turning
    // cost-after on is not asserted: the in-process store keys such a limiter by text, the others by digest.)
    reload_changes_l(&reloader, &one("", "cost-after = \"header:x-cost\""));
    for _ in 0..3 {
        let before = scripts();
        assert_eq!(ask(addr, "/refund", "refunded", &[]).status, 200);
        // The request's check and its refund.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while scripts() < before.saturating_add(2) {
            assert!(std::time::Instant::now() < deadline, "the refund never ran");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    reload_changes_l(&reloader, &one("", ""));
    let charged: Vec<_> = (0..2)
        .map(|_| ask(addr, "/refund", "charged", &[]).status)
        .collect();
    assert_eq!(charged, [200, 429], "without cost-after the cost is final");

    // lockout: a denial now locks the key out for 2 hours, past its token's refill (1 an hour): the denial's
    // Retry-After names the lockout's end, not the token's.
    reload_changes_l(&reloader, &one("", "lockout = \"2h\""));
    assert_eq!(retry_after(addr, "mallory").0, 200);
    let (status, retry) = retry_after(addr, "mallory");
    assert_eq!(status, 429);
    assert!(
        retry.is_some_and(|r| (7000..=7200).contains(&r)),
        "Retry-After tells the lockout's end (a token alone would be back within 3600 s): {retry:?}"
    );
}

#[test]
fn every_field_takes_effect_on_reload_in_process() {
    every_field_takes_effect(Arc::new(MemoryStore::new()), || u64::MAX);
}

#[test]
fn every_field_takes_effect_on_reload_on_redis() {
    let redis = RedisServer::start();
    let store = Arc::new(common::redis_store(&redis));
    every_field_takes_effect(store, || {
        redis.command_calls("evalsha") + redis.command_calls("eval")
    });
}

/// The file's trusted proxies take effect on reload: the client address is read from `X-Forwarded-For` once the
/// peer (loopback) is trusted, and not before.
#[test]
fn trusted_proxies_take_effect_on_reload() {
    let file = |top: &str| one(top, "").replace("header:x-api-key", "client-ip");
    let (addr, reloader) = serve(&file(""), Arc::new(MemoryStore::new()));
    let from = |client: &str| ask(addr, "/", "any", &[("x-forwarded-for", client)]).status;
    assert_eq!(from("192.0.2.1"), 200);
    assert_eq!(
        from("192.0.2.2"),
        429,
        "untrusted: both are the loopback peer"
    );
    reload_changes_l(&reloader, &file("trusted-proxies = [\"127.0.0.0/8\"]"));
    assert_eq!(from("192.0.2.3"), 200);
    assert_eq!(from("192.0.2.3"), 429);
    assert_eq!(from("192.0.2.4"), 200, "each forwarded client its own key");
}

/// The failure policy takes effect on reload: with the store gone, `local` (the default) limits in process,
/// `closed` refuses (503) and `open` admits. (The
/// key the store emptied before it went is refused by the deny cache, which holds the store's next denial: exact
/// whatever the store's state, so the failure policy is seen on keys the cache holds nothing for.)
#[test]
fn on_store_error_takes_effect_on_reload() {
    let mut redis = RedisServer::start();
    let (addr, reloader) = serve(&one("", ""), Arc::new(common::redis_store(&redis)));
    assert_eq!(statuses(addr, "k", 1), [200]);
    redis.kill();
    assert_eq!(statuses(addr, "k", 1), [429], "held by the deny cache");
    assert_eq!(
        statuses(addr, "a", 2),
        [200, 429],
        "local by default: the limit of 1 held in process"
    );
    reload_changes_l(&reloader, &one("", "on-store-error = \"open\""));
    assert_eq!(statuses(addr, "b", 2), [200; 2]);
    reload_changes_l(&reloader, &one("", "on-store-error = \"closed\""));
    assert_eq!(statuses(addr, "c", 1), [503]);
    reload_changes_l(&reloader, &one("", "on-store-error = \"local\""));
    assert_eq!(statuses(addr, "d", 2), [200, 429]);
}
