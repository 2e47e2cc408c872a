//! The concurrent-requests limiter over real TCP (axum, hyper client), in process and on the shared Redis:
//! exactly N in flight and the rest rejected at once; permits back after completion, client disconnect, handler
//! panic, body drop and cancellation; a client's next request waiting for the release of its previous one; two
//! instances holding one limit; a crashed instance's leases expiring; long requests renewing theirs.

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use http::HeaderName;
use http_body_util::BodyExt;
use tollgate_core::slot::{MemorySlotStore, SlotId, SlotStore};
use tollgate_http::HttpLimitLayer;
use tollgate_http::key::HeaderKey;
use tollgate_testkit::redis::{cli_url, redis_url, unique_prefix};
use tollgate_tower::ConcurrencyLimitLayer;
use tollgate_tower::{BoxError, KeyExtractor};
use tower::{Service, ServiceExt};

use support::{Gate, app, eventually, get, open, redis_instance, serve, try_open};

const ANN: &[(&str, &str)] = &[("x-client", "ann")];
const BOB: &[(&str, &str)] = &[("x-client", "bob")];

fn client_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-client"))
}

/// The store key the layer named `name` uses for client `ann`.
fn ann_key(name: &str) -> String {
    let req = http::Request::builder()
        .header("x-client", "ann")
        .body(())
        .unwrap();
    let mut key = format!("{name}:");
    client_key().extract(&req, &mut key).unwrap();
    key
}

fn layer<L: SlotStore>(limit: u64, store: Arc<L>) -> ConcurrencyLimitLayer<HeaderKey, L> {
    ConcurrencyLimitLayer::new("in-flight", limit, store, client_key()).unwrap()
}

/// A shared lease store whose every acquire times out; counts the releases it is asked for.
#[derive(Default)]
struct TimingOut {
    releases: std::sync::atomic::AtomicUsize,
}

impl SlotStore for TimingOut {
    fn slots_expire(&self) -> bool {
        true
    }

    fn acquire(
        &self,
        _: &str,
        _: SlotId,
        _: u64,
        _: Duration,
    ) -> impl Future<Output = Result<tollgate_core::slot::Admission, tollgate_core::StoreError>> + Send
    {
        std::future::ready(Err(tollgate_core::StoreError::Timeout(
            Duration::from_millis(50),
        )))
    }

    fn renew(
        &self,
        _: &str,
        _: SlotId,
        _: Duration,
    ) -> impl Future<Output = Result<bool, tollgate_core::StoreError>> + Send {
        std::future::ready(Ok(true))
    }

    fn release(
        &self,
        _: &str,
        _: SlotId,
    ) -> impl Future<Output = Result<(), tollgate_core::StoreError>> + Send {
        self.releases
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::future::ready(Ok(()))
    }
}

#[tokio::test]
async fn a_timed_out_acquire_is_released_once() -> Result<(), BoxError> {
    // Twice was one more Redis call per request while Redis is slow, each counting towards the circuit breaker.
    let store = Arc::new(TimingOut::default());
    let layer = layer(1, store.clone()).on_store_error(tollgate_core::FailurePolicy::Open);
    let svc = tower::ServiceBuilder::new()
        .layer(HttpLimitLayer::new(layer))
        .service_fn(|_: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        });
    let req = http::Request::builder()
        .header("x-client", "ann")
        .body(String::new())?;
    let response = svc.oneshot(req).await?;
    assert_eq!(response.status(), 200, "failed open");
    drop(response);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.releases.load(std::sync::atomic::Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stall_leaves_no_lease_behind() {
    // An acquire that times out while Redis is stopped still runs when it resumes. Its release is sent at once,
    // when the circuit breaker (opened by that very timeout, at a threshold of one) skips it: it must be retried
    // until Redis answers, or the late lease holds ann's only slot for the whole lease time with nobody to give
    // it back.
    let server = tollgate_testkit::redis::RedisServer::start();
    let store = Arc::new(
        tollgate_redis::RedisStore::builder(server.url())
            .namespace(unique_prefix("stall"))
            // Generous: the healthy steps must not time out (at a threshold of one, a slow reply on a loaded
            // machine would open the circuit); the stall is a server paused for real, which any timeout meets.
            .timeout(Duration::from_secs(2))
            .circuit_breaker(1, Duration::from_millis(200))
            .build()
            .await
            .unwrap(),
    );
    let gate = Gate::new();
    let limited = layer(1, store.clone())
        .on_store_error(tollgate_core::FailurePolicy::Closed)
        .slot_ttl(Duration::from_secs(30))
        .unwrap();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(limited)))).await;
    assert_eq!(get(addr, "/fast", ANN).await.status, 200);
    server.pause();
    assert_eq!(
        get(addr, "/fast", ANN).await.status,
        503,
        "fails closed while Redis is stopped"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.resume();
    // The acquire sent during the stall has run by now, or runs with the next command on its connection.
    eventually(addr, "/fast", ANN, 200).await;
    let slot_key = store.slot_key(&ann_key("in-flight"));
    let live = server.cli(&["ZCOUNT", &slot_key, "(0", "+inf"]);
    assert_eq!(live, "0", "a lease outlived the stall");
}

