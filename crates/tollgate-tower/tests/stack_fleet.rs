//! The fleet-usage shedder: two instances (separate servers and Redis pools) sharing the fleet-wide lease set keep
//! non-critical requests within (100 − reserve) % of fleet capacity, while critical requests still pass.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tollgate_http::HttpLimitLayer;
use tollgate_http::priority::HeaderPriority;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{cli_url, redis_url, unique_prefix};
use tollgate_tower::FleetShedLayer;
use tollgate_tower::Priority;

use support::{Gate, app, eventually, get, redis_instance, serve};

const NORMAL: &[(&str, &str)] = &[("x-priority", "normal")];
const CRITICAL: &[(&str, &str)] = &[("x-priority", "critical")];

fn shedder(store: Arc<RedisStore>) -> FleetShedLayer<HeaderPriority, RedisStore> {
    // 5 in flight fleet-wide, 40 % (2) reserved for critical: non-critical requests stop at 3.
    FleetShedLayer::new(5, store, HeaderPriority::new())
        .unwrap()
        .reserve_percent(40)
        .unwrap()
}

fn live_leases(redis_key: &str) -> u64 {
    let time = cli_url(&redis_url(), &["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let now_ms = parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000;
    cli_url(
        &redis_url(),
        &["ZCOUNT", redis_key, &format!("({now_ms}"), "+inf"],
    )
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_keep_non_critical_within_the_unreserved_share() {
    let namespace = unique_prefix("fleet");
    let (store_a, store_b) = (
        redis_instance(&namespace).await,
        redis_instance(&namespace).await,
    );
    let fleet_key = store_a.slot_key("fleet");
    assert_eq!(
        shedder(store_a.clone()).ceiling(Priority::Normal),
        3,
        "5 × (100 − 40) %"
    );
    let (gate_a, gate_b) = (Gate::new(), Gate::new());
    let a = serve(app(&gate_a, |r| {
        r.layer(HttpLimitLayer::new(shedder(store_a)))
    }))
    .await;
    let b = serve(app(&gate_b, |r| {
        r.layer(HttpLimitLayer::new(shedder(store_b)))
    }))
    .await;

    // Ten non-critical requests at once, five per instance, each held in the handler if admitted.
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let addr = if i % 2 == 0 { a } else { b };
            tokio::spawn(async move { get(addr, "/hold", NORMAL).await })
        })
        .collect();
    let entered = || gate_a.entered.load(Ordering::SeqCst) + gate_b.entered.load(Ordering::SeqCst);
    for _ in 0..1000 {
        if tasks.iter().filter(|t| t.is_finished()).count() == 7 && entered() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(entered(), 3, "exactly the unreserved share is in flight");
    assert_eq!(live_leases(&fleet_key), 3);
    let (mut shed, mut held) = (0, Vec::new());
    for task in tasks {
        if task.is_finished() {
            let reply = task.await.unwrap();
            assert_eq!(reply.status, 503, "{reply:#?}");
            assert_eq!(reply.header("retry-after"), "1");
            assert!(
                reply
                    .body
                    .contains("http-problem-types#temporary-reduced-capacity")
                    && reply.body.contains(r#""kind":"shed""#),
                "{}",
                reply.body
            );
            shed += 1;
        } else {
            held.push(task);
        }
    }
    assert_eq!(shed, 7);

    // Critical requests still pass, on either instance, up to the full capacity …
    let critical = [
        tokio::spawn(async move { get(a, "/hold", CRITICAL).await }),
        tokio::spawn(async move { get(b, "/hold", CRITICAL).await }),
    ];
    for _ in 0..1000 {
        if entered() == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(entered(), 5, "critical requests use the reserve");
    assert_eq!(live_leases(&fleet_key), 5);
    // … and no further: the fleet is full for everyone.
    assert_eq!(get(a, "/fast", CRITICAL).await.status, 503);
    assert_eq!(get(b, "/fast", NORMAL).await.status, 503);

    gate_a.release(5);
    gate_b.release(5);
    for task in held.into_iter().chain(critical) {
        assert_eq!(task.await.unwrap().status, 200);
    }
    // Finished requests gave their leases back.
    eventually(a, "/fast", NORMAL, 200).await;
    eventually(b, "/fast", NORMAL, 200).await;
    let ttl: i64 = cli_url(&redis_url(), &["PTTL", &fleet_key])
        .parse()
        .unwrap();
    assert!(
        ttl == -2 || ttl > 0,
        "the fleet key is gone or has a TTL: {ttl}"
    );
}
