//! The server's half of the promise, per algorithm and on both stores: after any history of requests, a client
//! that spends the `r` a response's `RateLimit` field states (draft-ietf-httpapi-ratelimit-headers-11), at any
//! instants within its `t`, is admitted every time; and a refusal's `Retry-After` is never before `t`'s end.
//!
//! The fields are rendered by the server's code (`HeaderSet`) and read back by this crate's parser, so the two
//! halves are tested against each other; the decisions are the stores' own (`check_at`, at chosen instants:
//! no wall clock).
//!
//! The same for a key whose cost is charged after the response (`cost_after`): the history goes through a
//! `RateLimitLayer`, whose last response shows its admission with the charge (or refund) its real cost makes, and
//! what it shows is spent once the charge has landed.
//!
//! The same for both algorithms under token leases: the history goes through one leasing instance (batches
//! fetched, spent and left to end), whose last response shows its view, and what it shows is spent through that
//! instance.
//!
//! And for the concurrency limiter (`qu="concurrent-requests"`): after any history of requests started and
//! finished, the `r` an answer states is that many more requests admitted while every open one stays open.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use proptest::prelude::*;
use tollgate_client::fields::{Observation, Unit};
use tollgate_core::slot::{MemorySlotStore, SlotStore};
use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{
    Algorithm, Clock, Decision, LostCharge, ManualClock, MemoryStore, Policy, Quota, Store,
    StoreError, Timestamp,
};
use tollgate_http::headers::HeaderSet;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{redis_url, unique_prefix};
use tollgate_tower::{
    BoxError, ConcurrencyLimitLayer, CostAfter, FinalCost, LeaseConfig, PermitBody, RateLimitLayer,
    Rejection, Verdict, Verdicts,
};
use tower::ServiceExt as _;

const START: u64 = 1_700_000_000_000_000;

/// A policy, a history of requests before the response under test, and how the client spends what it says.
#[derive(Debug, Clone)]
struct Case {
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    burst: u64,
    /// (µs since the previous request, cost)
    history: Vec<(u64, u64)>,
    /// Where in `[now, now + t)` each unit is spent, as fractions in per mille (sorted when used).
    spend_at: Vec<u16>,
    /// Spend `r` as one request of cost `r` instead of `r` requests of cost 1.
    at_once: bool,
}

fn case(algorithm: Algorithm) -> impl Strategy<Value = Case> {
    (
        1u64..=20,
        prop::sample::select(vec![1_000u64, 1_500, 2_000, 3_000, 10_000]),
        0u64..=20,
        prop::collection::vec((0u64..1_500_000, 1u64..=3), 0..30),
        prop::collection::vec(0u16..1000, 0..60),
        any::<bool>(),
    )
        .prop_map(
            move |(limit, period_ms, extra, history, spend_at, at_once)| Case {
                algorithm,
                limit,
                period_ms,
                burst: if algorithm == Algorithm::TokenBucket {
                    limit + extra % (limit + 1)
                } else {
                    limit
                },
                history,
                spend_at,
                at_once,
            },
        )
}

impl Case {
    fn policy(&self) -> Policy {
        let quota = Quota::new(self.limit, Duration::from_millis(self.period_ms))
            .and_then(|q| q.with_burst(self.burst))
            .expect("a valid quota");
        Policy::new(self.algorithm, quota).expect("a valid policy")
    }
}

/// What the response to `decision` says: (r, t, Retry-After), through the server's rendering and this crate's
/// parser.
fn fields(policy: &Policy, decision: Decision) -> (u64, u64, Option<u64>) {
    let verdict = Verdict::new("api", policy.quota().window(), decision);
    let mut headers = HeaderMap::new();
    HeaderSet::IETF.render(&Verdicts::from(verdict.clone()), &mut headers);
    let said = Observation::read(StatusCode::OK, &headers);
    let limit = &said.limits[0];
    let t = limit
        .window
        .expect("a tollgate server always states t")
        .as_secs();
    let retry = (!decision.is_allowed())
        .then(|| Rejection::rate_limited(verdict).retry_after_secs())
        .flatten();
    (limit.remaining, t, retry)
}

