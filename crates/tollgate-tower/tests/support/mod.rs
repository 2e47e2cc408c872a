//! Real servers and clients for the stack's tests: axum on a free loopback port, handlers the test holds in
//! flight and lets go, and an HTTP/1 client with one connection per request (so dropping it disconnects).
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tollgate_redis::RedisStore;

/// Requests to `/hold` wait inside the handler until the test lets them go; `entered` counts arrivals.
#[derive(Clone)]
pub struct Gate {
    pub entered: Arc<AtomicUsize>,
    pub go: Arc<Semaphore>,
}

impl Gate {
    pub fn new() -> Self {
        Self {
            entered: Arc::new(AtomicUsize::new(0)),
            go: Arc::new(Semaphore::new(0)),
        }
    }

    /// Waits until `n` requests have entered the handler in total (fails after 10 s).
    pub async fn wait_entered(&self, n: usize) {
        for _ in 0..2000 {
            if self.entered.load(Ordering::SeqCst) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "only {} of {n} requests entered the handler",
            self.entered.load(Ordering::SeqCst)
        );
    }

    /// Lets `n` held requests finish.
    pub fn release(&self, n: usize) {
        self.go.add_permits(n);
    }
}

pub async fn hold(State(gate): State<Gate>) -> &'static str {
    gate.entered.fetch_add(1, Ordering::SeqCst);
    gate.go.acquire().await.expect("gate open").forget();
    "released"
}

async fn boom() -> &'static str {
    panic!("handler panics on purpose");
}

/// `/hold` (held until released), `/fast` (GET and POST), `/panic` (the handler panics) and `/stream` (a body
/// that never ends: one chunk every 10 ms); `limit` adds the layers under test.
pub fn app(gate: &Gate, limit: impl FnOnce(Router<Gate>) -> Router<Gate>) -> Router {
    let routes = Router::new()
        .route("/hold", routing::get(hold))
        .route(
            "/fast",
            routing::get(|| async { "fast" }).post(|| async { "posted" }),
        )
        .route("/panic", routing::get(boom))
        .route("/stream", routing::get(stream));
    limit(routes).with_state(gate.clone())
}

async fn stream() -> axum::body::Body {
    let chunks = futures_util::stream::unfold(0_u64, |n| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Some((
            Ok::<_, std::io::Error>(Bytes::from(format!("chunk {n}\n"))),
            n + 1,
        ))
    });
    axum::body::Body::from_stream(chunks)
}

/// Serves `app` on a free port, with peer addresses for key extraction.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("server runs");
    });
    addr
}

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:#?}"))
            .to_str()
            .unwrap()
    }
}

/// Opens a connection and sends `method path` with `headers`; returns the response with its body unread.
pub async fn open(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> http::Response<hyper::body::Incoming> {
    try_open(addr, method, path, headers)
        .await
        .expect("response")
}

/// [`open`], returning the client's error when the connection fails (e.g. the handler panicked).
pub async fn try_open(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<http::Response<hyper::body::Incoming>, hyper::Error> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    sender
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
}

/// Sends a request and reads the whole response.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let response = open(addr, method, path, headers).await;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(addr, "GET", path, headers).await
}

/// Retries `GET path` until it answers `status` (fails after ~5 s): for what happens after a task runs or a
/// lease expires, without asserting how long it takes.
pub async fn eventually(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    status: u16,
) -> Reply {
    let mut last = None;
    for _ in 0..500 {
        let reply = get(addr, path, headers).await;
        if reply.status == status {
            return reply;
        }
        last = Some(reply);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{path} never answered {status}; last reply: {last:#?}");
}

/// A Redis store on the shared server under `namespace` (one "instance": its own pool).
pub async fn redis_instance(namespace: &str) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::builder(tollgate_testkit::redis::redis_url())
            .namespace(namespace)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("Redis store builds"),
    )
}
