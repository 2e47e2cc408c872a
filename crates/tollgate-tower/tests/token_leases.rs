//! Token leases against real Redis: N instances (N layers on one Redis, each its own instance id) with random
//! arrival timings never admit more than the plain path's bound; an instance killed holding a batch costs the
//! others at most that batch; a paused or killed Redis mid-lease meets each failure policy once the batch is
//! spent; headers stay this instance's monotone view.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{
    Clock, Decision, FailurePolicy, ManualClock, Policy, Quota, Store, StoreError, Timestamp,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{RedisServer, cli_url, redis_url, unique_prefix};
use tollgate_tower::{
    BoxError, ConstKey, CostFn, LeaseConfig, LeaseHandle, RateLimitLayer, Rejection, RejectionKind,
    VerdictSink, Verdicts,
};
use tower::{Service, ServiceExt, util::BoxCloneService};

#[derive(Debug, Default)]
struct Reply(Verdicts);
impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.0
    }
}

type Svc = BoxCloneService<(), Reply, BoxError>;

/// Redis deciding at a manual clock's instants (plain requests and lease calls alike), counting its calls.
struct Clocked {
    redis: Arc<RedisStore>,
    clock: ManualClock,
    calls: AtomicUsize,
}

impl Store for Clocked {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.redis
            .check_at(key, policy, cost, self.clock.now())
            .await
    }
    async fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> Result<TokenLeaseGrant, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.redis
            .lease_tokens_at(key, policy, request, self.clock.now())
            .await
    }
    fn is_shared(&self) -> bool {
        true
    }
    fn supports_token_leases(&self) -> bool {
        true
    }
}

fn instance(store: Arc<Clocked>, policy: Policy, config: LeaseConfig) -> (Svc, LeaseHandle) {
    let layer = RateLimitLayer::new("leased", policy, store, ConstKey::new("hot")).leases(config);
    let handle = layer.lease_handle();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) });
    (BoxCloneService::new(svc), handle)
}

async fn call(svc: &mut Svc) -> Result<Reply, BoxError> {
    svc.ready().await?.call(()).await
}

/// A Redis store with a 5 s timeout (a loaded machine's round trips are not under test) and a namespace of its own.
async fn redis_store(test: &str) -> Arc<RedisStore> {
    let redis = RedisStore::builder(redis_url())
        .namespace(unique_prefix(test))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    Arc::new(redis)
}

/// [`redis_store`] on `clock`, counting its calls.
async fn clocked(test: &str, clock: &ManualClock) -> Arc<Clocked> {
    Arc::new(Clocked {
        redis: redis_store(test).await,
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    })
}

fn start() -> Timestamp {
    // A whole second: sliding windows start at round instants.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    Timestamp::from_micros(now * 1_000_000)
}

