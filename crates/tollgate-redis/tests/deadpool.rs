//! A store built on a user's deadpool-redis pool decides like the built-in one; each decision costs the one
//! EVALSHA plus the pool's checkout ping, counted on a private server.
#![cfg(feature = "deadpool-redis")]

mod common;

use std::time::Duration;

use tollgate_core::Store;
use tollgate_redis::{BuildError, RedisStore};
use tollgate_testkit::redis::RedisServer;

fn calls(server: &RedisServer, command: &str) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("calls=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_deadpool_redis_pool_backs_the_store() {
    let server = RedisServer::start();
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let store = RedisStore::from_deadpool(pool)
        .namespace("deadpool")
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    // Pinned at start: a decision is one EVALSHA that finds its script.
    assert!(calls(&server, "script|load") >= 5);
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
    let policy = common::hourly_bucket(3);
    for remaining in [2, 1, 0] {
        assert_eq!(
            store.check("k", &policy, 1).await.unwrap().remaining,
            remaining
        );
    }
    assert!(!store.check("k", &policy, 1).await.unwrap().is_allowed());
    assert_eq!(calls(&server, "evalsha"), 4);
    assert_eq!(calls(&server, "eval"), 0);
    // deadpool-redis's recycle pings on every checkout of an idle connection: the cost of the interop.
    assert!(
        calls(&server, "ping") >= 3,
        "{}",
        server.cli(&["INFO", "commandstats"])
    );

    // Its TLS and credentials are the pool's own.
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let err = RedisStore::from_deadpool(pool)
        .password("x")
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::InvalidSetting(_)), "{err:?}");
}
