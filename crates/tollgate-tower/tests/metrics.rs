//! Decisions are counted through the `metrics` facade, in every mode: a recorder installed before the layers are
//! built sees `tollgate_decisions_total` by limiter and outcome.

mod counts;

use std::sync::Arc;

use counts::Counts;
use tollgate_core::{FailurePolicy, MemoryStore, OnFull, Policy, Quota};
use tollgate_tower::{BoxError, KeyError, Mode, RateLimitLayer, VerdictSink, Verdicts};
use tower::{Service, ServiceBuilder, ServiceExt};

#[derive(Debug, Default)]
struct Reply(Verdicts);

impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.0
    }
}

#[tokio::test]
async fn decisions_are_counted_by_limiter_and_outcome() {
    let counts = Counts::default();
    metrics::set_global_recorder(counts.clone()).expect("the only recorder in this test binary");

    let by_user = |user: &&'static str, key: &mut String| {
        key.push_str(user);
        Ok::<_, KeyError>(())
    };
    let policy = Policy::token_bucket(Quota::per_minute(2).unwrap());
    let layer = RateLimitLayer::new("dark", policy, Arc::new(MemoryStore::new()), by_user).shadow();
    let switch = layer.enforcement();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: &'static str| async { Ok::<_, BoxError>(Reply::default()) });

    for _ in 0..5 {
        svc.ready()
            .await
            .unwrap()
            .call("ann")
            .await
            .expect("shadow mode admits");
    }
    let dark = |outcome| {
        counts.get(
            "tollgate_decisions_total",
            &[("limiter", "dark"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (dark("allowed"), dark("shadow_limited"), dark("limited")),
        (2, 3, 0)
    );

    switch.set(Mode::Enforce);
    assert!(svc.ready().await.unwrap().call("ann").await.is_err());
    assert_eq!(dark("limited"), 1);
    switch.set(Mode::Off);
    svc.ready().await.unwrap().call("ann").await.unwrap();
    assert_eq!(
        dark("allowed") + dark("shadow_limited") + dark("limited"),
        6,
        "the kill switch decides nothing"
    );

    // Store failures: a real MemoryStore configured to refuse a new key at its bound, failing open.
    let full = Arc::new(
        MemoryStore::builder()
            .max_keys(1)
            .shards(1)
            .on_full(OnFull::Refuse)
            .build(),
    );
    full.check_now("full:other", &policy, 1).unwrap();
    let key = |user: &&'static str, key: &mut String| {
        key.push_str(user);
        Ok::<_, KeyError>(())
    };
    let mut open = ServiceBuilder::new()
        .layer(RateLimitLayer::new("full", policy, full, key).on_store_error(FailurePolicy::Open))
        .service_fn(|_: &'static str| async { Ok::<_, BoxError>(Reply::default()) });
    open.ready().await.unwrap().call("ann").await.unwrap();
    assert_eq!(
        counts.get(
            "tollgate_decisions_total",
            &[("limiter", "full"), ("outcome", "store_error_open")]
        ),
        1
    );
    let errors = [
        ("limiter", "full"),
        ("kind", "key_capacity"),
        ("failure_policy", "open"),
    ];
    assert_eq!(counts.get("tollgate_store_errors_total", &errors), 1);

    // Each decision counts once: the local fallback's admissions as `store_error_local`, its refusals as
    // `limited`; a closed policy's refusal in shadow mode apart from the 503s it did not send.
    let full = Arc::new(
        MemoryStore::builder()
            .max_keys(1)
            .shards(1)
            .on_full(OnFull::Refuse)
            .build(),
    );
    full.check_now("other", &policy, 1).unwrap();
    let user = || {
        |user: &&'static str, key: &mut String| {
            key.push_str(user);
            Ok::<_, KeyError>(())
        }
    };
    let mut local = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new("local", policy, full.clone(), user())
                .on_store_error(FailurePolicy::Local),
        )
        .service_fn(|_: &'static str| async { Ok::<_, BoxError>(Reply::default()) });
    for _ in 0..3 {
        let _ = local.ready().await.unwrap().call("ann").await;
    }
    let local = |outcome| {
        counts.get(
            "tollgate_decisions_total",
            &[("limiter", "local"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (
            local("store_error_local"),
            local("limited"),
            local("allowed")
        ),
        (2, 1, 0),
        "two admitted by the fallback, one refused by it, each counted once"
    );
    let mut dark_closed = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new("dark-closed", policy, full, user())
                .on_store_error(FailurePolicy::Closed)
                .shadow(),
        )
        .service_fn(|_: &'static str| async { Ok::<_, BoxError>(Reply::default()) });
    dark_closed
        .ready()
        .await
        .unwrap()
        .call("ann")
        .await
        .expect("shadow mode admits");
    let dark_closed = |outcome| {
        counts.get(
            "tollgate_decisions_total",
            &[("limiter", "dark-closed"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (
            dark_closed("shadow_store_error_closed"),
            dark_closed("store_error_closed")
        ),
        (1, 0)
    );

    // The deny cache on real Redis: its refusals count as ordinary `limited` decisions, and as hits.
    let redis = tollgate_redis::RedisStore::builder(tollgate_testkit::redis::redis_url())
        .namespace(tollgate_testkit::redis::unique_prefix("metrics-deny-cache"))
        .build()
        .await
        .expect("Redis must be running for this test");
    let mut cached = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            "cached",
            Policy::token_bucket(Quota::per_hour(1).unwrap()),
            Arc::new(redis),
            user(),
        ))
        .service_fn(|_: &'static str| async { Ok::<_, BoxError>(Reply::default()) });
    for _ in 0..5 {
        let _ = cached.ready().await.unwrap().call("ann").await;
    }
    let cached = |outcome| {
        counts.get(
            "tollgate_decisions_total",
            &[("limiter", "cached"), ("outcome", outcome)],
        )
    };
    assert_eq!((cached("allowed"), cached("limited")), (1, 4));
    assert_eq!(
        counts.get("tollgate_deny_cache_hits_total", &[("limiter", "cached")]),
        4,
        "the admission's reply emptied the bucket: the cache refused the four after"
    );
}