async fn fleet(
    redis: &Arc<RedisStore>,
    policy: Policy,
    n: usize,
    clock: &ManualClock,
) -> Vec<(Svc, LeaseHandle)> {
    let store = Arc::new(Clocked {
        redis: redis.clone(),
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    (0..n)
        .map(|_| {
            let config = LeaseConfig::new()
                .share_percent(25)
                .unwrap()
                .clock(clock.clone());
            instance(store.clone(), policy, config)
        })
        .collect()
}

/// Runs `events` (instance, µs to wait before its request, whether to let fetches land first) and returns the
/// instants of the admissions, and how many were admitted from batches.
async fn run(
    redis: &Arc<RedisStore>,
    policy: Policy,
    n: usize,
    events: &[(usize, u64, bool)],
) -> (Vec<u64>, u64) {
    let clock = ManualClock::new(start());
    let mut instances = fleet(redis, policy, n, &clock).await;
    let mut admitted = Vec::new();
    for &(i, wait, settle) in events {
        clock.advance(Duration::from_micros(wait));
        let (svc, handle) = &mut instances[i % n];
        if settle {
            handle.settled().await;
        }
        if call(svc).await.is_ok() {
            admitted.push(clock.now().as_micros());
        }
        tokio::task::yield_now().await;
    }
    let local = instances.iter().map(|(_, h)| h.local_admissions()).sum();
    for (_, h) in &instances {
        h.shutdown().await;
    }
    (admitted, local)
}

fn events() -> impl Strategy<Value = Vec<(usize, u64, bool)>> {
    prop::collection::vec(
        (0..4usize, 0..3_000u64, prop::bool::weighted(0.7)),
        100..220,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Token bucket, 200/s with a burst of 40: in every interval [a, b] the fleet admits at most
    /// 40 + 200 × (b − a) / 1 s, whatever the arrival timings and however the fetches interleave.
    #[test]
    fn the_fleet_never_admits_more_than_burst_plus_rate_times_t(n in 2..=4usize, events in events()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (admitted, local) = runtime.block_on(async {
            let redis = redis_store("lease-prop").await;
            let policy = Policy::token_bucket(Quota::per_second(200).unwrap().with_burst(40).unwrap());
            run(&redis, policy, n, &events).await
        });
        for (i, a) in admitted.iter().enumerate() {
            for (j, b) in admitted.iter().enumerate().skip(i) {
                let bound = 40 + (b - a) * 200 / 1_000_000;
                prop_assert!((j - i + 1) as u64 <= bound, "{} admitted in [{a}, {b}], bound {bound}", j - i + 1);
            }
        }
        prop_assert!(local > 0, "no request was admitted from a batch");
    }

    /// Sliding window, 60 per second: no aligned window counts more than 60 admissions.
    #[test]
    fn a_sliding_window_fleet_never_admits_more_than_the_limit_per_window(n in 2..=4usize, events in events()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (admitted, _) = runtime.block_on(async {
            let redis = redis_store("lease-prop-sw").await;
            let policy = Policy::sliding_window(Quota::per_second(60).unwrap()).unwrap();
            run(&redis, policy, n, &events).await
        });
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for t in &admitted {
            *per_window.entry(t / 1_000_000).or_default() += 1;
        }
        for (w, count) in per_window {
            prop_assert!(count <= 60, "window {w}: {count} admitted");
        }
    }
}

/// The remaining a response shows: an admission's verdict, or a refusal's decision.
fn remaining_of(result: &Result<Reply, BoxError>) -> u64 {
    match result {
        Ok(reply) => {
            reply
                .0
                .only()
                .expect("an admission's verdict")
                .decision
                .remaining
        }
        Err(err) => {
            let rejection = err
                .downcast_ref::<Rejection>()
                .expect("a rate-limit rejection");
            assert_eq!(
                rejection.kind(),
                RejectionKind::RateLimited,
                "{rejection:?}"
            );
            rejection
                .decision()
                .expect("a refusal's decision")
                .remaining
        }
    }
}

/// Clients hammering one hot key through `n` instances, round robin, each instance's next request less than a
/// token's refill after its last (`gaps` µs between events, each below a token's time ÷ `n`); `land[k]`: whether
/// the instance's fetches land before event k (otherwise a request may find its batch empty with a fetch out).
/// Returns each instance's (remaining shown, admitted by it so far, µs since the start) per response.
async fn hammer(
    redis: &Arc<RedisStore>,
    policy: Policy,
    n: usize,
    events: &[(u64, bool)],
) -> Vec<Vec<(u64, u64, u64)>> {
    let clock = ManualClock::new(start());
    let store = Arc::new(Clocked {
        redis: redis.clone(),
        clock: clock.clone(),
        calls: AtomicUsize::new(0),
    });
    let mut instances: Vec<_> = (0..n)
        .map(|_| {
            let config = LeaseConfig::new()
                .share_percent(25)
                .unwrap()
                .clock(clock.clone())
                // A loaded machine's Redis round trip never reaches the failure policy here.
                .wait(Duration::from_secs(30));
            instance(store.clone(), policy, config)
        })
        .collect();
    let mut shown = vec![Vec::new(); n];
    let mut admitted = vec![0; n];
    let mut elapsed = 0;
    for (k, &(gap, land)) in events.iter().enumerate() {
        clock.advance(Duration::from_micros(gap));
        elapsed += gap;
        let i = k % n;
        let (svc, handle) = &mut instances[i];
        if land {
            handle.settled().await;
        }
        let result = call(svc).await;
        admitted[i] += u64::from(result.is_ok());
        shown[i].push((remaining_of(&result), admitted[i], elapsed));
    }
    for (_, h) in &instances {
        h.shutdown().await;
    }
    shown
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    /// Issue 16's headers under leases, for clients hammering a hot key (token bucket 100/s, burst 60: a token
    /// refills every 10 ms, and each instance's requests come less than 10 ms apart), through 1 to 3 instances
    /// with random timings and fetch interleavings: an instance's remaining never rises between two of its
    /// responses, and never exceeds what the bucket can hold for it (the burst plus what refilled, less what it
    /// admitted itself: the global remaining plus its unspent batch are no more).
    #[test]
    fn remaining_never_rises_for_clients_hammering_a_hot_key(
        n in 1..=3usize,
        events in prop::collection::vec((0..3_300u64, prop::bool::weighted(0.5)), 150..300),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let shown = runtime.block_on(async {
            let redis = redis_store("lease-headers").await;
            let policy = Policy::token_bucket(Quota::per_second(100).unwrap().with_burst(60).unwrap());
            hammer(&redis, policy, n, &events).await
        });
        for (i, responses) in shown.iter().enumerate() {
            let mut last = u64::MAX;
            for (k, &(remaining, admitted, elapsed)) in responses.iter().enumerate() {
                prop_assert!(remaining <= last, "instance {i}, response {k}: remaining rose from {last} to {remaining}");
                let bound = (60 + elapsed * 100 / 1_000_000).saturating_sub(admitted);
                prop_assert!(remaining <= bound, "instance {i}, response {k}: remaining {remaining} above {bound}");
                last = remaining;
            }
        }
    }
}

/// An instance dies holding a batch (dropped without returning it): the others lose at most that batch, and get
/// its share back by refill from the lease's deadline.
#[tokio::test]
async fn an_instance_killed_holding_a_batch_costs_at_most_that_batch() {
    let clock = ManualClock::new(start());
    let store = clocked("lease-kill", &clock).await;
    // 100 per 10 s (10/s), burst 100, batches of up to 20, leases of 2 s.
    let policy = Policy::token_bucket(Quota::new(100, Duration::from_secs(10)).unwrap());
    let config = |crash: bool| {
        LeaseConfig::new()
            .share_percent(20)
            .unwrap()
            .ttl(Duration::from_secs(2))
            .return_on_drop(!crash)
            .clock(clock.clone())
    };
    let (mut doomed, doomed_leases) = instance(store.clone(), policy, config(true));
    // Hot: its batches land between requests.
    let mut spent_by_doomed = 0;
    for _ in 0..12 {
        call(&mut doomed).await.unwrap();
        spent_by_doomed += 1;
        doomed_leases.settled().await;
    }
    assert!(doomed_leases.local_admissions() > 0);
    drop(doomed);
    drop(doomed_leases);
    // What the dead instance's record holds: its unspent batch, and what it spent since its last report.
    let key = store.redis.redis_key("leased:hot", policy.algorithm());
    let fields = cli_url(&redis_url(), &["HGETALL", &key]);
    let record: u64 = fields
        .lines()
        .skip_while(|l| !l.starts_with("l:"))
        .nth(1)
        .and_then(|v| v.split(':').next()?.parse().ok())
        .expect("the dead instance's lease record");
    assert!((1..=20).contains(&record), "record {record}");

    let (mut survivor, survivor_leases) = instance(store.clone(), policy, config(false));
    let mut admitted = 0;
    for _ in 0..200 {
        if call(&mut survivor).await.is_ok() {
            admitted += 1;
        }
        survivor_leases.settled().await;
    }
    // Never more than the bucket's 100 less what the dead one spent; at most its record lost.
    assert!(admitted <= 100 - spent_by_doomed, "admitted {admitted}");
    assert!(
        admitted >= 100 - spent_by_doomed - record,
        "admitted {admitted}, record {record}"
    );
    // Past the dead lease's deadline its tokens stay spent, and the bucket refills from there at 10/s.
    clock.advance(Duration::from_secs(3));
    let mut later = 0;
    for _ in 0..100 {
        if call(&mut survivor).await.is_ok() {
            later += 1;
        }
        survivor_leases.settled().await;
    }
    assert!(
        (29..=31).contains(&later),
        "admitted {later} after 3 s at 10/s"
    );
    survivor_leases.shutdown().await;
}

/// Redis paused, then killed, while an instance holds a batch: the batch is spent (bounded by its size), then
/// each request meets the failure policy.
#[tokio::test]
async fn a_paused_or_killed_redis_mid_lease_meets_each_failure_policy() {
    for policy in [
        FailurePolicy::Open,
        FailurePolicy::Closed,
        FailurePolicy::Local,
    ] {
        let mut server = RedisServer::start();
        let redis = RedisStore::builder(server.url())
            .timeout(Duration::from_millis(200))
            .build()
            .await
            .unwrap();
        let layer = RateLimitLayer::new(
            "paused",
            Policy::token_bucket(Quota::per_hour(1_000).unwrap()),
            Arc::new(redis),
            ConstKey::new("hot"),
        )
        .on_store_error(policy)
        .leases(
            LeaseConfig::new()
                .share_percent(2)
                .unwrap()
                .ttl(Duration::from_secs(60)),
        );
        let leases = layer.lease_handle();
        let mut svc = BoxCloneService::new(
            tower::ServiceBuilder::new()
                .layer(layer)
                .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) }),
        );
        // Hot, with a batch of 20 in hand.
        for _ in 0..3 {
            call(&mut svc).await.unwrap();
            leases.settled().await;
        }
        let fetched = leases.store_calls();
        for outage in ["pause", "kill"] {
            if outage == "pause" {
                server.pause();
            } else {
                server.resume();
                server.kill();
            }
            let mut from_batch = 0;
            let mut failed = Vec::new();
            for _ in 0..30 {
                let before = leases.local_admissions();
                let result = call(&mut svc).await;
                leases.settled().await;
                if leases.local_admissions() > before {
                    from_batch += 1;
                } else {
                    failed.push(result);
                }
            }
            // The batch is bounded: at most its 20 tokens (fewer after the pause spent some) are admitted locally.
            assert!(
                from_batch <= 20,
                "{policy:?} {outage}: {from_batch} from the batch"
            );
            assert!(
                !failed.is_empty(),
                "{policy:?} {outage}: the batch never ran out"
            );
            for result in failed {
                match policy {
                    FailurePolicy::Open | FailurePolicy::Local => {
                        assert!(result.is_ok(), "{policy:?} {outage}: refused");
                    }
                    FailurePolicy::Closed => {
                        let err = result.expect_err("closed refuses");
                        let rejection = err.downcast_ref::<Rejection>().expect("a rejection");
                        assert_eq!(rejection.kind(), RejectionKind::StoreUnavailable);
                    }
                }
            }
        }
        assert!(
            leases.store_calls() > fetched,
            "{policy:?}: no fetch was tried during the outage"
        );
        leases.shutdown().await;
    }
}

