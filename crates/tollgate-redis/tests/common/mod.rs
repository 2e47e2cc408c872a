//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use tollgate_core::{FailurePolicy, Policy, Quota};
use tollgate_redis::RedisStore;

/// A store on `url` under a namespace no other test uses, with a timeout generous enough for a loaded CI
/// machine (tests that exercise the timeout set their own).
pub async fn store(url: &str, test: &str) -> RedisStore {
    RedisStore::builder(url)
        .namespace(tollgate_testkit::redis::unique_prefix(test))
        .timeout(Duration::from_secs(5))
        .failure_policy(FailurePolicy::Closed)
        .build()
        .await
        .expect("store builds")
}

/// A multi-threaded runtime for tests that want real parallelism.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

/// `limit` per hour: nothing refills during a test.
pub fn hourly_bucket(limit: u64) -> Policy {
    Policy::token_bucket(Quota::per_hour(limit).expect("valid quota"))
}

/// `limit` per hour, sliding window.
pub fn hourly_window(limit: u64) -> Policy {
    Policy::sliding_window(Quota::per_hour(limit).expect("valid quota")).expect("valid policy")
}

/// Sum of `calls=` over every `cmdstat_*` line of `INFO commandstats`, except the commands in `skip`.
pub fn command_calls(info: &str, skip: &[&str]) -> Vec<(String, u64)> {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            (!skip.contains(&name)).then(|| (name.to_owned(), calls))
        })
        .collect()
}
