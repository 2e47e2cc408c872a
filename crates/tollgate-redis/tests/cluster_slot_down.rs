//! A Redis Cluster primary that fails with no replica to take its slots: decisions on its keys fail with an error
//! naming the key's hash slot (not a bare timeout), and resume on the same store once the node is back.

mod common;

use std::time::{Duration, Instant};

use tollgate_core::{Decision, Outcome, Policy, Store, StoreError};
use tollgate_redis::{BackendError, RedisStore};
use tollgate_testkit::redis::RedisCluster;

/// Long enough for the cluster to see a node fail (its node timeout) and to take it back, many times over.
const PATIENCE: Duration = Duration::from_secs(30);

/// Decides `client-0` every 50 ms until `wanted` takes the result, for at most [`PATIENCE`].
async fn first_answer<T>(
    store: &RedisStore,
    policy: &Policy,
    what: &str,
    wanted: impl Fn(Result<Decision, StoreError>) -> Option<T>,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(found) = wanted(store.check("client-0", policy, 1).await) {
            return found;
        }
        assert!(Instant::now() < deadline, "{what} within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_slot_without_a_primary_is_named_and_recovers_when_its_node_returns() {
    let mut cluster = RedisCluster::start(3);
    common::runtime().block_on(async {
        // A breaker that never opens: every call reaches the cluster, so every failure is the cluster's own.
        let store = RedisStore::cluster_builder(cluster.urls())
            .namespace("slot-down")
            .circuit_breaker(u32::MAX, Duration::from_millis(1))
            .build()
            .await
            .expect("cluster store builds");
        let policy = common::hourly_bucket(1_000);
        let first = store.check("client-0", &policy, 1).await.expect("decided");
        assert_eq!(first.outcome, Outcome::Allowed);

        // The node that holds the key, and the key's slot as the cluster computes it.
        let owner = (0..3)
            .find(|&i| {
                !cluster
                    .node(i)
                    .cli(&["KEYS", "slot-down:*client-0*"])
                    .trim()
                    .is_empty()
            })
            .expect("one node holds the key");
        let redis_key = cluster.node(owner).cli(&["KEYS", "slot-down:*client-0*"]);
        let redis_key = redis_key.trim();
        let other = (owner + 1) % 3;
        let slot: u16 = cluster
            .node(other)
            .cli(&["CLUSTER", "KEYSLOT", redis_key])
            .trim()
            .parse()
            .expect("a slot number");
        cluster.node_mut(owner).kill();

        let error = first_answer(&store, &policy, "decisions never failed", Result::err).await;
        let StoreError::Backend(backend) = &error else {
            panic!("not a Redis error: {error:?}");
        };
        match backend.downcast_ref::<BackendError>() {
            Some(BackendError::ClusterSlotDown { hash_slot, .. }) => assert_eq!(*hash_slot, slot),
            other => panic!("not a slot named: {other:?} ({error})"),
        }
        let text = error.to_string();
        assert!(text.contains(&format!("hash slot {slot}")), "{text}");

        // Once the cluster has failed the node (no replica: the slot stays unserved), still the slot by name.
        tokio::time::sleep(tollgate_testkit::redis::CLUSTER_NODE_TIMEOUT * 2).await;
        let later = store
            .check("client-0", &policy, 1)
            .await
            .expect_err("nobody serves the slot");
        assert!(
            later.to_string().contains(&format!("hash slot {slot}")),
            "{later}"
        );

        // The node comes back (empty: nothing is persisted): the same store decides on its keys again.
        cluster.node_mut(owner).restart();
        let resumed = first_answer(&store, &policy, "never resumed", Result::ok).await;
        assert_eq!(resumed.outcome, Outcome::Allowed);
    });
}