/// Decides through a store at chosen instants.
trait Decide {
    fn at(&mut self, key: &str, policy: &Policy, cost: u64, now: Timestamp) -> Decision;
}

impl Decide for MemoryStore {
    fn at(&mut self, key: &str, policy: &Policy, cost: u64, now: Timestamp) -> Decision {
        self.check_at(key, policy, cost, now)
            .expect("in-process decisions cannot fail")
    }
}

struct Redis {
    store: RedisStore,
    runtime: tokio::runtime::Runtime,
}

impl Decide for Redis {
    fn at(&mut self, key: &str, policy: &Policy, cost: u64, now: Timestamp) -> Decision {
        self.runtime
            .block_on(self.store.check_at(key, policy, cost, now))
            .expect("the shared Redis answers")
    }
}

/// The shared Redis with a timeout far above any stall of a loaded machine: what is under test is the fields,
/// not the store's deadline (its 50 ms default would turn a busy moment into a failed case).
async fn shared_redis() -> Result<RedisStore, tollgate_redis::BuildError> {
    RedisStore::builder(redis_url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
}

fn redis() -> Redis {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime.block_on(shared_redis()).expect("the shared Redis");
    Redis { store, runtime }
}

/// Runs the history, reads the last response's fields, spends them: every spend admitted.
fn spend_what_is_said(store: &mut impl Decide, case: &Case) -> Result<(), TestCaseError> {
    let policy = case.policy();
    let key = unique_prefix("ratelimit-fields");
    let mut now = START;
    let mut last = store.at(&key, &policy, 1, Timestamp::from_micros(now));
    for &(gap, cost) in &case.history {
        now += gap;
        last = store.at(&key, &policy, cost, Timestamp::from_micros(now));
    }
    let (r, t, retry) = fields(&policy, last);
    if let Some(retry) = retry {
        prop_assert!(
            retry >= t,
            "Retry-After {retry} before the end of t={t}: {last:?}"
        );
    }
    prop_assert!(r <= policy.quota().burst());
    let decided = last.now.as_micros();
    let within = |per_mille: u16| decided + t * 1_000_000 * u64::from(per_mille) / 1000;
    if case.at_once {
        if r > 0 {
            let at = within(case.spend_at.first().copied().unwrap_or(0));
            let d = store.at(&key, &policy, r, Timestamp::from_micros(at));
            prop_assert!(
                d.is_allowed(),
                "r={r} at once, {}µs into t={t}: {d:?} after {last:?}",
                at - decided
            );
        }
        return Ok(());
    }
    let mut times: Vec<u64> = (0..r)
        .map(|i| within(case.spend_at.get(i as usize).copied().unwrap_or(999)))
        .collect();
    times.sort_unstable();
    for (i, at) in times.into_iter().enumerate() {
        let d = store.at(&key, &policy, 1, Timestamp::from_micros(at));
        prop_assert!(
            d.is_allowed(),
            "unit {i} of r={r}, {}µs into t={t}: {d:?} after {last:?}",
            at - decided
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn token_bucket_in_process(case in case(Algorithm::TokenBucket)) {
        spend_what_is_said(&mut MemoryStore::new(), &case)?;
    }

    #[test]
    fn sliding_window_in_process(case in case(Algorithm::SlidingWindowCounter)) {
        spend_what_is_said(&mut MemoryStore::new(), &case)?;
    }
}

proptest! {
    // Each case is a few dozen round trips to the shared Redis.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn token_bucket_on_redis(case in case(Algorithm::TokenBucket)) {
        spend_what_is_said(&mut redis(), &case)?;
    }

    #[test]
    fn sliding_window_on_redis(case in case(Algorithm::SlidingWindowCounter)) {
        spend_what_is_said(&mut redis(), &case)?;
    }
}

/// A history of requests through a `RateLimitLayer` that charges each request's real cost after its response,
/// then the last response's fields — shown with its charge — spent.
#[derive(Debug, Clone)]
struct Charged {
    case: Case,
    /// The last request's cost up front, and in the end (a charge if more, a refund if less).
    upfront: u64,
    real: u64,
}

fn charged(algorithm: Algorithm) -> impl Strategy<Value = Charged> {
    (case(algorithm), 0u64..=3, 0u64..=45).prop_map(|(case, upfront, real)| Charged {
        case,
        upfront,
        real,
    })
}

/// Redis deciding and charging at a manual clock's instants; a charge after the response is spawned, as
/// `RedisStore` does, and kept for the test to wait for.
struct ClockedRedis {
    store: RedisStore,
    clock: ManualClock,
    charges: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Store for ClockedRedis {
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.store.check_at(key, policy, cost, self.clock.now())
    }

    fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.store
            .charge_at(key, policy, delta, decided_at, self.clock.now())
    }

    fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> impl Future<Output = Result<TokenLeaseGrant, StoreError>> + Send {
        self.store
            .lease_tokens_at(key, policy, request, self.clock.now())
    }

    fn supports_token_leases(&self) -> bool {
        true
    }

    fn charge_detached(
        &self,
        key: String,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        _: LostCharge,
    ) {
        let (store, policy, now) = (self.store.clone(), *policy, self.clock.now());
        let charge = tokio::spawn(async move {
            store
                .charge_at(&key, &policy, delta, decided_at, now)
                .await
                .expect("Redis charges");
        });
        self.charges.lock().unwrap().push(charge);
    }
}

type Request = http::Request<(u64, u64)>;

/// The limiter under test: its up-front cost is the request's first number.
type Charging<St> = RateLimitLayer<String, St, fn(&Request) -> u64>;

/// The charges spawned so far, taken for the test to wait for (none in process: they land at once).
type Landed<'a> = &'a (dyn Fn() -> Vec<tokio::task::JoinHandle<()>> + Sync);

/// One request of `(up front, real)` cost through `layer` at `at`: its verdict (admitted or refused), once every
/// charge it caused has landed.
async fn send<St: Store>(
    layer: &Charging<St>,
    clock: &ManualClock,
    landed: Landed<'_>,
    at: u64,
    costs: (u64, u64),
) -> Verdict {
    clock.set(Timestamp::from_micros(at));
    let service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(|req: Request| async move {
            let mut response = http::Response::new(String::new());
            response.extensions_mut().insert(FinalCost(req.body().1));
            Ok::<_, BoxError>(response)
        });
    let verdict = match service.oneshot(http::Request::new(costs)).await {
        Ok(response) => response
            .extensions()
            .get::<Verdicts>()
            .and_then(|v| v.only())
            .cloned(),
        Err(err) => err
            .downcast_ref::<Rejection>()
            .and_then(|r| r.verdict())
            .cloned(),
    };
    for charge in landed() {
        charge.await.expect("the charge ran");
    }
    verdict.expect("every decision has a verdict")
}

/// How a client spends `r` within `t` from `decided` (µs): one request of cost `r` at the first of `spend_at`, or
/// `r` requests of cost 1 at the instants `spend_at` names (per mille of `t`, sorted; the rest at its end).
fn spends(decided: u64, t: u64, r: u64, spend_at: &[u16], at_once: bool) -> Vec<(u64, u64)> {
    let within = |per_mille: u16| decided + t * 1_000_000 * u64::from(per_mille) / 1000;
    if at_once {
        let at = within(spend_at.first().copied().unwrap_or(0));
        return (r > 0).then_some((at, r)).into_iter().collect();
    }
    let mut times: Vec<u64> = (0..r)
        .map(|i| within(spend_at.get(i as usize).copied().unwrap_or(999)))
        .collect();
    times.sort_unstable();
    times.into_iter().map(|at| (at, 1)).collect()
}

/// Runs the history through the layer (the last request charged after its response), reads the last response's
/// fields, lets its charge land, and spends them at once or unit by unit within `t`: every spend admitted.
async fn spend_what_is_said_after_a_charge<St: Store>(
    store: Arc<St>,
    clock: &ManualClock,
    landed: Landed<'_>,
    charged: &Charged,
) -> Result<(), TestCaseError> {
    let case = &charged.case;
    let policy = case.policy();
    let upfront: fn(&Request) -> u64 = |req| req.body().0;
    let layer = RateLimitLayer::new(
        "api",
        policy,
        store,
        unique_prefix("ratelimit-fields-charged"),
    )
    .cost(upfront)
    .cost_after(CostAfter::Extension);
    let mut now = START;
    send(&layer, clock, landed, now, (1, 1)).await;
    for &(gap, cost) in &case.history {
        now += gap;
        send(&layer, clock, landed, now, (cost, cost)).await;
    }
    now += 1;
    let last = send(&layer, clock, landed, now, (charged.upfront, charged.real)).await;
    let (r, t, _) = fields(&policy, last.decision);
    prop_assert!(r <= policy.quota().burst());
    let decided = last.decision.now.as_micros();
    let spends = spends(decided, t, r, &case.spend_at, case.at_once);
    for (i, (at, cost)) in spends.into_iter().enumerate() {
        let v = send(&layer, clock, landed, at, (cost, cost)).await;
        prop_assert!(
            v.decision.is_allowed(),
            "spend {i} (cost {cost}) of r={r}, {}µs into t={t}: {:?} after {last:?}",
            at - decided,
            v.decision
        );
    }
    Ok(())
}

fn in_process(charged: &Charged) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(Timestamp::from_micros(START));
    let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(spend_what_is_said_after_a_charge(
        store,
        &clock,
        &Vec::new,
        charged,
    ))
}

