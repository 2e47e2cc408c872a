//! RedisStore against the shared Redis at `REDIS_URL`: the shared vectors, Rust/Lua agreement, atomicity under
//! concurrency, several instances sharing one limit, and TTLs. Each test uses its own key namespace.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::AsyncCommands;
use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};
use tollgate_core::{Algorithm, MemoryStore, Outcome, Policy, Quota, Store, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_testkit::vectors::Vectors;

#[tokio::test]
async fn shared_vectors_are_bit_identical_to_memory_store_and_expected() {
    let redis = common::AclRedis::start();
    let vectors = Vectors::load();
    assert!(
        vectors.cases.len() >= 10,
        "the vector file holds too few cases"
    );
    let redis = redis.store("vectors").await;
    let mut steps = 0;
    for (i, case) in vectors.cases.iter().enumerate() {
        let policy = case.policy();
        let memory = MemoryStore::new();
        for (j, step) in case.steps.iter().enumerate() {
            // A key per case: cases must not see each other's state.
            let key = format!("case{i}:{}", step.key);
            let (from_redis, from_memory) = if let Some(delta) = step.charge {
                let (decided, at) = (step.decided_at(), step.at());
                let from_redis = redis.charge_at(&key, &policy, delta, decided, at).await;
                (
                    from_redis.expect("redis charges"),
                    memory
                        .charge_at(&key, &policy, delta, decided, at)
                        .expect("memory charges"),
                )
            } else if step.peek {
                let from_redis = redis.peek_at(&key, &policy, step.cost, step.at()).await;
                (
                    from_redis.expect("redis peeks"),
                    memory.peek_at(&key, &policy, step.cost, step.at()),
                )
            } else {
                let from_redis = redis.check_at(&key, &policy, step.cost, step.at()).await;
                (
                    from_redis.expect("redis decides"),
                    memory
                        .check_at(&key, &policy, step.cost, step.at())
                        .expect("memory decides"),
                )
            };
            let expected = step.expected(&policy);
            assert_eq!(
                from_redis, expected,
                "case {:?}, step {j}: redis vs expected",
                case.name
            );
            assert_eq!(
                from_memory, expected,
                "case {:?}, step {j}: memory vs expected",
                case.name
            );
            steps += 1;
        }
    }
    assert!(steps >= 100, "only {steps} steps ran");
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Rust and Lua agree on awkward policies too: huge limits, periods that share no factor with the limit,
/// microsecond periods, products close to 2^52, costs above the burst, and a clock that steps back.
#[tokio::test]
async fn lua_agrees_with_rust_on_random_policies_and_traffic() {
    let redis = common::AclRedis::start();
    let redis = redis.store("agree").await;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let quotas: Vec<Quota> = [
        (3, 7),
        (1, 1),
        (999_983, 3_600_000_000),
        (1 << 20, 999_999_937),
        (1_000_000_007, 86_400_000_000),
        (13, 1_700_000),
        (1 << 40, 1_000_000),
        (1 << 30, 1_048_576),
        (4_503_599, 1_000_000_000),
    ]
    .into_iter()
    .filter_map(|(limit, us)| Quota::new(limit, Duration::from_micros(us)).ok())
    .collect();
    assert!(quotas.len() >= 7, "too few valid quotas: {quotas:?}");
    let mut policies = Vec::new();
    for q in quotas {
        policies.push(Policy::token_bucket(q));
        policies.push(Policy::token_bucket(q.with_burst(1).unwrap()));
        if let Ok(q) = q.with_burst(q.limit().saturating_mul(3).min(1 << 30)) {
            policies.push(Policy::token_bucket(q));
        }
        if let Ok(p) = Policy::sliding_window(q) {
            policies.push(p);
        }
    }
    let mut compared = 0;
    for (i, policy) in policies.iter().enumerate() {
        let memory = MemoryStore::new();
        let period = policy.quota().period_micros();
        let mut now = 1_700_000_000_000_000 + rng.below(1 << 40);
        for _ in 0..60 {
            now = match rng.below(10) {
                0 => now.saturating_sub(rng.below(period.min(1 << 30) + 1)), // the clock steps back
                1..=3 => now,
                4..=7 => now + rng.below(period / 4 + 1),
                _ => now + rng.below(3 * period + 1),
            };
            let burst = policy.max_cost();
            let cost = match rng.below(8) {
                0 => 0,
                1 => burst,
                2 => burst + 1 + rng.below(3),
                3 => rng.below(burst.min(1 << 20)) + 1,
                _ => 1,
            };
            let key = format!("p{i}");
            let at = Timestamp::from_micros(now);
            let r = redis
                .check_at(&key, policy, cost, at)
                .await
                .expect("redis decides");
            let m = memory
                .check_at(&key, policy, cost, at)
                .expect("memory decides");
            assert_eq!(r, m, "policy {policy:?}, cost {cost}, at {now}");
            compared += 1;
        }
    }
    assert!(compared > 1_000);
}

/// A held decision (a request the caller may hold back) is the same in Lua as in Rust
/// (`token_bucket::decide_held`), interleaved with plain ones, on awkward token bucket quotas; a sliding window and
/// a lockout (whose script takes no hold) are decided as without one.
#[tokio::test]
async fn lua_holds_as_rust_does() {
    let redis = common::AclRedis::start();
    let redis = redis.store("hold").await;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let quotas: Vec<Quota> = [
        (3, 7),
        (1, 1),
        (100, 1_000_000),
        (13, 1_700_000),
        (999_983, 3_600_000_000),
        (1 << 40, 1_000_000),
    ]
    .into_iter()
    .filter_map(|(limit, us)| Quota::new(limit, Duration::from_micros(us)).ok())
    .collect();
    let (mut compared, mut held) = (0, 0);
    for (i, q) in quotas
        .iter()
        .flat_map(|q| [*q, q.with_burst(1).unwrap()])
        .enumerate()
    {
        let policy = Policy::token_bucket(q);
        let period = q.period_micros();
        let mut state: Option<TokenBucketState> = None;
        let mut now = 1_700_000_000_000_000 + rng.below(1 << 40);
        for _ in 0..80 {
            now += match rng.below(4) {
                0 => 0,
                1 | 2 => rng.below(period / 8 + 1),
                _ => rng.below(2 * period + 1),
            };
            let cost = if rng.below(4) == 0 {
                rng.below(q.burst().min(1 << 20)) + 1
            } else {
                1
            };
            let at = Timestamp::from_micros(now);
            let key = format!("h{i}");
            let (r, step) = if rng.below(3) == 0 {
                let r = redis.check_at(&key, &policy, cost, at).await;
                (r, token_bucket::decide(state, &q, cost, at))
            } else {
                let hold = Duration::from_micros(rng.below(2 * period + 1));
                let r = redis.check_held_at(&key, &policy, cost, hold, at).await;
                (r, token_bucket::decide_held(state, &q, cost, at, hold))
            };
            let r = r.expect("redis decides");
            assert_eq!(r, step.decision, "quota {q:?}, cost {cost}, at {now}");
            held += usize::from(r.is_allowed() && r.retry_after.is_some());
            state = step.state.or(state);
            compared += 1;
        }
    }
    assert!(
        compared >= 800 && held >= 50,
        "{compared} compared, {held} held"
    );

    // No hold where the script takes none: the same decisions as plain checks on a twin key.
    let q = Quota::new(2, Duration::from_secs(1)).unwrap();
    let lockout = Policy::token_bucket(q)
        .with_lockout(Duration::from_secs(5))
        .unwrap();
    for policy in [Policy::sliding_window(q).unwrap(), lockout] {
        for step in 0..4 {
            let at = Timestamp::from_micros(1_700_000_000_000_000 + step * 100_000);
            let hold = Duration::from_secs(1);
            let held = redis
                .check_held_at("twin-a", &policy, 1, hold, at)
                .await
                .unwrap();
            let plain = redis.check_at("twin-b", &policy, 1, at).await.unwrap();
            assert_eq!(held, plain, "{policy:?}, step {step}");
        }
    }
}

/// The textbook race: read state, decide in the client, write state back. Two round trips let concurrent
/// callers read the same state.
async fn naive_check(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    policy: &Policy,
) -> bool {
    let (full_at, remainder): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(key)
        .arg("full_at")
        .arg("remainder")
        .query_async(conn)
        .await
        .unwrap();
    let state = full_at.map(|full_at| TokenBucketState {
        full_at,
        remainder: remainder.unwrap_or(0),
    });
    let step = token_bucket::decide(
        state,
        &policy.quota(),
        1,
        Timestamp::from(std::time::SystemTime::now()),
    );
    if let Some(s) = step.state {
        let _: () = conn
            .hset_multiple(key, &[("full_at", s.full_at), ("remainder", s.remainder)])
            .await
            .unwrap();
        let _: () = conn.expire(key, 3_600).await.unwrap();
    }
    step.decision.is_allowed()
}

#[test]
fn sixty_four_concurrent_tasks_admit_exactly_the_limit_and_a_naive_client_does_not() {
    let redis = common::AclRedis::start();
    let rt = common::runtime();
    rt.block_on(async {
        const TASKS: usize = 64;
        const PER_TASK: usize = 8;
        let limit = 100;
        for policy in [common::hourly_bucket(limit), common::hourly_window(limit)] {
            let store = Arc::new(redis.store("atomic").await);
            let admitted = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for _ in 0..TASKS {
                let (store, admitted) = (store.clone(), admitted.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..PER_TASK {
                        if store
                            .check("hot", &policy, 1)
                            .await
                            .expect("redis decides")
                            .is_allowed()
                        {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            assert_eq!(
                admitted.load(Ordering::Relaxed),
                limit,
                "{:?}",
                policy.algorithm()
            );
        }

        // The same load through the naive client over-admits: the race is real.
        let policy = common::hourly_bucket(limit);
        let key = format!("{}:naive", tollgate_testkit::redis::unique_prefix("naive"));
        let client = redis::Client::open(redis.url()).unwrap();
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let (admitted, key) = (admitted.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..PER_TASK {
                    if naive_check(&mut conn, &key, &policy).await {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let naive = admitted.load(Ordering::Relaxed);
        assert!(
            naive > limit,
            "the naive GET-then-SET client admitted {naive}, expected more than {limit}"
        );
    });
}

#[test]
fn four_instances_with_their_own_pools_share_one_global_limit() {
    let redis = common::AclRedis::start();
    let rt = common::runtime();
    rt.block_on(async {
        let namespace = tollgate_testkit::redis::unique_prefix("fleet");
        for policy in [common::hourly_bucket(40), common::hourly_window(40)] {
            let mut instances = Vec::new();
            for _ in 0..4 {
                let store = redis
                    .builder_in(namespace.clone())
                    .pool_size(8)
                    .build()
                    .await
                    .unwrap();
                instances.push(Arc::new(store));
            }
            let admitted = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for store in &instances {
                for _ in 0..8 {
                    let (store, admitted) = (store.clone(), admitted.clone());
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..5 {
                            // Through the Store trait, as a tower layer would call it.
                            if store
                                .check("tenant", &policy, 1)
                                .await
                                .unwrap()
                                .is_allowed()
                            {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                }
            }
            for t in tasks {
                t.await.unwrap();
            }
            // 160 attempts; an in-process limit per instance would admit 4 × 40.
            assert_eq!(
                admitted.load(Ordering::Relaxed),
                40,
                "{:?}",
                policy.algorithm()
            );
        }
    });
}

#[tokio::test]
async fn every_key_has_the_policy_derived_ttl() {
    let redis = common::AclRedis::start();
    let store = redis.store("ttl").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();

    // 5 per hour: each token is 720 s, so after two requests the bucket is full again in 1440 s.
    let bucket = common::hourly_bucket(5);
    // 10 per minute: an admitted request keeps the window alive until the end of the next window.
    let window = Policy::sliding_window(Quota::per_minute(10).unwrap()).unwrap();
    for (policy, requests) in [(bucket, 2), (window, 3)] {
        let mut last = None;
        for _ in 0..requests {
            last = Some(store.check("client", &policy, 1).await.unwrap());
        }
        let decision = last.unwrap();
        let key = store.redis_key("client", policy.algorithm());
        let pttl: i64 = conn.pttl(&key).await.unwrap();
        let derived = i64::try_from(decision.reset_after().as_micros().div_ceil(1_000)).unwrap();
        assert!(derived > 0);
        // The TTL was set to `derived` when the script ran; the PTTL read afterwards can only be lower.
        assert!(
            pttl <= derived && pttl > derived - 5_000,
            "{:?}: PTTL {pttl} ms, derived {derived} ms",
            policy.algorithm()
        );
        if policy.algorithm() == Algorithm::TokenBucket {
            // Two tokens of 720 s owed, minus the moment between the two requests.
            assert!(derived <= 1_440_000 && derived > 1_435_000, "{derived}");
        }
    }

    // A denied request writes nothing: the TTL is not extended.
    let tiny = Policy::token_bucket(Quota::per_hour(1).unwrap());
    assert_eq!(
        store.check("once", &tiny, 1).await.unwrap().outcome,
        Outcome::Allowed
    );
    let once = store.redis_key("once", Algorithm::TokenBucket);
    let before: i64 = conn.pttl(&once).await.unwrap();
    assert_eq!(
        store.check("once", &tiny, 1).await.unwrap().outcome,
        Outcome::Limited
    );
    let after: i64 = conn.pttl(&once).await.unwrap();
    assert!(
        after <= before,
        "a denied request extended the TTL from {before} to {after}"
    );

    // No tollgate limiter key in the shared Redis lacks a TTL (whoever wrote it).
    let mut iter: redis::AsyncIter<String> = conn.scan_match("*:{*}:[ts][bw]").await.unwrap();
    let mut keys = Vec::new();
    while let Some(k) = iter.next_item().await {
        keys.push(k.unwrap());
    }
    drop(iter);
    assert!(keys.len() >= 2);
    for key in keys {
        let pttl: i64 = conn.pttl(&key).await.unwrap();
        assert!(pttl != -1, "{key} has no TTL");
    }
}

#[tokio::test]
async fn state_left_by_another_quota_is_decided_alike_by_lua_and_rust() {
    let redis = common::AclRedis::start();
    // A limit changed under a running key (a redeploy) leaves a bucket written in the old quota's units: a
    // remainder above what the new quota owes, or a refill instant far beyond its bucket. Both stores must read it
    // the same way, and neither may fail on it.
    let store = redis.store("foreign").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let now = Timestamp::from_micros(1_700_000_000_000_000);
    let policy = Policy::token_bucket(Quota::per_second(1_000).unwrap());
    let states = [
        TokenBucketState {
            full_at: now.as_micros() + 1,
            remainder: 999_999,
        },
        TokenBucketState {
            full_at: now.as_micros() + 10,
            remainder: 10_000,
        },
        TokenBucketState {
            full_at: now.as_micros() + 3_600_000_000,
            remainder: 0,
        },
    ];
    for (i, state) in states.into_iter().enumerate() {
        let key = format!("k{i}");
        let redis_key = store.redis_key(&key, Algorithm::TokenBucket);
        let _: () = conn
            .hset_multiple(
                &redis_key,
                &[("full_at", state.full_at), ("remainder", state.remainder)],
            )
            .await
            .unwrap();
        let _: () = conn.expire(&redis_key, 3_600).await.unwrap();
        let from_redis = store.check_at(&key, &policy, 1, now).await.unwrap();
        let expected = token_bucket::decide(Some(state), &policy.quota(), 1, now).decision;
        assert_eq!(from_redis, expected, "state {state:?}");
        assert!(from_redis.remaining <= from_redis.limit, "{from_redis:?}");
    }
}

#[tokio::test]
async fn a_window_decided_after_a_clock_step_back_lives_until_its_reset() {
    let redis = common::AclRedis::start();
    // After a step back the window decides as of its stored start, a later instant than the server's; its key
    // must still live until the reset in the server's time, as the in-process store keeps it, not expire as
    // much earlier as the clock stepped back.
    let store = redis.store("step-back").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let window = Policy::sliding_window(Quota::per_hour(10).unwrap()).unwrap();
    let hour = 3_600_000_000_u64;
    let window_start = Timestamp::from_micros(1_700_000_000_000_000 / hour * hour + hour);
    let at = |offset: i64| {
        Timestamp::from_micros(window_start.as_micros().checked_add_signed(offset).unwrap())
    };
    let first = store
        .check_at("c", &window, 1, at(10_000_000))
        .await
        .unwrap();
    assert!(first.is_allowed());
    // An hour back: into the previous window.
    let stepped = store
        .check_at("c", &window, 1, at(10_000_000 - 3_600_000_000))
        .await
        .unwrap();
    assert!(stepped.is_allowed());
    assert_eq!(stepped.reset, first.reset, "the stored window decides");
    let key = store.redis_key("c", Algorithm::SlidingWindowCounter);
    let pttl: i64 = conn.pttl(&key).await.unwrap();
    // The reset is two hours after the window's start; the server's time (the injected one) is 59 min 50 s
    // before that start: 3 h less 10 s.
    let until_reset = 3 * 3_600_000 - 10_000;
    assert!(
        pttl <= until_reset && pttl > until_reset - 5_000,
        "PTTL {pttl} ms, the reset is {until_reset} ms away"
    );
}

#[tokio::test]
async fn bad_builder_settings_are_errors() {
    let redis = common::AclRedis::start();
    for ns in ["", "has space", "{tag}", &"n".repeat(65)] {
        let err = RedisStore::builder(redis.url())
            .namespace(ns)
            .build()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("namespace"), "{err}");
    }
    let err = RedisStore::builder(redis.url())
        .timeout(Duration::ZERO)
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timeout"), "{err}");
    let err = RedisStore::builder("not a url").build().await.unwrap_err();
    assert!(err.to_string().contains("Redis"), "{err}");
}

#[tokio::test]
async fn hostile_keys_are_hashed_and_still_limited() {
    let redis = common::AclRedis::start();
    let store = redis.store("hostile").await;
    let policy = common::hourly_bucket(2);
    let long = "k".repeat(10_000);
    for key in [long.as_str(), "{slot}", "caf\u{e9} \u{0}\n"] {
        let redis_key = store.redis_key(key, Algorithm::TokenBucket);
        assert!(
            redis_key.len() < 120 && !redis_key.contains(key),
            "{redis_key}"
        );
        assert!(store.check(key, &policy, 1).await.unwrap().is_allowed());
        assert!(store.check(key, &policy, 1).await.unwrap().is_allowed());
        assert!(!store.check(key, &policy, 1).await.unwrap().is_allowed());
    }
}
