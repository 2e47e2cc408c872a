//! A charge after the response that cannot reach the store is counted in `tollgate_charges_lost_total{limiter}`,
//! for a single limiter and for a limiter in a set (both forward their verdicts: the default responder `()` reads
//! the real cost through `VerdictSink::final_cost`, here of a response type of the test's own). Real Redis, killed while the
//! request is being served.

mod counts;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use counts::Counts;
use tollgate_core::{Policy, Quota};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::limit::rate::RateLimitSetLayer;
use tollgate_tower::observe::CHARGES_LOST_TOTAL;
use tollgate_tower::{BoxError, CostAfter, RateLimitLayer, VerdictSink, Verdicts};
use tower::{Layer, Service, ServiceExt};

/// A response stating its real cost, read by the limiter after it is ready.
#[derive(Debug, Default)]
struct Reply {
    verdicts: Verdicts,
    cost: u64,
}

impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.verdicts
    }

    fn final_cost(&self, source: &CostAfter) -> Option<u64> {
        (*source == CostAfter::Extension).then_some(self.cost)
    }
}

/// Waits (bounded) for `counter` to reach `want`: the charge runs as a task after the response.
async fn wait_for(counts: &Counts, limiter: &str, want: u64) {
    for _ in 0..1_000 {
        if counts.get(CHARGES_LOST_TOTAL, &[("limiter", limiter)]) >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        counts.get(CHARGES_LOST_TOTAL, &[("limiter", limiter)]),
        want,
        "{limiter}"
    );
}

/// A store on a private Redis server of its own, which the handler can kill.
async fn private_store() -> (Arc<Mutex<RedisServer>>, Arc<RedisStore>) {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("the private Redis");
    (Arc::new(Mutex::new(redis)), Arc::new(store))
}

/// Serves a reply of cost 4, killing `redis` first when the request asks for it.
fn handler(
    redis: Arc<Mutex<RedisServer>>,
) -> impl Service<bool, Response = Reply, Error = BoxError, Future: Send> + Clone {
    tower::service_fn(move |kill: bool| {
        if kill {
            redis.lock().unwrap().kill();
        }
        async {
            Ok::<_, BoxError>(Reply {
                verdicts: Verdicts::default(),
                cost: 4,
            })
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_that_cannot_reach_the_store_is_counted() {
    let counts = Counts::default();
    metrics::set_global_recorder(counts.clone()).expect("the only recorder in this test binary");
    let policy = Policy::token_bucket(Quota::per_hour(10).unwrap());
    let (single_redis, single_store) = private_store().await;
    let (set_redis, set_store) = private_store().await;
    let single =
        RateLimitLayer::new("single", policy, single_store, "k").cost_after(CostAfter::Extension);
    let in_set =
        RateLimitLayer::new("in-set", policy, set_store, "k").cost_after(CostAfter::Extension);
    let set = RateLimitSetLayer::new([(in_set.clone(), true)]);
    let mut single_svc = single.layer(handler(single_redis));
    let mut set_svc = set.layer(handler(set_redis));

    // Redis up: each charge lands (1 up front, 3 after), and nothing is lost.
    single_svc.ready().await.unwrap().call(false).await.unwrap();
    set_svc.ready().await.unwrap().call(false).await.unwrap();
    for layer in [&single, &in_set] {
        let mut left = 0;
        for _ in 0..500 {
            left = layer.peek(&false).await.expect("peek").remaining;
            if left == 5 {
                break; // a request of cost 1 would leave 5: 4 spent
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(left, 5, "the charge landed");
    }
    assert_eq!(counts.get(CHARGES_LOST_TOTAL, &[("limiter", "single")]), 0);
    assert_eq!(counts.get(CHARGES_LOST_TOTAL, &[("limiter", "in-set")]), 0);

    // Redis killed while the request is served: it was decided, and its charge cannot land.
    single_svc.ready().await.unwrap().call(true).await.unwrap();
    wait_for(&counts, "single", 1).await;
    assert_eq!(
        counts.get(CHARGES_LOST_TOTAL, &[("limiter", "in-set")]),
        0,
        "per limiter"
    );
    set_svc.ready().await.unwrap().call(true).await.unwrap();
    wait_for(&counts, "in-set", 1).await;
    assert_eq!(counts.get(CHARGES_LOST_TOTAL, &[("limiter", "single")]), 1);
}
