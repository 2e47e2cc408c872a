//! Concurrency leases on the shared Redis: the limit holds across stores (instances), leases expire when their
//! holder stops renewing them, renewal keeps them alive, and every lease key carries a TTL.

mod common;

use std::time::Duration;

use tollgate_core::slot::{SlotId, SlotStore};
use tollgate_testkit::redis::cli_url;

const LONG: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_lease_released_before_its_acquire_lands_is_never_granted() {
    let redis = common::AclRedis::start();
    // A caller whose acquire timed out during a stall releases at once; the acquire, sent first, may still run
    // when the server wakes. The release leaves a tombstone that refuses it, counts as no lease, and cannot be
    // renewed back to life.
    let url = redis.url();
    let store = redis.store("lease-tombstone").await;
    let key = store.slot_key("k");
    let (late, other) = (SlotId::new(), SlotId::new());
    store.release("k", late).await.unwrap();
    let ttl: i64 = cli_url(&url, &["PTTL", &key]).parse().unwrap();
    assert!(
        ttl > 50_000 && ttl <= 60_000,
        "the tombstone keeps the key alive: PTTL {ttl} ms"
    );
    let refused = store.acquire("k", late, 1, LONG).await.unwrap();
    assert!(!refused.granted);
    assert_eq!(refused.in_flight, 0, "a tombstone is not a lease");
    // Refused once, the tombstone is gone, and the slot was never taken.
    let granted = store.acquire("k", other, 1, LONG).await.unwrap();
    assert!(granted.granted);
    assert_eq!(granted.in_flight, 1);
    store.release("k", other).await.unwrap();
    store.release("k", late).await.unwrap();
    assert!(
        !store.renew("k", late, LONG).await.unwrap(),
        "a tombstone is not renewed"
    );
    assert!(store.acquire("k", other, 1, LONG).await.unwrap().granted);
    assert_eq!(cli_url(&url, &["ZCOUNT", &key, "(0", "+inf"]), "1");
    store.release("k", other).await.unwrap();
}

#[tokio::test]
async fn a_lease_time_beyond_any_use_is_a_year_not_a_lease_deleted_as_it_is_granted() {
    let redis = common::AclRedis::start();
    let store = redis.store("lease-huge").await;
    let (a, b) = (SlotId::new(), SlotId::new());
    assert!(
        store
            .acquire("k", a, 1, Duration::MAX)
            .await
            .unwrap()
            .granted
    );
    // Recorded: the limit of one holds.
    let second = store.acquire("k", b, 1, Duration::MAX).await.unwrap();
    assert!(!second.granted);
    assert_eq!(second.in_flight, 1);
    let ttl: i64 = cli_url(&redis.url(), &["PTTL", &store.slot_key("k")])
        .parse()
        .unwrap();
    let year_ms = 365 * 24 * 3_600_000;
    assert!(ttl > year_ms - 60_000 && ttl <= year_ms, "PTTL {ttl} ms");
    store.release("k", a).await.unwrap();
}

#[tokio::test]
async fn two_stores_share_one_limit_and_release_frees_a_slot() {
    let redis = common::AclRedis::start();
    let url = redis.url();
    let a = redis.store("lease-share").await;
    // A second instance: its own pool, same namespace.
    let b = redis
        .builder_in(a.slot_key("x").split(':').next().unwrap().to_owned())
        .build()
        .await
        .unwrap();
    let leases: Vec<SlotId> = (0..4).map(|_| SlotId::new()).collect();
    assert!(a.acquire("k", leases[0], 3, LONG).await.unwrap().granted);
    assert!(b.acquire("k", leases[1], 3, LONG).await.unwrap().granted);
    let third = a.acquire("k", leases[2], 3, LONG).await.unwrap();
    assert!(third.granted);
    assert_eq!(third.in_flight, 3);
    let denied = b.acquire("k", leases[3], 3, LONG).await.unwrap();
    assert!(!denied.granted);
    assert_eq!(denied.in_flight, 3);

    b.release("k", leases[0]).await.unwrap(); // any instance may release
    assert!(b.acquire("k", leases[3], 3, LONG).await.unwrap().granted);

    let ttl: i64 = cli_url(&url, &["PTTL", &a.slot_key("k")]).parse().unwrap();
    assert!(
        ttl > 20_000 && ttl <= 30_000,
        "the key lives as long as its longest lease: {ttl} ms"
    );
    for lease in &leases[1..] {
        a.release("k", *lease).await.unwrap();
    }
    assert_eq!(
        cli_url(&url, &["EXISTS", &a.slot_key("k")]),
        "0",
        "the last release deletes the key"
    );
}

