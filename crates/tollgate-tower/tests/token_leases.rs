//! Token leases against real Redis: N instances (N layers on one Redis, each its own instance id) with random
//! arrival timings never admit more than the plain path's bound; an instance killed holding a batch costs the
//! others at most that batch; a paused or killed Redis mid-lease meets each failure policy once the batch is
//! spent; headers stay this instance's monotone view.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::algorithm::sliding_window::{self, SlidingWindowState};
use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{
    Clock, Decision, FailurePolicy, ManualClock, Policy, Quota, Store, StoreError, Timestamp,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{RedisServer, cli_url, redis_url, unique_prefix};
use tollgate_tower::{
    BoxError, DenyCacheConfig, LeaseConfig, LeasedStore, RateLimitLayer, Rejection, RejectionKind,
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
/// A leasing limiter on [`Clocked`], kept beside its service to reach its leases (the clones share them).
type Layer = RateLimitLayer<&'static str, Clocked>;

/// Redis deciding at a manual clock's instants (plain requests and lease calls alike), counting its calls and
/// logging what it counted.
struct Clocked {
    redis: Arc<RedisStore>,
    clock: ManualClock,
    calls: AtomicUsize,
    log: std::sync::Mutex<Vec<Counted>>,
}

/// What the store counted: a plain request admitted, or a lease call (slots or tokens granted, and what it gave
/// back of a batch granted in the window starting at `from`).
#[derive(Debug, Clone, Copy)]
enum Counted {
    Plain {
        at: u64,
        cost: u64,
    },
    Lease {
        at: u64,
        granted: u64,
        returned: u64,
        from: u64,
    },
}

impl Clocked {
    fn new(redis: Arc<RedisStore>, clock: &ManualClock) -> Self {
        Self {
            redis,
            clock: clock.clone(),
            calls: AtomicUsize::new(0),
            log: std::sync::Mutex::default(),
        }
    }
}

impl Store for Clocked {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let at = self.clock.now();
        let decision = self.redis.check_at(key, policy, cost, at).await?;
        if decision.is_allowed() {
            let at = at.as_micros();
            self.log.lock().unwrap().push(Counted::Plain { at, cost });
        }
        Ok(decision)
    }
    async fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> Result<TokenLeaseGrant, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let at = self.clock.now();
        let grant = self.redis.lease_tokens_at(key, policy, request, at).await?;
        self.log.lock().unwrap().push(Counted::Lease {
            at: at.as_micros(),
            granted: grant.granted,
            returned: request.unspent,
            from: request.window_start,
        });
        Ok(grant)
    }
    fn is_shared(&self) -> bool {
        true
    }
    fn supports_token_leases(&self) -> bool {
        true
    }
}

/// One instance of the leasing limiter on `store`, its deny cache (on, as by default on a shared store) on the
/// store's manual clock: a denial's entry expires when the store's time says, not the machine's.
fn instance(store: Arc<Clocked>, policy: Policy, config: LeaseConfig) -> (Svc, Layer) {
    let deny_cache = DenyCacheConfig::new().clock(store.clock.clone());
    let layer = RateLimitLayer::new("leased", policy, store, "hot")
        .deny_cache_config(deny_cache)
        .leases(config);
    let handle = layer.clone();
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
    Arc::new(Clocked::new(redis_store(test).await, clock))
}

fn start() -> Timestamp {
    // A whole second: sliding windows start at round instants.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    Timestamp::from_micros(now * 1_000_000)
}

/// `n` instances on one store, leases of `ttl`.
fn fleet(store: &Arc<Clocked>, policy: Policy, n: usize, ttl: Duration) -> Vec<(Svc, Layer)> {
    (0..n)
        .map(|_| {
            let config = LeaseConfig::new()
                .share_percent(25)
                .unwrap()
                .ttl(ttl)
                .clock(store.clock.clone());
            instance(store.clone(), policy, config)
        })
        .collect()
}

/// What a fleet run saw: the instants of the admissions, how many came from batches, and what the store counted.
struct Run {
    admitted: Vec<u64>,
    local: u64,
    counted: Vec<Counted>,
}

