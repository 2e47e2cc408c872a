//! The deny cache against real Redis: exact (it never refuses what the cache-less store admits, and admits
//! exactly what it admits), the store's numbers, cost-aware, invalidated on demand, bounded, and ≈ 0 script
//! calls for a flood on a denied key.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use tollgate_core::{
    Algorithm, Clock, Decision, ManualClock, MemoryStore, Outcome, Policy, Quota, Store,
    StoreError, Timestamp,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{RedisServer, redis_url, unique_prefix};
use tollgate_tower::{
    BoxError, DenyCacheConfig, KeyError, RateLimitLayer, Rejection, VerdictSink, Verdicts,
};
use tower::{Service, ServiceExt, util::BoxCloneService};

/// A request: its key and its cost.
type Req = (String, u64);

#[derive(Debug, Default)]
struct Reply(Verdicts);
impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.0
    }
}

type Svc = BoxCloneService<Req, Reply, BoxError>;

/// Redis deciding at a manual clock's instants, counting its calls; shared, as Redis is.
struct Clocked {
    redis: Arc<RedisStore>,
    clock: ManualClock,
    calls: AtomicUsize,
}

impl Store for Clocked {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.redis
            .check_at(key, policy, cost, self.clock.now())
            .await
    }
    fn is_shared(&self) -> bool {
        true
    }
}

/// Redis on its own clock, counting its calls.
struct Counted {
    redis: Arc<RedisStore>,
    calls: AtomicUsize,
}

impl Store for Counted {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.redis.check(key, policy, cost).await
    }
    fn is_shared(&self) -> bool {
        self.redis.is_shared()
    }
}

async fn redis(namespace: &str) -> Arc<RedisStore> {
    redis_at(&redis_url(), namespace).await
}

async fn redis_at(url: &str, namespace: &str) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::builder(url)
            .namespace(namespace)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap_or_else(|e| panic!("Redis at {url} must be running for this test: {e}")),
    )
}

/// A manual clock at the current wall-clock second (Redis TTLs then stay near real time).
fn clock() -> ManualClock {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    ManualClock::new(Timestamp::from_micros(secs * 1_000_000))
}

type KeyOf = fn(&Req, &mut String) -> Result<(), KeyError>;
type CostOf = fn(&Req) -> u64;
type Limit<St> = RateLimitLayer<KeyOf, St, CostOf>;

fn layer<St: Store>(store: Arc<St>, policy: Policy) -> Limit<St> {
    fn key(req: &Req, key: &mut String) -> Result<(), KeyError> {
        key.push_str(&req.0);
        Ok(())
    }
    fn cost(req: &Req) -> u64 {
        req.1
    }
    RateLimitLayer::new("dc", policy, store, key as fn(&Req, &mut String) -> _)
        .cost(cost as fn(&Req) -> u64)
}

fn service<St: Store>(layer: Limit<St>) -> Svc {
    BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: Req| async { Ok::<_, BoxError>(Reply::default()) }),
    )
}

/// The decision a request got from the layer.
async fn decide(svc: &mut Svc, key: &str, cost: u64) -> Decision {
    match svc
        .ready()
        .await
        .unwrap()
        .call((key.to_owned(), cost))
        .await
    {
        Ok(reply) => reply.0.iter().next().expect("a verdict").decision,
        Err(err) => *err
            .downcast_ref::<Rejection>()
            .and_then(Rejection::decision)
            .unwrap_or_else(|| panic!("not a rate-limit rejection: {err}")),
    }
}

fn policies() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::token_bucket(Quota::per_second(5).unwrap())),
        Just(Policy::token_bucket(
            Quota::per_second(10).unwrap().with_burst(4).unwrap()
        )),
        Just(Policy::sliding_window(Quota::per_second(5).unwrap()).unwrap()),
    ]
}

/// Steps: (time to advance in µs, key index, cost).
fn steps(max_cost: u64) -> impl Strategy<Value = Vec<(u64, usize, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0_u64), 0..2_000_u64, 0..400_000_u64],
            0..2_usize,
            1..=max_cost,
        ),
        1..60,
    )
}