/// The Redis store with every release held back until an acquire is refused: a client's next request then surely
/// reaches Redis while its previous slot is still held there. Logs what it is asked and answers.
struct ReleasesHeldBack {
    redis: Arc<tollgate_redis::RedisStore>,
    refused: tokio::sync::Semaphore,
    log: std::sync::Mutex<Vec<&'static str>>,
}

impl ReleasesHeldBack {
    fn note(&self, event: &'static str) {
        self.log.lock().unwrap().push(event);
    }

    fn log(&self) -> Vec<&'static str> {
        self.log.lock().unwrap().clone()
    }
}

impl SlotStore for ReleasesHeldBack {
    fn slots_expire(&self) -> bool {
        true
    }

    async fn acquire(
        &self,
        key: &str,
        slot: SlotId,
        limit: u64,
        ttl: Duration,
    ) -> Result<tollgate_core::slot::Admission, tollgate_core::StoreError> {
        let admission = self.redis.acquire(key, slot, limit, ttl).await?;
        if admission.granted {
            self.note("granted");
        } else {
            self.note("refused");
            self.refused.add_permits(1);
        }
        Ok(admission)
    }

    fn renew(
        &self,
        key: &str,
        slot: SlotId,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, tollgate_core::StoreError>> + Send {
        self.redis.renew(key, slot, ttl)
    }

    async fn release(&self, key: &str, slot: SlotId) -> Result<(), tollgate_core::StoreError> {
        self.note("release asked");
        self.refused.acquire().await.expect("open").forget();
        self.redis.release(key, slot).await?;
        self.note("released");
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_one_request_after_another_never_meets_its_own_previous_slot() {
    let store = Arc::new(ReleasesHeldBack {
        redis: redis_instance(&unique_prefix("cc-seq")).await,
        refused: tokio::sync::Semaphore::new(0),
        log: std::sync::Mutex::default(),
    });
    let gate = Gate::new();
    let limited = layer(1, store.clone());
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(limited)))).await;

    assert_eq!(get(addr, "/fast", ANN).await.status, 200);
    // The response is read, and its release asked for, but held back: the slot is still in Redis.
    assert_eq!(store.log(), ["granted", "release asked"]);
    let slot_key = store.redis.slot_key(&ann_key("in-flight"));
    assert_eq!(cli_url(&redis_url(), &["ZCARD", &slot_key]), "1");

    // The next request meets it, waits for this instance's release, and asks again.
    let next = get(addr, "/fast", ANN).await;
    assert_eq!(
        next.status, 200,
        "refused by its own previous slot: {next:?}"
    );
    assert_eq!(
        store.log()[2..],
        ["refused", "released", "granted", "release asked"]
    );

    // A slot really held still refuses: asked again only after a release of this instance on the key.
    let held = hold(addr, &gate, 1).await;
    assert_eq!(store.log()[6..], ["refused", "released", "granted"]);
    assert_eq!(get(addr, "/fast", ANN).await.status, 429);
    assert_eq!(
        store.log()[9..],
        ["refused"],
        "no release on its way: asked once"
    );
    gate.release(1);
    for reply in held {
        assert_eq!(reply.await.unwrap().status, 200);
    }
}

/// The Redis store with every release held back until an acquire has been refused by Redis, and that refusal
/// held back until the release has been answered: the release reaches Redis after the acquire, but is over by the
/// time the limiter hears of the refusal.
struct ReleaseLandsDuringAcquire {
    redis: Arc<tollgate_redis::RedisStore>,
    go: tokio::sync::Semaphore,
    released: tokio::sync::Semaphore,
}

impl SlotStore for ReleaseLandsDuringAcquire {
    fn slots_expire(&self) -> bool {
        true
    }