/// Runs `events` (instance, µs to wait before its request, whether to let fetches land first) through `n`
/// instances with leases of `ttl`. Before them every instance takes a batch, the clock passes its deadline while
/// it still holds tokens, a plain request lets the store drop the expired records, the bucket refills in full,
/// and then all of them ask at one instant: a batch spent past its deadline would show there, beside the full
/// bucket.
async fn run(
    redis: &Arc<RedisStore>,
    policy: Policy,
    n: usize,
    ttl: Duration,
    events: &[(usize, u64, bool)],
) -> Run {
    let clock = ManualClock::new(start());
    let store = Arc::new(Clocked::new(redis.clone(), &clock));
    let mut instances = fleet(&store, policy, n, ttl);
    let mut admitted = Vec::new();
    for (svc, handle) in &mut instances {
        for _ in 0..6 {
            clock.advance(Duration::from_micros(300));
            if call(svc).await.is_ok() {
                admitted.push(clock.now().as_micros());
            }
            handle.leases_settled().await;
        }
    }
    let key = store.redis.redis_key("leased:hot", policy.algorithm());
    let fields = cli_url(&redis_url(), &["HGETALL", &key]);
    let mut lines = fields.lines();
    let held = std::iter::from_fn(|| Some((lines.next()?, lines.next()?)))
        .filter(|(f, _)| f.starts_with("l:"))
        .count();
    assert!(
        held > 0,
        "no instance holds a batch before its deadline: {fields}"
    );
    clock.advance(ttl + Duration::from_millis(1));
    if store
        .check("leased:hot", &policy, 1)
        .await
        .unwrap()
        .is_allowed()
    {
        admitted.push(clock.now().as_micros());
    }
    let quota = policy.quota();
    clock.advance(quota.period() * u32::try_from(quota.burst() / quota.limit() + 1).unwrap());
    for _ in 0..15 {
        for (svc, handle) in &mut instances {
            if call(svc).await.is_ok() {
                admitted.push(clock.now().as_micros());
            }
            handle.leases_settled().await;
        }
    }
    for &(i, wait, settle) in events {
        clock.advance(Duration::from_micros(wait));
        let (svc, handle) = &mut instances[i % n];
        if settle {
            handle.leases_settled().await;
        }
        if call(svc).await.is_ok() {
            admitted.push(clock.now().as_micros());
        }
        tokio::task::yield_now().await;
    }
    let local = instances
        .iter()
        .map(|(_, h)| h.leases_local_admissions())
        .sum();
    for (_, h) in &instances {
        h.leases_shutdown().await;
    }
    let counted = store.log.lock().unwrap().clone();
    Run {
        admitted,
        local,
        counted,
    }
}

/// The sliding window oracle: the store's counting replayed through a plain sliding window. Every plain admission
/// and every grant (k slots at once, as k requests would be) must be one a plain window admits at that instant,
/// with returns taken off the window they were granted in; the events of one instant are replayed together,
/// returns first. Returns what was counted per window (start → slots).
fn replay_through_a_plain_window(
    policy: &Policy,
    counted: &[Counted],
) -> Result<std::collections::BTreeMap<u64, i64>, TestCaseError> {
    let period = policy.quota().period_micros();
    let mut oracle: Option<SlidingWindowState> = None;
    let mut per_window = std::collections::BTreeMap::<u64, i64>::new();
    let at_of = |c: &Counted| match *c {
        Counted::Plain { at, .. } | Counted::Lease { at, .. } => at,
    };
    for same in counted.chunk_by(|a, b| at_of(a) == at_of(b)) {
        let at = at_of(&same[0]);
        let start = at - at % period;
        // The window as of `at`, then the instant's returns.
        let (mut previous, mut current) = match oracle {
            Some(s) if s.window_start == start => (s.previous, s.current),
            Some(s) if s.window_start + period == start => (s.current, 0),
            _ => (0, 0),
        };
        let mut added = 0;
        for c in same {
            match *c {
                Counted::Plain { cost, .. } => added += cost,
                Counted::Lease {
                    granted,
                    returned,
                    from,
                    ..
                } => {
                    added += granted;
                    if from == start {
                        let back = returned.min(current);
                        current -= back;
                        *per_window.entry(from).or_default() -= back as i64;
                    } else if from + period == start {
                        let back = returned.min(previous);
                        previous -= back;
                        *per_window.entry(from).or_default() -= back as i64;
                    }
                }
            }
        }
        oracle = Some(SlidingWindowState {
            window_start: start,
            previous,
            current,
        });
        if added > 0 {
            let step = sliding_window::decide(oracle, policy, added, Timestamp::from_micros(at));
            prop_assert!(
                step.decision.is_allowed(),
                "at {at}: {added} counted where a plain window with {previous} before and {current} now admits \
                 {} ({same:?})",
                step.decision.remaining
            );
            oracle = step.state;
            *per_window.entry(start).or_default() += added as i64;
        }
    }
    Ok(per_window)
}