/// Redis at a manual clock's instants, recording every lease grant (instant, tokens).
struct Granting {
    clocked: Clocked,
    grants: std::sync::Mutex<Vec<(u64, u64)>>,
    /// The store key the layer asks for (its limiter's name and the request's key).
    key: std::sync::Mutex<String>,
    /// What each return gave back.
    returned: std::sync::Mutex<Vec<u64>>,
}

impl Store for Granting {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        key.clone_into(&mut self.key.lock().unwrap());
        self.clocked.check(key, policy, cost).await
    }
    async fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> Result<TokenLeaseGrant, StoreError> {
        let grant = self.clocked.lease_tokens(key, policy, request).await?;
        let at = self.clocked.clock.now().as_micros();
        self.grants.lock().unwrap().push((at, grant.granted));
        if request.end {
            self.returned.lock().unwrap().push(request.unspent);
        }
        Ok(grant)
    }
    fn is_shared(&self) -> bool {
        true
    }
    fn supports_token_leases(&self) -> bool {
        true
    }
}

/// A leased lockout policy on real Redis, hammered through 2 instances: the first denial locks the key for 60 s;
/// from then on the store grants no lease, every refusal's Retry-After is the lockout's end, the instance that was
/// denied admits nothing more, and what the other spends is only the batch it held (debited before the lockout):
/// the fleet admits no more than the plain path with the lockout would (the burst plus the refill until the
/// denial). After the lockout both instances admit again.
#[tokio::test]
async fn a_leased_lockout_policy_locks_a_hot_key_out_exactly_through_two_instances() {
    let redis = redis_store("lease-lockout").await;
    let clock = ManualClock::new(start());
    let lockout = Duration::from_secs(60);
    // A burst of 100 makes batches of up to 10 (the default share) worth leasing for a key asked 2 000 times/s.
    let policy = Policy::token_bucket(Quota::per_second(100).unwrap().with_burst(100).unwrap())
        .with_lockout(lockout)
        .unwrap();
    let store = Arc::new(Granting {
        clocked: Clocked {
            redis,
            clock: clock.clone(),
            calls: AtomicUsize::new(0),
        },
        grants: std::sync::Mutex::default(),
        key: std::sync::Mutex::default(),
        returned: std::sync::Mutex::default(),
    });
    let mut instances: Vec<(Svc, LeaseHandle)> = (0..2)
        .map(|_| {
            // The deny cache off: every refusal is the store's or the lease table's own.
            let layer = RateLimitLayer::new("leased", policy, store.clone(), ConstKey::new("hot"))
                .deny_cache(false)
                .leases(LeaseConfig::new().clock(clock.clone()));
            let handle = layer.lease_handle();
            let svc = tower::ServiceBuilder::new()
                .layer(layer)
                .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) });
            (BoxCloneService::new(svc), handle)
        })
        .collect();
    let t0 = clock.now().as_micros();
    let mut admitted: Vec<(u64, usize)> = Vec::new();
    let mut denied_at: Option<(u64, usize)> = None;
    let mut refusals = 0;
    // Both instances, one request each every ms, until 2 s after the first denial.
    while denied_at.is_none_or(|(t, _)| clock.now().as_micros() < t + 2_000_000) {
        clock.advance(Duration::from_millis(1));
        assert!(clock.now().as_micros() < t0 + 10_000_000, "no denial");
        for (i, (svc, handle)) in instances.iter_mut().enumerate() {
            handle.settled().await;
            let now = clock.now().as_micros();
            match call(svc).await {
                Ok(_) => admitted.push((now, i)),
                Err(err) => {
                    let rejection = err.downcast_ref::<Rejection>().expect("a rejection");
                    assert_eq!(rejection.kind(), RejectionKind::RateLimited);
                    let retry = rejection
                        .retry_after()
                        .expect("a retry instant")
                        .as_micros() as u64;
                    let (t, _) = *denied_at.get_or_insert((now, i));
                    let end = t + lockout.as_micros() as u64;
                    // The lockout's end: exactly from the store, at most a drift margin sooner from the instance.
                    assert!(
                        retry <= end - now && retry + 1_000_000 > end - now,
                        "retry {retry} µs at {} µs into a lockout ending {} µs in",
                        now - t,
                        end - t
                    );
                    refusals += 1;
                }
            }
        }
    }
    let (t_d, who) = denied_at.unwrap();
    let before = admitted.iter().filter(|&&(t, _)| t < t_d).count() as u64;
    let after: Vec<_> = admitted.iter().filter(|&&(t, _)| t >= t_d).collect();
    // The plain path with the lockout admits the burst plus the refill (0.1 a ms) until its denial, then nothing.
    let bound = 100 + (t_d - t0) / 10_000;
    assert!(
        before + after.len() as u64 <= bound,
        "admitted {before} + {} > {bound}",
        after.len()
    );
    // Under-admission is bounded too: a batch held when the store denied may be short of what the plain path's
    // later denial would have let through, by less than one batch.
    assert!(
        before + after.len() as u64 + 10 >= bound,
        "admitted only {before} + {} of {bound}",
        after.len()
    );
    let granted_after: u64 = store
        .grants
        .lock()
        .unwrap()
        .iter()
        .filter(|&&(t, _)| t >= t_d)
        .map(|&(_, g)| g)
        .sum();
    assert_eq!(
        granted_after, 0,
        "the store granted tokens during the lockout"
    );
    assert!(
        after.iter().all(|&&(_, i)| i != who),
        "the denied instance admitted after its denial: {after:?}"
    );
    // What the other instance spent is the batch it held: at most one (10 tokens), within its lifetime (1 s).
    assert!(
        after.len() <= 10 && after.iter().all(|&&(t, _)| t < t_d + 1_000_000),
        "admitted during the lockout: {after:?}"
    );
    assert!(refusals > 1_000, "{refusals} refusals");
    let local: u64 = instances.iter().map(|(_, h)| h.local_admissions()).sum();
    assert!(local >= 80, "leased: only {local} admitted from batches");
    // The bucket is full again long before the lockout ends; the key stays refused until then, on both instances.
    let end = t_d + lockout.as_micros() as u64;
    // An instance that never learned the lockout asks for a batch: Redis grants nothing until the lockout's end.
    clock.advance(Duration::from_secs(30));
    let ask = TokenLeaseRequest::take(u64::MAX >> 12, 1, 10, Duration::from_secs(1));
    let key = store.key.lock().unwrap().clone();
    let grant = store.lease_tokens(&key, &policy, &ask).await.unwrap();
    let left = end - clock.now().as_micros();
    assert_eq!(
        (grant.granted, grant.remaining, grant.retry_after),
        (0, 0, Some(Duration::from_micros(left))),
        "a lease fetch during the lockout"
    );
    clock.advance(Duration::from_micros(end - 1_000 - clock.now().as_micros()));
    for (svc, handle) in &mut instances {
        handle.settled().await;
        let Err(err) = call(svc).await else {
            panic!("still locked out: expected an error");
        };
        let retry = err
            .downcast_ref::<Rejection>()
            .unwrap()
            .retry_after()
            .unwrap();
        assert!(retry <= Duration::from_millis(1), "retry after {retry:?}");
    }
    clock.advance(Duration::from_millis(2));
    for (svc, handle) in &mut instances {
        handle.settled().await;
        call(svc).await.expect("the lockout is over");
    }
    for (_, h) in &instances {
        h.shutdown().await;
    }
}

