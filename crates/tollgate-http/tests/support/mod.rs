//! Test support: a real server on a loopback port, a raw HTTP/1.1 client, and the two stores.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::{self, Route};
use std::convert::Infallible;
use std::future::Future;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use tollgate_core::{
    Clock, Decision, ManualClock, MemoryStore, Policy, Store, StoreError, Timestamp,
};

use tollgate_http::HttpLimitLayer;
use tollgate_redis::RedisStore;

/// `GET /` limited by `layer` (through the HTTP adapter), `GET /health` never limited.
pub fn limited_app<L>(layer: L) -> Router
where
    L: tower::Layer<Route> + Clone + Send + Sync + 'static,
    HttpLimitLayer<L>: tower::Layer<Route>,
    <HttpLimitLayer<L> as tower::Layer<Route>>::Service: tower::Service<Request, Response = Response, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <<HttpLimitLayer<L> as tower::Layer<Route>>::Service as tower::Service<Request>>::Future:
        Send + 'static,
{
    Router::new()
        .route("/", routing::get(|| async { "hello" }))
        .layer(HttpLimitLayer::new(layer))
        .route("/health", routing::get(|| async { "ok" }))
}

/// Serves `app` on 127.0.0.1 (a free port) with peer addresses available to key extractors.
pub async fn serve(app: Router) -> SocketAddr {
    serve_with(app, true).await
}

/// Serves `app`, with or without `ConnectInfo`.
pub async fn serve_with(app: Router, connect_info: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        if connect_info {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        } else {
            axum::serve(listener, app).await.unwrap();
        }
    });
    addr
}

/// A parsed HTTP/1.1 response.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Header names (lowercase) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl Reply {
    /// The single value of header `name` (lowercase); panics with the response if absent or repeated.
    pub fn header(&self, name: &str) -> &str {
        let mut values = self.headers.iter().filter(|(n, _)| n == name);
        let value = values
            .next()
            .unwrap_or_else(|| panic!("no {name} header in {self:#?}"));
        assert!(values.next().is_none(), "{name} repeated in {self:#?}");
        &value.1
    }

    /// Whether header `name` is present.
    pub fn has(&self, name: &str) -> bool {
        self.headers.iter().any(|(n, _)| n == name)
    }

    /// A numeric header.
    pub fn num(&self, name: &str) -> u64 {
        self.header(name)
            .parse()
            .unwrap_or_else(|_| panic!("{name} is not a number in {self:#?}"))
    }
}

/// `GET path` with extra headers, on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("connect to the test server");
    let mut request = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .expect("a complete response head");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(':').expect("a header line");
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// `REDIS_URL`, or the local default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A unique namespace per store, so tests share the Redis at `REDIS_URL` in parallel.
fn namespace() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "tollgate-http-test:{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A Redis store on `REDIS_URL`, checked to be reachable (a test fails, never skips, without Redis).
pub async fn redis_store() -> Arc<RedisStore> {
    let url = redis_url();
    // A healthy server: a generous timeout (the production 50 ms is a race on a loaded machine).
    let store = RedisStore::builder(url.clone())
        .namespace(namespace())
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .await
        .unwrap_or_else(|e| panic!("cannot build a Redis store for {url}: {e} (set REDIS_URL)"));
    let probe = Policy::token_bucket(tollgate_core::Quota::per_second(1).unwrap());
    if let Err(e) = store.check("probe", &probe, 0).await {
        panic!("Redis at {url} is not reachable: {e} (start redis-server or set REDIS_URL)");
    }
    Arc::new(store)
}

/// Redis deciding at the instants of a [`ManualClock`] (`RedisStore::check_at`) instead of its own `TIME`. Shared,
/// as Redis is: a layer over it caches its denials (its deny cache) unless told otherwise.
pub struct ClockedRedis {
    redis: Arc<RedisStore>,
    clock: ManualClock,
}

impl Store for ClockedRedis {
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.redis.check_at(key, policy, cost, self.clock.now())
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn peek(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.redis.peek_at(key, policy, cost, self.clock.now())
    }

    fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.redis
            .charge_at(key, policy, delta, decided_at, self.clock.now())
    }

    /// As `RedisStore` does: spawned, the response is not held back.
    fn charge_detached(
        &self,
        key: String,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        _lost: tollgate_core::LostCharge,
    ) {
        let (redis, policy, now) = (self.redis.clone(), *policy, self.clock.now());
        tokio::spawn(async move {
            redis
                .charge_at(&key, &policy, delta, decided_at, now)
                .await
                .expect("Redis charges");
        });
    }
}

/// A clock standing still at the start of the current wall-clock second (reset instants then stay near now), until
/// a test advances it.
pub fn frozen_clock() -> ManualClock {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    ManualClock::new(Timestamp::from_micros(secs * 1_000_000))
}

/// The in-process store on `clock`.
pub fn clocked_memory_store(clock: &ManualClock) -> Arc<MemoryStore<ManualClock>> {
    Arc::new(MemoryStore::builder().clock(clock.clone()).build())
}

/// Redis on `REDIS_URL` deciding at `clock`'s instants.
pub async fn clocked_redis_store(clock: &ManualClock) -> Arc<ClockedRedis> {
    Arc::new(ClockedRedis {
        redis: redis_store().await,
        clock: clock.clone(),
    })
}

/// A fresh in-process store.
pub fn memory_store() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new())
}

/// Runs an async test body once per store, both on one frozen clock (exact times, whatever the machine's load):
/// `both_clocked_stores!(name, body_fn)` calls `body_fn(store, clock)` in `name::memory` and `name::redis`.
#[macro_export]
macro_rules! both_clocked_stores {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test]
            async fn memory() {
                let clock = super::support::frozen_clock();
                super::$body(super::support::clocked_memory_store(&clock), clock).await;
            }

            #[tokio::test]
            async fn redis() {
                let clock = super::support::frozen_clock();
                super::$body(super::support::clocked_redis_store(&clock).await, clock).await;
            }
        }
    };
}

/// Runs an async test body once per store: `both!(name, body_fn)` defines `name::memory` and `name::redis`. Both
/// stores decide on a frozen clock ([`frozen_clock`]), so that every `t=`, reset and retry figure is exact however
/// long the requests take on a loaded machine.
#[macro_export]
macro_rules! both_stores {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test]
            async fn memory() {
                let clock = super::support::frozen_clock();
                super::$body(super::support::clocked_memory_store(&clock)).await;
            }

            #[tokio::test]
            async fn redis() {
                let clock = super::support::frozen_clock();
                super::$body(super::support::clocked_redis_store(&clock).await).await;
            }
        }
    };
}