/// Runs `steps` on Redis with the cache, Redis without it and the in-process store, all at one manual clock's
/// instants, and checks that they decide alike. With `exact_numbers` (unit costs), every number agrees too.
async fn compare(policy: Policy, steps: Vec<(u64, usize, u64)>, exact_numbers: bool) {
    let clock = clock();
    let prefix = unique_prefix("deny-cache-prop");
    let shared = redis(&prefix).await;
    let cached_store = Arc::new(Clocked {
        redis: shared.clone(),
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let plain_store = Arc::new(Clocked {
        redis: redis(&format!("{prefix}-plain")).await,
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let memory = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let mut cached = service(
        layer(cached_store.clone(), policy)
            .deny_cache_config(DenyCacheConfig::new().clock(clock.clone())),
    );
    let mut plain = service(layer(plain_store.clone(), policy).deny_cache(false));
    let mut in_process = service(layer(memory, policy));
    for (i, (advance, key, cost)) in steps.iter().copied().enumerate() {
        clock.advance(Duration::from_micros(advance));
        let key = ["a", "b"][key];
        let with = decide(&mut cached, key, cost).await;
        let without = decide(&mut plain, key, cost).await;
        let local = decide(&mut in_process, key, cost).await;
        assert_eq!(
            without, local,
            "step {i}: Redis and the in-process store disagree"
        );
        assert_eq!(
            with.outcome, without.outcome,
            "step {i}: the cache changed a decision: {with:?} vs {without:?}"
        );
        if exact_numbers {
            assert_eq!(
                with, without,
                "step {i}: the cached numbers differ from the store's"
            );
        } else {
            assert_eq!(
                (with.limit, with.reset, with.now),
                (without.limit, without.reset, without.now),
                "step {i}"
            );
            assert!(
                with.remaining <= without.remaining,
                "step {i}: {with:?} vs {without:?}"
            );
            assert!(
                with.retry_after <= without.retry_after,
                "step {i}: {with:?} vs {without:?}"
            );
        }
    }
    assert!(
        cached_store.calls.load(Ordering::Relaxed) <= plain_store.calls.load(Ordering::Relaxed)
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Unit costs: the cache decides as the store does, with the store's numbers (headers are rendered from them).
    #[test]
    fn the_cache_decides_and_numbers_as_the_store(policy in policies(), steps in steps(1)) {
        runtime().block_on(compare(policy, steps, true));
    }

    /// Mixed costs: the same admissions; a costlier request refused from a cheaper one's entry announces no
    /// later retry and no more remaining than the store would.
    #[test]
    fn the_cache_is_exact_with_mixed_costs(policy in policies(), steps in steps(4)) {
        runtime().block_on(compare(policy, steps, false));
    }
}

/// On Redis's own clock: whenever the store itself says (just before) that a request fits, the layer admits it.
#[tokio::test]
async fn never_refuses_what_redis_admits_on_its_own_clock() {
    let redis = redis(&unique_prefix("deny-cache-live")).await;
    let store = Arc::new(Counted {
        redis: redis.clone(),
        calls: AtomicUsize::new(0),
    });
    let policy = Policy::token_bucket(Quota::per_second(20).unwrap().with_burst(5).unwrap());
    let layer = layer(store.clone(), policy);
    let handle = layer.clone();
    let mut svc = service(layer);
    let (mut fits, mut refused) = (0, 0);
    let requests = 400_u64;
    for i in 0..requests {
        let cost = 1 + i % 3;
        // Cost 0 inspects: `remaining` whole tokens are there now, and only more later (no other traffic).
        let inspected = redis.check("dc:k", &policy, 0).await.unwrap();
        let decision = decide(&mut svc, "k", cost).await;
        if inspected.remaining >= cost {
            fits += 1;
            assert!(
                decision.is_allowed(),
                "request {i}: refused with {} tokens there: {decision:?}",
                inspected.remaining
            );
        }
        refused += usize::from(!decision.is_allowed());
        if i % 7 == 0 {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    assert!(handle.deny_cache_is_active(), "on by default for Redis");
    let cached = requests as usize - store.calls.load(Ordering::Relaxed);
    assert!(
        fits > 0 && refused > 0 && cached > 0,
        "{fits} fitted, {refused} refused, {cached} of them by the cache"
    );
}

/// The cheaper request the algorithm admits passes; the costlier one is refused from the entry.
#[tokio::test]
async fn a_cheaper_request_still_asks_the_store() {
    let clock = clock();
    let store = Arc::new(Clocked {
        redis: redis(&unique_prefix("deny-cache-cost")).await,
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let policy = Policy::token_bucket(Quota::per_minute(10).unwrap());
    let mut svc = service(
        layer(store.clone(), policy).deny_cache_config(DenyCacheConfig::new().clock(clock.clone())),
    );
    assert!(decide(&mut svc, "k", 8).await.is_allowed());
    assert_eq!(decide(&mut svc, "k", 5).await.outcome, Outcome::Limited); // the store's denial, cached for ≥ 5
    let calls = store.calls.load(Ordering::Relaxed);
    assert_eq!(decide(&mut svc, "k", 7).await.outcome, Outcome::Limited);
    assert_eq!(
        store.calls.load(Ordering::Relaxed),
        calls,
        "a costlier request is refused locally"
    );
    assert!(
        decide(&mut svc, "k", 2).await.is_allowed(),
        "two tokens are left"
    );
    assert_eq!(store.calls.load(Ordering::Relaxed), calls + 1);
    // Beyond the burst the store's own answer (cost exceeds capacity) is given, not the entry's.
    assert_eq!(
        decide(&mut svc, "k", 11).await.outcome,
        Outcome::CostExceedsCapacity
    );
}

/// `forget` and `clear` send the next request to the store, which an operator reset lets through.
#[tokio::test]
async fn invalidation_after_an_operator_reset() {
    let clock = clock();
    let prefix = unique_prefix("deny-cache-reset");
    let store = Arc::new(Clocked {
        redis: redis(&prefix).await,
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let policy = Policy::sliding_window(Quota::per_hour(1).unwrap()).unwrap();
    let layer =
        layer(store.clone(), policy).deny_cache_config(DenyCacheConfig::new().clock(clock.clone()));
    let handle = layer.clone();
    let mut svc = service(layer);
    for key in ["a", "b"] {
        assert!(decide(&mut svc, key, 1).await.is_allowed());
        assert!(!decide(&mut svc, key, 1).await.is_allowed());
    }
    assert_eq!(handle.deny_cache_len(), 2);
    // The operator deletes the keys in Redis; the cache still refuses them.
    let keys = tollgate_testkit::redis::cli_url(
        &redis_url(),
        &["--scan", "--pattern", &format!("{prefix}*")],
    );
    for key in keys.lines().filter(|k| !k.is_empty()) {
        let _ = tollgate_testkit::redis::cli_url(&redis_url(), &["DEL", key]);
    }
    assert!(!decide(&mut svc, "a", 1).await.is_allowed());
    handle.deny_cache_forget("a");
    assert_eq!(handle.deny_cache_len(), 1);
    assert!(
        decide(&mut svc, "a", 1).await.is_allowed(),
        "forgotten: asked the store, which was reset"
    );
    assert!(!decide(&mut svc, "b", 1).await.is_allowed());
    handle.deny_cache_clear();
    assert!(handle.deny_cache_is_empty());
    assert!(decide(&mut svc, "b", 1).await.is_allowed());
}

/// A flood of distinct denied keys keeps the cache within its bound, and a key that keeps being refused keeps
/// its entry (it is recent).
#[tokio::test]
async fn bounded_under_a_flood_of_denied_keys() {
    let clock = clock();
    let store = Arc::new(Clocked {
        redis: redis(&unique_prefix("deny-cache-flood")).await,
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let policy = Policy::token_bucket(Quota::per_hour(1).unwrap());
    let layer = layer(store.clone(), policy)
        .deny_cache_config(DenyCacheConfig::new().max_keys(64).clock(clock.clone()));
    let handle = layer.clone();
    let mut svc = service(layer);
    assert!(decide(&mut svc, "abuser", 1).await.is_allowed());
    for i in 0..600 {
        let key = format!("k{i}");
        decide(&mut svc, &key, 1).await;
        decide(&mut svc, &key, 1).await;
        assert!(!decide(&mut svc, "abuser", 1).await.is_allowed());
        assert!(
            handle.deny_cache_len() <= 64,
            "{} entries over a bound of 64",
            handle.deny_cache_len()
        );
    }
    let calls = store.calls.load(Ordering::Relaxed);
    assert!(!decide(&mut svc, "abuser", 1).await.is_allowed());
    assert_eq!(
        store.calls.load(Ordering::Relaxed),
        calls,
        "the abuser's entry survived the flood"
    );
    // Expired entries are swept: an hour on, one insertion clears the table of them.
    clock.advance(Duration::from_secs(3_700));
    assert!(decide(&mut svc, "x", 1).await.is_allowed());
    assert!(!decide(&mut svc, "x", 1).await.is_allowed());
    assert_eq!(handle.deny_cache_len(), 1);
}

/// The count of `EVALSHA` calls a private server has served.
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a number of calls"))
}

/// A flood on one denied key costs no script call until the retry instant (the last admission's reply makes the
/// entry: a token bucket it leaves empty refuses the next request until its next token); without the cache, one
/// per request.
#[tokio::test]
async fn a_flood_on_a_denied_key_costs_about_no_script_calls() {
    let server = RedisServer::start();
    // An hour per token: no token accrues during the test, however slow the machine.
    let policy = Policy::token_bucket(Quota::per_hour(5).unwrap());
    for (cache, allowed_calls) in [(true, 5), (false, 5 + 500)] {
        let store = redis_at(&server.url(), &unique_prefix("deny-cache-calls")).await;
        let mut svc = service(layer(store, policy).deny_cache(cache));
        let before = script_calls(&server);
        let mut admitted = 0;
        for _ in 0..505 {
            admitted += usize::from(decide(&mut svc, "flooder", 1).await.is_allowed());
        }
        assert_eq!(admitted, 5, "cache {cache}: the burst, exactly");
        let calls = script_calls(&server) - before;
        assert_eq!(
            calls, allowed_calls,
            "cache {cache}: {calls} script calls for 505 requests"
        );
    }
}

/// The default follows the store: off for the in-process store, on for Redis (every denial it returns is its own:
/// a failure is an error the layer's failure policy answers, never a made-up denial).
#[tokio::test]
async fn on_by_default_only_for_shared_stores() {
    let policy = Policy::token_bucket(Quota::per_hour(1).unwrap());
    let memory = layer(Arc::new(MemoryStore::new()), policy);
    let handle = memory.clone();
    let _svc = service(memory);
    assert!(!handle.deny_cache_is_active());
    let shared = redis(&unique_prefix("deny-cache-default")).await;
    assert!(shared.is_shared());
    let on_redis = layer(shared, policy);
    let handle = on_redis.clone();
    let _svc = service(on_redis);
    assert!(handle.deny_cache_is_active());
}

/// A limiter charging the cost after the response has no deny cache unless told to, even on Redis: a refund
/// (on any instance) can admit a key before a cached denial's instant.
#[tokio::test]
async fn off_by_default_when_the_cost_is_charged_after_the_response() {
    let policy = Policy::token_bucket(Quota::per_hour(1).unwrap());
    let shared = redis(&unique_prefix("deny-cache-after")).await;
    let after = layer(shared.clone(), policy).cost_after(tollgate_tower::CostAfter::Extension);
    let handle = after.clone();
    let _svc = service(after);
    assert!(
        !handle.deny_cache_is_active(),
        "off with a cost charged after"
    );
    let told = layer(shared, policy)
        .cost_after(tollgate_tower::CostAfter::Extension)
        .deny_cache(true);
    let handle = told.clone();
    let _svc = service(told);
    assert!(handle.deny_cache_is_active(), "on when switched on");
}

/// Over HTTP: the cached 429s carry exactly the fields the store's 429s carry at the same instants.
#[tokio::test]
async fn cached_refusals_answer_with_the_stores_header_fields() {
    let clock = clock();
    let prefix = unique_prefix("deny-cache-http");
    let policy = Policy::token_bucket(Quota::per_second(2).unwrap());
    let mut addrs = Vec::new();
    let mut stores = Vec::new();
    for cache in [true, false] {
        let store = Arc::new(Clocked {
            redis: redis(&format!("{prefix}-{cache}")).await,
            clock: clock.clone(),
            calls: AtomicUsize::new(0),
        });
        stores.push(store.clone());
        let layer = RateLimitLayer::new("http", policy, store, tollgate_http::key::PeerIp);
        let layer = if cache {
            layer.deny_cache_config(DenyCacheConfig::new().clock(clock.clone()))
        } else {
            layer.deny_cache(false)
        };
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(tollgate_http::HttpLimitLayer::new(layer));
        addrs.push(support::serve(app).await);
    }
    let mut refused = 0;
    for advance_ms in [0, 0, 0, 0, 100, 0, 150, 99, 1, 0, 230, 20, 0] {
        clock.advance(Duration::from_millis(advance_ms));
        let with = support::get(addrs[0], "/", &[]).await;
        let without = support::get(addrs[1], "/", &[]).await;
        assert_eq!(with.status, without.status);
        let fields = |reply: &support::Reply| {
            let mut fields: Vec<(String, String)> = reply
                .headers
                .iter()
                .filter(|(name, _)| *name != "date")
                .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
                .collect();
            fields.sort();
            fields
        };
        assert_eq!(fields(&with), fields(&without), "after +{advance_ms} ms");
        assert_eq!(with.body, without.body);
        refused += usize::from(with.status == http::StatusCode::TOO_MANY_REQUESTS);
    }
    let (cached_calls, plain_calls) = (
        stores[0].calls.load(Ordering::Relaxed),
        stores[1].calls.load(Ordering::Relaxed),
    );
    assert!(refused >= 4, "{refused} refusals");
    assert!(
        cached_calls < plain_calls,
        "the cache answered none: {cached_calls} vs {plain_calls} calls"
    );
}

/// Redis at a manual clock's instants, counting its calls, whose next call waits for a permit once `hold` is set:
/// a store call kept in flight for as long as a test needs.
struct Gated {
    inner: Clocked,
    hold: std::sync::atomic::AtomicBool,
    gate: tokio::sync::Semaphore,
}

impl Store for Gated {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        if self.hold.swap(false, Ordering::SeqCst) {
            self.gate.acquire().await.expect("open").forget();
        }
        self.inner
            .redis
            .check_at(key, policy, cost, self.inner.clock.now())
            .await
    }
    fn is_shared(&self) -> bool {
        true
    }
}

/// A cached and a plain service at one manual clock under `policy` (one request per second), the key "k" denied
/// (cached) at the clock's start.
async fn denied_key(name: &str, policy: Policy) -> (ManualClock, Arc<Gated>, Svc, Svc) {
    let clock = clock();
    let prefix = unique_prefix(name);
    let gated = Arc::new(Gated {
        inner: Clocked {
            redis: redis(&prefix).await,
            clock: clock.clone(),
            calls: AtomicUsize::new(0),
        },
        hold: false.into(),
        gate: tokio::sync::Semaphore::new(0),
    });
    let plain = Arc::new(Clocked {
        redis: redis(&format!("{prefix}-plain")).await,
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let mut cached = service(
        layer(gated.clone(), policy).deny_cache_config(DenyCacheConfig::new().clock(clock.clone())),
    );
    let mut plain = service(layer(plain, policy).deny_cache(false));
    for svc in [&mut cached, &mut plain] {
        assert!(decide(svc, "k", 1).await.is_allowed());
        assert!(!decide(svc, "k", 1).await.is_allowed());
    }
    // A token bucket's admission that empties it makes the entry; a sliding window's denial does.
    let calls = match policy.algorithm() {
        Algorithm::TokenBucket => 1,
        _ => 2,
    };
    assert_eq!(gated.inner.calls.load(Ordering::Relaxed), calls);
    (clock, gated, cached, plain)
}

/// Starts `n` concurrent requests for "k" with the store's next call held, lets every one of them run until it
/// waits (a current-thread runtime runs each ready task before the yielding one again), and returns them.
async fn flood_held(gated: &Gated, svc: &Svc, n: usize) -> Vec<tokio::task::JoinHandle<Decision>> {
    gated.hold.store(true, Ordering::SeqCst);
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let mut svc = svc.clone();
            tokio::spawn(async move { decide(&mut svc, "k", 1).await })
        })
        .collect();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tasks
}

/// Concurrent requests just after an entry expired (still denied, by less than a millisecond) ask the store once;
/// the others wait for that reply and are refused from the entry it brings, with the store's numbers.
#[tokio::test]
async fn after_an_expiry_concurrent_requests_ask_the_store_once() {
    let (clock, gated, cached, mut plain) =
        denied_key("deny-cache-flight", token_per_second()).await;
    // The entry expires 600 µs (the drift margin) before the retry instant, one second on.
    clock.advance(Duration::from_micros(999_500));
    let tasks = flood_held(&gated, &cached, 8).await;
    assert_eq!(
        gated.inner.calls.load(Ordering::Relaxed),
        2,
        "one request asks the store, the seven others wait"
    );
    assert!(tasks.iter().all(|t| !t.is_finished()));
    gated.gate.add_permits(1);
    let expected = decide(&mut plain, "k", 1).await;
    assert_eq!(expected.outcome, Outcome::Limited);
    for task in tasks {
        assert_eq!(task.await.unwrap(), expected, "the store's own numbers");
    }
    assert_eq!(gated.inner.calls.load(Ordering::Relaxed), 2);
}

/// A token bucket of one request per second.
fn token_per_second() -> Policy {
    Policy::token_bucket(Quota::per_second(1).unwrap())
}

/// Floods "k" with 8 requests `advance` after its denial under `policy`, the first one's store call held, then lets
/// it land: one of them is admitted and the others are refused with the store's own numbers, exactly as the store
/// decides the same requests one by one. Returns the store calls made while the call was held, and in all.
async fn flood_after_an_expiry(name: &str, policy: Policy, advance: Duration) -> (usize, usize) {
    let (clock, gated, cached, mut plain) = denied_key(name, policy).await;
    clock.advance(advance);
    let tasks = flood_held(&gated, &cached, 8).await;
    let held = gated.inner.calls.load(Ordering::Relaxed);
    assert!(tasks.iter().all(|t| !t.is_finished()));
    gated.gate.add_permits(1);
    let mut expected = Vec::new();
    for _ in 0..8 {
        expected.push(decide(&mut plain, "k", 1).await);
    }
    let mut got = Vec::new();
    for task in tasks {
        got.push(task.await.unwrap());
    }
    assert_eq!(got.iter().filter(|d| d.is_allowed()).count(), 1);
    for denied in got.iter().filter(|d| !d.is_allowed()) {
        assert_eq!(denied, &expected[1], "the store's own numbers");
    }
    (held, gated.inner.calls.load(Ordering::Relaxed))
}

/// When a token bucket's single flight is admitted (the token that accrued is spent), its reply refuses the
/// waiters until the next token: one call, one admission.
#[tokio::test]
async fn an_admitted_flight_refuses_the_waiters_from_its_reply() {
    let calls = flood_after_an_expiry(
        "deny-cache-admitted",
        token_per_second(),
        Duration::from_millis(1_200),
    )
    .await;
    assert_eq!(
        calls,
        (2, 2),
        "the admitted flight alone: its reply refuses the seven others"
    );
}

/// When a sliding window's single flight is admitted, the next waiter asks in turn (the window's admission does
/// not tell when the next request fits) and its denial refuses the rest: two calls, one admission.
#[tokio::test]
async fn an_admitted_flight_hands_the_call_to_the_next_waiter() {
    let policy = Policy::sliding_window(Quota::per_second(1).unwrap()).unwrap();
    // Past the denial's retry instant: the end of the window after the admission's.
    let calls =
        flood_after_an_expiry("deny-cache-chain", policy, Duration::from_millis(2_200)).await;
    assert_eq!(
        calls,
        (3, 3 + 1),
        "the admitted flight, then the one denial that refuses the six others"
    );
}

/// A flight whose request is dropped (its client went away) lets the waiters go at once: they ask on their own.
#[tokio::test]
async fn a_dropped_flight_lets_its_waiters_ask() {
    let (clock, gated, cached, mut plain) =
        denied_key("deny-cache-dropped", token_per_second()).await;
    clock.advance(Duration::from_micros(999_500));
    let mut tasks = flood_held(&gated, &cached, 3).await;
    assert_eq!(gated.inner.calls.load(Ordering::Relaxed), 2);
    // The probe is the task whose store call is held: the only one the gate can be waiting for.
    let probe = tasks.remove(0);
    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    let expected = decide(&mut plain, "k", 1).await;
    for task in tasks {
        assert_eq!(task.await.unwrap(), expected);
    }
    assert_eq!(
        gated.inner.calls.load(Ordering::Relaxed),
        2 + 2,
        "each waiter asked the store itself"
    );
}

/// Redis on a clock of its own, at a manual local clock's instants: the store's clock reads the local one plus
/// `offset` µs, running `ppm` parts per million faster (or slower), and each call takes `latency` (µs on the way
/// out, before the store decides, and on the way back) of local time. Its last decision's instant is kept, so a
/// test can ask a twin store the same question at the same instant.
struct Skewed {
    redis: Arc<RedisStore>,
    clock: ManualClock,
    start: u64,
    offset: i64,
    ppm: i64,
    latency: std::sync::Mutex<(u64, u64)>,
    calls: AtomicUsize,
    last: std::sync::atomic::AtomicU64,
    /// Set: the next call waits for a permit of `gate` before the store decides.
    hold: std::sync::atomic::AtomicBool,
    gate: tokio::sync::Semaphore,
}

impl Skewed {
    async fn new(prefix: &str, clock: &ManualClock, offset: i64, ppm: i64) -> Arc<Self> {
        Arc::new(Self {
            redis: redis(prefix).await,
            clock: clock.clone(),
            start: clock.now().as_micros(),
            offset,
            ppm,
            latency: std::sync::Mutex::new((0, 0)),
            calls: AtomicUsize::new(0),
            last: 0.into(),
            hold: false.into(),
            gate: tokio::sync::Semaphore::new(0),
        })
    }

    /// The store's clock at local instant `local` (µs).
    fn server(&self, local: u64) -> Timestamp {
        let elapsed = i128::from(local - self.start);
        let at = i128::from(local)
            + i128::from(self.offset)
            + elapsed * i128::from(self.ppm) / 1_000_000;
        Timestamp::from_micros(u64::try_from(at).unwrap())
    }

    /// The first local instant (µs) at which the store's clock reads `instant` or later.
    fn local(&self, instant: Timestamp) -> u64 {
        let target = i128::from(instant.as_micros()) - i128::from(self.offset);
        let start = i128::from(self.start);
        let guess = start + (target - start) * 1_000_000 / (1_000_000 + i128::from(self.ppm));
        let mut local = u64::try_from((guess - 2).max(start)).unwrap();
        while self.server(local) < instant {
            local += 1;
        }
        local
    }
}

impl Store for Skewed {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let (out, back) = *self.latency.lock().unwrap();
        self.clock.advance(Duration::from_micros(out));
        if self.hold.swap(false, Ordering::SeqCst) {
            self.gate.acquire().await.expect("open").forget();
        }
        let at = self.server(self.clock.now().as_micros());
        self.last.store(at.as_micros(), Ordering::Relaxed);
        let decision = self.redis.check_at(key, policy, cost, at).await;
        self.clock.advance(Duration::from_micros(back));
        decision
    }
    fn is_shared(&self) -> bool {
        true
    }
}

/// One step of a skewed run: local time to advance (µs; [`TO_RETRY`]: to the instant the store's last denial of
/// the key said), key index, cost, the store call's latencies (µs).
type SkewedStep = (u64, usize, u64, u64, u64);

/// A step that advances the local clock to the first instant at which the store's clock reaches the retry instant
/// of its last denial of the step's key: where an entry expiring a little late would refuse what the store admits.
const TO_RETRY: u64 = u64::MAX;

/// Runs `steps` through a cached layer on a [`Skewed`] store (its cache on the steady manual clock: no step
/// allowance, only the learned offset and the drift allowance) and checks every decision against a cache-less
/// twin asked at the same store instant: a request the store answered gets the twin's decision exactly; one the
/// cache refused is one the twin refuses too (never refused where the store admits), with the same limit and
/// reset and no more remaining. Returns (store calls, admitted).
async fn skewed_run(
    policy: Policy,
    offset: i64,
    ppm: i64,
    steps: impl IntoIterator<Item = SkewedStep>,
) -> (usize, usize) {
    let clock = clock();
    let prefix = unique_prefix("deny-cache-skew");
    let store = Skewed::new(&prefix, &clock, offset, ppm).await;
    let twin = redis(&format!("{prefix}-twin")).await;
    let mut cached = service(
        layer(store.clone(), policy)
            .deny_cache_config(DenyCacheConfig::new().steady_clock(clock.clone())),
    );
    let mut admitted = 0;
    // Per key, the store instant its last denial said it would admit at.
    let mut retry_at = [None; 2];
    for (i, (advance, index, cost, out, back)) in steps.into_iter().enumerate() {
        if advance == TO_RETRY {
            if let Some(at) = retry_at[index] {
                let to = store.local(at);
                let now = clock.now().as_micros();
                clock.advance(Duration::from_micros(to.saturating_sub(now)));
            }
        } else {
            clock.advance(Duration::from_micros(advance));
        }
        *store.latency.lock().unwrap() = (out, back);
        let key = ["a", "b"][index];
        let calls = store.calls.load(Ordering::Relaxed);
        let local = clock.now().as_micros();
        let with = decide(&mut cached, key, cost).await;
        let asked = store.calls.load(Ordering::Relaxed) > calls;
        let at = if asked {
            Timestamp::from_micros(store.last.load(Ordering::Relaxed))
        } else {
            store.server(local)
        };
        let expected = twin
            .check_at(&format!("dc:{key}"), &policy, cost, at)
            .await
            .unwrap();
        if asked {
            assert_eq!(with, expected, "step {i}: the store's own decision");
        } else {
            assert_eq!(
                with.outcome, expected.outcome,
                "step {i}: the cache refused what the store admits at {at:?}: {with:?} vs {expected:?}"
            );
            assert_eq!(
                (with.limit, with.reset),
                (expected.limit, expected.reset),
                "step {i}"
            );
            assert!(
                with.remaining <= expected.remaining,
                "step {i}: {with:?} vs {expected:?}"
            );
        }
        if let Some(retry) = expected.retry_after {
            retry_at[index] = Some(expected.now.saturating_add(retry));
        }
        admitted += usize::from(with.is_allowed());
    }
    (store.calls.load(Ordering::Relaxed), admitted)
}

fn skewed_steps(max_cost: u64) -> impl Strategy<Value = Vec<SkewedStep>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0_u64), 0..2_000_u64, 0..400_000_u64, Just(TO_RETRY)],
            0..2_usize,
            1..=max_cost,
            prop_oneof![Just(0_u64), 0..300_u64, 0..5_000_u64],
            0..3_000_u64,
        ),
        1..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The store on a clock of its own (seconds apart, drifting by up to 400 ppm), round trips of random
    /// latency, requests at random instants and at the store's retry instants: entries expiring by the offset
    /// the key's replies bound never refuse what the store admits.
    #[test]
    fn the_cache_is_exact_on_a_skewed_store_clock(
        policy in policies(),
        offset in -5_000_000_i64..5_000_000,
        ppm in -400_i64..=400,
        steps in skewed_steps(3),
    ) {
        runtime().block_on(skewed_run(policy, offset, ppm, steps));
    }
}

/// A flood on one key whose store calls take from 0.1 to 3 ms to reach the store (one took 50 µs), on a store
/// clock 2.5 s ahead and 300 ppm fast: after the burst each token costs about one store call (the first request
/// after the entry's expiry is admitted, and its reply makes the next entry), although a reply's own bound is up
/// to 3 ms loose; every decision is the store's (checked against a twin).
#[tokio::test]
async fn a_flood_costs_one_call_per_token_whatever_the_latency() {
    let policy = Policy::token_bucket(Quota::per_second(100).unwrap().with_burst(10).unwrap());
    let mut seed = 0x2545_f491_u64;
    let steps = (0..12_000_u64).map(|i| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let out = if i == 20 {
            50
        } else {
            100 + (seed >> 33) % 2_900
        };
        (200, 0, 1, out, 30)
    });
    let (calls, admitted) = skewed_run(policy, 2_500_000, 300, steps).await;
    let tokens = admitted - 10;
    assert!(tokens > 200, "{admitted} admitted");
    // The burst's 10 admissions one call each, then 1 per token; a second only where the probe reached the store
    // about as fast as the tightest bound (aged by the drift allowance) and was sent within a few µs of the
    // expiry, then denied with a retry too short to cache: a few tokens in a hundred here (a 200 µs request
    // spacing against a drift allowance of 5 µs per 10 ms of the bound's age).
    assert!(
        calls <= 10 + tokens + tokens / 20,
        "{calls} store calls for {admitted} admissions ({tokens} tokens after the burst)"
    );
}

/// A probe denied a few µs before the instant whose reply lands after that instant: its entry has expired when the
/// waiters look again, and they go on waiting for one probe at a time (the key's coalescing window is not cut
/// to the short retry): one admission, whose reply refuses the rest — not one store call each.
#[tokio::test]
async fn a_denial_just_before_the_instant_keeps_the_waiters_coalesced() {
    let clock = clock();
    let store = Skewed::new(&unique_prefix("deny-cache-short"), &clock, 0, 0).await;
    let policy = Policy::token_bucket(Quota::per_second(1).unwrap());
    let cached = service(
        layer(store.clone(), policy)
            .deny_cache_config(DenyCacheConfig::new().steady_clock(clock.clone())),
    );
    {
        let mut svc = cached.clone();
        assert!(decide(&mut svc, "k", 1).await.is_allowed());
        assert!(!decide(&mut svc, "k", 1).await.is_allowed()); // cached until 1 s on, less 501 µs
    }
    assert_eq!(
        store.calls.load(Ordering::Relaxed),
        1,
        "the admission's reply made the entry"
    );
    clock.advance(Duration::from_micros(999_950));
    // Every reply now lands 200 µs after the store decided.
    *store.latency.lock().unwrap() = (0, 200);
    store.hold.store(true, Ordering::SeqCst);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let mut svc = cached.clone();
            tokio::spawn(async move { decide(&mut svc, "k", 1).await })
        })
        .collect();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        store.calls.load(Ordering::Relaxed),
        2,
        "one probe, seven waiting"
    );
    // The probe is denied 50 µs before the token accrues; its reply lands 150 µs after it did.
    store.gate.add_permits(1);
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 1, "the one token");
    assert_eq!(
        store.calls.load(Ordering::Relaxed),
        2 + 1,
        "after the short denial: the admission, whose reply refuses the other six"
    );
}

/// Redis deciding at a manual clock's instants, holding requests asked ahead; counting its calls and the
/// admissions it held.
struct Holding {
    inner: Clocked,
    held: AtomicUsize,
    /// Fail every request asked ahead (with a hold), as an unreachable store does.
    fail_held: std::sync::atomic::AtomicBool,
}

impl Holding {
    fn new(redis: Arc<RedisStore>, clock: &ManualClock, fail_held: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: Clocked {
                redis,
                clock: clock.clone(),
                calls: AtomicUsize::new(0),
            },
            held: AtomicUsize::new(0),
            fail_held: fail_held.into(),
        })
    }
}