fn events() -> impl Strategy<Value = Vec<(usize, u64, bool)>> {
    let wait = prop_oneof![9 => 0..3_000u64, 1 => 0..60_000u64];
    prop::collection::vec((0..4usize, wait, prop::bool::weighted(0.7)), 100..220)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Token bucket, 200/s with a burst of 40, leases of 40 ms (the run begins with every instance holding a batch
    /// past its deadline, and lasts 0.2 to 2 s of manual time more, where some instances sit idle past theirs):
    /// in every interval [a, b] the fleet admits at most 40 + 200 × (b − a) / 1 s, whatever the arrival timings
    /// and however the fetches interleave.
    #[test]
    fn the_fleet_never_admits_more_than_burst_plus_rate_times_t(n in 2..=4usize, events in events()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let Run { admitted, local, .. } = runtime.block_on(async {
            let redis = redis_store("lease-prop").await;
            let policy = Policy::token_bucket(Quota::per_second(200).unwrap().with_burst(40).unwrap());
            run(&redis, policy, n, Duration::from_millis(40), &events).await
        });
        for (i, a) in admitted.iter().enumerate() {
            for (j, b) in admitted.iter().enumerate().skip(i) {
                let bound = 40 + (b - a) * 200 / 1_000_000;
                prop_assert!((j - i + 1) as u64 <= bound, "{} admitted in [{a}, {b}], bound {bound}", j - i + 1);
            }
        }
        prop_assert!(local > 0, "no request was admitted from a batch");
    }

    /// Sliding window, 60 per second: what the store counted (plain admissions, grants, returns) replayed
    /// through a plain sliding window is all admitted there; no window admits more than it counted; and every
    /// admission keeps the estimate of what was really admitted (at the instants it was) within 60.
    #[test]
    fn a_sliding_window_fleet_admits_only_what_a_plain_window_would(n in 2..=4usize, events in events()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let policy = Policy::sliding_window(Quota::per_second(60).unwrap()).unwrap();
        prop_assert_eq!(policy.tick_micros(), 1);
        let Run { admitted, local, counted } = runtime.block_on(async {
            let redis = redis_store("lease-prop-sw").await;
            run(&redis, policy, n, Duration::from_secs(1), &events).await
        });
        prop_assert!(local > 0, "no request was admitted from a batch");
        let per_window = replay_through_a_plain_window(&policy, &counted)?;
        let period = 1_000_000;
        let mut admitted_in = std::collections::BTreeMap::<u64, i64>::new();
        for &t in &admitted {
            let start = t - t % period;
            *admitted_in.entry(start).or_default() += 1;
            let current = admitted_in[&start];
            let previous = admitted_in.get(&(start - period)).copied().unwrap_or(0);
            // estimate × period = current × period + previous × (period − elapsed), in µs ticks.
            let elapsed = (t - start) as i64;
            prop_assert!(
                current * period as i64 + previous * (period as i64 - elapsed) <= 60 * period as i64,
                "at {t}: {current} admitted in this window and {previous} in the last, {elapsed} µs in"
            );
        }
        for (start, n) in admitted_in {
            let counted = per_window.get(&start).copied().unwrap_or(0);
            prop_assert!(n <= counted, "window {start}: {n} admitted, {counted} counted");
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
    let store = Arc::new(Clocked::new(redis.clone(), &clock));
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
            handle.leases_settled().await;
        }
        let result = call(svc).await;
        admitted[i] += u64::from(result.is_ok());
        shown[i].push((remaining_of(&result), admitted[i], elapsed));
    }
    for (_, h) in &instances {
        h.leases_shutdown().await;
    }
    shown
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    /// The header fields under leases, for clients hammering a hot key (token bucket 100/s, burst 60: a token
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
        doomed_leases.leases_settled().await;
    }
    assert!(doomed_leases.leases_local_admissions() > 0);
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
        survivor_leases.leases_settled().await;
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
        survivor_leases.leases_settled().await;
    }
    assert!(
        (29..=31).contains(&later),
        "admitted {later} after 3 s at 10/s"
    );
    survivor_leases.leases_shutdown().await;
}

