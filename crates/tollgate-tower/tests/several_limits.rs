//! A set of limiters decides a request as one: over random sequences of requests and clock steps, against
//! random mixes of token buckets and sliding windows, a request is admitted exactly when every limiter would
//! admit it, a refusal leaves every limiter's state as it was, and its retry is the latest of the refusing
//! limiters', and the set's peek is every limiter's — in process, on a real Redis deciding at the same manual
//! instants (in one script call per request, and one call per limit with give-backs), and on a Redis Cluster.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use tollgate_core::{
    Check, Clock, Decision, ManualClock, MemoryStore, Policy, Quota, Store, StoreError, Timestamp,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{redis_url, unique_prefix};
use tollgate_tower::limit::rate::RateLimitSetLayer;
use tollgate_tower::{BoxError, KeyError, RateLimitLayer, Rejection, VerdictSink, Verdicts};
use tower::{Service, ServiceExt};

/// A request: its cost.
type Req = u64;

#[derive(Debug, Default)]
struct Reply(Verdicts);
impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.0
    }
}

type KeyOf = fn(&Req, &mut String) -> Result<(), KeyError>;
type CostOf = fn(&Req) -> u64;
type Limit<St> = RateLimitLayer<KeyOf, St, CostOf>;

fn layer<St: Store>(name: &str, policy: Policy, store: Arc<St>) -> Limit<St> {
    fn key(_: &Req, key: &mut String) -> Result<(), KeyError> {
        key.push_str("client");
        Ok(())
    }
    fn cost(req: &Req) -> u64 {
        *req
    }
    RateLimitLayer::new(name.to_owned(), policy, store, key as KeyOf).cost(cost as CostOf)
}

/// Redis deciding, peeking and charging at a manual clock's instants; shared, as Redis is. `joint`: a set's
/// limiters are decided in one script call (as `RedisStore` decides them), else one call each and give-backs (as
/// on a Redis Cluster whose limits' keys are in different slots).
struct Clocked {
    redis: RedisStore,
    clock: ManualClock,
    joint: bool,
}

impl Store for Clocked {
    fn check_all(
        &self,
        checks: &[Check<'_>],
    ) -> Option<impl Future<Output = Result<Vec<Decision>, StoreError>> + Send> {
        if !self.joint {
            return None;
        }
        self.redis.check_all_at(checks, self.clock.now())
    }
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.redis
            .check_at(key, policy, cost, self.clock.now())
            .await
    }
    async fn peek(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.redis
            .peek_at(key, policy, cost, self.clock.now())
            .await
    }
    async fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.redis
            .charge_at(key, policy, delta, decided_at, self.clock.now())
            .await
    }
    fn is_shared(&self) -> bool {
        true
    }
}

/// One limiter: sliding window or token bucket, its limit and period in seconds.
fn policy((sliding, limit, secs): (bool, u64, u64)) -> Policy {
    let quota = Quota::new(limit, Duration::from_secs(secs)).expect("a valid quota");
    if sliding {
        Policy::sliding_window(quota).expect("no burst of its own")
    } else {
        Policy::token_bucket(quota)
    }
}

fn limits() -> impl Strategy<Value = Vec<(bool, u64, u64)>> {
    prop::collection::vec((any::<bool>(), 1..6u64, 1..10u64), 2..5)
}

/// Steps: milliseconds to move the clock on, then a request of that cost.
fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0..2_500u64, 1..4u64), 1..40)
}

