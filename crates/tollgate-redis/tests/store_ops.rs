//! Peek and lockouts on a private Redis (its command statistics are this test's alone), as the least-privilege
//! user: a peek runs one read-only script call and writes nothing (`INFO commandstats`, key values and TTLs);
//! a lockout lives in the key's hash with a TTL covering it, on Redis's own clock.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;
use tollgate_core::{Algorithm, Outcome, Policy, Quota, Store};

/// `cmdstat_<name>` → calls, from `INFO commandstats`.
fn command_calls(server: &tollgate_testkit::redis::RedisServer) -> HashMap<String, u64> {
    let info = server.cli(&["INFO", "commandstats"]);
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Every field of a hash, and its TTL in ms.
async fn snapshot(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> (HashMap<String, String>, i64) {
    let fields: HashMap<String, String> = conn.hgetall(key).await.unwrap();
    let ttl: i64 = conn.pttl(key).await.unwrap();
    (fields, ttl)
}

#[tokio::test]
async fn a_peek_writes_nothing_on_either_algorithm() {
    let redis = common::AclRedis::start();
    let store = redis.store("peek").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let lockout = Duration::from_secs(300);
    let policies = [
        Policy::token_bucket(Quota::per_hour(3).unwrap()),
        Policy::sliding_window(Quota::per_hour(3).unwrap()).unwrap(),
        Policy::token_bucket(Quota::per_hour(3).unwrap())
            .with_lockout(lockout)
            .unwrap(),
        Policy::sliding_window(Quota::per_hour(3).unwrap())
            .unwrap()
            .with_lockout(lockout)
            .unwrap(),
    ];
    let mut keys = Vec::new();
    for (i, policy) in policies.iter().enumerate() {
        // Some state on one key (a locked one for the lockout policies), none on another.
        let key = format!("used-{i}");
        let requests = if policy.lockout().is_some() { 4 } else { 2 };
        for _ in 0..requests {
            store.check(&key, policy, 1).await.unwrap();
        }
        keys.push((key, *policy));
        keys.push((format!("fresh-{i}"), *policy));
    }
    let mut before = Vec::new();
    for (key, policy) in &keys {
        before.push(snapshot(&mut conn, &store.redis_key(key, policy.algorithm())).await);
    }
    assert_eq!(redis.server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    let mut peeks = 0;
    for (key, policy) in &keys {
        for cost in [0, 1, 3, 4] {
            let d = store.peek(key, policy, cost).await.unwrap();
            let locked = policy.lockout().is_some() && key.starts_with("used");
            if cost == 4 {
                assert_eq!(d.outcome, Outcome::CostExceedsCapacity);
            } else if locked {
                assert_eq!(d.outcome, Outcome::Limited, "{key}");
                assert_eq!(d.remaining, 0);
                // The lockout's end, or the quota's refill if later (a cost 0 needs no refill).
                let retry = d.retry_after.unwrap();
                assert!(
                    retry > Duration::ZERO && (cost > 0 || retry <= lockout),
                    "{retry:?}"
                );
            } else if key.starts_with("fresh") {
                assert!(d.is_allowed(), "{key} {cost}");
                assert_eq!(d.remaining, 3 - cost);
            }
            peeks += 1;
        }
    }
    let calls = command_calls(&redis.server);
    // One read-only script call per peek; nothing else reached the server but the stats query itself.
    assert_eq!(calls.get("evalsha_ro"), Some(&peeks), "{calls:?}");
    for (name, n) in &calls {
        assert!(
            matches!(
                name.as_str(),
                "evalsha_ro" | "hmget" | "time" | "info" | "config|resetstat"
            ),
            "a peek ran `{name}` ({n} calls): {calls:?}"
        );
    }
    for ((key, policy), (fields, ttl)) in keys.iter().zip(&before) {
        let redis_key = store.redis_key(key, policy.algorithm());
        let (now_fields, now_ttl) = snapshot(&mut conn, &redis_key).await;
        assert_eq!(&now_fields, fields, "{redis_key}");
        if key.starts_with("fresh") {
            assert_eq!(now_ttl, -2, "a peek created {redis_key}");
        } else {
            // TTLs only ran down; none was set again.
            assert!(
                now_ttl > 0 && now_ttl <= *ttl,
                "{redis_key}: {ttl} then {now_ttl}"
            );
        }
    }
}

#[tokio::test]
async fn a_lockout_is_kept_with_the_key_on_redis_time() {
    let redis = common::AclRedis::start();
    let store = redis.store("lockout").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let lockout = Duration::from_secs(120);
    for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingWindowCounter] {
        // 5 per second: the quota alone never makes anyone wait more than a second.
        let policy = Policy::new(algorithm, Quota::per_second(5).unwrap())
            .unwrap()
            .with_lockout(lockout)
            .unwrap();
        let key = format!("user-{algorithm}");
        let mut denied = None;
        for _ in 0..20 {
            let d = store.check(&key, &policy, 1).await.unwrap();
            if !d.is_allowed() {
                denied = Some(d);
                break;
            }
        }
        let denied = denied.expect("refused within 20 requests");
        assert_eq!(denied.retry_after, Some(lockout), "{algorithm}");
        assert_eq!(denied.remaining, 0);
        let end = denied.now.as_micros() + lockout.as_micros() as u64;
        assert!(denied.reset.as_micros() >= end);
        // Stored in the key's hash, which lives until the lockout ends.
        let redis_key = store.redis_key(&key, algorithm);
        let stored: u64 = conn.hget(&redis_key, "locked_until").await.unwrap();
        assert_eq!(stored, end);
        let expires_ms: i64 = redis::cmd("PEXPIRETIME")
            .arg(&redis_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            expires_ms as u64 * 1000 >= end - 1000,
            "{expires_ms} vs {end}"
        );
        // Refused again, counting down to the same instant on Redis's clock.
        let again = store.check(&key, &policy, 1).await.unwrap();
        assert_eq!(again.outcome, Outcome::Limited);
        assert_eq!(
            again.now.as_micros() + again.retry_after.unwrap().as_micros() as u64,
            end
        );
        let stored_again: u64 = conn.hget(&redis_key, "locked_until").await.unwrap();
        assert_eq!(stored_again, end, "a refusal extended the lockout");
    }
}

/// Before Redis 7 there is no `EVALSHA_RO`. A server without it (renamed away, so it answers "unknown command"
/// as Redis 6 does) still serves peeks: the store notices once and runs the same script by `EVALSHA`, whose peek
/// flag skips every write.
#[tokio::test]
async fn a_peek_falls_back_to_evalsha_where_the_server_has_no_evalsha_ro() {
    let server = tollgate_testkit::redis::RedisServer::start_with(&[
        "--rename-command",
        "EVALSHA_RO",
        "",
        "--rename-command",
        "EVAL_RO",
        "",
    ]);
    assert!(
        server
            .cli(&["EVALSHA_RO", "0", "0"])
            .contains("unknown command"),
        "the server still knows EVALSHA_RO"
    );
    let store = common::store(&server.url(), "peek-fallback").await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingWindowCounter] {
        let policy = Policy::new(algorithm, Quota::per_hour(3).unwrap()).unwrap();
        let key = format!("used-{algorithm}");
        store.check(&key, &policy, 1).await.unwrap();
        let redis_key = store.redis_key(&key, algorithm);
        let before = snapshot(&mut conn, &redis_key).await;
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
        for _ in 0..3 {
            let d = store.peek(&key, &policy, 1).await.unwrap();
            assert!(d.is_allowed());
            assert_eq!(d.remaining, 1, "2 of 3 left; a cost of 1 would leave 1");
        }
        let fresh = store.peek("never-used", &policy, 1).await.unwrap();
        assert_eq!(fresh.remaining, 2);
        let calls = command_calls(&server);
        // Four peeks, each one script call: `EVALSHA_RO` is known to be missing after the first store call.
        assert_eq!(calls.get("evalsha"), Some(&4), "{algorithm}: {calls:?}");
        let (fields, ttl) = snapshot(&mut conn, &redis_key).await;
        assert_eq!(fields, before.0, "{algorithm}: a peek wrote");
        assert!(
            ttl > 0 && ttl <= before.1,
            "{algorithm}: {} then {ttl}",
            before.1
        );
        let exists: bool = conn
            .exists(store.redis_key("never-used", algorithm))
            .await
            .unwrap();
        assert!(!exists, "{algorithm}: a peek created a key");
    }
}