fn on_redis(charged: &Charged) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new(Timestamp::from_micros(START));
    let store = Arc::new(ClockedRedis {
        store: runtime.block_on(shared_redis()).expect("the shared Redis"),
        clock: clock.clone(),
        charges: Mutex::new(Vec::new()),
    });
    let charges = store.clone();
    let landed = move || std::mem::take(&mut *charges.charges.lock().unwrap());
    runtime.block_on(spend_what_is_said_after_a_charge(
        store, &clock, &landed, charged,
    ))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn token_bucket_charged_after_the_response_in_process(c in charged(Algorithm::TokenBucket)) {
        in_process(&c)?;
    }

    #[test]
    fn sliding_window_charged_after_the_response_in_process(
        c in charged(Algorithm::SlidingWindowCounter)
    ) {
        in_process(&c)?;
    }
}

proptest! {
    // Each case is a few dozen round trips to the shared Redis.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn token_bucket_charged_after_the_response_on_redis(c in charged(Algorithm::TokenBucket)) {
        on_redis(&c)?;
    }

    #[test]
    fn sliding_window_charged_after_the_response_on_redis(
        c in charged(Algorithm::SlidingWindowCounter)
    ) {
        on_redis(&c)?;
    }
}

/// The concurrency limiter's half: after any history of requests started and finished, a response's `r` is
/// how many more may start, and that many more started while the ones open stay open are all admitted. Its
/// policy states its ceiling in the unit `concurrent-requests`, and neither field a window.
#[derive(Debug, Clone)]
struct Slots {
    limit: u64,
    /// `true` starts a request (held open), `false` finishes the oldest open one.
    history: Vec<bool>,
}

