//! ACL users on a private server: credentials from the URL, the builder and a file; the documented
//! least-privilege line is enough (the shared-state and lease suites run as that user too: see `common::AclRedis`);
//! a user lacking one needed command, or the key pattern, gets a typed `NOPERM` error at start-up; a wrong
//! password or unknown user is its own error; and the eviction check without `CONFIG` warns, never fails.

mod common;

use std::time::Duration;

use tollgate_core::Store;
use tollgate_core::slot::{SlotId, SlotStore};
use tollgate_redis::{BuildError, EvictionCheck, RedisStore};
use tollgate_testkit::redis::{RedisServer, unique_prefix};

const TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn the_documented_line_is_the_one_in_the_docs_and_the_readme() {
    let line = tollgate_redis::LEAST_PRIVILEGE_ACL;
    let docs = include_str!("../src/lib.rs");
    assert!(
        docs.contains(&format!("//! {line}\n")),
        "the crate docs show another ACL line than LEAST_PRIVILEGE_ACL"
    );
    let readme = include_str!("../../../README.md");
    assert!(
        readme.contains(line),
        "the README shows another ACL line than LEAST_PRIVILEGE_ACL"
    );
}

#[tokio::test]
async fn the_least_privilege_user_decides_and_holds_leases() {
    let server = RedisServer::start();
    let namespace = unique_prefix("acl");
    server.acl_setuser(&common::least_privilege_rule(
        "limiter", "s3cret", &namespace,
    ));
    let store = RedisStore::builder(server.url_as("limiter", "s3cret"))
        .namespace(&namespace)
        .timeout(TIMEOUT)
        .build()
        .await
        .unwrap();
    for policy in [common::hourly_bucket(2), common::hourly_window(2)] {
        assert!(store.check("k", &policy, 1).await.unwrap().is_allowed());
        assert!(store.check("k", &policy, 1).await.unwrap().is_allowed());
        assert!(!store.check("k", &policy, 1).await.unwrap().is_allowed());
    }
    let lease = SlotId::new();
    assert!(store.acquire("k", lease, 1, TIMEOUT).await.unwrap().granted);
    assert!(store.renew("k", lease, TIMEOUT).await.unwrap());
    store.release("k", lease).await.unwrap();
    // A flushed script cache is reloaded through EVAL, which the line allows too.
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    assert!(
        store
            .check("fresh", &common::hourly_bucket(1), 1)
            .await
            .unwrap()
            .is_allowed()
    );
}

#[tokio::test]
async fn the_eviction_check_without_config_permission_warns_and_says_why() {
    let server = RedisServer::start();
    let namespace = unique_prefix("acl-evict");
    server.acl_setuser(&common::least_privilege_rule("limiter", "pw", &namespace));
    let store = RedisStore::builder(server.url_as("limiter", "pw"))
        .namespace(&namespace)
        .timeout(TIMEOUT)
        .build()
        .await
        .expect("a missing CONFIG permission never fails start-up");
    match store.eviction_check() {
        EvictionCheck::Unknown(why) => assert!(
            why.contains("NOPERM") || why.contains("permission"),
            "the reason names the missing permission: {why}"
        ),
        other => panic!("the check cannot have read the policy: {other:?}"),
    }
    // With `+config|get` added, the same user's check reads the policy.
    server.acl_setuser("limiter +config|get");
    assert_eq!(
        store.check_eviction_policy().await,
        EvictionCheck::NoEviction
    );
}

