//! The gRPC adapter over real TCP with a tonic client, on a real Redis: the shared one at `REDIS_URL` (a unique
//! namespace per test) and, to see Redis fail, a private `redis-server` that the test kills.

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use support::countdown::CountRequest;
use support::{GuardLayer, countdown, eventually, greeter, hello, meta, serve, with_api_key};
use tollgate_core::{
    Clock, Decision, FailurePolicy, ManualClock, MemoryStore, Policy, Quota, Store, StoreError,
    Timestamp,
};
use tollgate_grpc::key::{MetadataKey, PeerIp};
use tollgate_grpc::{GrpcLimitLayer, MethodLimitLayer};
use tollgate_http::HeaderSet;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{RedisServer, cli_url, redis_url, unique_prefix};
use tollgate_tower::RateLimitLayer;
use tonic::Code;
use tonic_types::StatusExt;
use tower_layer::Stack;

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn shared_store(test: &str) -> RedisStore {
    let url = redis_url();
    RedisStore::builder(url.as_str())
        .namespace(unique_prefix(test))
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_or_else(|e| panic!("the Redis at {url} (REDIS_URL) is needed by this test: {e}"))
}

/// The shared Redis's clock (`TIME`), in µs: the clock its scripts decide by.
fn redis_time_us() -> u64 {
    let time = cli_url(&redis_url(), &["TIME"]);
    let mut parts = time.lines().map(|part| {
        part.trim()
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("TIME replied {time:?}: {e}"))
    });
    let (Some(secs), Some(micros)) = (parts.next(), parts.next()) else {
        panic!("TIME replied {time:?}");
    };
    secs * 1_000_000 + micros
}

/// Redis deciding at instants the test sets (`RedisStore::check_at`), so the server's decisions can be compared
/// with an in-process store's, which must be identical.
struct AtClock {
    redis: RedisStore,
    clock: ManualClock,
}

impl Store for AtClock {
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.redis.check_at(key, policy, cost, self.clock.now())
    }
}

#[tokio::test]
async fn resource_exhausted_with_the_decisions_retry_info_over_redis() -> TestResult {
    let clock = ManualClock::new(Timestamp::from_micros(1_800_000_000_000_000));
    let store = Arc::new(AtClock {
        redis: shared_store("grpc-retry").await,
        clock: clock.clone(),
    });
    let policy = Policy::sliding_window(Quota::new(3, Duration::from_secs(2))?)?;
    let (addr, _) = serve(
        GrpcLimitLayer::new(RateLimitLayer::new("per-client", policy, store, PeerIp))
            .headers(HeaderSet::ALL),
    )
    .await;
    let mut client = greeter(addr).await;
    let expected_store = MemoryStore::builder().clock(clock.clone()).build();
    let expect = || {
        expected_store
            .check_now("me", &policy, 1)
            .expect("an in-process decision")
    };

    for remaining in ["2", "1", "0"] {
        let reply = client.say_hello(hello("a")).await?;
        assert!(expect().is_allowed());
        assert_eq!(meta(reply.metadata(), "x-ratelimit-remaining"), remaining);
    }
    clock.advance(Duration::from_millis(700));
    let status = client
        .say_hello(hello("a"))
        .await
        .expect_err("over the limit");
    let expected = expect();
    assert!(!expected.is_allowed());
    assert_eq!(status.code(), Code::ResourceExhausted);
    let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
    assert_eq!(
        delay, expected.retry_after,
        "Redis decided exactly as the in-process store"
    );
    assert_eq!(
        meta(status.metadata(), "x-ratelimit-reset"),
        expected.reset.as_secs_ceil().to_string()
    );
    Ok(())
}

#[tokio::test]
async fn retry_info_on_redis_time_is_within_the_policy() -> TestResult {
    // On Redis's own clock the delay is not known in advance, but it is exactly derived: 2 per 10 min, so the third
    // request (at t3) waits until the first one's token is back (t1 + 5 min): delay = 5 min - (t3 - t1), and Redis's
    // TIME read before the first and after the third request bounds t3 - t1. The `retry-after` metadata is
    // never earlier than the delay.
    let store = Arc::new(shared_store("grpc-redis-time").await);
    let policy = Policy::token_bucket(Quota::new(2, Duration::from_secs(600))?);
    let (addr, _) = serve(
        GrpcLimitLayer::new(RateLimitLayer::new("tb", policy, store, PeerIp))
            .headers(HeaderSet::ALL),
    )
    .await;
    let mut client = greeter(addr).await;
    let before = redis_time_us();
    client.say_hello(hello("a")).await?;
    client.say_hello(hello("a")).await?;
    let status = client
        .say_hello(hello("a"))
        .await
        .expect_err("over the limit");
    let after = redis_time_us();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let delay = status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("a retry delay");
    let token = Duration::from_secs(300);
    let longest_gap = Duration::from_micros(after - before);
    assert!(
        delay <= token && delay >= token.saturating_sub(longest_gap) && delay > Duration::ZERO,
        "{delay:?}: not 5 min less the time between the first and third request (at most {longest_gap:?})"
    );
    let retry_after: u64 = meta(status.metadata(), "retry-after").parse()?;
    assert!(Duration::from_secs(retry_after) >= delay);
    assert_eq!(meta(status.metadata(), "x-ratelimit-remaining"), "0");
    Ok(())
}