/// Requests that find the batch spent while its next fetch is out wait for that fetch and are decided from its
/// batch: a hot key's store calls are its fetches only, none on the plain path. (The runtime is single-threaded:
/// the fetch a take starts runs only when a request waits, so every batch is spent before its successor lands.)
#[tokio::test(flavor = "current_thread")]
async fn requests_that_find_the_batch_spent_wait_for_the_fetch_under_way() {
    let clock = ManualClock::new(start());
    let store = clocked("lease-wait", &clock).await;
    let policy = Policy::token_bucket(Quota::per_hour(10_000).unwrap());
    let config = LeaseConfig::new()
        .share_percent(1)
        .unwrap()
        .clock(clock.clone())
        .wait(Duration::from_secs(30));
    let (mut svc, leases) = instance(store.clone(), policy, config);
    // Hot, with a batch in hand.
    for _ in 0..3 {
        call(&mut svc).await.unwrap();
        leases.settled().await;
    }
    let plain = |store: &Clocked, leases: &LeaseHandle| {
        store.calls.load(Ordering::Relaxed) as u64 - leases.store_calls()
    };
    let (plain_before, local_before) = (plain(&store, &leases), leases.local_admissions());
    // 1 000 requests, a batch (at most 100) at a time, and 20 more at once on an empty batch.
    for i in 0..1_000 {
        assert!(call(&mut svc).await.is_ok(), "request {i}");
    }
    let together: Vec<_> = (0..20)
        .map(|_| {
            let mut svc = svc.clone();
            async move { call(&mut svc).await.is_ok() }
        })
        .collect();
    for admitted in futures_util::future::join_all(together).await {
        assert!(admitted);
    }
    assert_eq!(
        plain(&store, &leases),
        plain_before,
        "a plain call beside a fetch"
    );
    assert_eq!(leases.local_admissions() - local_before, 1_020);
    leases.shutdown().await;
}