fn slots() -> impl Strategy<Value = Slots> {
    (1u64..=6, prop::collection::vec(any::<bool>(), 0..24))
        .prop_map(|(limit, history)| Slots { limit, history })
}

/// What one request's answer says: admitted, its response (held open while kept) and (q, r) as read back.
async fn start<L: SlotStore>(
    layer: &ConcurrencyLimitLayer<String, L>,
) -> (bool, Option<http::Response<PermitBody<String>>>, (u64, u64)) {
    let service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(|_: http::Request<()>| async {
            Ok::<_, BoxError>(http::Response::new(String::new()))
        });
    let (admitted, response, verdict) = match service.oneshot(http::Request::new(())).await {
        Ok(response) => {
            let verdict = response
                .extensions()
                .get::<Verdicts>()
                .and_then(|v| v.only())
                .cloned();
            (true, Some(response), verdict)
        }
        Err(err) => {
            let verdict = err
                .downcast_ref::<Rejection>()
                .and_then(|r| r.verdict())
                .cloned();
            (false, None, verdict)
        }
    };
    let verdict = verdict.expect("every decision has a verdict");
    let mut headers = HeaderMap::new();
    HeaderSet::IETF.render(&Verdicts::from(verdict), &mut headers);
    let said = Observation::read(StatusCode::OK, &headers);
    let (policy, limit) = (&said.policies[0], &said.limits[0]);
    assert_eq!(policy.unit, Unit::ConcurrentRequests, "{headers:?}");
    assert_eq!((policy.window, limit.window), (None, None), "{headers:?}");
    (admitted, response, (policy.quota, limit.remaining))
}

