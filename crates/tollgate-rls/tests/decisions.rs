//! `ShouldRateLimit` as Envoy expects it, on the in-process store with a manual clock: every descriptor decided,
//! statuses in request order, `overall_code`, unknown domains and unmatched descriptors `OK` with no limit,
//! `unlimited`, `replaces`, shadow and quota modes, `hits_addend`, Envoy's limit override, the algorithms, and the
//! response header fields.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::{ManualClock, MemoryStore, Timestamp};
use tollgate_http::headers::HeaderSet;
use tollgate_rls::config::{ConfigDir, Loader};
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus,
};
use tollgate_rls::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_rls::proto::envoy::r#type::v3::RateLimitUnit;
use tollgate_rls::{Options, RateLimitService};

/// A whole minute (and second) since the epoch, in µs.
const T0: u64 = 1_700_000_040_000_000;

struct Fixture {
    clock: ManualClock,
    service: RateLimitService<MemoryStore<ManualClock>>,
}

fn fixture(options: Options) -> Fixture {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config/good");
    let config = ConfigDir::new(dir, Loader::new()).load().unwrap();
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let service = RateLimitService::new(store, Arc::new(ArcSwap::from_pointee(config)), options);
    Fixture { clock, service }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

impl Fixture {
    async fn ask(&self, request: &RateLimitRequest) -> RateLimitResponse {
        self.service.should_rate_limit(request).await.unwrap()
    }

    /// `n` requests of one descriptor; the codes in order.
    async fn codes(&self, domain: &str, entries: &[(&str, &str)], n: usize) -> Vec<Code> {
        let r = request(domain, vec![descriptor(entries)]);
        let mut codes = Vec::new();
        for _ in 0..n {
            codes.push(self.ask(&r).await.overall_code());
        }
        codes
    }
}

fn limit_of(status: &DescriptorStatus) -> Option<(u32, Unit)> {
    status
        .current_limit
        .as_ref()
        .map(|l| (l.requests_per_unit, l.unit()))
}

use Code::{Ok as OK, OverLimit as OVER};

#[tokio::test]
async fn every_descriptor_is_decided_in_order_and_one_over_limit_makes_the_request_over() {
    let f = fixture(Options::new());
    let r = request(
        "shop",
        vec![
            descriptor(&[("path", "/checkout")]),
            descriptor(&[("tenant", "acme"), ("user", "ann")]),
            descriptor(&[("nothing", "configured")]),
            descriptor(&[("internal", "batch")]),
            descriptor(&[("path", "/health")]),
        ],
    );
    let first = f.ask(&r).await;
    assert_eq!(first.overall_code(), OK);
    let s = &first.statuses;
    assert_eq!(s.len(), 5);
    assert_eq!(limit_of(&s[0]), Some((10, Unit::Minute)));
    assert_eq!((s[0].code(), s[0].limit_remaining), (OK, 9));
    assert_eq!(limit_of(&s[1]), Some((5, Unit::Second)));
    assert_eq!((s[1].code(), s[1].limit_remaining), (OK, 4));
    // No limit: OK, nothing else; unlimited: OK with everything remaining; whitelisted: no limit.
    assert_eq!(
        (
            s[2].code(),
            s[2].current_limit.clone(),
            s[2].limit_remaining
        ),
        (OK, None, 0)
    );
    assert_eq!(
        (
            s[3].code(),
            s[3].current_limit.clone(),
            s[3].limit_remaining
        ),
        (OK, None, u32::MAX)
    );
    assert_eq!((s[4].code(), s[4].current_limit.clone()), (OK, None));
    for _ in 0..4 {
        assert_eq!(f.ask(&r).await.overall_code(), OK);
    }
    let sixth = f.ask(&r).await;
    assert_eq!(
        sixth.overall_code(),
        OVER,
        "the user's 5 per second are spent"
    );
    let codes: Vec<Code> = sixth.statuses.iter().map(DescriptorStatus::code).collect();
    assert_eq!(codes, [OK, OVER, OK, OK, OK]);
    // The path was still counted (every descriptor is decided): 10 - 6.
    assert_eq!(sixth.statuses[0].limit_remaining, 4);
    // Its reset: when the user's next request is admitted (the sliding window's previous second must decay).
    let reset = sixth.statuses[1].duration_until_reset.unwrap();
    assert!((1..=2).contains(&reset.seconds), "{reset:?}");
}

#[tokio::test]
async fn an_unknown_domain_and_an_unmatched_descriptor_are_ok_with_no_limit() {
    let f = fixture(Options::new());
    let r = request(
        "nobody-configured-this",
        vec![descriptor(&[("path", "/checkout")])],
    );
    for _ in 0..20 {
        let reply = f.ask(&r).await;
        assert_eq!(reply.overall_code(), OK);
        assert_eq!(reply.statuses[0].current_limit, None);
    }
    let deeper = request(
        "shop",
        vec![descriptor(&[("path", "/checkout"), ("more", "x")])],
    );
    assert_eq!(f.ask(&deeper).await.statuses[0].current_limit, None);
}

#[tokio::test]
async fn an_empty_domain_or_no_descriptors_is_an_invalid_argument() {
    let f = fixture(Options::new());
    let err = f
        .service
        .should_rate_limit(&request("", vec![descriptor(&[("a", "b")])]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = f
        .service
        .should_rate_limit(&request("shop", vec![]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn hits_addend_is_the_cost_and_a_descriptors_own_wins_zero_only_checks() {
    let f = fixture(Options::new());
    let mut r = request("shop", vec![descriptor(&[("region", "eu")])]); // 3 per hour
    r.hits_addend = 2;
    assert_eq!(f.ask(&r).await.statuses[0].limit_remaining, 1);
    let mut check = request("shop", vec![descriptor(&[("region", "eu")])]);
    check.descriptors[0].hits_addend = Some(0);
    check.hits_addend = 5;
    let peek = f.ask(&check).await;
    assert_eq!(
        (peek.overall_code(), peek.statuses[0].limit_remaining),
        (OK, 1),
        "0 checks, spends nothing"
    );
    assert_eq!(f.ask(&r).await.overall_code(), OVER, "2 more do not fit");
    r.hits_addend = 0; // 0 means 1
    assert_eq!(f.ask(&r).await.statuses[0].limit_remaining, 0);
    let mut big = request("shop", vec![descriptor(&[("region", "us")])]);
    big.descriptors[0].hits_addend = Some(4);
    assert_eq!(
        f.ask(&big).await.overall_code(),
        OVER,
        "a cost above the limit never fits"
    );
}

#[tokio::test]
async fn a_limit_named_in_replaces_is_not_applied() {
    let f = fixture(Options::new());
    let both = request(
        "replace",
        vec![descriptor(&[("user", "u1")]), descriptor(&[("vip", "v1")])],
    );
    for _ in 0..20 {
        let reply = f.ask(&both).await;
        assert_eq!(reply.overall_code(), OK);
        assert_eq!(
            reply.statuses[0].current_limit, None,
            "per-user is replaced by vip"
        );
        assert_eq!(limit_of(&reply.statuses[1]), Some((100, Unit::Minute)));
    }
    // Alone, the user's limit applies (and was not counted while replaced).
    assert_eq!(
        f.codes("replace", &[("user", "u1")], 6).await,
        [OK, OK, OK, OK, OK, OVER]
    );
}

#[tokio::test]
async fn shadow_mode_answers_ok_and_still_counts() {
    let f = fixture(Options::new());
    let trial = [("tenant", "acme"), ("user", "trial")];
    assert_eq!(f.codes("shadow", &trial, 3).await, [OK, OK, OK]);
    let r = request("shadow", vec![descriptor(&trial)]);
    let reply = f.ask(&r).await;
    assert_eq!(
        (reply.statuses[0].code(), reply.statuses[0].limit_remaining),
        (OK, 0),
        "counted: none left"
    );
    assert_eq!(
        f.codes("shadow", &[("tenant", "acme"), ("user", "ann")], 2)
            .await,
        [OK, OVER]
    );
    assert_eq!(f.codes("shadow", &[("path", "/x")], 2).await, [OK, OK]);
    assert_eq!(
        f.codes("shadow", &[("path", "/enforced")], 2).await,
        [OK, OVER]
    );
    // The global shadow mode: every answer OK.
    let g = fixture(Options::new().shadow_mode(true));
    assert_eq!(
        g.codes("shadow", &[("path", "/enforced")], 3).await,
        [OK, OK, OK]
    );
}

#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
    let f = fixture(Options::new());
    assert_eq!(
        f.codes("meta", &[("user", "ann")], 6).await,
        [OK, OK, OK, OK, OK, OVER]
    );
    let two = request(
        "meta",
        vec![
            descriptor(&[("user", "ann")]),
            descriptor(&[("user", "bob")]),
        ],
    );
    let reply = f.ask(&two).await;
    assert_eq!(reply.overall_code(), OK, "bob still has quota");
    assert_eq!(
        (reply.statuses[0].code(), reply.statuses[1].code()),
        (OVER, OK)
    );
}

#[tokio::test]
async fn envoys_limit_override_replaces_the_configured_limit() {
    let f = fixture(Options::new());
    let mut d = descriptor(&[("path", "/cart")]); // configured: 100 per minute
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: RateLimitUnit::Second as i32,
    });
    let r = request("shop", vec![d]);
    let first = f.ask(&r).await;
    assert_eq!(limit_of(&first.statuses[0]), Some((2, Unit::Second)));
    assert_eq!(f.ask(&r).await.overall_code(), OK);
    assert_eq!(f.ask(&r).await.overall_code(), OVER);
    // An override needs the domain, as upstream.
    let mut unknown = descriptor(&[("path", "/cart")]);
    unknown.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Second as i32,
    });
    let reply = f.ask(&request("no-such-domain", vec![unknown])).await;
    assert_eq!(reply.statuses[0].current_limit, None);
}

#[tokio::test]
async fn the_fixed_window_passes_twice_the_limit_across_a_boundary_the_sliding_window_does_not() {
    let f = fixture(Options::new());
    f.clock.advance(Duration::from_millis(900));
    assert_eq!(
        f.codes("algo", &[("upstream_like", "a")], 3).await,
        [OK, OK, OVER]
    );
    assert_eq!(
        f.codes("algo", &[("sliding", "a")], 3).await,
        [OK, OK, OVER]
    );
    f.clock.advance(Duration::from_millis(100)); // the next second
    assert_eq!(
        f.codes("algo", &[("upstream_like", "a")], 3).await,
        [OK, OK, OVER],
        "4 in 100 ms"
    );
    assert_eq!(
        f.codes("algo", &[("sliding", "a")], 1).await,
        [OVER],
        "the last second still counts"
    );
    // The fixed window resets at the unit's end, as upstream says.
    let r = request("algo", vec![descriptor(&[("upstream_like", "a")])]);
    let over = f.ask(&r).await;
    let reset = over.statuses[0].duration_until_reset.unwrap();
    assert_eq!((reset.seconds, over.statuses[0].limit_remaining), (1, 0));
    // The token bucket: a burst of 2, one more each half second.
    assert_eq!(f.codes("algo", &[("bucket", "a")], 3).await, [OK, OK, OVER]);
    f.clock.advance(Duration::from_millis(500));
    assert_eq!(f.codes("algo", &[("bucket", "a")], 2).await, [OK, OVER]);
}

#[tokio::test]
async fn a_wildcard_counts_each_value_apart_unless_share_threshold_pools_them() {
    let f = fixture(Options::new());
    // 2 per minute per value: two values do not share.
    assert_eq!(f.codes("wild", &[("route", "r1")], 3).await, [OK, OK, OVER]);
    assert_eq!(f.codes("wild", &[("route", "r2")], 1).await, [OK]);
    // share_threshold: 2 per minute across every files/* value.
    assert_eq!(f.codes("wild", &[("shared", "files/a")], 1).await, [OK]);
    assert_eq!(
        f.codes("wild", &[("shared", "files/b")], 2).await,
        [OK, OVER]
    );
}

#[tokio::test]
async fn response_headers_carry_the_ratelimit_fields_of_the_descriptors_decided() {
    let f = fixture(Options::new().headers(HeaderSet::ALL));
    let r = request(
        "shop",
        vec![
            descriptor(&[("path", "/checkout")]),
            descriptor(&[("api_key", "k")]),
        ],
    );
    let reply = f.ask(&r).await;
    let header = |name: &str| {
        reply
            .response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
            .unwrap_or_else(|| panic!("no {name} in {:?}", reply.response_headers_to_add))
    };
    let policy = header("ratelimit-policy");
    assert!(
        policy.contains("q=10;w=60") && policy.contains(r#""per-api-key";q=1000;w=86400"#),
        "{policy}"
    );
    assert!(
        header("ratelimit").contains("r=9"),
        "{}",
        header("ratelimit")
    );
    // The binding limit (fewest remaining) in the X-RateLimit fields.
    assert_eq!(header("x-ratelimit-limit"), "10");
    assert_eq!(header("x-ratelimit-remaining"), "9");
    let none = fixture(Options::new());
    assert!(
        none.ask(&r).await.response_headers_to_add.is_empty(),
        "off by default"
    );
}

/// Envoy's semantics by default: a refused request's other descriptors are counted. All or nothing: a refused
/// request spends nothing, and the refused answer reports what the others have left after the give-back.
#[tokio::test]
async fn all_or_nothing_gives_a_refused_requests_hits_back() {
    let r = request(
        "shop",
        vec![
            descriptor(&[("path", "/checkout")]),
            descriptor(&[("tenant", "acme"), ("user", "ann")]),
        ],
    );
    let checkout_only = request("shop", vec![descriptor(&[("path", "/checkout")])]);
    // 10 a minute on /checkout, 5 a second for ann; the clock stands still: 5 admitted, then 3 refused.
    for (options, left_when_refused, left_after) in [
        (Options::new(), [4, 3, 2], 1),
        (Options::new().all_or_nothing(true), [5, 5, 5], 4),
    ] {
        let f = fixture(options);
        for n in 0..5 {
            let reply = f.ask(&r).await;
            assert_eq!(reply.overall_code(), OK);
            assert_eq!(reply.statuses[0].limit_remaining, 9 - n);
        }
        for left in left_when_refused {
            let reply = f.ask(&r).await;
            assert_eq!(reply.overall_code(), OVER);
            assert_eq!(
                (reply.statuses[0].code(), reply.statuses[0].limit_remaining),
                (OK, left)
            );
            assert_eq!(reply.statuses[1].code(), OVER);
        }
        let reply = f.ask(&checkout_only).await;
        assert_eq!(
            (reply.overall_code(), reply.statuses[0].limit_remaining),
            (OK, left_after)
        );
    }
}
