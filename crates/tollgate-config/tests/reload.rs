//! Reloading a policy under load, over real TCP, on both stores: no request fails while the set is swapped, a key
//! whose policy is unchanged keeps its state, an invalid policy keeps the old set. And client-address keys matched
//! against networks.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tollgate_config::{Reloader, Source};
use tollgate_core::{MemoryStore, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;

/// Serves `/` behind `policy` on `store` on a loopback port, on a runtime of its own (dropped with the process).
fn serve<St: Store>(policy: &str, store: Arc<St>) -> (SocketAddr, Reloader<St>) {
    let (limits, reloader) =
        tollgate_config::axum(Source::text(policy, "policy.toml"), store).expect("a valid policy");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(limits);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .expect("serve");
        });
    });
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
    let store = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(RedisStore::builder(redis.url()).build())
        .expect("the private Redis");
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
    let store = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(RedisStore::builder(redis.url()).build())
        .expect("the private Redis");
    client_ip_networks(Arc::new(store));
}

/// The status and `Retry-After` of `GET /` with API key `key`.
fn retry_after(addr: SocketAddr, key: &str) -> (u16, Option<u64>) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-api-key: {key}\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let retry = response
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok());
    (status, retry)
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
    let store = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(RedisStore::builder(redis.url()).build())
        .expect("the private Redis");
    lockout(Arc::new(store));
}