/// The wait is bounded: with Redis paused (its client's timeout far longer), a request whose batch is spent while
/// the fetch hangs meets the failure policy once the configured wait is over, not when Redis comes back.
#[tokio::test(flavor = "current_thread")]
async fn a_fetch_that_outlasts_the_wait_leaves_its_waiters_to_the_failure_policy() {
    let server = RedisServer::start();
    let redis = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let layer = RateLimitLayer::new(
        "bounded-wait",
        Policy::token_bucket(Quota::per_hour(1_000).unwrap()),
        Arc::new(redis),
        ConstKey::new("hot"),
    )
    .on_store_error(FailurePolicy::Closed)
    .leases(
        LeaseConfig::new()
            .share_percent(2)
            .unwrap()
            .wait(Duration::from_millis(50)),
    );
    let leases = layer.lease_handle();
    let mut svc = BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) }),
    );
    for _ in 0..3 {
        call(&mut svc).await.unwrap();
        leases.settled().await;
    }
    server.pause();
    // The batch (20) is spent locally; the fetch started at its half hangs on the paused Redis; the request that
    // finds the batch spent waits 50 ms of the 60 s the fetch could take, then the closed policy refuses it.
    // (A 30 s guard, 600 × the wait and half the client's timeout: only a wait that is not bounded reaches it.)
    let mut from_batch = 0;
    let refused = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match call(&mut svc).await {
                Ok(_) => from_batch += 1,
                Err(err) => break err,
            }
            assert!(from_batch <= 20, "{from_batch} admitted from a batch of 20");
        }
    })
    .await
    .expect("the wait is bounded by 50 ms, not by the paused Redis");
    let rejection = refused.downcast_ref::<Rejection>().expect("a rejection");
    assert_eq!(rejection.kind(), RejectionKind::StoreUnavailable);
    assert_eq!(leases.fetches_in_flight(), 1, "the fetch still hangs");
    server.resume();
    leases.settled().await;
    leases.shutdown().await;
}