/// Runs `steps` through a set of `limits` on `store` (whose instants `clock` gives) and checks every decision. The
/// deny cache is off: it keeps time by its own clock, not the manual one (the example servers' tests cover it).
///
/// `calls` counts the store's round trips, where they are counted and one decides the whole set: every request
/// then costs exactly one, admitted or refused.
async fn run<St: Store>(
    store: Arc<St>,
    clock: &ManualClock,
    prefix: &str,
    limits: &[(bool, u64, u64)],
    steps: &[(u64, u64)],
    calls: impl Fn() -> Option<u64>,
) -> Result<(), TestCaseError> {
    let layers: Vec<Limit<St>> = limits
        .iter()
        .enumerate()
        .map(|(i, l)| layer(&format!("{prefix}{i}"), policy(*l), store.clone()).deny_cache(false))
        .collect();
    let set = RateLimitSetLayer::new(layers.iter().cloned().map(|l| (l, true)));
    let mut svc = tower::ServiceBuilder::new()
        .layer(set.clone())
        .service_fn(|_: Req| async { Ok::<_, BoxError>(Reply::default()) });
    for &(ms, cost) in steps {
        clock.advance(Duration::from_millis(ms));
        let mut before = Vec::with_capacity(layers.len());
        for l in &layers {
            before.push(l.peek(&cost).await.expect("a peek"));
        }
        let peeked: Vec<Decision> = set
            .peek(&cost)
            .await
            .expect("a peek")
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        prop_assert_eq!(&peeked, &before, "the set's peek is every limiter's");
        let every = before.iter().all(Decision::is_allowed);
        let calls_before = calls();
        let result = svc.ready().await.expect("ready").call(cost).await;
        prop_assert_eq!(result.is_ok(), every, "every limit admits: {:?}", before);
        if let (Some(before), Some(after)) = (calls_before, calls()) {
            prop_assert_eq!(after - before, 1, "one round trip decides the set");
        }
        let Err(err) = result else { continue };
        let rejection = err.downcast_ref::<Rejection>().expect("a rejection");
        let latest = before
            .iter()
            .filter(|d| !d.is_allowed())
            .map(|d| d.retry_after.unwrap_or(Duration::MAX))
            .max();
        prop_assert_eq!(
            rejection.retry_after().unwrap_or(Duration::MAX),
            latest.expect("a refusing limit"),
            "the latest retry of the refusing limits"
        );
        // Every other limit is listed with what it has left: an admitting one with its cost unspent.
        let listed: Vec<_> = std::iter::once(rejection.verdict().expect("a verdict"))
            .chain(rejection.admitted())
            .map(|v| (v.limiter.to_string(), v.decision))
            .collect();
        for (i, was) in before.iter().enumerate() {
            let name = format!("{prefix}{i}");
            let shown = listed.iter().find(|(n, _)| *n == name).map(|(_, d)| d);
            let shown = shown.ok_or_else(|| TestCaseError::fail(format!("{name} not listed")))?;
            if was.is_allowed() {
                prop_assert_eq!(
                    shown.remaining,
                    was.remaining + cost,
                    "{} has its cost back",
                    name
                );
            }
        }
        for (l, was) in layers.iter().zip(&before) {
            let now = l.peek(&cost).await.expect("a peek");
            prop_assert_eq!(
                (now.outcome, now.remaining, now.reset, now.retry_after),
                (was.outcome, was.remaining, was.reset, was.retry_after),
                "a refusal spends nothing"
            );
        }
    }
    Ok(())
}

/// A manual clock at the current wall-clock second (Redis TTLs then stay near real time).
fn clock() -> ManualClock {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    ManualClock::new(Timestamp::from_micros(secs * 1_000_000))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn in_process_a_set_decides_as_one(limits in limits(), steps in steps()) {
        let clock = clock();
        let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
        runtime().block_on(run(store, &clock, "l", &limits, &steps, || None))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn on_redis_a_set_decides_as_one(limits in limits(), steps in steps(), joint in any::<bool>()) {
        let clock = clock();
        let rt = runtime();
        rt.block_on(async {
            let redis = RedisStore::builder(redis_url())
                .namespace(unique_prefix("several"))
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .expect("Redis answers");
            let store = Arc::new(Clocked { redis, clock: clock.clone(), joint });
            let counted = store.clone();
            let calls = move || joint.then(|| counted.redis.script_calls());
            run(store, &clock, "l", &limits, &steps, calls).await
        })?;
    }
}

/// On a private 3-primary Redis Cluster (one for every case, each case on keys of its own): a set's keys are in different hash slots
/// (one script call cannot take them), so each limit is decided on its own node and a refusal gives back.
#[test]
fn on_a_redis_cluster_a_set_decides_as_one() {
    let cluster = tollgate_testkit::redis::RedisCluster::start(3);
    let rt = runtime();
    let redis = rt.block_on(async {
        RedisStore::cluster_builder(cluster.urls())
            .namespace(unique_prefix("several"))
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("the cluster answers")
    });
    let clock = clock();
    let store = Arc::new(Clocked {
        redis,
        clock: clock.clone(),
        joint: true,
    });
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(8));
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&(limits(), steps()), |(limits, steps)| {
            // A key prefix of its own per case (and per shrinking step): no case sees another's state.
            let prefix = format!(
                "c{}-",
                case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            rt.block_on(run(store.clone(), &clock, &prefix, &limits, &steps, || {
                None
            }))
        })
        .expect("the set decides as one on a Cluster");
}