#[tokio::test]
async fn credentials_from_the_builder_and_a_password_file() {
    let server = RedisServer::start();
    let namespace = unique_prefix("acl-file");
    server.acl_setuser(&common::least_privilege_rule(
        "filed",
        "from-a-file",
        &namespace,
    ));
    let dir = std::env::temp_dir().join(unique_prefix("password"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("redis-password");
    std::fs::write(&file, "from-a-file\n").unwrap();
    let store = RedisStore::builder(server.url())
        .namespace(&namespace)
        .timeout(TIMEOUT)
        .username("filed")
        .password_file(&file)
        .build()
        .await;
    let _ = std::fs::remove_dir_all(&dir);
    let store = store.unwrap();
    assert!(
        store
            .check("k", &common::hourly_bucket(1), 1)
            .await
            .unwrap()
            .is_allowed()
    );
    // The builder's password overrides the URL's.
    let store = RedisStore::builder(server.url_as("filed", "wrong"))
        .namespace(&namespace)
        .timeout(TIMEOUT)
        .password("from-a-file")
        .build()
        .await
        .unwrap();
    assert!(
        store
            .check("k2", &common::hourly_bucket(1), 1)
            .await
            .unwrap()
            .is_allowed()
    );
    let err = RedisStore::builder(server.url())
        .password_file(dir.join("missing"))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::ReadFile { .. }), "{err:?}");
    let var = format!("TOLLGATE_TEST_UNSET_{}", std::process::id());
    let err = RedisStore::builder(server.url())
        .password_env(&var)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::MissingEnv(v) if v == var));
}

#[tokio::test]
async fn a_wrong_password_or_an_unknown_user_stops_start_up() {
    let server = RedisServer::start();
    let namespace = unique_prefix("acl-auth");
    server.acl_setuser(&common::least_privilege_rule(
        "limiter", "right", &namespace,
    ));
    for url in [
        server.url_as("limiter", "wrong"),
        server.url_as("nobody", "right"),
    ] {
        let err = RedisStore::builder(&url)
            .namespace(&namespace)
            .timeout(TIMEOUT)
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, BuildError::Auth(_)), "{url}: {err:?}");
    }
    // A server that wants a password, given none.
    let locked = RedisServer::start();
    locked.acl_setuser("default resetpass >secret");
    let err = RedisStore::builder(locked.url())
        .timeout(TIMEOUT)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Auth(_)), "{err:?}");
}

#[tokio::test]
async fn a_user_lacking_one_needed_permission_gets_noperm_at_start_up() {
    let server = RedisServer::start();
    let namespace = unique_prefix("acl-noperm");
    let full = common::least_privilege_rule("full", "pw", &namespace);
    // Each user lacks one thing the store needs: the call it sends, one its script makes, the scripts' loading,
    // or its keys.
    let mut cases = vec![
        ("no-evalsha".to_owned(), full.replacen(" +evalsha", "", 1)),
        ("no-load".to_owned(), full.replacen(" +script|load", "", 1)),
        (
            "no-keys".to_owned(),
            full.replacen(&format!("~{namespace}:*"), "~elsewhere:*", 1),
        ),
    ];
    // Every command a script runs, the ones only token leases and concurrency slots run included: each one
    // missing stops start-up.
    for command in [
        "time",
        "hmget",
        "hset",
        "hgetall",
        "hdel",
        "pexpire",
        "pexpireat",
        "pttl",
        "zadd",
        "zcount",
        "zrange",
        "zrem",
        "zremrangebyscore",
        "zscore",
    ] {
        let granted = format!(" +{command} ");
        assert!(full.contains(&granted), "{full} grants {command}");
        cases.push((format!("no-{command}"), full.replacen(&granted, " ", 1)));
    }
    for (user, rule) in cases {
        let user = user.as_str();
        let rule = rule.replacen("full on", &format!("{user} on"), 1);
        assert_ne!(rule, full);
        server.acl_setuser(&rule);
        let Err(err) = RedisStore::builder(server.url_as(user, "pw"))
            .namespace(&namespace)
            .timeout(TIMEOUT)
            .build()
            .await
        else {
            panic!("{user} ({rule}) built a store");
        };
        assert!(
            matches!(err, BuildError::NoPermission(_)),
            "{user}: {err:?}"
        );
        assert!(err.to_string().contains("ACL SETUSER"), "{err}");
    }
}
