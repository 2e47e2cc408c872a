//! What the scripts rely on: every key a script touches is one it was given in `KEYS` (the rule Redis Cluster,
//! Dragonfly and other Redis-compatible servers enforce). Checked on a real server, by a user whose ACL grants
//! exactly the keys the store passes and no other: a script that reads or writes any key it was not given (a
//! derived key, a key from `ARGV`) is refused by the server.

mod common;

use std::time::Duration;

use tollgate_core::slot::{SlotId, SlotStore};
use tollgate_core::token_lease::TokenLeaseRequest;
use tollgate_core::{Algorithm, Policy, Quota, Store, Timestamp};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{RedisServer, unique_prefix};

const TIMEOUT: Duration = Duration::from_secs(5);

/// The least-privilege line with its namespace pattern replaced by exactly `keys`.
fn exact_keys_rule(user: &str, keys: &[String]) -> String {
    let rule = common::least_privilege_rule(user, "pw", "NAMESPACE");
    let patterns: Vec<String> = keys.iter().map(|k| format!("~{k}")).collect();
    let rule = rule.replacen("~NAMESPACE:*", &patterns.join(" "), 1);
    assert!(
        !rule
            .split(' ')
            .any(|w| w.starts_with('~') && (w.contains('*') || w.contains("NAMESPACE"))),
        "only exact key patterns: {rule}"
    );
    rule
}

/// Every key the store passes to its scripts when deciding on `key`: one per algorithm, the key's slots, and the
/// start-up probe's.
fn keys_given(namespace: &str, key: &str) -> Vec<String> {
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::SlidingWindowCounter,
        Algorithm::FixedWindow,
    ];
    let mut keys = Vec::new();
    for k in [key, "tollgate-startup-probe"] {
        for a in algorithms {
            keys.push(format!("{namespace}:{{{k}}}:{}", suffix(a)));
        }
    }
    keys.push(format!("{namespace}:{{{key}}}:inflight"));
    keys.push(format!("{namespace}:{{tollgate-startup-probe}}:commands"));
    keys
}

fn suffix(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket => "tb",
        Algorithm::SlidingWindowCounter => "sw",
        Algorithm::FixedWindow => "fw",
    }
}

#[tokio::test]
async fn every_script_touches_only_the_keys_it_is_given() {
    let server = RedisServer::start();
    let namespace = unique_prefix("keys");
    let given = keys_given(&namespace, "k");
    server.acl_setuser(&exact_keys_rule("exact", &given));
    let store = RedisStore::builder(server.url_as("exact", "pw"))
        .namespace(&namespace)
        .timeout(TIMEOUT)
        .build()
        .await
        .expect("the start-up probe runs on its own keys only");
    // The store names its keys as this test does: otherwise the ACL below would refuse the store's own keys and
    // prove nothing about the scripts.
    for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingWindowCounter] {
        assert!(given.contains(&store.redis_key("k", algorithm)));
    }
    assert!(given.contains(&store.slot_key("k")));

    let quota = Quota::per_hour(10).unwrap();
    let policies = [
        Policy::token_bucket(quota),
        Policy::sliding_window(quota).unwrap(),
        Policy::fixed_window(quota).unwrap(),
        Policy::token_bucket(Quota::per_hour(1).unwrap())
            .with_lockout(Duration::from_secs(60))
            .unwrap(),
    ];
    // Twice: by EVALSHA, then after SCRIPT FLUSH by EVAL (the path a new or failed-over server takes).
    for round in 0..2 {
        for policy in &policies {
            let why = |what: &str, e: &dyn std::fmt::Display| {
                format!("round {round}, {:?}, {what}: {e}", policy.algorithm())
            };
            store
                .check("k", policy, 1)
                .await
                .map_err(|e| why("check", &e))
                .unwrap();
            store
                .peek("k", policy, 1)
                .await
                .map_err(|e| why("peek", &e))
                .unwrap();
            store
                .check_held("k", policy, 1, Duration::from_millis(50))
                .await
                .map_err(|e| why("check_held", &e))
                .unwrap();
            // The fixed window has no charge after the response, nor token leases.
            if policy.algorithm() == Algorithm::FixedWindow {
                continue;
            }
            store
                .charge("k", policy, 1, Timestamp::from_micros(0))
                .await
                .map_err(|e| why("charge", &e))
                .unwrap();
            if policy.lockout().is_none() {
                let take = TokenLeaseRequest::take(7, 1 + 2 * round, 3, Duration::from_secs(1));
                let grant = store
                    .lease_tokens("k", policy, &take)
                    .await
                    .map_err(|e| why("lease", &e))
                    .unwrap();
                store
                    .lease_tokens("k", policy, &take.next(take.seq + 1).ending(grant.granted))
                    .await
                    .map_err(|e| why("lease end", &e))
                    .unwrap();
            }
        }
        let slot = SlotId::new();
        assert!(store.acquire("k", slot, 2, TIMEOUT).await.unwrap().granted);
        assert!(store.renew("k", slot, TIMEOUT).await.unwrap());
        store.release("k", slot).await.unwrap();
        assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    }
}