/// One Redis server through two stores: a 5 s timeout while the test keeps the server healthy (a loaded machine's
/// round trip never meets the failure policy there) and a 200 ms one once the test breaks it (each call then
/// meets the failure policy quickly).
struct Breakable {
    healthy: RedisStore,
    faulty: RedisStore,
    broken: std::sync::atomic::AtomicBool,
}

impl Breakable {
    async fn new(server: &RedisServer) -> Self {
        let store = |timeout| RedisStore::builder(server.url()).timeout(timeout).build();
        Self {
            healthy: store(Duration::from_secs(5)).await.unwrap(),
            faulty: store(Duration::from_millis(200)).await.unwrap(),
            broken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on calls go through the short timeout.
    fn break_now(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }

    fn store(&self) -> &RedisStore {
        if self.broken.load(Ordering::Relaxed) {
            &self.faulty
        } else {
            &self.healthy
        }
    }
}

impl Store for Breakable {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.store().check(key, policy, cost).await
    }
    async fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
    ) -> Result<TokenLeaseGrant, StoreError> {
        self.store().lease_tokens(key, policy, request).await
    }
    fn is_shared(&self) -> bool {
        true
    }
    fn supports_token_leases(&self) -> bool {
        true
    }
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
        let redis = Arc::new(Breakable::new(&server).await);
        let layer = RateLimitLayer::new(
            "paused",
            Policy::token_bucket(Quota::per_hour(1_000).unwrap()),
            redis.clone(),
            "hot",
        )
        .on_store_error(policy)
        .leases(
            LeaseConfig::new()
                .share_percent(2)
                .unwrap()
                .ttl(Duration::from_secs(60)),
        );
        let leases = layer.clone();
        let mut svc = BoxCloneService::new(
            tower::ServiceBuilder::new()
                .layer(layer)
                .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) }),
        );
        // Hot, with a batch of 20 in hand.
        for _ in 0..3 {
            call(&mut svc).await.unwrap();
            leases.leases_settled().await;
        }
        let fetched = leases.leases_store_calls();
        redis.break_now();
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
                let before = leases.leases_local_admissions();
                let result = call(&mut svc).await;
                leases.leases_settled().await;
                if leases.leases_local_admissions() > before {
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
            leases.leases_store_calls() > fetched,
            "{policy:?}: no fetch was tried during the outage"
        );
        leases.leases_shutdown().await;
    }
}

/// Redis at a manual clock's instants, recording every lease grant (instant, tokens) and how many grants came
/// before the store's first denial (events of one instant are told apart by their order).
struct Granting {
    clocked: Clocked,
    grants: std::sync::Mutex<Vec<(u64, u64)>>,
    granted_before_denial: std::sync::OnceLock<usize>,
    /// The store key the layer asks for (its limiter's name and the request's key).
    key: std::sync::Mutex<String>,
    /// What each return gave back.
    returned: std::sync::Mutex<Vec<u64>>,
}