async fn start_what_is_said<L: SlotStore>(
    store: Arc<L>,
    case: &Slots,
) -> Result<(), TestCaseError> {
    let key = unique_prefix("ratelimit-fields-slots");
    let layer = ConcurrencyLimitLayer::new("in-flight", case.limit, store, key).unwrap();
    let mut open = std::collections::VecDeque::new();
    for &starts in &case.history {
        if starts {
            if let (_, Some(response), _) = start(&layer).await {
                open.push_back(response);
            }
        } else {
            drop(open.pop_front());
        }
    }
    let (admitted, last, (q, r)) = start(&layer).await;
    prop_assert_eq!(q, case.limit);
    prop_assert!(r <= q);
    let mut kept = Vec::from_iter(last);
    for i in 0..r {
        let (admitted_too, response, _) = start(&layer).await;
        prop_assert!(
            admitted_too,
            "start {i} of r={r} (the answer admitted: {admitted}; {} open before it)",
            open.len()
        );
        kept.extend(response);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn concurrency_in_process(case in slots()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(start_what_is_said(Arc::new(MemorySlotStore::new()), &case))?;
    }
}

proptest! {
    // Each case is a few dozen round trips to the shared Redis.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn concurrency_on_redis(case in slots()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = runtime.block_on(shared_redis()).expect("the shared Redis");
        runtime.block_on(start_what_is_said(Arc::new(store), &case))?;
    }
}

/// The vectors above are draft -11's: a fresh key states its whole quota over the whole window.
#[test]
fn a_fresh_key_states_q_over_w() {
    let policy = Policy::token_bucket(Quota::per_minute(100).unwrap());
    let d = MemoryStore::new()
        .check_at("k", &policy, 1, Timestamp::from_micros(START))
        .unwrap();
    assert_eq!(fields(&policy, d), (99, 60, None));
}

/// Token leases: a history of requests through one leasing instance (batches fetched and spent, some left to
/// expire), then the last response's fields — this instance's view — spent through the same instance.
#[derive(Debug, Clone)]
struct Leased {
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    share_percent: u32,
    ttl_ms: u64,
    /// (µs since the previous request, cost)
    history: Vec<(u64, u64)>,
    spend_at: Vec<u16>,
    at_once: bool,
}

fn leased(algorithm: Algorithm) -> impl Strategy<Value = Leased> {
    (
        (
            20u64..=120,
            prop::sample::select(vec![1_000u64, 2_000, 10_000]),
            prop::sample::select(vec![10u32, 25, 50]),
            prop::sample::select(vec![100u64, 400, 1_000]),
        ),
        prop::collection::vec(
            (
                prop_oneof![0u64..5_000, 0u64..60_000, 0u64..1_500_000],
                1u64..=3,
            ),
            0..80,
        ),
        prop::collection::vec(0u16..1000, 0..120),
        any::<bool>(),
    )
        .prop_map(
            move |((limit, period_ms, share_percent, ttl_ms), history, spend_at, at_once)| Leased {
                algorithm,
                limit,
                period_ms,
                share_percent,
                ttl_ms,
                history,
                spend_at,
                at_once,
            },
        )
}

impl Leased {
    fn policy(&self) -> Policy {
        let quota =
            Quota::new(self.limit, Duration::from_millis(self.period_ms)).expect("a valid quota");
        Policy::new(self.algorithm, quota).expect("a valid policy")
    }
}

/// The leasing limiter under test: each request's cost is its body.
type Leasing<St> = RateLimitLayer<String, St, fn(&http::Request<u64>) -> u64>;

