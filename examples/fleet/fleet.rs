//! The fleet: instances of one service, each wrapped in tollgate, behind a round-robin load balancer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use http::StatusCode;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tollgate::http::HttpLimitLayer;
use tollgate::tower::{LeaseConfig, RateLimitLayer};
use tollgate::{Policy, Store};

/// One instance: `GET /` answers "ok" behind the instance's own limiter, like every instance of a real service;
/// a shared store's denials are cached if `deny_cache` (the default a layer has on Redis).
pub(crate) async fn start_instance<St: Store>(
    store: Arc<St>,
    policy: Option<Policy>,
    deny_cache: bool,
    leases: bool,
) -> (SocketAddr, JoinHandle<()>) {
    let app = Router::new().route("/", get(|| async { "ok" }));
    let app = match policy {
        // Every instance limits the same service-wide key: "this service takes L per second".
        Some(policy) => {
            let layer = RateLimitLayer::new("fleet", policy, store, "api").deny_cache(deny_cache);
            // With leases the key is hot on every instance: admitted from batches leased from Redis.
            let layer = if leases {
                layer.leases(LeaseConfig::new())
            } else {
                layer
            };
            app.layer(HttpLimitLayer::new(layer))
        }
        None => app,
    };
    serve(app).await
}

async fn serve(app: Router) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    (addr, task)
}

/// A round-robin HTTP load balancer over a set of instances that may grow while it runs.
#[derive(Clone)]
pub(crate) struct Balancer {
    backends: Arc<RwLock<Vec<SocketAddr>>>,
    next: Arc<AtomicUsize>,
    client: Client<HttpConnector, Body>,
}

impl Balancer {
    pub(crate) fn new() -> Self {
        Self {
            backends: Arc::default(),
            next: Arc::default(),
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(256)
                .build_http(),
        }
    }

    pub(crate) fn add(&self, backend: SocketAddr) {
        self.backends.write().expect("backends lock").push(backend);
    }

    pub(crate) async fn start(&self) -> (SocketAddr, JoinHandle<()>) {
        serve(Router::new().fallback(forward).with_state(self.clone())).await
    }
}

async fn forward(State(lb): State<Balancer>, req: Request) -> Result<Response, Infallible> {
    let backend = {
        let backends = lb.backends.read().expect("backends lock");
        backends[lb.next.fetch_add(1, Ordering::Relaxed) % backends.len()]
    };
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("http://{backend}{path}")
        .parse()
        .expect("backend URI");
    Ok(
        match lb.client.request(Request::from_parts(parts, body)).await {
            Ok(resp) => resp.map(Body::new),
            Err(_) => Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(Body::empty())
                .expect("response"),
        },
    )
}
