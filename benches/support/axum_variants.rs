//! The axum routers the axum benches compare, shared by `axum_overhead` (time) and `axum_allocs` (allocations).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::routing::get;
use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_http::key::PeerIp;
use tollgate_http::{HeaderSet, HttpLimitLayer};
use tollgate_tower::RateLimitLayer;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// One server under test, and the row it is judged against (besides bare axum).
pub(crate) struct Variant {
    pub(crate) name: &'static str,
    pub(crate) peer: usize,
    /// Builds the router: only the row being measured is built, so that no other row's state (stores, tables)
    /// shapes the heap the measured requests allocate in.
    pub(crate) router: Box<dyn Fn() -> Router>,
}

fn v(name: &'static str, peer: usize, router: impl Fn() -> Router + 'static) -> Variant {
    Variant {
        name,
        peer,
        router: Box::new(router),
    }
}

/// The variants; `ONLY=<index>` in the environment measures just that one (for profiling).
pub(crate) fn variants() -> Vec<Variant> {
    vec![
        v("bare axum", 0, hello),
        v("bare + 7 constant fields", 0, bare_with_headers),
        v("tower-governor", 2, governor),
        v("tower-governor (2 fields)", 3, governor_with_headers),
        v("tollgate (no fields)", 2, || tollgate(HeaderSet::NONE)),
        v("tollgate (IETF, 2 fields)", 3, || tollgate(HeaderSet::IETF)),
        v("tollgate (all 7 fields)", 1, || tollgate(HeaderSet::ALL)),
        v("bare + pass-through layer", 0, pass_through),
        // A policy file's stack against the same stack in code, all 7 fields: a client-ip limiter
        // adapted in place (`HttpLimitLayer`; the file's set answers in place too), then the same with an
        // exempt network the client is not in (the override lookup runs). For scale, the same limiter inside a
        // `ServiceBuilder`, which the adapter wraps in its own service (the path of layers that do not answer in
        // place).
        v("code: in a ServiceBuilder", 6, || in_code(false, false)),
        v("code: in place", 6, || in_code(true, false)),
        v("policy file", 9, || from_file(false)),
        v("code: in place + exempt", 9, || in_code(true, true)),
        v("policy file + exempt net", 11, || from_file(true)),
    ]
}

/// The policy file's limiter built in code: a client-ip token bucket, adapted in place or, inside a
/// `ServiceBuilder`, by the adapter's own service.
fn in_code(in_place: bool, exempt: bool) -> Router {
    use tollgate_tower::limit::rate::Overrides;
    let policy = Policy::token_bucket(Quota::per_second(1_000_000_000).expect("a valid quota"));
    let mut layer = RateLimitLayer::new(
        "bench",
        policy,
        Arc::new(MemoryStore::new()),
        tollgate_http::key::ClientIp::new(),
    );
    if exempt {
        let network = Overrides::new().exempt_network([10, 0, 0, 0].into(), 8);
        layer = layer.overrides(network.expect("a valid network"));
    }
    if in_place {
        return hello().layer(HttpLimitLayer::new(layer));
    }
    hello().layer(HttpLimitLayer::new(
        tower::ServiceBuilder::new().layer(layer),
    ))
}

/// The same limiter from a policy file.
fn from_file(exempt: bool) -> Router {
    let mut policy = String::from(
        "[[limiter]]\nname = \"bench\"\nkey = \"client-ip\"\nlimit = 1000000000\nperiod = \"1s\"\n",
    );
    if exempt {
        policy.push_str("exempt = [\"10.0.0.0/8\"]\n");
    }
    let source = tollgate_config::Source::text(&policy, "bench.toml");
    let (layer, _reloader) =
        tollgate_config::axum(source, Arc::new(MemoryStore::new())).expect("a valid policy");
    hello().layer(layer)
}

/// Bare axum behind a layer that adds nothing (`tower`'s `Identity`): what axum's layering costs any middleware —
/// the per-request clone of the layered route, the response-mapping futures — before it does any work.
fn pass_through() -> Router {
    hello().layer(tower::layer::util::Identity::new())
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

fn tollgate(headers: HeaderSet) -> Router {
    let policy = Policy::token_bucket(Quota::per_second(1_000_000_000).expect("a valid quota"));
    let layer = RateLimitLayer::new("bench", policy, Arc::new(MemoryStore::new()), PeerIp);
    hello().layer(HttpLimitLayer::new(layer).headers(headers))
}

/// Bare axum plus seven constant fields as long as tollgate's: the floor that sending the header bytes costs.
fn bare_with_headers() -> Router {
    use axum::http::{HeaderName, HeaderValue};
    use axum::response::IntoResponse;
    // Built at compile time, as tollgate's names are.
    const fn field(name: &'static str, value: &'static str) -> (HeaderName, HeaderValue) {
        (
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        )
    }
    const FIELDS: [(HeaderName, HeaderValue); 7] = [
        field("ratelimit-policy", "\"bench\";q=1000000000;w=1"),
        field("ratelimit", "\"bench\";r=999999999;t=1"),
        field("x-ratelimit-limit", "1000000000"),
        field("x-ratelimit-remaining", "999999999"),
        field("x-ratelimit-reset", "1796000000"),
        field("x-ratelimit-used", "1"),
        field("x-ratelimit-resource", "bench"),
    ];
    Router::new().route(
        "/",
        get(|| async {
            let mut response = "Hello, World!".into_response();
            for (name, value) in FIELDS {
                response.headers_mut().insert(name, value);
            }
            response
        }),
    )
}

fn governor() -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .finish()
        .expect("a valid governor config");
    hello().layer(GovernorLayer::new(config))
}

/// tower-governor with its `x-ratelimit-limit` and `x-ratelimit-remaining` headers.
fn governor_with_headers() -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .use_headers()
        .finish()
        .expect("a valid governor config");
    hello().layer(GovernorLayer::new(config))
}

/// One `GET /` from 127.0.0.1:40000 through `app`, in-process; panics unless it is admitted.
#[allow(dead_code)] // `axum_instructions` goes over TCP only
pub(crate) async fn call(app: &mut Router) {
    use tower::{Service, ServiceExt};
    let mut req = Request::new(Body::empty());
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40_000))));
    let ready = ServiceExt::<Request>::ready(app)
        .await
        .expect("the router is always ready");
    let response = ready.call(req).await.expect("axum routers are infallible");
    assert!(response.status().is_success(), "every request is admitted");
}