/// One request of `cost` through the leasing instance at `at`, and the fetches it started landed at that instant
/// (a store that answers before the clock moves on): its verdict.
async fn send_leased<S, St: Store>(
    service: &mut S,
    leases: &Leasing<St>,
    clock: &ManualClock,
    at: u64,
    cost: u64,
) -> Verdict
where
    S: tower::Service<http::Request<u64>, Response = http::Response<String>, Error = BoxError>,
{
    clock.set(Timestamp::from_micros(at));
    let verdict = match service
        .ready()
        .await
        .expect("ready")
        .call(http::Request::new(cost))
        .await
    {
        Ok(response) => response
            .extensions()
            .get::<Verdicts>()
            .and_then(|v| v.only())
            .cloned(),
        Err(err) => err
            .downcast_ref::<Rejection>()
            .and_then(|r| r.verdict())
            .cloned(),
    };
    leases.leases_settled().await;
    verdict.expect("every decision has a verdict")
}

/// Runs the history through one leasing instance, reads the last response's fields, and spends them through the
/// same instance at once or unit by unit within `t`: every spend admitted.
async fn spend_what_is_said_under_leases<St: Store>(
    store: Arc<St>,
    clock: &ManualClock,
    case: &Leased,
) -> Result<(), TestCaseError> {
    let policy = case.policy();
    let cost: fn(&http::Request<u64>) -> u64 = |req| *req.body();
    let config = LeaseConfig::new()
        .share_percent(case.share_percent)
        .expect("a valid share")
        .ttl(Duration::from_millis(case.ttl_ms))
        .clock(clock.clone());
    let layer: Leasing<St> = RateLimitLayer::new(
        "api",
        policy,
        store,
        unique_prefix("ratelimit-fields-leased"),
    )
    .cost(cost)
    .leases(config);
    let leases = layer.clone(); // shares the leases
    let mut service =
        tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: http::Request<u64>| async {
                Ok::<_, BoxError>(http::Response::new(String::new()))
            });
    let mut now = START;
    let mut last = send_leased(&mut service, &leases, clock, now, 1).await;
    for &(gap, cost) in &case.history {
        now += gap;
        last = send_leased(&mut service, &leases, clock, now, cost).await;
    }
    let (r, t, retry) = fields(&policy, last.decision);
    if let Some(retry) = retry {
        prop_assert!(
            retry >= t,
            "Retry-After {retry} before the end of t={t}: {last:?}"
        );
    }
    prop_assert!(r <= policy.quota().burst());
    let decided = last.decision.now.as_micros();
    let spends = spends(decided, t, r, &case.spend_at, case.at_once);
    for (i, (at, cost)) in spends.into_iter().enumerate() {
        let v = send_leased(&mut service, &leases, clock, at, cost).await;
        prop_assert!(
            v.decision.is_allowed(),
            "spend {i} (cost {cost}) of r={r}, {}µs into t={t}: {:?} after {last:?}",
            at - decided,
            v.decision
        );
    }
    leases.leases_shutdown().await;
    Ok(())
}

fn leased_in_process(case: &Leased) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(Timestamp::from_micros(START));
    let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    // Paused time: the lease table's idle sweep runs only when the test waits, never on the machine's clock.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(spend_what_is_said_under_leases(store, &clock, case))
}

fn leased_on_redis(case: &Leased) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new(Timestamp::from_micros(START));
    let store = Arc::new(ClockedRedis {
        store: runtime.block_on(shared_redis()).expect("the shared Redis"),
        clock: clock.clone(),
        charges: Mutex::new(Vec::new()),
    });
    runtime.block_on(spend_what_is_said_under_leases(store, &clock, case))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn token_bucket_under_leases_in_process(case in leased(Algorithm::TokenBucket)) {
        leased_in_process(&case)?;
    }

    #[test]
    fn sliding_window_under_leases_in_process(case in leased(Algorithm::SlidingWindowCounter)) {
        leased_in_process(&case)?;
    }
}

proptest! {
    // Each case is a few dozen round trips to the shared Redis.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn token_bucket_under_leases_on_redis(case in leased(Algorithm::TokenBucket)) {
        leased_on_redis(&case)?;
    }

    #[test]
    fn sliding_window_under_leases_on_redis(case in leased(Algorithm::SlidingWindowCounter)) {
        leased_on_redis(&case)?;
    }
}
