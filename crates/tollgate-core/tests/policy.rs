//! Policies are validated when built: every invalid one is a typed error with a readable message.

use std::time::Duration;

use tollgate_core::{Algorithm, MAX_SCALED, Policy, PolicyError, Quota};

#[test]
fn zero_limit_is_rejected() {
    let err = Quota::per_second(0).unwrap_err();
    assert_eq!(err, PolicyError::ZeroLimit);
    assert_eq!(err.to_string(), "a quota's limit must be at least 1");
}

#[test]
fn zero_period_is_rejected() {
    let err = Quota::new(10, Duration::ZERO).unwrap_err();
    assert_eq!(err, PolicyError::ZeroPeriod);
    assert!(err.to_string().contains("period"));
}

#[test]
fn sub_microsecond_period_is_rejected() {
    assert_eq!(
        Quota::new(1, Duration::from_nanos(500)).unwrap_err(),
        PolicyError::SubMicrosecondPeriod
    );
    assert_eq!(
        Quota::new(1, Duration::from_nanos(1_500)).unwrap_err(),
        PolicyError::SubMicrosecondPeriod
    );
    assert!(Quota::new(1, Duration::from_micros(1)).is_ok());
}

#[test]
fn zero_burst_is_rejected() {
    let err = Quota::per_second(5).unwrap().with_burst(0).unwrap_err();
    assert_eq!(err, PolicyError::ZeroBurst);
    assert_eq!(err.to_string(), "a token bucket's burst must be at least 1");
}

#[test]
fn products_beyond_exact_integers_are_rejected() {
    // A prime limit shares no factor with the period, so burst × period itself must fit.
    let err = Quota::new(999_983, Duration::from_secs(86_400 * 365)).unwrap_err();
    assert!(matches!(err, PolicyError::TooLarge { .. }), "{err:?}");
    assert!(err.to_string().contains("2^52"));
    let err = Quota::per_second(1)
        .unwrap()
        .with_burst(u64::MAX)
        .unwrap_err();
    assert!(matches!(err, PolicyError::TooLarge { .. }));
    assert!(Quota::new(1, Duration::from_secs(u64::MAX)).is_err());
}

#[test]
fn round_numbers_over_long_periods_are_accepted() {
    // 1 M per day: gcd(1e6, 86.4e9 µs) = 1e6, so a token is 86 400 units.
    let quota = Quota::new(1_000_000, Duration::from_secs(86_400)).unwrap();
    assert_eq!(quota.token_bucket_token(), 86_400);
    assert_eq!(quota.token_bucket_rate(), 1);
    assert!(quota.burst() * quota.token_bucket_token() <= MAX_SCALED);
}

#[test]
fn sliding_window_has_no_burst() {
    let quota = Quota::per_second(10).unwrap().with_burst(20).unwrap();
    assert_eq!(
        Policy::sliding_window(quota).unwrap_err(),
        PolicyError::BurstNotSupported
    );
    assert!(Policy::new(Algorithm::TokenBucket, quota).is_ok());
}

#[test]
fn sliding_window_picks_the_finest_exact_tick() {
    let micro = Policy::sliding_window(Quota::per_hour(1_000).unwrap()).unwrap();
    assert_eq!(micro.tick_micros(), 1);
    let milli = Policy::sliding_window(Quota::per_hour(5_000_000).unwrap()).unwrap();
    assert_eq!(milli.tick_micros(), 1_000);
    let day = Quota::new(1_000_000_000, Duration::from_secs(86_400)).unwrap();
    assert_eq!(
        Policy::sliding_window(day).unwrap().tick_micros(),
        1_000_000
    );
    // Exact for a token bucket (a token is 2 units) but not for a window at any tick.
    let impossible = Quota::new(1 << 39, Duration::from_micros(1 << 40)).unwrap();
    assert!(matches!(
        Policy::sliding_window(impossible),
        Err(PolicyError::TooLarge { .. })
    ));
}

#[test]
fn constructors_are_const() {
    const QUOTA: Quota = match Quota::per_minute(60) {
        Ok(q) => q,
        Err(_) => panic!("valid"),
    };
    const POLICY: Policy = Policy::token_bucket(QUOTA);
    assert_eq!(POLICY.quota().limit(), 60);
    assert_eq!(POLICY.quota().period(), Duration::from_secs(60));
    assert_eq!(POLICY.max_cost(), 60);
    assert_eq!(POLICY.algorithm().to_string(), "token_bucket");
}

#[test]
fn failure_answers_announce_the_burst_like_decisions_do() {
    // The limit a client is told is the burst: a fail-open answer with the remaining burst beside a smaller limit
    // (and a limit field flipping whenever the store fails) would contradict every real decision.
    use tollgate_core::{FailurePolicy, Timestamp};
    let policy = Policy::token_bucket(Quota::per_second(10).unwrap().with_burst(20).unwrap());
    let now = Timestamp::from_micros(1_700_000_000_000_000);
    let open = FailurePolicy::Open.synthesize(&policy, now).unwrap();
    assert_eq!((open.limit, open.remaining), (20, 19));
    let closed = FailurePolicy::Closed.synthesize(&policy, now).unwrap();
    assert_eq!((closed.limit, closed.remaining), (20, 0));
    assert_eq!(FailurePolicy::Local.synthesize(&policy, now), None);
}