    async fn acquire(
        &self,
        key: &str,
        slot: SlotId,
        limit: u64,
        ttl: Duration,
    ) -> Result<tollgate_core::slot::Admission, tollgate_core::StoreError> {
        let admission = self.redis.acquire(key, slot, limit, ttl).await?;
        if !admission.granted {
            self.go.add_permits(1);
            self.released.acquire().await.expect("open").forget();
        }
        Ok(admission)
    }

    fn renew(
        &self,
        key: &str,
        slot: SlotId,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, tollgate_core::StoreError>> + Send {
        self.redis.renew(key, slot, ttl)
    }

    async fn release(&self, key: &str, slot: SlotId) -> Result<(), tollgate_core::StoreError> {
        self.go.acquire().await.expect("open").forget();
        self.redis.release(key, slot).await?;
        self.released.add_permits(1);
        Ok(())
    }
}

/// One thread: the release task's answer and its end as a release in flight happen in one poll, before the
/// refused acquire is polled again, so the order is fixed.
#[tokio::test(flavor = "current_thread")]
async fn a_release_answered_before_the_refusal_it_caused_still_lets_the_request_ask_again() {
    let store = Arc::new(ReleaseLandsDuringAcquire {
        redis: redis_instance(&unique_prefix("cc-during")).await,
        go: tokio::sync::Semaphore::new(0),
        released: tokio::sync::Semaphore::new(0),
    });
    let gate = Gate::new();
    let limited = layer(1, store.clone());
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(limited)))).await;

    assert_eq!(get(addr, "/fast", ANN).await.status, 200);
    // Its release is held: the next acquire is refused by Redis, the release then lands and is answered, and only
    // then does the limiter hear of the refusal. The release was on its way as the acquire was sent: ask again.
    let next = get(addr, "/fast", ANN).await;
    assert_eq!(
        next.status, 200,
        "refused by its own previous slot, released meanwhile: {next:?}"
    );
}

#[test]
fn lease_times_from_3_ms_to_a_day_are_accepted_and_others_are_config_errors() {
    let store = Arc::new(MemorySlotStore::new());
    for ttl in [
        Duration::from_millis(3),
        tollgate_tower::limit::concurrency::MAX_SLOT_TTL,
    ] {
        assert!(layer(1, store.clone()).slot_ttl(ttl).is_ok(), "{ttl:?}");
    }
    for (ttl, why) in [
        (Duration::from_millis(2), "too short"),
        (
            tollgate_tower::limit::concurrency::MAX_SLOT_TTL + Duration::from_millis(1),
            "too long",
        ),
        (Duration::MAX, "too long"),
    ] {
        let err = layer(1, store.clone()).slot_ttl(ttl).unwrap_err();
        assert!(err.to_string().contains(why), "{ttl:?}: {err}");
    }
}

/// Holds `n` requests of ann on `/hold` and returns their tasks once all are inside the handler.
async fn hold(
    addr: std::net::SocketAddr,
    gate: &Gate,
    n: usize,
) -> Vec<tokio::task::JoinHandle<support::Reply>> {
    let before = gate.entered.load(std::sync::atomic::Ordering::SeqCst);
    let held: Vec<_> = (0..n)
        .map(|_| tokio::spawn(async move { get(addr, "/hold", ANN).await }))
        .collect();
    gate.wait_entered(before + n).await;
    held
}