/// Renews `lease`; `false` when the renewal was sent `short` or more after the previous one, or took that long:
/// then the lease may rightly have expired, and the run proves nothing.
async fn renew_alive(
    store: &tollgate_redis::RedisStore,
    key: &str,
    lease: SlotId,
    short: Duration,
    renewed_at: &mut std::time::Instant,
) -> bool {
    let sent = std::time::Instant::now();
    let renewed = store.renew(key, lease, short).await.unwrap();
    if sent.duration_since(*renewed_at) >= short || sent.elapsed() >= short {
        return false;
    }
    assert!(renewed, "a live lease renews");
    *renewed_at = sent;
    true
}

/// One run of the expiry scenario with leases of `short`; `false` when the machine stalled so long that the run
/// proves nothing (a renewal sent `short` or more after the previous one may rightly find its lease expired).
///
/// The margins come from the lease time itself: the server starts a lease's clock between the client sending the
/// call and reading the reply, so a lease renewed at client time `sent` lives at least until `sent + short`, and
/// one granted with a reply at `replied` is gone by `replied + short`.
async fn expiry_scenario(store: &tollgate_redis::RedisStore, key: &str, short: Duration) -> bool {
    use std::time::Instant;
    let (dead, alive, waiting) = (SlotId::new(), SlotId::new(), SlotId::new());
    assert!(store.acquire(key, dead, 2, short).await.unwrap().granted);
    let dead_granted = Instant::now();
    let mut renewed_at = Instant::now();
    assert!(store.acquire(key, alive, 2, short).await.unwrap().granted);
    assert!(!store.acquire(key, waiting, 2, short).await.unwrap().granted);

    // `alive` renews every quarter of its lease time; `dead` does not (its instance crashed).
    while dead_granted.elapsed() < short + short / 4 {
        tokio::time::sleep(short / 4).await;
        if !renew_alive(store, key, alive, short, &mut renewed_at).await {
            return false;
        }
    }
    assert!(
        !store.renew(key, dead, short).await.unwrap(),
        "an expired lease cannot be renewed"
    );
    // Renew once more, then `waiting` gets the slot `dead` left while `alive` still counts.
    if !renew_alive(store, key, alive, short, &mut renewed_at).await {
        return false;
    }
    let admitted = store.acquire(key, waiting, 2, LONG).await.unwrap();
    if renewed_at.elapsed() >= short {
        return false;
    }
    assert!(admitted.granted);
    assert_eq!(admitted.in_flight, 2, "the renewed lease still counts");
    assert!(
        !store
            .acquire(key, SlotId::new(), 2, LONG)
            .await
            .unwrap()
            .granted
    );
    true
}

#[tokio::test]
async fn leases_of_a_dead_holder_expire_and_renewed_ones_do_not() {
    let redis = common::AclRedis::start();
    let url = redis.url();
    let store = redis.store("lease-expiry").await;
    let short = Duration::from_secs(1);
    let mut ran = None;
    for attempt in 0..3 {
        let key = format!("k{attempt}");
        if expiry_scenario(&store, &key, short).await {
            ran = Some(key);
            break;
        }
    }
    let key = ran.unwrap_or_else(|| {
        panic!("the machine stalled longer than the lease time ({short:?}) in each of three runs")
    });
    let ttl: i64 = cli_url(&url, &["PTTL", &store.slot_key(&key)])
        .parse()
        .unwrap();
    assert!(ttl > 20_000, "the TTL follows the longest lease: {ttl} ms");
}

#[tokio::test]
async fn a_lower_ceiling_applies_to_the_same_leases() {
    let redis = common::AclRedis::start();
    let store = redis.store("lease-ceiling").await;
    for _ in 0..3 {
        assert!(
            store
                .acquire("fleet", SlotId::new(), 5, LONG)
                .await
                .unwrap()
                .granted
        );
    }
    let low = store
        .acquire("fleet", SlotId::new(), 3, LONG)
        .await
        .unwrap();
    assert!(!low.granted, "non-critical ceiling reached");
    assert!(
        store
            .acquire("fleet", SlotId::new(), 5, LONG)
            .await
            .unwrap()
            .granted,
        "critical still fits"
    );
}