/// A sliding window flooded through 2 instances (3 requests per instance per ms, 50 per second allowed) admits its
/// limit in every window, to within a slot per instance: a short grant's local refusal ends a tenth of a batch's
/// time before the window does, so the slots that come free late in a window are taken in it (waiting for a whole
/// batch past its end lost about 5 per window: 45 of 50).
#[tokio::test(flavor = "current_thread")]
async fn a_flooded_sliding_window_admits_its_limit_in_every_window() {
    let clock = ManualClock::new(start());
    let store = clocked("lease-sw-flood", &clock).await;
    let policy = Policy::sliding_window(Quota::per_second(50).unwrap()).unwrap();
    let mut instances: Vec<_> = (0..2)
        .map(|_| {
            let layer =
                RateLimitLayer::new("sw-flood", policy, store.clone(), ConstKey::new("hot"))
                    .deny_cache_config(tollgate_tower::DenyCache::new().clock(clock.clone()))
                    .leases(
                        LeaseConfig::new()
                            .clock(clock.clone())
                            .wait(Duration::from_secs(30)),
                    );
            let handle = layer.lease_handle();
            let svc = BoxCloneService::new(
                tower::ServiceBuilder::new()
                    .layer(layer)
                    .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) }),
            );
            (svc, handle)
        })
        .collect();
    let mut per_window = [0_u64; 6];
    for ms in 0..6_000 {
        clock.advance(Duration::from_millis(1));
        for (svc, _) in &mut instances {
            for _ in 0..3 {
                if call(svc).await.is_ok() {
                    per_window[ms / 1_000] += 1;
                }
            }
        }
        tokio::task::yield_now().await;
    }
    for (w, admitted) in per_window.iter().enumerate() {
        assert!(
            (48..=50).contains(admitted),
            "window {w}: {admitted} admitted of 50 ({per_window:?})"
        );
    }
    for (_, h) in &instances {
        h.shutdown().await;
    }
}

