//! Token leases on Redis: the shared lease vectors (Lua = Rust twin = reference model), the lease book's TTL, and
//! a Redis Cluster. The layer's fleet tests (several instances, crashes, outages) are in tollgate-tower.

mod common;

use std::time::Duration;

use redis::AsyncCommands;
use tollgate_core::token_lease::TokenLeaseRequest;
use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisCluster;
use tollgate_testkit::vectors::LeaseVectors;

#[tokio::test]
async fn lease_vectors_are_bit_identical_to_memory_store_and_expected() {
    // As the documented least-privilege user: the lease scripts need no command beyond that line.
    let redis = common::AclRedis::start();
    let store = redis.store("lease-vectors").await;
    let vectors = LeaseVectors::load();
    let mut steps = 0;
    for (i, case) in vectors.cases.iter().enumerate() {
        let policy = case.policy();
        let memory = MemoryStore::new();
        let key = format!("case{i}");
        for (j, step) in case.steps.iter().enumerate() {
            let at = step.at();
            if step.is_lease() {
                let request = step.request();
                let from_redis = store
                    .lease_tokens_at(&key, &policy, &request, at)
                    .await
                    .unwrap();
                let from_memory = memory.lease_tokens_at(&key, &policy, &request, at).unwrap();
                assert_eq!(
                    from_redis,
                    step.expected_grant(),
                    "case {:?}, step {j}: redis",
                    case.name
                );
                assert_eq!(
                    from_memory, from_redis,
                    "case {:?}, step {j}: memory",
                    case.name
                );
            } else {
                let from_redis = store.check_at(&key, &policy, step.cost, at).await.unwrap();
                let from_memory = memory.check_at(&key, &policy, step.cost, at).unwrap();
                let expected = step.expected_decision(&policy);
                assert_eq!(
                    from_redis, expected,
                    "case {:?}, step {j}: redis",
                    case.name
                );
                assert_eq!(
                    from_memory, expected,
                    "case {:?}, step {j}: memory",
                    case.name
                );
            }
            steps += 1;
        }
    }
    assert!(steps > 600, "only {steps} steps ran");
}

#[tokio::test]
async fn a_leased_key_lives_until_its_leases_end_and_their_tokens_refill() {
    let url = tollgate_testkit::redis::redis_url();
    let store = common::store(&url, "lease-ttl").await;
    let mut admin = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // 10 per second: an emptied bucket refills in 1 s, but a 30 s lease must keep the book (and the tokens it
    // holds out) alive 30 s and then the time its 10 tokens take to refill.
    let policy = Policy::token_bucket(Quota::per_second(10).unwrap());
    let lease = TokenLeaseRequest::take(7, 1, 10, Duration::from_secs(30));
    let grant = store.lease_tokens("hot", &policy, &lease).await.unwrap();
    assert_eq!(grant.granted, 10);
    let key = store.redis_key("hot", policy.algorithm());
    let ttl: i64 = admin.pttl(&key).await.unwrap();
    assert!((30_000..=31_000).contains(&ttl), "ttl {ttl} ms");
    let record: Option<String> = admin.hget(&key, "l:7").await.unwrap();
    assert!(record.is_some_and(|r| r.starts_with("10:")));
    // A plain request neither shortens the TTL nor forgets the lease.
    assert!(!store.check("hot", &policy, 1).await.unwrap().is_allowed());
    let ttl: i64 = admin.pttl(&key).await.unwrap();
    assert!(
        (29_000..=31_000).contains(&ttl),
        "ttl {ttl} ms after a plain request"
    );
    // Returned: the book is gone and the key lives as a plain bucket does.
    let back = store
        .lease_tokens("hot", &policy, &lease.next(2).ending(10))
        .await
        .unwrap();
    assert_eq!(back.remaining, 10);
    let fields: Vec<String> = admin.hkeys(&key).await.unwrap();
    assert!(
        !fields
            .iter()
            .any(|f| f.starts_with("l:") || f.starts_with("lease")),
        "{fields:?}"
    );
    let ttl: i64 = admin.pttl(&key).await.unwrap();
    assert!(ttl <= 1_000, "ttl {ttl} ms once returned");

    // A sliding window's lease is its window's count: the key's TTL is the plain one (the end of the next window).
    let window = Policy::sliding_window(Quota::per_minute(100).unwrap()).unwrap();
    let grant = store
        .lease_tokens(
            "hot",
            &window,
            &TokenLeaseRequest::take(7, 1, 30, Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_eq!(grant.granted, 30);
    let ttl: i64 = admin
        .pttl(store.redis_key("hot", window.algorithm()))
        .await
        .unwrap();
    assert!((60_000..=120_000).contains(&ttl), "ttl {ttl} ms");
}

#[test]
fn leases_work_on_a_redis_cluster() {
    let cluster = RedisCluster::start(3);
    common::runtime().block_on(async {
        let store = RedisStore::cluster_builder(cluster.urls())
            .namespace("leases")
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("cluster store builds");
        let policy = Policy::token_bucket(Quota::per_hour(50).unwrap());
        let window = Policy::sliding_window(Quota::per_hour(50).unwrap()).unwrap();
        // Keys across every shard: a lease call touches one hash-tagged key, never CROSSSLOT.
        for i in 0..30 {
            let key = format!("client-{i}");
            for p in [&policy, &window] {
                let a = TokenLeaseRequest::take(1, 1, 20, Duration::from_secs(60));
                let b = TokenLeaseRequest::take(2, 1, 40, Duration::from_secs(60));
                assert_eq!(
                    store.lease_tokens(&key, p, &a).await.unwrap().granted,
                    20,
                    "{key}"
                );
                assert_eq!(
                    store.lease_tokens(&key, p, &b).await.unwrap().granted,
                    30,
                    "{key}"
                );
                assert!(
                    !store.check(&key, p, 1).await.unwrap().is_allowed(),
                    "{key}"
                );
                let back = store
                    .lease_tokens(&key, p, &b.next(2).ending(30).holding(30, 0))
                    .await;
                assert!(back.is_ok(), "{key}");
            }
            // The bucket's 30 returned tokens are its again.
            assert_eq!(
                store.check(&key, &policy, 1).await.unwrap().remaining,
                29,
                "{key}"
            );
        }
    });
}