impl Store for Granting {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        key.clone_into(&mut self.key.lock().unwrap());
        let decision = self.clocked.check(key, policy, cost).await?;
        if !decision.is_allowed() {
            let _ = self
                .granted_before_denial
                .set(self.grants.lock().unwrap().len());
        }
        Ok(decision)
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
        clocked: Clocked::new(redis, &clock),
        grants: std::sync::Mutex::default(),
        granted_before_denial: std::sync::OnceLock::new(),
        key: std::sync::Mutex::default(),
        returned: std::sync::Mutex::default(),
    });
    let mut instances: Vec<(Svc, _)> = (0..2)
        .map(|_| {
            // The deny cache off: every refusal is the store's or the lease table's own.
            let layer = RateLimitLayer::new("leased", policy, store.clone(), "hot")
                .deny_cache(false)
                .leases(LeaseConfig::new().clock(clock.clone()));
            let handle = layer.clone();
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
            handle.leases_settled().await;
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
    // The lockout begins with the store's first denial: every grant after it, in the store's own order.
    let first_denial = *store.granted_before_denial.get().expect("the store denied");
    let granted_after: u64 = store.grants.lock().unwrap()[first_denial..]
        .iter()
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
    let local: u64 = instances
        .iter()
        .map(|(_, h)| h.leases_local_admissions())
        .sum();
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
        handle.leases_settled().await;
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
        handle.leases_settled().await;
        call(svc).await.expect("the lockout is over");
    }
    for (_, h) in &instances {
        h.leases_shutdown().await;
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
        leases.leases_settled().await;
    }
    let plain = |store: &Clocked, leases: &Layer| {
        store.calls.load(Ordering::Relaxed) as u64 - leases.leases_store_calls()
    };
    let (plain_before, local_before) = (plain(&store, &leases), leases.leases_local_admissions());
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
    assert_eq!(leases.leases_local_admissions() - local_before, 1_020);
    leases.leases_shutdown().await;
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
        // Batches of 20 (2 %): a per-minute quota refills 83 in half its lease's life.
        Policy::token_bucket(Quota::per_minute(1_000).unwrap()),
        Arc::new(redis),
        "hot",
    )
    .on_store_error(FailurePolicy::Closed)
    .leases(
        LeaseConfig::new()
            .share_percent(2)
            .unwrap()
            .wait(Duration::from_millis(50)),
    );
    let leases = layer.clone();
    let mut svc = BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|()| async { Ok::<_, BoxError>(Reply::default()) }),
    );
    for _ in 0..3 {
        call(&mut svc).await.unwrap();
        leases.leases_settled().await;
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
    assert_eq!(
        leases.leases_fetches_in_flight(),
        1,
        "the fetch still hangs"
    );
    server.resume();
    leases.leases_settled().await;
    leases.leases_shutdown().await;
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
            let layer = RateLimitLayer::new("sw-flood", policy, store.clone(), "hot")
                .deny_cache_config(DenyCacheConfig::new().clock(clock.clone()))
                .leases(
                    LeaseConfig::new()
                        .clock(clock.clone())
                        .wait(Duration::from_secs(30)),
                );
            let handle = layer.clone();
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
        h.leases_shutdown().await;
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
        clocked: Clocked::new(redis, &clock),
        grants: std::sync::Mutex::default(),
        granted_before_denial: std::sync::OnceLock::new(),
        key: std::sync::Mutex::default(),
        returned: std::sync::Mutex::default(),
    });
    let layer = RateLimitLayer::new("leased", policy, store.clone(), "hot")
        .cost(|cost: &u64| *cost)
        .deny_cache(false)
        .leases(LeaseConfig::new().clock(clock.clone()));
    let handle = layer.clone();
    let mut svc: BoxCloneService<u64, Reply, BoxError> = BoxCloneService::new(
        tower::ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: u64| async { Ok::<_, BoxError>(Reply::default()) }),
    );
    // Hot, with a batch in hand (fetched ahead: at least half a batch is held after each take).
    for _ in 0..30 {
        clock.advance(Duration::from_millis(1));
        handle.leases_settled().await;
        svc.ready().await.unwrap().call(1).await.unwrap();
    }
    handle.leases_settled().await;
    assert!(handle.leases_local_admissions() > 0, "no batch");
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
    handle.leases_shutdown().await;
    let returned: u64 = store.returned.lock().unwrap().iter().sum();
    assert!(
        returned > 0,
        "the instance held no batch: the test shows nothing"
    );
}

