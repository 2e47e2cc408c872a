//! A flood of new client keys over real TCP against an in-process store at its bound: a newcomer still gets its
//! own bucket (200, never the closed failure policy's 503), and an abuser that keeps requesting stays limited.

mod support;

use std::sync::Arc;

use tollgate_core::{FailurePolicy, MemoryStore, Policy, Quota};
use tollgate_http::key::HeaderKey;
use tollgate_tower::RateLimitLayer;

use support::{get as http_get, limited_app as app, serve_with};

#[tokio::test]
async fn a_key_flood_over_http_neither_locks_out_newcomers_nor_frees_the_abuser() {
    let store = Arc::new(
        MemoryStore::builder()
            .max_keys(64)
            .name("per-client")
            .build(),
    );
    // Two per hour: nothing refills while the test runs, whatever the machine's load.
    let policy = Policy::token_bucket(Quota::per_hour(2).unwrap());
    let key = HeaderKey::new(http::HeaderName::from_static("x-client"));
    let layer = RateLimitLayer::new("per-client", policy, store.clone(), key)
        .on_store_error(FailurePolicy::Closed);
    let addr = serve_with(app(layer), false).await;
    let get = |client: String| async move { http_get(addr, "/", &[("x-client", &client)]).await };

    for _ in 0..2 {
        assert_eq!(get("abuser".into()).await.status, 200);
    }
    assert_eq!(get("abuser".into()).await.status, 429);
    for i in 0..400 {
        let reply = get(format!("flood-{i}")).await;
        assert_eq!(reply.status, 200, "flood key {i}: {reply:#?}");
        // Every other key: used again within 3 new keys, long before the hand goes round the 64 (an eviction
        // takes one not used since the hand last passed it, or a decayed one; the abuser is neither).
        if i % 2 == 0 {
            let reply = get("abuser".into()).await;
            assert_eq!(reply.status, 429, "flood key {i}: the abuser was freed");
        }
        assert!(store.len() <= 64);
    }
    let reply = get("newcomer".into()).await;
    assert_eq!(reply.status, 200, "{reply:#?}");
    assert_eq!(reply.num("x-ratelimit-remaining"), 1, "its own bucket");
    assert!(store.evictions().live >= 400 - 64);
}