/// An instance that learns a lockout from the store's denial stops spending the batch it still holds: a request
/// its batch could pay is refused too, until the lockout's end (the batch goes back on shutdown).
#[tokio::test]
async fn an_instance_denied_under_a_lockout_stops_spending_its_batch() {
    let redis = redis_store("lease-lockout-learned").await;
    let clock = ManualClock::new(start());
    let policy = Policy::token_bucket(Quota::per_second(100).unwrap().with_burst(100).unwrap())
        .with_lockout(Duration::from_secs(60))
        .unwrap();
    let store = Arc::new(Granting {
        clocked: Clocked {
            redis,
            clock: clock.clone(),
            calls: AtomicUsize::new(0),
        },
        grants: std::sync::Mutex::default(),
        key: std::sync::Mutex::default(),
        returned: std::sync::Mutex::default(),
    });
    let layer = RateLimitLayer::new("leased", policy, store.clone(), ConstKey::new("hot"))
        .cost(CostFn::new(|cost: &u64| *cost))
        .deny_cache(false)
        .leases(LeaseConfig::new().clock(clock.clone()));
    let handle = layer.lease_handle();
    let mut svc: BoxCloneService<u64, Reply, BoxError> = BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: u64| async { Ok::<_, BoxError>(Reply::default()) }),
    );
    // Hot, with a batch in hand (fetched ahead: at least half a batch is held after each take).
    for _ in 0..30 {
        clock.advance(Duration::from_millis(1));
        handle.settled().await;
        svc.ready().await.unwrap().call(1).await.unwrap();
    }
    handle.settled().await;
    assert!(handle.local_admissions() > 0, "no batch");
    // Another client empties the bucket on the plain path (no denial: no lockout yet).
    let key = store.key.lock().unwrap().clone();
    loop {
        let d = store.clocked.check(&key, &policy, 1).await.unwrap();
        assert!(d.is_allowed());
        if d.remaining == 0 {
            break;
        }
    }
    // A request the batch cannot pay goes to the store, whose denial starts the lockout.
    let Err(err) = svc.ready().await.unwrap().call(50).await else {
        panic!("a cost of 50 on an empty bucket was admitted");
    };
    let rejection = err.downcast_ref::<Rejection>().expect("a rejection");
    assert_eq!(rejection.kind(), RejectionKind::RateLimited);
    assert_eq!(rejection.retry_after(), Some(Duration::from_secs(60)));
    // A request the batch could pay is refused as well, until the lockout's end.
    clock.advance(Duration::from_millis(1));
    let Err(err) = svc.ready().await.unwrap().call(1).await else {
        panic!("admitted from the batch during the lockout");
    };
    let retry = err
        .downcast_ref::<Rejection>()
        .unwrap()
        .retry_after()
        .unwrap();
    assert!(
        retry > Duration::from_secs(59) && retry < Duration::from_secs(60),
        "retry after {retry:?}"
    );
    handle.shutdown().await;
    let returned: u64 = store.returned.lock().unwrap().iter().sum();
    assert!(
        returned > 0,
        "the instance held no batch: the test shows nothing"
    );
}