async fn exactly_n_in_flight<L: SlotStore>(store: Arc<L>, in_flight: impl Fn() -> u64) {
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| {
        r.layer(HttpLimitLayer::new(layer(3, store)))
    }))
    .await;

    let held = hold(addr, &gate, 3).await;
    assert_eq!(in_flight(), 3);
    // Four more while three are held: each is answered at once (were they queued, they would wait on the gate
    // forever and the timeout would fail the test).
    let extra: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { get(addr, "/hold", ANN).await }))
        .collect();
    for reply in extra {
        let reply = tokio::time::timeout(Duration::from_secs(10), reply)
            .await
            .expect("a rejection is immediate, never queued")
            .unwrap();
        assert_eq!(reply.status, 429, "{reply:#?}");
        assert_eq!(reply.header("retry-after"), "1");
        assert!(reply.body.contains("concurrency_limited"), "{}", reply.body);
    }
    assert_eq!(in_flight(), 3, "rejected requests took no lease");
    assert_eq!(
        get(addr, "/fast", BOB).await.status,
        200,
        "other keys are not affected"
    );

    gate.release(3);
    for reply in held {
        assert_eq!(reply.await.unwrap().status, 200);
    }
    // Completed responses gave their permits back: three can be in flight again.
    eventually(addr, "/fast", ANN, 200).await;
    let again = hold(addr, &gate, 3).await;
    assert_eq!(get(addr, "/fast", ANN).await.status, 429);
    gate.release(3);
    for reply in again {
        assert_eq!(reply.await.unwrap().status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_exactly_n_in_flight_and_the_rest_rejected_at_once() {
    let store = Arc::new(MemorySlotStore::new());
    let key = ann_key("in-flight");
    let probe = store.clone();
    exactly_n_in_flight(store, move || probe.in_flight(&key)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_exactly_n_in_flight_and_the_rest_rejected_at_once() {
    let store = redis_instance(&unique_prefix("cc-exact")).await;
    let redis_key = store.slot_key(&ann_key("in-flight"));
    exactly_n_in_flight(store, move || {
        cli_url(&redis_url(), &["ZCARD", &redis_key])
            .parse()
            .unwrap()
    })
    .await;
}

async fn permits_return_after_disconnect_and_panic<L: SlotStore>(store: Arc<L>) {
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| {
        r.layer(HttpLimitLayer::new(layer(1, store)))
    }))
    .await;

    // A streaming response holds its permit while the body is being sent …
    let mut streaming = open(addr, "GET", "/stream", ANN).await;
    assert_eq!(streaming.status(), 200);
    let first = streaming.body_mut().frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some());
    assert_eq!(get(addr, "/fast", ANN).await.status, 429);
    // … and the client going away gives it back (the server's next write fails and drops the body).
    drop(streaming);
    eventually(addr, "/fast", ANN, 200).await;

    // A panicking handler: the connection dies, and unwinding drops the permit.
    assert!(try_open(addr, "GET", "/panic", ANN).await.is_err());
    eventually(addr, "/fast", ANN, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_permits_return_after_disconnect_and_panic() {
    permits_return_after_disconnect_and_panic(Arc::new(MemorySlotStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_permits_return_after_disconnect_and_panic() {
    permits_return_after_disconnect_and_panic(redis_instance(&unique_prefix("cc-disc")).await)
        .await;
}

#[tokio::test]
async fn permits_return_when_the_body_is_dropped_or_the_call_cancelled() -> Result<(), BoxError> {
    let store = Arc::new(MemorySlotStore::new());
    let never = Arc::new(tokio::sync::Notify::new());
    let mut svc = tower::ServiceBuilder::new()
        .layer(HttpLimitLayer::new(layer(1, store.clone())))
        .service_fn(move |req: http::Request<axum::body::Body>| {
            let never = never.clone();
            async move {
                if req.uri().path() == "/never" {
                    never.notified().await; // nobody notifies: only cancellation ends it
                }
                Ok::<_, BoxError>(http::Response::new(axum::body::Body::from("unread body")))
            }
        });
    let req = |path: &str| {
        http::Request::builder()
            .uri(path)
            .header("x-client", "ann")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let key = ann_key("in-flight");

    let response = svc.ready().await?.call(req("/")).await?;
    assert_eq!(response.status(), 200);
    assert_eq!(store.in_flight(&key), 1, "the unread body holds the permit");
    assert_eq!(svc.ready().await?.call(req("/")).await?.status(), 429);
    drop(response);
    assert_eq!(store.in_flight(&key), 0, "dropping the body released it");

    let pending = svc.ready().await?.call(req("/never"));
    assert!(
        pending.now_or_never().is_none(),
        "the handler never finishes"
    );
    assert_eq!(store.in_flight(&key), 0, "the cancelled call released it");
    assert_eq!(svc.ready().await?.call(req("/")).await?.status(), 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_redis_hold_the_limit_together() {
    let namespace = unique_prefix("cc-two");
    let gate_a = Gate::new();
    let gate_b = Gate::new();
    // Two instances: separate servers, separate Redis pools, one namespace.
    let a = redis_instance(&namespace).await;
    let b = redis_instance(&namespace).await;
    let addr_a = serve(app(&gate_a, |r| r.layer(HttpLimitLayer::new(layer(2, a))))).await;
    let addr_b = serve(app(&gate_b, |r| r.layer(HttpLimitLayer::new(layer(2, b))))).await;

    let held_a = hold(addr_a, &gate_a, 1).await;
    let held_b = hold(addr_b, &gate_b, 1).await;
    assert_eq!(get(addr_a, "/fast", ANN).await.status, 429);
    assert_eq!(get(addr_b, "/fast", ANN).await.status, 429);
    assert_eq!(get(addr_b, "/fast", BOB).await.status, 200);

    gate_a.release(1);
    assert_eq!(
        held_a.into_iter().next().unwrap().await.unwrap().status,
        200
    );
    // A's slot is free for either instance; B's request still counts.
    eventually(addr_b, "/fast", ANN, 200).await;
    let again = hold(addr_b, &gate_b, 1).await;
    assert_eq!(get(addr_a, "/fast", ANN).await.status, 429);
    gate_b.release(2);
    for reply in held_b.into_iter().chain(again) {
        assert_eq!(reply.await.unwrap().status, 200);
    }
}

/// The shared Redis's clock (`TIME`) in ms: the clock lease expiries are in.
fn redis_now_ms() -> u64 {
    let time = cli_url(&redis_url(), &["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let (secs, micros) = (parts.next().unwrap(), parts.next().unwrap());
    secs * 1000 + micros / 1000
}

/// The earliest expiry (server ms) of the leases on `redis_key`.
fn first_expiry_ms(redis_key: &str) -> u64 {
    let reply = cli_url(&redis_url(), &["ZRANGE", redis_key, "0", "0", "WITHSCORES"]);
    let score = reply
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no lease: {reply:?}"));
    score
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{reply:?}: {e}"))
}

/// Leases on `redis_key` whose expiry (server time) has not passed; expired ones linger until the next acquire.
fn live_leases(redis_key: &str) -> u64 {
    let now_ms = redis_now_ms();
    cli_url(
        &redis_url(),
        &["ZCOUNT", redis_key, &format!("({now_ms}"), "+inf"],
    )
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_crashed_instance_expire_and_long_requests_renew() {
    let namespace = unique_prefix("cc-crash");
    let live = redis_instance(&namespace).await;
    let key = ann_key("in-flight");
    let redis_key = live.slot_key(&key);
    let gate = Gate::new();
    // Renewed every third of it: a renewal late by two thirds (a stall on a loaded machine) loses the lease, as it
    // would in production, so the lease time is long against any stall.
    let short = Duration::from_secs(1);
    let live_layer = layer(2, live).slot_ttl(short).unwrap();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(live_layer)))).await;

    // Another instance took both of ann's slots and crashed: its leases were never released nor renewed.
    // While they live (until the earlier expiry, in Redis's time) ann is refused. A reply that came after it (a
    // stall longer than the lease time) proves nothing: the crash is staged again once they expired.
    let crashed = redis_instance(&namespace).await;
    let mut refused_while_live = false;
    for _ in 0..5 {
        for _ in 0..2 {
            let admission = crashed
                .acquire(&key, SlotId::new(), 2, short)
                .await
                .unwrap();
            assert!(admission.granted);
        }
        let expiry = first_expiry_ms(&redis_key);
        let status = get(addr, "/fast", ANN).await.status;
        if redis_now_ms() < expiry {
            assert_eq!(status, 429, "both slots held by live leases");
            refused_while_live = true;
            break;
        }
        eventually(addr, "/fast", ANN, 200).await;
    }
    assert!(
        refused_while_live,
        "no request was answered within the lease time in five tries"
    );
    drop(crashed);
    // Without renewals they expire after the lease time, and the slots are usable again.
    eventually(addr, "/fast", ANN, 200).await;

    // A request outliving its lease time several times over keeps its lease by renewing it.
    let held = hold(addr, &gate, 1).await;
    tokio::time::sleep(short * 4).await;
    assert_eq!(
        live_leases(&redis_key),
        1,
        "the long request's lease was renewed, not expired"
    );
    let ttl: i64 = cli_url(&redis_url(), &["PTTL", &redis_key])
        .parse()
        .unwrap();
    assert!(ttl > 0, "the lease key has a TTL: {ttl}");
    let second = hold(addr, &gate, 1).await;
    assert_eq!(
        get(addr, "/fast", ANN).await.status,
        429,
        "limit 2: both held"
    );
    gate.release(2);
    for reply in held.into_iter().chain(second) {
        assert_eq!(reply.await.unwrap().status, 200);
    }
    eventually(addr, "/fast", ANN, 200).await;
}
