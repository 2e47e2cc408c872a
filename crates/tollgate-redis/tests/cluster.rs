//! RedisStore on a private 3-primary Redis Cluster: many keys across all slots without CROSSSLOT, and the limits
//! hold across a reshard (MOVED) and a primary's restart.

mod common;

use std::time::Duration;

use tollgate_core::{Outcome, Policy, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisCluster;

const KEYS: usize = 60;

async fn round(store: &RedisStore, policy: &Policy, expected: Outcome, what: &str) {
    for i in 0..KEYS {
        let key = format!("client-{i}");
        let d = store
            .check(&key, policy, 1)
            .await
            .unwrap_or_else(|e| panic!("{what}: {key}: {e}"));
        assert_eq!(d.outcome, expected, "{what}: {key}: {d:?}");
    }
}

#[test]
fn cluster_decides_on_many_keys_and_survives_moved_and_a_primary_restart() {
    let mut cluster = RedisCluster::start(3);
    common::runtime().block_on(async {
        let store = RedisStore::cluster_builder(cluster.urls())
            .namespace("cluster")
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("cluster store builds");
        assert_eq!(
            store.eviction_check(),
            &tollgate_redis::EvictionCheck::NoEviction
        );
        // One primary that may evict is enough to lose limits: the check asks every primary.
        assert_eq!(
            cluster
                .node(2)
                .cli(&["CONFIG", "SET", "maxmemory-policy", "volatile-ttl"]),
            "OK"
        );
        assert_eq!(
            store.check_eviction_policy().await,
            tollgate_redis::EvictionCheck::Evicting("volatile-ttl".into())
        );
        let bucket = common::hourly_bucket(3);
        let window = common::hourly_window(3);
        for policy in [&bucket, &window] {
            round(&store, policy, Outcome::Allowed, "first request").await;
        }
        // The keys really are spread over the three primaries.
        for i in 0..3 {
            let keys: u64 = cluster.node(i).cli(&["DBSIZE"]).parse().unwrap();
            assert!(keys > 0, "node {i} holds no key");
        }

        // Move a third of node 0's slots (with their keys) to node 1: the client's slot map is stale, and the
        // keys that moved answer MOVED until the client refreshes it. Their state moved with them.
        let dbsize = |i: usize| cluster.node(i).cli(&["DBSIZE"]).parse::<u64>().unwrap();
        let before = dbsize(1);
        cluster.reshard(0, 1, 2_000);
        assert!(
            dbsize(1) > before,
            "no key moved: the test would not see a MOVED"
        );
        for policy in [&bucket, &window] {
            round(
                &store,
                policy,
                Outcome::Allowed,
                "second request, after the reshard",
            )
            .await;
        }

        // Restart a primary (no persistence: its keys are gone) and let the cluster see it again.
        cluster.node_mut(2).restart();
        cluster.wait_settled();
        let mut fresh = 0;
        for policy in [&bucket, &window] {
            for i in 0..KEYS {
                let key = format!("client-{i}");
                let third = store
                    .check(&key, policy, 1)
                    .await
                    .unwrap_or_else(|e| panic!("restart: {key}: {e}"));
                assert!(third.is_allowed(), "{key}: {third:?}");
                let fourth = store
                    .check(&key, policy, 1)
                    .await
                    .unwrap_or_else(|e| panic!("restart: {key}: {e}"));
                if third.remaining == 2 {
                    // The key lived on the restarted node and starts over.
                    fresh += 1;
                    assert_eq!(
                        (fourth.outcome, fourth.remaining),
                        (Outcome::Allowed, 1),
                        "{key}"
                    );
                } else {
                    // The key kept its state: this was its third request, the fourth is over the limit.
                    assert_eq!(third.remaining, 0, "{key}: {third:?}");
                    assert_eq!(fourth.outcome, Outcome::Limited, "{key}: {fourth:?}");
                }
            }
        }
        assert!(fresh > 0 && fresh < 2 * KEYS, "{fresh} keys started over");
    });
}
