//! RedisStore against a healthy Redis that answers slowly: every reply some tens of milliseconds late (another
//! region), with a stall that cuts decisions off. Once the stall is over the store decides again by itself, although
//! making a connection again (connect, `SCRIPT LOAD`, then the decision: three replies) would not fit into one
//! decision's budget.

mod common;

use std::time::{Duration, Instant};

use tollgate_core::Store;
use tollgate_redis::RedisStore;
use tollgate_testkit::proxy::LatencyProxy;
use tollgate_testkit::redis::RedisServer;

/// Every reply's delay: a decision (one reply) fits the budget with room for a busy machine; a new connection and
/// its first decision (three replies, 120 ms) do not.
const DELAY: Duration = Duration::from_millis(40);
const BUDGET: Duration = Duration::from_millis(100);

#[tokio::test]
async fn a_slow_redis_is_used_again_after_a_stall_cut_decisions_off() {
    let server = RedisServer::start();
    let proxy = LatencyProxy::start(&format!("127.0.0.1:{}", server.port()), DELAY);
    let store = RedisStore::builder(proxy.url())
        .namespace("slow")
        .timeout(BUDGET)
        .circuit_breaker(3, Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let policy = common::hourly_bucket(1_000_000);

    // The stall cuts off every decision sent during it: the store counts them as failures and opens its circuit.
    proxy.stall(Duration::from_millis(600));
    let mut failed = 0;
    let stalled = Instant::now();
    while stalled.elapsed() < Duration::from_millis(500) {
        if store.check("k", &policy, 1).await.is_err() {
            failed += 1;
        }
    }
    assert!(
        failed > 0,
        "a stall of 600 ms with a 100 ms budget failed no decision"
    );

    // Redis answers within the budget again: the store decides again, without a restart. (Before, each cut-off
    // call replaced its connection, and every replacement was cut off by the next decision's budget: never.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut errors = Vec::new();
    let resumed = loop {
        match store.check("k", &policy, 1).await {
            Ok(decision) => break decision,
            Err(e) => errors.push(e.to_string()),
        }
        assert!(
            Instant::now() < deadline,
            "no decision within 10 s of the stall's end; errors: {:?}",
            &errors[errors.len().saturating_sub(5)..]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(resumed.is_allowed());
}

/// A busy machine: the only worker is blocked for longer than the budget while a healthy Redis's reply is on its
/// way. The reply is there when the worker runs again; the decision is Redis's, not a timeout.
#[tokio::test(flavor = "current_thread")]
async fn a_worker_blocked_past_the_budget_does_not_fail_a_decision_redis_answered() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .namespace("busy")
        .timeout(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let policy = common::hourly_bucket(1_000_000);
    store.check("k", &policy, 1).await.unwrap();
    for round in 0..5 {
        let blocker = tokio::spawn(async {
            // Runs once the decision has sent its command and waits for the reply.
            std::thread::sleep(Duration::from_millis(150));
        });
        let decision = store.check("k", &policy, 1).await;
        assert!(
            decision.as_ref().is_ok_and(|d| d.is_allowed()),
            "round {round}: a decision Redis answered in time failed because the worker was blocked: {decision:?}"
        );
        blocker.await.unwrap();
    }
}
