//! Each limiter of the stack keeps its own shadow mode, kill switch and failure policy: shadow mode admits what it
//! would reject, the switch turns enforcement on at run time, and when a private Redis dies the concurrency
//! limiter fails open, closed (503) or to an in-process count, as configured.

mod support;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tollgate_core::FailurePolicy;
use tollgate_core::slot::MemorySlotStore;
use tollgate_http::HttpLimitLayer;
use tollgate_http::key::HeaderKey;
use tollgate_http::priority::HeaderPriority;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::{ConcurrencyLimitLayer, FleetShedLayer, WorkerShedLayer};
use tollgate_tower::{Mode, Priority};

use support::{Gate, app, get, serve};

const ANN: &[(&str, &str)] = &[("x-client", "ann")];

fn client_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-client"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_admits_and_the_switch_enforces() {
    let leases = Arc::new(MemorySlotStore::new());
    let concurrency = ConcurrencyLimitLayer::new("in-flight", 1, leases.clone(), client_key())
        .unwrap()
        .shadow();
    let fleet = FleetShedLayer::new(2, leases, HeaderPriority::new())
        .unwrap()
        .reserve_percent(50)
        .unwrap()
        .shadow();
    let (concurrency_switch, fleet_switch) = (concurrency.enforcement(), fleet.enforcement());
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| {
        r.layer(HttpLimitLayer::new(concurrency))
            .layer(HttpLimitLayer::new(fleet))
    }))
    .await;

    let held = tokio::spawn(async move { get(addr, "/hold", ANN).await });
    gate.wait_entered(1).await;
    // Over both limits (ann's one slot, the fleet's one non-critical slot), yet admitted: shadow mode.
    assert_eq!(get(addr, "/fast", ANN).await.status, 200);
    assert_eq!(get(addr, "/fast", &[("x-client", "bob")]).await.status, 200);

    fleet_switch.set(Mode::Enforce);
    let shed = get(addr, "/fast", &[("x-client", "bob")]).await;
    assert_eq!(shed.status, 503, "{shed:#?}");
    concurrency_switch.set(Mode::Enforce);
    fleet_switch.set(Mode::Off); // the kill switch
    assert_eq!(get(addr, "/fast", ANN).await.status, 429);
    assert_eq!(get(addr, "/fast", &[("x-client", "bob")]).await.status, 200);

    gate.release(1);
    assert_eq!(held.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_shedder_in_shadow_mode_sheds_nothing() {
    let worker = WorkerShedLayer::new(2, HeaderPriority::new())
        .unwrap()
        .interval(Duration::from_millis(1))
        .step_percent(100)
        .unwrap()
        .shadow();
    let levels = worker.clone();
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(worker)))).await;
    let held = tokio::spawn(async move { get(addr, "/hold", &[("x-priority", "critical")]).await });
    gate.wait_entered(1).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(3)).await;
        assert_eq!(
            get(addr, "/fast", &[("x-priority", "low")]).await.status,
            200
        );
    }
    assert_eq!(
        levels.shed_percent(Priority::Low),
        100,
        "decided, not enforced"
    );
    levels.enforcement().set(Mode::Enforce);
    tokio::time::sleep(Duration::from_millis(3)).await;
    assert_eq!(
        get(addr, "/fast", &[("x-priority", "low")]).await.status,
        503
    );
    gate.release(1);
    assert_eq!(held.await.unwrap().status, 200);
}

async fn private_store(server: &RedisServer) -> Arc<RedisStore> {
    // Generous: the calls before the kill must not time out on a loaded machine; a killed server refuses at once.
    Arc::new(
        RedisStore::builder(server.url())
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_redis_dies_each_failure_policy_applies() {
    let mut server = RedisServer::start();
    let store = private_store(&server).await;
    let gate = Gate::new();
    let limit = |policy| {
        HttpLimitLayer::new(
            ConcurrencyLimitLayer::new("in-flight", 1, store.clone(), client_key())
                .unwrap()
                .on_store_error(policy),
        )
    };
    let open = serve(app(&gate, |r| r.layer(limit(FailurePolicy::Open)))).await;
    let closed = serve(app(&gate, |r| r.layer(limit(FailurePolicy::Closed)))).await;
    let local = serve(app(&gate, |r| r.layer(limit(FailurePolicy::Local)))).await;
    // The three share one lease key, and a finished request's lease is released by a spawned task: each one
    // waits (boundedly) for the previous release instead of racing it.
    for addr in [open, closed, local] {
        support::eventually(addr, "/fast", ANN, 200).await;
    }

    server.kill();
    assert_eq!(get(open, "/fast", ANN).await.status, 200, "fails open");
    let unavailable = get(closed, "/fast", ANN).await;
    assert_eq!(unavailable.status, 503, "fails closed: {unavailable:#?}");
    assert!(
        unavailable.body.contains("store_unavailable"),
        "{}",
        unavailable.body
    );
    assert_eq!(unavailable.header("retry-after"), "1");

    // Local: this instance counts in process, with the same limit.
    let held = tokio::spawn(async move { get(local, "/hold", ANN).await });
    gate.wait_entered(1).await;
    assert_eq!(
        get(local, "/fast", ANN).await.status,
        429,
        "the local count holds the limit"
    );
    assert_eq!(
        get(local, "/fast", &[("x-client", "bob")]).await.status,
        200
    );
    gate.release(1);
    assert_eq!(held.await.unwrap().status, 200);
    support::eventually(local, "/fast", ANN, 200).await;
}
