//! The whole stack on axum over real TCP: on a router (every limiter on the shared Redis) and on one route
//! (in process), in the documented order.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get as route_get;
use http::HeaderName;
use tollgate_core::slot::MemorySlotStore;
use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_http::HttpLimitLayer;
use tollgate_http::key::HeaderKey;
use tollgate_http::priority::HeaderPriority;
use tollgate_testkit::redis::{cli_url, redis_url, unique_prefix};
use tollgate_tower::{ConcurrencyLimitLayer, FleetShedLayer, StackLayer, WorkerShedLayer};
use tollgate_tower::{KeyExtractor, Priority, RateLimitLayer};

use support::{Gate, app, get, redis_instance, serve};

fn client_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-client"))
}

fn per_hour(n: u64) -> Policy {
    Policy::token_bucket(Quota::per_hour(n).unwrap())
}

fn client(name: &'static str) -> [(&'static str, &'static str); 1] {
    [("x-client", name)]
}

/// Waits until no lease is live on `redis_key` (the release is a spawned task).
async fn until_released(redis_key: &str) {
    for _ in 0..500 {
        let time = cli_url(&redis_url(), &["TIME"]);
        let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
        let now_ms = parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000;
        let live = cli_url(
            &redis_url(),
            &["ZCOUNT", redis_key, &format!("({now_ms}"), "+inf"],
        );
        if live == "0" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the lease on {redis_key} was never released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_on_a_router_over_redis() {
    let store = redis_instance(&unique_prefix("stack-axum")).await;
    let stack = StackLayer::new()
        .worker_shedder(WorkerShedLayer::new(100, HeaderPriority::new()).unwrap())
        .rate_limit(RateLimitLayer::new(
            "per-client",
            per_hour(4),
            store.clone(),
            client_key(),
        ))
        .concurrency_limit(
            ConcurrencyLimitLayer::new("in-flight", 1, store.clone(), client_key()).unwrap(),
        )
        .fleet_shedder(FleetShedLayer::new(50, store.clone(), HeaderPriority::new()).unwrap());
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(stack)))).await;
    let ann = client("ann");
    let ann_leases = {
        let req = http::Request::builder()
            .header("x-client", "ann")
            .body(())
            .unwrap();
        let mut key = "in-flight:".to_owned();
        client_key().extract(&req, &mut key).unwrap();
        store.slot_key(&key)
    };

    let held = tokio::spawn(async move { get(addr, "/hold", &client("ann")).await });
    gate.wait_entered(1).await;
    assert_eq!(
        cli_url(&redis_url(), &["ZCARD", &store.slot_key("fleet")]),
        "1",
        "the held request has a fleet lease"
    );
    // Ann already has a request in flight: the concurrency limiter rejects, after the rate limiter counted it.
    let second = get(addr, "/fast", &ann).await;
    assert_eq!(second.status, 429, "{second:#?}");
    assert!(
        second.body.contains("concurrency_limited"),
        "{}",
        second.body
    );
    assert_eq!(
        get(addr, "/fast", &client("bob"))
            .await
            .header("x-ratelimit-remaining"),
        "3"
    );

    gate.release(1);
    let held = held.await.unwrap();
    assert_eq!(held.status, 200);
    assert_eq!(held.header("x-ratelimit-remaining"), "3");
    assert_eq!(
        held.header("ratelimit-policy"),
        r#""per-client";q=4;w=3600, "in-flight";q=1;qu="concurrent-requests""#
    );
    until_released(&ann_leases).await;

    // Two tokens were taken (the held request and the rejected one): two remain.
    for remaining in ["1", "0"] {
        let reply = get(addr, "/fast", &ann).await;
        assert_eq!(reply.status, 200, "{reply:#?}");
        assert_eq!(reply.header("x-ratelimit-remaining"), remaining);
        until_released(&ann_leases).await;
    }
    let limited = get(addr, "/fast", &ann).await;
    assert_eq!(limited.status, 429);
    assert!(limited.body.contains("rate_limited"), "{}", limited.body);
    // The bucket is empty: the next token (4 per hour) is 900 s away, which is what `t` and Retry-After say.
    assert_eq!(limited.header("ratelimit"), "\"per-client\";r=0;t=900");
    assert_eq!(limited.header("retry-after"), "900");
    assert_eq!(
        cli_url(&redis_url(), &["EXISTS", &ann_leases]),
        "0",
        "a rate-limited request never took a lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_on_one_route_and_shed_requests_spend_no_rate_tokens() {
    let leases = Arc::new(MemorySlotStore::new());
    let worker = WorkerShedLayer::new(5, HeaderPriority::new())
        .unwrap()
        .interval(Duration::from_millis(1))
        .step_percent(100)
        .unwrap();
    let levels = worker.clone();
    let stack = StackLayer::new()
        .worker_shedder(worker)
        .rate_limit(RateLimitLayer::new(
            "per-client",
            per_hour(3),
            Arc::new(MemoryStore::new()),
            client_key(),
        ))
        .concurrency_limit(
            ConcurrencyLimitLayer::new("in-flight", 1, leases.clone(), client_key()).unwrap(),
        )
        .fleet_shedder(FleetShedLayer::new(100, leases, HeaderPriority::new()).unwrap());
    let gate = Gate::new();
    let app: Router = Router::new()
        .route(
            "/hold",
            route_get(support::hold).layer(HttpLimitLayer::new(stack.clone())),
        )
        .route(
            "/limited",
            route_get(|| async { "limited" }).layer(HttpLimitLayer::new(stack)),
        )
        .route("/open", route_get(|| async { "open" }))
        .with_state(gate.clone());
    let addr = serve(app).await;

    // Three critical requests from three clients hold 60 % of the worker's capacity of 5.
    let holders: Vec<_> = ["ops-1", "ops-2", "ops-3"]
        .into_iter()
        .map(|who| {
            tokio::spawn(async move {
                get(
                    addr,
                    "/hold",
                    &[("x-client", who), ("x-priority", "critical")],
                )
                .await
            })
        })
        .collect();
    gate.wait_entered(3).await;
    // Ann's low-priority requests are shed by the worker shedder, first in the stack …
    let low = [("x-client", "ann"), ("x-priority", "low")];
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(3)).await;
        let reply = get(addr, "/limited", &low).await;
        assert_eq!(reply.status, 503, "{reply:#?}");
    }
    assert_eq!(levels.shed_percent(Priority::Low), 100);
    assert_eq!(
        get(addr, "/open", &low).await.status,
        200,
        "routes without the stack are not limited"
    );

    gate.release(3);
    for holder in holders {
        assert_eq!(holder.await.unwrap().status, 200);
    }
    for _ in 0..100 {
        if levels.shed_percent(Priority::Low) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
        get(
            addr,
            "/limited",
            &[("x-client", "ops-1"), ("x-priority", "critical")],
        )
        .await;
    }
    assert_eq!(levels.shed_percent(Priority::Low), 0);
    // … so they spent none of ann's rate tokens: her first admitted request finds the bucket full.
    let reply = get(addr, "/limited", &low).await;
    assert_eq!(reply.status, 200, "{reply:#?}");
    assert_eq!(reply.header("x-ratelimit-remaining"), "2");
}
