//! The paced client in front of a tollgate concurrent-requests limiter over real TCP (axum behind
//! `HttpLimitLayer`, in process and on Redis): more callers than the server's ceiling, and nobody refused.
//!
//! The server's handler holds every request until the test lets it go, so each step is a count the test waits
//! for rather than a duration: the client's probe alone, then the ceiling's worth at once, again and again. A
//! client that sent one request more than the ceiling would be refused (429) at once; one that sent fewer would
//! never reach the count the test waits for.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get as route_get;
use tokio::sync::Semaphore;
use tollgate_core::slot::{MemorySlotStore, SlotStore};
use tollgate_http::HttpLimitLayer;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{redis_url, unique_prefix};
use tollgate_tower::ConcurrencyLimitLayer;

use support::{bare, get, paced};
use tollgate_client::PaceLayer;

/// The server's ceiling: requests in flight at once.
const CEILING: usize = 2;

/// Requests in the handler, held until the test releases them.
#[derive(Clone)]
struct Held {
    entered: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    go: Arc<Semaphore>,
}

impl Held {
    fn new() -> Self {
        Self {
            entered: Arc::default(),
            in_flight: Arc::default(),
            most: Arc::default(),
            go: Arc::new(Semaphore::new(0)),
        }
    }

    /// Waits until `n` requests have entered the handler in total (fails after 10 s).
    async fn entered(&self, n: usize) {
        for _ in 0..2_000 {
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
}

async fn handler(State(held): State<Held>) -> &'static str {
    held.entered.fetch_add(1, Ordering::SeqCst);
    let now = held.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    held.most.fetch_max(now, Ordering::SeqCst);
    held.go.acquire().await.expect("open").forget();
    held.in_flight.fetch_sub(1, Ordering::SeqCst);
    "ok"
}

/// `/` behind a concurrency limit of [`CEILING`] for everyone, counted in `store`.
async fn serve<L: SlotStore>(store: Arc<L>, held: &Held) -> SocketAddr {
    let limit = ConcurrencyLimitLayer::new("in-flight", CEILING as u64, store, "everyone").unwrap();
    let app = Router::new()
        .route("/", route_get(handler))
        .layer(HttpLimitLayer::new(limit))
        .with_state(held.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// `callers` callers send `each` requests apiece through one paced client; the statuses.
fn callers(
    layer: &PaceLayer,
    url: &str,
    callers: usize,
    each: usize,
) -> tokio::task::JoinSet<Vec<u16>> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (mut client, url) = (paced(layer), url.to_owned());
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..each {
                let answer = get(&mut client, &url).await.expect("an answer");
                statuses.push(answer.status.as_u16());
            }
            statuses
        });
    }
    tasks
}

async fn more_callers_than_the_ceiling_are_never_refused<L: SlotStore>(store: Arc<L>) {
    let held = Held::new();
    let addr = serve(store, &held).await;
    let (n_callers, each) = (3 * CEILING, 3);
    let total = n_callers * each;
    let mut tasks = callers(
        &PaceLayer::new(),
        &format!("http://{addr}/"),
        n_callers,
        each,
    );

    // A new scope sends one request and waits for its answer, which states the ceiling; from then on the ceiling's
    // worth is in flight at every step.
    let mut released = 0;
    let mut want = 1;
    while released < total {
        held.entered(released + want).await;
        held.go.add_permits(want);
        released += want;
        want = CEILING.min(total - released);
    }
    let mut statuses = Vec::new();
    while let Some(some) = tasks.join_next().await {
        statuses.extend(some.expect("no panic"));
    }
    assert_eq!(statuses, vec![200; total], "{statuses:?}");
    assert_eq!(held.entered.load(Ordering::SeqCst), total);
    assert_eq!(
        held.most.load(Ordering::SeqCst),
        CEILING,
        "the client used the whole ceiling"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_more_callers_than_the_ceiling_are_never_refused() {
    more_callers_than_the_ceiling_are_never_refused(Arc::new(MemorySlotStore::new())).await;
}

/// On Redis a slot is released by a command sent once the response's last frame is polled, which may reach Redis
/// after the acquire of the client's next request (on another pooled connection): the limiter's acquire refused
/// while this instance's own release on the key is on its way waits for that release, so the client is never
/// refused for a request it sent within `q`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_more_callers_than_the_ceiling_are_never_refused() {
    let store = RedisStore::builder(redis_url())
        .namespace(unique_prefix("client-cc"))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    more_callers_than_the_ceiling_are_never_refused(Arc::new(store)).await;
}

/// Without the layer, one request more than the ceiling is refused: the tests above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pacing_one_more_than_the_ceiling_is_refused() {
    let held = Held::new();
    let addr = serve(Arc::new(MemorySlotStore::new()), &held).await;
    let url = format!("http://{addr}/");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CEILING {
        let url = url.clone();
        tasks.spawn(async move { get(&mut bare(), &url).await.unwrap().status });
    }
    held.entered(CEILING).await;
    let refused = get(&mut bare(), &url).await.unwrap();
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.headers["ratelimit-policy"],
        r#""in-flight";q=2;qu="concurrent-requests""#
    );
    assert_eq!(refused.headers["ratelimit"], r#""in-flight";r=0"#);
    held.go.add_permits(CEILING);
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
}