#[tokio::test]
async fn per_method_policies_and_hashed_api_keys_in_redis() -> TestResult {
    let namespace = unique_prefix("grpc-keys");
    // A healthy server: a generous timeout (the production 50 ms is a race on a loaded machine).
    let redis = RedisStore::builder(redis_url())
        .namespace(namespace.clone())
        .timeout(Duration::from_secs(5))
        .build()
        .await?;
    let store = Arc::new(redis);
    let api_key = || MetadataKey::metadata("x-api-key").expect("a valid name");
    let limit = |name: &'static str, n| {
        RateLimitLayer::new(
            name,
            Policy::token_bucket(Quota::per_minute(n).unwrap()),
            store.clone(),
            api_key(),
        )
    };
    let layer = GrpcLimitLayer::new(
        MethodLimitLayer::new()
            .method("/helloworld.Greeter/SayHello", limit("say-hello", 1))?
            .default_limit(limit("rest", 2)),
    )
    .headers(HeaderSet::ALL);
    let (addr, _) = serve(layer).await;
    let secret = "secret-api-key-0123456789";
    let mut greeter = greeter(addr).await;
    greeter.say_hello(with_api_key(hello("a"), secret)).await?;
    let status = greeter
        .say_hello(with_api_key(hello("a"), secret))
        .await
        .expect_err("SayHello: one a minute");
    assert_eq!(status.code(), Code::ResourceExhausted);
    let mut countdown = countdown(addr).await;
    for _ in 0..2 {
        countdown
            .ping(with_api_key(
                tonic::Request::new(CountRequest { from: 1 }),
                secret,
            ))
            .await?;
    }
    let status = countdown
        .ping(with_api_key(
            tonic::Request::new(CountRequest { from: 1 }),
            secret,
        ))
        .await
        .expect_err("the default quota is spent");
    assert_eq!(meta(status.metadata(), "x-ratelimit-resource"), "rest");

    let keys = cli_url(
        &redis_url(),
        &["--scan", "--pattern", &format!("{namespace}*")],
    );
    assert_eq!(keys.lines().count(), 2, "one key per policy: {keys}");
    assert!(
        !keys.contains(secret),
        "the API key is stored hashed: {keys}"
    );
    let digest = tollgate_tower::digest::hex_digest(secret.as_bytes());
    assert!(keys.lines().all(|k| k.contains(&digest)), "{keys}");
    Ok(())
}

#[tokio::test]
async fn a_stream_holds_its_guard_over_redis() -> TestResult {
    let store = Arc::new(shared_store("grpc-stream").await);
    let guards = GuardLayer::default();
    let rate = RateLimitLayer::new(
        "streams",
        Policy::token_bucket(Quota::per_minute(10)?),
        store,
        PeerIp,
    );
    let (addr, go) =
        serve(GrpcLimitLayer::new(Stack::new(guards.clone(), rate)).headers(HeaderSet::ALL)).await;
    let mut stream = countdown(addr)
        .await
        .count(CountRequest { from: 1 })
        .await?
        .into_inner();
    go.add_permits(1);
    assert_eq!(stream.message().await?.map(|r| r.value), Some(1));
    assert_eq!(guards.alive(), 1);
    go.add_permits(1);
    assert_eq!(stream.message().await?.map(|r| r.value), Some(0));
    assert_eq!(stream.message().await?, None);
    eventually("the finished stream releases its guard", || {
        guards.alive() == 0
    })
    .await;
    Ok(())
}

#[tokio::test]
async fn a_failed_redis_with_a_closed_failure_policy_is_unavailable() -> TestResult {
    let mut server = RedisServer::start();
    // Generous: the call before the kill must not time out on a loaded machine; a killed server refuses at once.
    let redis = RedisStore::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await?;
    let policy = Policy::token_bucket(Quota::per_minute(100)?);
    let layer = GrpcLimitLayer::new(
        RateLimitLayer::new(
            "fleet",
            policy,
            Arc::new(redis), // no store failure policy: the layer's decides
            PeerIp,
        )
        .on_store_error(FailurePolicy::Closed),
    )
    .headers(HeaderSet::ALL);
    let (addr, _) = serve(layer).await;
    let mut client = greeter(addr).await;
    client.say_hello(hello("a")).await?;

    server.kill();
    let status = client
        .say_hello(hello("a"))
        .await
        .expect_err("Redis is down and the layer fails closed");
    assert_eq!(status.code(), Code::Unavailable);
    let info = status
        .get_details_error_info()
        .expect("an ErrorInfo detail");
    assert_eq!(info.reason, "LIMITER_UNAVAILABLE");
    // The core's closed policy: retry after one period, clamped to 1 s ..= 60 s.
    let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
    assert_eq!(delay, Some(Duration::from_secs(60)));
    assert_eq!(meta(status.metadata(), "retry-after"), "60");
    Ok(())
}