/// The check above can fail: a script touching a key it was not given is refused for that user.
#[test]
fn a_script_touching_a_key_it_was_not_given_is_refused() {
    let server = RedisServer::start();
    let namespace = unique_prefix("keys-neg");
    let given = keys_given(&namespace, "k");
    server.acl_setuser(&exact_keys_rule("exact", &given));
    let url = server.url_as("exact", "pw");
    let own = tollgate_testkit::redis::cli_url(
        &url,
        &[
            "EVAL",
            "return redis.call('HSET', KEYS[1], 'f', 1)",
            "1",
            &given[0],
        ],
    );
    // (redis-cli's warning about a password on its command line follows the reply.)
    assert!(
        own.starts_with('1') && !own.contains("NOPERM"),
        "the key it was given: {own}"
    );
    let derived = tollgate_testkit::redis::cli_url(
        &url,
        &[
            "EVAL",
            "return redis.call('HSET', KEYS[1] .. ':other', 'f', 1)",
            "1",
            &given[0],
        ],
    );
    // Redis 7.0 says "can't access at least one of the keys"; later versions NOPERM.
    assert!(
        derived.contains("NOPERM") || derived.contains("can't access"),
        "{derived}"
    );
}

/// No Lua the servers deprecate or refuse: effects replication is the only kind since Redis 7 (and the default
/// since 5), so no script asks for it; nothing non-deterministic or environment-changing; and one key each, the
/// only one the store passes.
#[test]
fn the_scripts_use_no_deprecated_lua_and_one_key_each() {
    const DEPRECATED: [&str; 9] = [
        "replicate_commands",
        "set_repl",
        "table.getn",
        "loadstring",
        "setfenv",
        "getfenv",
        "math.random",
        "redis.breakpoint",
        "redis.debug",
    ];
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
    let mut scripts = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "lua") {
            continue;
        }
        scripts += 1;
        let source = std::fs::read_to_string(&path).unwrap();
        let code: String = source
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for word in DEPRECATED {
            assert!(!code.contains(word), "{} uses {word}", path.display());
        }
        let name = path.file_name().unwrap().to_string_lossy();
        if name.starts_with("set_") {
            // Several limits decided as one: one key per limit, each given to its algorithm as its only key.
            assert!(
                code.matches("KEYS[").count() == code.matches("{ KEYS[i] }").count(),
                "{} hands its algorithms other keys than one each",
                path.display()
            );
        } else {
            assert!(
                !code.contains("KEYS[2]") && !code.contains("#KEYS"),
                "{} reads a second key: the store passes one",
                path.display()
            );
        }
    }
    assert!(scripts >= 10, "the scripts were not found in {dir}");
}