impl Store for Holding {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.inner.check(key, policy, cost).await
    }
    async fn check_held(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        hold: Duration,
    ) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        inner.calls.fetch_add(1, Ordering::Relaxed);
        if !hold.is_zero() && self.fail_held.load(Ordering::Relaxed) {
            return Err(StoreError::CircuitOpen);
        }
        let decision = inner
            .redis
            .check_held_at(key, policy, cost, hold, inner.clock.now())
            .await?;
        if decision.is_allowed() && decision.retry_after.is_some() {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        Ok(decision)
    }
    fn is_shared(&self) -> bool {
        true
    }
}

/// µs after `start`.
fn after(start: Timestamp, micros: u64) -> Timestamp {
    Timestamp::from_micros(start.as_micros() + micros)
}

/// A flooded token bucket's next token is asked for just before its entry expires, and the request held until the
/// token accrues: admitted at the token's instant (the store's own decision there, checked against a twin), no
/// sooner, while the key's other requests are refused from the entries throughout — at the expiry too, with no
/// store call.
#[tokio::test]
async fn the_next_token_is_asked_for_ahead_and_held_until_it_accrues() {
    let clock = clock();
    let prefix = unique_prefix("deny-cache-ahead");
    let store = Holding::new(redis(&prefix).await, &clock, false);
    let twin = redis(&format!("{prefix}-twin")).await;
    let policy = Policy::token_bucket(Quota::per_second(100).unwrap().with_burst(1).unwrap());
    let mut svc = service(
        layer(store.clone(), policy)
            .deny_cache_config(DenyCacheConfig::new().steady_clock(clock.clone())),
    );
    let calls = || store.inner.calls.load(Ordering::Relaxed);
    let start = clock.now();
    // The burst's one token; its admission makes the entry for the next one, 10 ms on.
    assert!(decide(&mut svc, "k", 1).await.is_allowed());
    assert!(
        twin.check_at("dc:k", &policy, 1, start)
            .await
            .unwrap()
            .is_allowed()
    );
    clock.advance(Duration::from_millis(5));
    assert!(!decide(&mut svc, "k", 1).await.is_allowed());
    assert_eq!(calls(), 1, "refused from the entry");
    // 1.5 ms before the token: one request asks ahead and is held until it accrues.
    clock.advance(Duration::from_micros(3_500));
    let asked = std::time::Instant::now();
    let held = decide(&mut svc, "k", 1).await;
    let waited = asked.elapsed();
    assert!(held.is_allowed(), "{held:?}");
    assert_eq!((calls(), store.held.load(Ordering::Relaxed)), (2, 1));
    assert!(
        waited >= Duration::from_micros(1_500),
        "held {waited:?} only"
    );
    let plain = twin
        .check_at("dc:k", &policy, 1, clock.now())
        .await
        .unwrap();
    assert_eq!(
        plain.outcome,
        Outcome::Limited,
        "not yet the token's instant"
    );
    let token = plain.now.saturating_add(plain.retry_after.unwrap());
    assert_eq!(token, after(start, 10_000));
    let expected = twin.check_at("dc:k", &policy, 1, token).await.unwrap();
    assert!(expected.is_allowed());
    assert_eq!(held.retry_after, None);
    assert_eq!(
        held,
        Decision {
            now: token,
            ..expected
        },
        "the store's admission at the token's instant"
    );
    // Around and past the old entry's expiry: refused from the entry the held admission made, no store call,
    // as the store refuses them.
    for at in [9_000, 9_999, 10_000, 10_001, 14_000, 17_000] {
        clock.advance(
            Duration::from_micros(at)
                - Duration::from_micros(clock.now().as_micros() - start.as_micros()),
        );
        let got = decide(&mut svc, "k", 1).await;
        let expected = twin
            .check_at("dc:k", &policy, 1, clock.now())
            .await
            .unwrap();
        assert_eq!(got.outcome, Outcome::Limited, "at {at} µs");
        assert_eq!(
            (got.outcome, got.reset),
            (expected.outcome, expected.reset),
            "at {at} µs"
        );
        assert_eq!(calls(), 2, "at {at} µs");
    }
}