/// Redis forgets a hot key while instances hold batches of it (its hash deleted: what a restart without
/// persistence, a `FLUSHALL` or a failover to a replica that missed the writes does), on both algorithms. The
/// plain path through the same loss admits a fresh burst (or window) afterwards; the leasing fleet may add only
/// what each instance spends of its old batch until its first grant after the loss lands — that grant's `held`
/// says the store knows only the grant, and the rest of the old batch is dropped. (Keeping it, as the layer did,
/// admitted the fresh burst plus every batch held.) The clock stands still: no refill muddies the count.
#[tokio::test(flavor = "current_thread")]
async fn a_store_that_forgets_a_key_leaves_no_batch_spendable_beside_the_fresh_one() {
    // A token bucket leases no more than its quota refills in half a lease's life (a per-minute quota's lease
    // lives 10 s: batches of 8); the clock never moves here, so nothing refills.
    for policy in [
        Policy::token_bucket(Quota::per_minute(100).unwrap()),
        Policy::sliding_window(Quota::per_hour(100).unwrap()).unwrap(),
    ] {
        // An hour's start: the sliding window's whole limit is in one window.
        let now = start().as_micros();
        let clock = ManualClock::new(Timestamp::from_micros(now - now % 3_600_000_000));
        let store = clocked("lease-forgotten", &clock).await;
        let config = || {
            LeaseConfig::new()
                .share_percent(20)
                .unwrap()
                .clock(clock.clone())
                .wait(Duration::from_secs(30))
        };
        let mut instances: Vec<_> = (0..3)
            .map(|_| instance(store.clone(), policy, config()))
            .collect();
        // Hot: each holds a batch (up to 20, a token bucket 8, fetched again below half), its fetches landing
        // between requests.
        let mut before = 0;
        for k in 0..30 {
            let (svc, handle) = &mut instances[k % 3];
            before += u64::from(call(svc).await.is_ok());
            handle.leases_settled().await;
        }
        assert!(
            instances
                .iter()
                .all(|(_, h)| h.leases_local_admissions() > 0),
            "an instance holds no batch: the test shows nothing"
        );
        assert!(before <= 100, "{before} admitted before the loss");
        let key = store.redis.redis_key("leased:hot", policy.algorithm());
        assert_eq!(cli_url(&redis_url(), &["DEL", &key]), "1", "{key}");

        // A flood through the three, round robin, until all refuse.
        let calls_at_loss: Vec<u64> = instances
            .iter()
            .map(|(_, h)| h.leases_store_calls())
            .collect();
        let mut landed = [false; 3];
        let (mut after, mut from_old_batches, mut refusals) = (0, 0, 0);
        for k in 0.. {
            assert!(k < 2_000, "{after} admitted and still admitting");
            let i = k % 3;
            let (svc, handle) = &mut instances[i];
            if call(svc).await.is_ok() {
                after += 1;
                from_old_batches += u64::from(!landed[i]);
                refusals = 0;
            } else {
                refusals += 1;
                if refusals == 6 {
                    break;
                }
            }
            handle.leases_settled().await;
            landed[i] |= handle.leases_store_calls() > calls_at_loss[i];
        }
        assert!(landed.iter().all(|l| *l), "an instance never fetched again");
        assert!(
            after <= 100 + from_old_batches,
            "{policy:?}: {after} admitted after the loss: the fresh 100 plus {from_old_batches} spent from the \
             old batches before a grant after the loss landed, at most"
        );
        assert!(
            after >= 100,
            "{policy:?}: only {after} admitted of the fresh 100"
        );
        for (_, h) in &instances {
            h.leases_shutdown().await;
        }
    }
}

