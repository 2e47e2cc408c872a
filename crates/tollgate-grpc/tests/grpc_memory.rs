//! The gRPC adapter over real TCP with a tonic client, on the in-process store driven by a manual clock.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::countdown::CountRequest;
use support::{GuardLayer, countdown, eventually, greeter, hello, meta, serve, with_api_key};
use tollgate_core::{ManualClock, MemoryStore, Policy, Quota, Timestamp};
use tollgate_grpc::key::{MetadataKey, PeerIp};
use tollgate_grpc::{GrpcLimitLayer, MethodLimitLayer};
use tollgate_http::HeaderSet;
use tollgate_tower::verdict::ceil_secs;
use tollgate_tower::{Mode, RateLimitLayer};
use tonic::Code;
use tonic_types::StatusExt;
use tower_layer::Stack;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const START: Timestamp = Timestamp::from_micros(1_800_000_000_000_000);

fn clocked_store() -> (ManualClock, Arc<MemoryStore<ManualClock>>) {
    let clock = ManualClock::new(START);
    (
        clock.clone(),
        Arc::new(MemoryStore::builder().clock(clock).build()),
    )
}

/// By default an admitted call carries `ratelimit` alone (what is left, within which time); a refused one every
/// field, as [`HeaderSet::ALL`] writes them, with its status.
#[tokio::test]
async fn admitted_calls_carry_ratelimit_by_default_and_refusals_every_field() -> TestResult {
    let (_clock, store) = clocked_store();
    let policy = Policy::token_bucket(Quota::per_second(4)?.with_burst(2)?);
    let (addr, _) = serve(GrpcLimitLayer::new(RateLimitLayer::new(
        "per-client",
        policy,
        store,
        PeerIp,
    )))
    .await;
    let mut client = greeter(addr).await;
    for (remaining, t) in [("1", "1"), ("0", "1")] {
        let reply = client.say_hello(hello("ann")).await?;
        let md = reply.metadata();
        assert_eq!(
            meta(md, "ratelimit"),
            format!("\"per-client\";r={remaining};t={t}")
        );
        for absent in [
            "ratelimit-policy",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "x-ratelimit-used",
            "x-ratelimit-resource",
            "retry-after",
        ] {
            assert!(md.get(absent).is_none(), "{absent} in {md:?}");
        }
    }
    let status = client
        .say_hello(hello("ann"))
        .await
        .expect_err("the third call is over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted);
    let md = status.metadata();
    assert_eq!(meta(md, "ratelimit-policy"), r#""per-client";q=4;w=1"#);
    assert!(meta(md, "ratelimit").starts_with(r#""per-client";r=0;t="#));
    assert_eq!(meta(md, "x-ratelimit-remaining"), "0");
    assert_eq!(meta(md, "x-ratelimit-resource"), "per-client");
    assert_eq!(meta(md, "retry-after"), "1");
    Ok(())
}

#[tokio::test]
async fn resource_exhausted_after_the_limit_with_the_decisions_retry_info() -> TestResult {
    let (clock, store) = clocked_store();
    let policy = Policy::token_bucket(Quota::per_second(4)?.with_burst(2)?);
    let layer = GrpcLimitLayer::new(RateLimitLayer::new("per-client", policy, store, PeerIp))
        .headers(HeaderSet::ALL);
    let (addr, _) = serve(layer).await;
    let mut client = greeter(addr).await;

    // The same policy, clock and call sequence on a store of our own gives the decisions the server must make.
    let expected_store = MemoryStore::builder().clock(clock.clone()).build();
    let expect = || {
        expected_store
            .check_now("me", &policy, 1)
            .expect("an in-process decision")
    };

    for remaining in ["1", "0"] {
        let reply = client.say_hello(hello("ann")).await?;
        let expected = expect();
        assert!(expected.is_allowed());
        assert_eq!(reply.get_ref().message, "Hello ann!");
        let md = reply.metadata();
        assert_eq!(meta(md, "x-ratelimit-remaining"), remaining);
        // The limit is the burst (never less than what remains); its window, the 500 ms the burst takes to
        // accrue, is announced over the whole second that covers it, the limit scaled to match.
        assert_eq!(meta(md, "x-ratelimit-limit"), "2");
        assert_eq!(
            meta(md, "x-ratelimit-used"),
            (2 - remaining.parse::<u64>()?).to_string()
        );
        assert_eq!(meta(md, "ratelimit-policy"), r#""per-client";q=4;w=1"#);
        assert_eq!(
            meta(md, "x-ratelimit-reset"),
            expected.reset.as_secs_ceil().to_string()
        );
        assert!(md.get("retry-after").is_none());
    }

    clock.advance(Duration::from_millis(100)); // part of a token: still over the limit, with less to wait
    let status = client
        .say_hello(hello("ann"))
        .await
        .expect_err("the third call is over the limit");
    let expected = expect();
    assert!(!expected.is_allowed());
    assert_eq!(expected.retry_after, Some(Duration::from_millis(150)));

    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "rate limit \"per-client\" exceeded; retry after 150ms"
    );
    let retry = status
        .get_details_retry_info()
        .expect("a google.rpc.RetryInfo detail");
    assert_eq!(retry.retry_delay, expected.retry_after);
    let info = status
        .get_details_error_info()
        .expect("a google.rpc.ErrorInfo detail");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("RATE_LIMIT_EXCEEDED", "tollgate")
    );
    assert_eq!(info.metadata["limiter"], "per-client");

    let md = status.metadata();
    assert_eq!(meta(md, "x-ratelimit-remaining"), "0");
    assert_eq!(
        meta(md, "ratelimit"),
        format!("\"per-client\";r=0;t={}", ceil_secs(expected.reset_after()))
    );
    // Whole seconds, rounded up, never before the announced reset (t).
    assert_eq!(meta(md, "retry-after"), "1");

    // Once the delay has passed, the same call is admitted.
    clock.advance(expected.retry_after.unwrap());
    assert_eq!(
        client.say_hello(hello("ann")).await?.get_ref().message,
        "Hello ann!"
    );
    Ok(())
}

#[tokio::test]
async fn per_method_and_per_service_policies() -> TestResult {
    let (_clock, store) = clocked_store();
    let limit = |name: &'static str, n| {
        RateLimitLayer::new(
            name,
            Policy::token_bucket(Quota::per_minute(n).unwrap()),
            store.clone(),
            PeerIp,
        )
    };
    let layer = GrpcLimitLayer::new(
        MethodLimitLayer::new()
            .method("/helloworld.Greeter/SayHello", limit("say-hello", 1))?
            .service("countdown.Countdown", limit("countdown", 3))?,
    )
    .headers(HeaderSet::ALL);
    let (addr, go) = serve(layer).await;
    let mut greeter = greeter(addr).await;
    let mut countdown = countdown(addr).await;

    greeter.say_hello(hello("a")).await?;
    let status = greeter
        .say_hello(hello("a"))
        .await
        .expect_err("SayHello allows one call a minute");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(meta(status.metadata(), "x-ratelimit-resource"), "say-hello");

    // The service rule has its own bucket: three calls, whatever SayHello did, shared by its methods.
    let reply = countdown.ping(CountRequest { from: 7 }).await?;
    assert_eq!(
        meta(reply.metadata(), "ratelimit-policy"),
        r#""countdown";q=3;w=60"#
    );
    assert_eq!(meta(reply.metadata(), "x-ratelimit-remaining"), "2");
    go.add_permits(1);
    let mut stream = countdown
        .count(CountRequest { from: 0 })
        .await?
        .into_inner();
    assert_eq!(stream.message().await?.map(|r| r.value), Some(0));
    countdown.ping(CountRequest { from: 7 }).await?;
    let status = countdown
        .ping(CountRequest { from: 7 })
        .await
        .expect_err("the service's quota is spent");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(meta(status.metadata(), "x-ratelimit-resource"), "countdown");
    Ok(())
}

#[tokio::test]
async fn the_default_policy_limits_the_other_methods() -> TestResult {
    let (_clock, store) = clocked_store();
    let limit = |name: &'static str, n| {
        RateLimitLayer::new(
            name,
            Policy::token_bucket(Quota::per_minute(n).unwrap()),
            store.clone(),
            PeerIp,
        )
    };
    let layer = GrpcLimitLayer::new(
        MethodLimitLayer::new()
            .method("/helloworld.Greeter/SayHello", limit("say-hello", 1))?
            .default_limit(limit("rest", 2)),
    )
    .headers(HeaderSet::ALL);
    let (addr, _) = serve(layer).await;
    let mut countdown = countdown(addr).await;
    for remaining in ["1", "0"] {
        let reply = countdown.ping(CountRequest { from: 1 }).await?;
        assert_eq!(meta(reply.metadata(), "x-ratelimit-resource"), "rest");
        assert_eq!(meta(reply.metadata(), "x-ratelimit-remaining"), remaining);
    }
    let status = countdown
        .ping(CountRequest { from: 1 })
        .await
        .expect_err("the default quota is spent");
    assert_eq!(status.code(), Code::ResourceExhausted);
    let reply = greeter(addr).await.say_hello(hello("a")).await?;
    assert_eq!(
        meta(reply.metadata(), "x-ratelimit-resource"),
        "say-hello",
        "SayHello has a bucket of its own"
    );
    Ok(())
}

#[tokio::test]
async fn methods_without_a_rule_or_default_are_not_limited() -> TestResult {
    let (_clock, store) = clocked_store();
    let say_hello = RateLimitLayer::new(
        "say-hello",
        Policy::token_bucket(Quota::per_minute(1)?),
        store,
        PeerIp,
    );
    let layer = GrpcLimitLayer::new(
        MethodLimitLayer::new().method("/helloworld.Greeter/SayHello", say_hello)?,
    )
    .headers(HeaderSet::ALL);
    let (addr, _) = serve(layer).await;
    let mut countdown = countdown(addr).await;
    for from in 0..5 {
        let reply = countdown.ping(CountRequest { from }).await?;
        assert_eq!(reply.get_ref().value, from);
        assert!(
            reply.metadata().get("ratelimit").is_none(),
            "an unlimited call carries no rate-limit fields"
        );
    }
    Ok(())
}

#[tokio::test]
async fn api_keys_in_metadata_have_their_own_buckets_and_a_missing_key_is_an_error() -> TestResult {
    let (_clock, store) = clocked_store();
    let policy = Policy::sliding_window(Quota::per_minute(2)?)?;
    let layer = GrpcLimitLayer::new(RateLimitLayer::new(
        "per-key",
        policy,
        store,
        MetadataKey::metadata("x-api-key")?,
    ))
    .headers(HeaderSet::ALL);
    let (addr, _) = serve(layer).await;
    let mut client = greeter(addr).await;

    for _ in 0..2 {
        client.say_hello(with_api_key(hello("a"), "key-a")).await?;
    }
    let status = client
        .say_hello(with_api_key(hello("a"), "key-a"))
        .await
        .expect_err("key-a is spent");
    assert_eq!(status.code(), Code::ResourceExhausted);
    let reply = client.say_hello(with_api_key(hello("b"), "key-b")).await?;
    assert_eq!(
        meta(reply.metadata(), "x-ratelimit-remaining"),
        "1",
        "key-b has a bucket of its own"
    );

    let status = client
        .say_hello(hello("nobody"))
        .await
        .expect_err("no API key: no bucket to count in");
    assert_eq!(status.code(), Code::Internal);
    assert!(
        status.message().contains("x-api-key metadata is missing"),
        "{}",
        status.message()
    );
    Ok(())
}

#[tokio::test]
async fn the_peer_address_is_one_key_across_connections() -> TestResult {
    let (_clock, store) = clocked_store();
    let layer = GrpcLimitLayer::new(RateLimitLayer::new(
        "per-peer",
        Policy::token_bucket(Quota::per_minute(2)?),
        store,
        PeerIp,
    ))
    .headers(HeaderSet::ALL);
    let (addr, _) = serve(layer).await;
    greeter(addr)
        .await
        .say_hello(hello("first connection"))
        .await?;
    greeter(addr)
        .await
        .say_hello(hello("second connection"))
        .await?;
    let status = greeter(addr)
        .await
        .say_hello(hello("third"))
        .await
        .expect_err("127.0.0.1 is spent");
    assert_eq!(status.code(), Code::ResourceExhausted);
    Ok(())
}

#[tokio::test]
async fn a_streams_guard_lives_until_the_stream_ends_or_is_dropped() -> TestResult {
    let (_clock, store) = clocked_store();
    let guards = GuardLayer::default();
    let rate = RateLimitLayer::new(
        "per-peer",
        Policy::token_bucket(Quota::per_minute(100)?),
        store,
        PeerIp,
    );
    // The guard sits inside the rate limit, where a concurrency limiter's permit would be.
    let layer = GrpcLimitLayer::new(Stack::new(guards.clone(), rate)).headers(HeaderSet::ALL);
    let (addr, go) = serve(layer).await;
    let mut client = countdown(addr).await;

    // A stream read to its end.
    let response = client.count(CountRequest { from: 2 }).await?;
    assert_eq!(
        meta(response.metadata(), "x-ratelimit-remaining"),
        "99",
        "streams carry the fields too"
    );
    let mut stream = response.into_inner();
    go.add_permits(1);
    assert_eq!(stream.message().await?.map(|r| r.value), Some(2));
    // Headers (and response extensions) are long gone: only the body still holds the guard.
    assert_eq!(guards.alive(), 1, "the guard is held while the stream runs");
    go.add_permits(2);
    assert_eq!(stream.message().await?.map(|r| r.value), Some(1));
    assert_eq!(stream.message().await?.map(|r| r.value), Some(0));
    assert_eq!(stream.message().await?, None);
    eventually("the finished stream releases its guard", || {
        guards.alive() == 0
    })
    .await;

    // A stream the client drops halfway.
    let mut stream = client.count(CountRequest { from: 5 }).await?.into_inner();
    go.add_permits(1);
    assert_eq!(stream.message().await?.map(|r| r.value), Some(5));
    assert_eq!(guards.alive(), 1);
    drop(stream);
    eventually("the dropped stream releases its guard", || {
        guards.alive() == 0
    })
    .await;
    Ok(())
}

#[tokio::test]
async fn shadow_mode_admits_without_fields_and_the_kill_switch_turns_the_limit_off() -> TestResult {
    let (_clock, store) = clocked_store();
    let rate = RateLimitLayer::new(
        "dark",
        Policy::token_bucket(Quota::per_minute(1)?),
        store,
        PeerIp,
    )
    .shadow();
    let switch = rate.enforcement();
    let (addr, _) = serve(GrpcLimitLayer::new(rate).headers(HeaderSet::ALL)).await;
    let mut client = greeter(addr).await;
    for _ in 0..3 {
        let reply = client.say_hello(hello("a")).await?;
        assert!(
            reply.metadata().get("ratelimit").is_none(),
            "shadow verdicts are not shown"
        );
    }
    switch.set(Mode::Enforce);
    assert_eq!(
        client
            .say_hello(hello("a"))
            .await
            .expect_err("enforced")
            .code(),
        Code::ResourceExhausted
    );
    switch.set(Mode::Off);
    client.say_hello(hello("a")).await?;
    Ok(())
}

#[tokio::test]
async fn a_rejection_carries_the_fields_of_every_limit_that_counted_the_call() -> TestResult {
    // The outer limiter admitted (and counted) the second call before the inner one refused it: the status's
    // metadata names both.
    let (_clock, store) = clocked_store();
    let limit = |name: &'static str, n| {
        Ok::<_, tollgate_core::PolicyError>(RateLimitLayer::new(
            name,
            Policy::token_bucket(Quota::per_hour(n)?),
            store.clone(),
            PeerIp,
        ))
    };
    let pair = Stack::new(limit("inner", 1)?, limit("outer", 10)?);
    let (addr, _) = serve(GrpcLimitLayer::new(pair).headers(HeaderSet::ALL)).await;
    greeter(addr).await.say_hello(hello("one")).await?;
    let status = greeter(addr)
        .await
        .say_hello(hello("two"))
        .await
        .expect_err("the inner limit is spent");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        meta(status.metadata(), "ratelimit"),
        r#""outer";r=8;t=2880, "inner";r=0;t=3600"#
    );
    assert_eq!(meta(status.metadata(), "x-ratelimit-resource"), "inner");
    Ok(())
}