/// A store that does not hold (its `check_held` is `check`) is asked ahead once per key: the request comes back
/// refused within its hold, and the key's next entries wait for their expiry as before.
#[tokio::test]
async fn a_store_that_does_not_hold_is_asked_ahead_once() {
    let clock = clock();
    let store = Arc::new(Clocked {
        redis: redis(&unique_prefix("deny-cache-no-hold")).await,
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let policy = Policy::token_bucket(Quota::per_second(100).unwrap().with_burst(1).unwrap());
    let mut svc = service(
        layer(store.clone(), policy)
            .deny_cache_config(DenyCacheConfig::new().steady_clock(clock.clone())),
    );
    let calls = || store.calls.load(Ordering::Relaxed);
    assert!(decide(&mut svc, "k", 1).await.is_allowed());
    clock.advance(Duration::from_micros(8_500));
    assert!(!decide(&mut svc, "k", 1).await.is_allowed());
    assert_eq!(calls(), 2, "asked ahead, refused: the store held nothing");
    for token in 1..=3 {
        // Past the token's instant: one call, admitted, its entry refuses the key until the next token.
        clock.advance(Duration::from_micros(2_000));
        assert!(decide(&mut svc, "k", 1).await.is_allowed(), "token {token}");
        assert_eq!(calls(), 2 + token);
        clock.advance(Duration::from_micros(7_500));
        assert!(!decide(&mut svc, "k", 1).await.is_allowed());
        assert_eq!(calls(), 2 + token, "not asked ahead again");
        clock.advance(Duration::from_micros(500));
    }
}

/// A request asked ahead whose store call fails is refused from the entry that still covers it (as without asking
/// ahead), not by the failure policy — here one that admits —, and the key asks ahead no more until its next entry.
#[tokio::test]
async fn a_failed_ask_ahead_is_answered_by_the_entry() {
    let clock = clock();
    let store = Holding::new(
        redis(&unique_prefix("deny-cache-ahead-fails")).await,
        &clock,
        true,
    );
    let policy = Policy::token_bucket(Quota::per_second(100).unwrap().with_burst(1).unwrap());
    let mut svc = service(
        layer(store.clone(), policy)
            .on_store_error(tollgate_core::FailurePolicy::Open)
            .deny_cache_config(DenyCacheConfig::new().steady_clock(clock.clone())),
    );
    let calls = || store.inner.calls.load(Ordering::Relaxed);
    assert!(decide(&mut svc, "k", 1).await.is_allowed());
    clock.advance(Duration::from_micros(8_500));
    let refused = decide(&mut svc, "k", 1).await;
    assert_eq!(refused.outcome, Outcome::Limited, "{refused:?}");
    assert_eq!(calls(), 2, "asked ahead once");
    clock.advance(Duration::from_micros(500));
    assert!(!decide(&mut svc, "k", 1).await.is_allowed());
    assert_eq!(calls(), 2, "not asked ahead again");
    // Past the token's instant the key asks as before, and is admitted.
    clock.advance(Duration::from_micros(1_500));
    assert!(decide(&mut svc, "k", 1).await.is_allowed());
    assert_eq!((calls(), store.held.load(Ordering::Relaxed)), (3, 0));
}