/// [`LeaseConfig::around`] on Redis, as a rate limit service uses it (one store call per descriptor, the policy
/// with each call): three wrapped stores (three replicas, each its own instance id) on one hot key, on both
/// algorithms, the clock standing still. After 60 requests, most admitted from batches with far fewer store calls
/// than requests, a shutdown gives every unspent token back: the store holds the other 40. Then three more flood
/// the key: together they admit the rest at most, and at least the rest less what two may hold unspent when the
/// third refuses.
#[tokio::test(flavor = "current_thread")]
async fn leased_stores_on_one_redis_admit_the_burst_at_most_and_give_back_the_rest() {
    for policy in [
        Policy::token_bucket(Quota::per_minute(100).unwrap()),
        Policy::sliding_window(Quota::per_hour(100).unwrap()).unwrap(),
    ] {
        // An hour's start: the sliding window's whole limit is in one window.
        let now = start().as_micros();
        let clock = ManualClock::new(Timestamp::from_micros(now - now % 3_600_000_000));
        let store = clocked("leased-store", &clock).await;
        let share = 20;
        let replicas = || -> Vec<_> {
            (0..3)
                .map(|_| {
                    LeaseConfig::new()
                        .share_percent(share)
                        .unwrap()
                        .clock(clock.clone())
                        .around("gateway", store.clone())
                })
                .collect()
        };
        let first = replicas();
        let handles: Vec<_> = first.clone();
        for k in 0..60 {
            let decision = first[k % 3].check("hot", &policy, 1).await.unwrap();
            assert!(
                decision.is_allowed(),
                "{policy:?}: request {k}: {decision:?}"
            );
            handles[k % 3].settled().await;
        }
        let local: u64 = handles.iter().map(LeasedStore::local_admissions).sum();
        let calls = store.calls.load(Ordering::Relaxed);
        assert!(
            local > 30,
            "{policy:?}: {local} of 60 admitted from batches"
        );
        // A call per batch (up to 8 tokens, 20 slots) and a replica's first, cold, requests: under half of 60.
        assert!(
            calls * 2 < 60,
            "{policy:?}: {calls} store calls for 60 requests"
        );
        for handle in &handles {
            handle.shutdown().await;
        }
        let after = store.check("hot", &policy, 1).await.unwrap();
        assert!(after.is_allowed(), "{policy:?}: {after:?}");
        assert_eq!(
            after.remaining + 1,
            40,
            "{policy:?}: the store after shutdown: {after:?}"
        );

        // 39 left: flooded round robin until each of three refuses twice in a row.
        let second = replicas();
        let handles: Vec<_> = second.clone();
        let (mut admitted, mut refusals) = (0, [0; 3]);
        for k in 0.. {
            assert!(k < 1_000, "{admitted} admitted and still admitting");
            let i = k % 3;
            if second[i]
                .check("hot", &policy, 1)
                .await
                .unwrap()
                .is_allowed()
            {
                admitted += 1;
                refusals[i] = 0;
            } else {
                refusals[i] += 1;
                if refusals.iter().all(|r| *r >= 2) {
                    break;
                }
            }
            handles[i].settled().await;
        }
        // A token bucket's batch is at most 8 here (what a per-minute quota refills in half a 10 s lease); a
        // sliding window's, 20 % of 100.
        let largest = if policy.algorithm() == tollgate_core::Algorithm::TokenBucket {
            8
        } else {
            100 * u64::from(share) / 100
        };
        assert!(admitted <= 39, "{policy:?}: {admitted} admitted of 39");
        assert!(
            admitted + 2 * largest >= 39,
            "{policy:?}: only {admitted} admitted of 39: more than two batches were stranded"
        );
        for handle in &handles {
            handle.shutdown().await;
        }
    }
}

/// A wrapped store leases only what it can: a fixed window (no store leases one) takes the plain path, one store
/// call per request; a leased policy refuses a charge after the response (a refund would land under leased tokens)
/// where a fixed window's goes to the store; each policy leases in a table of its own, the handle counting them all.
#[tokio::test(flavor = "current_thread")]
async fn a_leased_store_keeps_fixed_windows_plain_refuses_charges_on_leased_policies_and_leases_per_policy()
 {
    let clock = ManualClock::new(start());
    let store = clocked("leased-store-plain", &clock).await;
    let leased = LeaseConfig::new()
        .clock(clock.clone())
        .around("gateway", store.clone());
    let handle = leased.clone();
    let fixed = Policy::fixed_window(Quota::per_hour(100).unwrap()).unwrap();
    for _ in 0..20 {
        assert!(leased.check("fixed", &fixed, 1).await.unwrap().is_allowed());
        handle.settled().await;
    }
    assert_eq!(
        store.calls.load(Ordering::Relaxed),
        20,
        "one call per request"
    );
    assert_eq!(handle.local_admissions(), 0);
    // Passed on: the store's own answer (this one charges nothing).
    let passed = leased.charge("fixed", &fixed, 1, clock.now()).await;
    assert!(
        matches!(passed, Err(StoreError::Unsupported("charge"))),
        "{passed:?}"
    );

    let per_second = Policy::sliding_window(Quota::per_second(1_000).unwrap()).unwrap();
    let per_hour = Policy::sliding_window(Quota::per_hour(1_000).unwrap()).unwrap();
    for policy in [per_second, per_hour] {
        for _ in 0..20 {
            assert!(leased.check("hot", &policy, 1).await.unwrap().is_allowed());
            handle.settled().await;
        }
    }
    assert!(
        handle.local_admissions() >= 2 * 10,
        "both policies lease: {} admitted from batches",
        handle.local_admissions()
    );
    let err = leased
        .charge("hot", &per_hour, -1, clock.now())
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Unsupported(what) if what.contains("leased")),
        "{err:?}"
    );
    assert!(
        !leased.supports_token_leases(),
        "a layer over it must not lease again"
    );
    handle.shutdown().await;
}
