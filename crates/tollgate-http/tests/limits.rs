//! The axum adapter over real TCP, on the in-process store and on Redis: status codes, every header and its
//! exact value, stacked layers, forwarded-header spoofing, shadow mode and the kill switch.

mod support;

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tollgate_core::{Clock, FailurePolicy, ManualClock, Policy, Quota, Store};
use tollgate_http::key::{ClientIp, HeaderKey, PeerIp, RouteKey};
use tollgate_http::problem::{ProblemType, ProblemTypes};
use tollgate_http::{HeaderSet, HttpLimitLayer};
use tollgate_tower::{DenyCacheConfig, Mode, RateLimitLayer, RejectionKind};

use support::{Reply, get as http_get, limited_app as app, serve, serve_with};

fn per_hour(n: u64) -> Policy {
    Policy::token_bucket(Quota::per_hour(n).unwrap())
}

fn assert_allowed(reply: &Reply, name: &str, limit: u64, window: u64, remaining: u64, t: u64) {
    assert_eq!(reply.status, 200, "{reply:#?}");
    assert_eq!(
        reply.header("ratelimit-policy"),
        format!("\"{name}\";q={limit};w={window}")
    );
    assert_eq!(
        reply.header("ratelimit"),
        format!("\"{name}\";r={remaining};t={t}")
    );
    assert_eq!(reply.num("x-ratelimit-limit"), limit);
    assert_eq!(reply.num("x-ratelimit-remaining"), remaining);
    assert_eq!(reply.num("x-ratelimit-used"), limit - remaining);
    assert_eq!(reply.header("x-ratelimit-resource"), name);
    assert!(!reply.has("retry-after"));
}

async fn limit_then_429_with_every_header<St: Store>(store: Arc<St>, clock: ManualClock) {
    // On Redis the deny cache is on, as by default, on the test's clock.
    let layer = RateLimitLayer::new("per-client", per_hour(3), store, PeerIp)
        .deny_cache_config(DenyCacheConfig::new().steady_clock(clock.clone()));
    let addr = serve(app(layer)).await;
    // 3 per hour: each request takes one token, which refills in 1200 s; the bucket is full again at `reset`.
    // Draft -11's `t`: the time the remaining tokens take to accrue (2 × 1200 s, 1200 s), and with none left the
    // time until the bucket is full (3600 s).
    let mut resets = Vec::new();
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        let reply = http_get(addr, "/", &[]).await;
        let t = [2400, 1200, 3600][i];
        assert_allowed(&reply, "per-client", 3, 3600, remaining, t);
        assert_eq!(reply.body, "hello");
        resets.push(reply.num("x-ratelimit-reset"));
    }
    // The stored reset moves by exactly one token per request: consecutive responses agree to the second.
    assert_eq!(resets[1] - resets[0], 1200);
    assert_eq!(resets[2] - resets[1], 1200);
    // The clock stands still: three tokens are back exactly an hour after it.
    assert_eq!(resets[2], clock.now().as_secs_ceil() + 3600);

    let denied = http_get(addr, "/", &[]).await;
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.header("content-type"), "application/problem+json");
    assert_eq!(
        denied.header("ratelimit-policy"),
        "\"per-client\";q=3;w=3600"
    );
    // On a denial `t` is when the denied request would be admitted (one token, 1200 s), not the full refill.
    assert_eq!(denied.header("ratelimit"), "\"per-client\";r=0;t=1200");
    assert_eq!(denied.num("x-ratelimit-remaining"), 0);
    assert_eq!(denied.num("x-ratelimit-used"), 3);
    assert_eq!(denied.num("x-ratelimit-reset"), resets[2]);
    assert_eq!(denied.header("x-ratelimit-resource"), "per-client");
    // Never earlier than the reset the RateLimit field announces.
    assert_eq!(denied.num("retry-after"), 1200);
    assert_eq!(
        denied.body,
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"detail":"rate limit \"per-client\" exceeded; retry after 1200 s","violated-policies":["per-client"],"limiter":"per-client","kind":"rate_limited"}"#
    );

    // Refused again (on Redis from the deny cache, the store's denial held until its retry instant): the same
    // answer, field for field, the clock standing still.
    let again = http_get(addr, "/", &[]).await;
    assert_eq!(again.status, 429);
    for field in [
        "ratelimit",
        "ratelimit-policy",
        "retry-after",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert_eq!(again.header(field), denied.header(field), "{field}");
    }
    assert_eq!(again.body, denied.body);

    let health = http_get(addr, "/health", &[]).await;
    assert_eq!(health.status, 200);
    assert!(
        !health.has("ratelimit") && !health.has("x-ratelimit-limit"),
        "{health:#?}"
    );
}
both_clocked_stores!(limit_then_429, limit_then_429_with_every_header);

/// A user's own problem type for rate limits, installed on the layer; the other kinds keep the IETF ones.
const OUR_TYPES: ProblemTypes = ProblemTypes::IETF.with(
    RejectionKind::RateLimited,
    ProblemType::new("https://example.com/problems/slow-down", "Slow \"down\""),
);

async fn problem_types_are_the_users_choice<St: Store>(store: Arc<St>) {
    let layer = RateLimitLayer::new("api", per_hour(1), store, PeerIp);
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(HttpLimitLayer::new(layer).problem_types(&OUR_TYPES));
    let addr = serve(app).await;
    assert_eq!(http_get(addr, "/", &[]).await.status, 200);
    let denied = http_get(addr, "/", &[]).await;
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.header("content-type"), "application/problem+json");
    assert_eq!(denied.num("retry-after"), 3600);
    assert_eq!(
        denied.body,
        r#"{"type":"https://example.com/problems/slow-down","title":"Slow \"down\"","status":429,"detail":"rate limit \"api\" exceeded; retry after 3600 s","violated-policies":["api"],"limiter":"api","kind":"rate_limited"}"#
    );
    assert_eq!(
        OUR_TYPES.of(RejectionKind::Shed),
        ProblemType::TEMPORARY_REDUCED_CAPACITY
    );
}
both_stores!(own_problem_types, problem_types_are_the_users_choice);

async fn a_burst_is_announced_as_the_limit_over_its_refill_time<St: Store>(store: Arc<St>) {
    // 2 per hour with bursts of 4: a token every 1800 s, and the full bucket of 4 accrues in 7200 s. Told "4 per
    // 7200 s", a client never sees more remaining than the limit beside it, and `used` counts its requests.
    let policy = Policy::token_bucket(Quota::per_hour(2).unwrap().with_burst(4).unwrap());
    let big = serve(app(RateLimitLayer::new(
        "big",
        policy,
        store.clone(),
        PeerIp,
    )))
    .await;
    // Draft -11's `t`: 1800 s per remaining token, and the full refill when none is left.
    for (remaining, t) in [(3, 5400), (2, 3600), (1, 1800), (0, 7200)] {
        let reply = http_get(big, "/", &[]).await;
        assert_allowed(&reply, "big", 4, 7200, remaining, t);
    }
    let denied = http_get(big, "/", &[]).await;
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.header("ratelimit-policy"), "\"big\";q=4;w=7200");
    assert_eq!(denied.header("ratelimit"), "\"big\";r=0;t=1800");
    assert_eq!(denied.num("retry-after"), 1800);

    // 4 per hour with bursts of 2: "2 per 1800 s".
    let policy = Policy::token_bucket(Quota::per_hour(4).unwrap().with_burst(2).unwrap());
    let small = serve(app(RateLimitLayer::new("small", policy, store, PeerIp))).await;
    for (remaining, t) in [(1, 900), (0, 1800)] {
        let reply = http_get(small, "/", &[]).await;
        assert_allowed(&reply, "small", 2, 1800, remaining, t);
    }
    assert_eq!(http_get(small, "/", &[]).await.status, 429);
}
both_stores!(
    burst,
    a_burst_is_announced_as_the_limit_over_its_refill_time
);

async fn sliding_window_reset_is_stable<St: Store>(store: Arc<St>) {
    let policy = Policy::sliding_window(Quota::per_hour(3).unwrap()).unwrap();
    let addr = serve(app(RateLimitLayer::new("window", policy, store, PeerIp))).await;
    let mut seen = Vec::new();
    for remaining in [2, 1, 0] {
        let reply = http_get(addr, "/", &[]).await;
        assert_eq!(reply.num("x-ratelimit-remaining"), remaining, "{reply:#?}");
        assert_eq!(reply.header("ratelimit-policy"), "\"window\";q=3;w=3600");
        seen.push(reply.num("x-ratelimit-reset"));
    }
    let denied = http_get(addr, "/", &[]).await;
    assert_eq!(denied.status, 429);
    seen.push(denied.num("x-ratelimit-reset"));
    // The window's reset is stored with its state: every response names the same instant.
    assert!(
        seen.windows(2).all(|w| w[0] == w[1]),
        "resets wobble: {seen:?}"
    );
    let t: u64 = denied
        .header("ratelimit")
        .rsplit("t=")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        denied.num("retry-after") >= t,
        "Retry-After earlier than t: {denied:#?}"
    );
}
both_stores!(sliding_window, sliding_window_reset_is_stable);

async fn route_layer_stacks_with_router_layer<St: Store>(store: Arc<St>) {
    let per_client = RateLimitLayer::new("per-client", per_hour(5), store.clone(), PeerIp);
    let report = RateLimitLayer::new("report", per_hour(2), store, (PeerIp, RouteKey));
    let router = Router::new()
        .route("/", get(|| async { "hello" }))
        .route(
            "/report",
            get(|| async { "report" }).layer(HttpLimitLayer::new(report)),
        )
        .layer(HttpLimitLayer::new(per_client));
    let addr = serve(router).await;

    let first = http_get(addr, "/report", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("ratelimit-policy"),
        "\"per-client\";q=5;w=3600, \"report\";q=2;w=3600"
    );
    assert_eq!(
        first.header("ratelimit"),
        "\"per-client\";r=4;t=2880, \"report\";r=1;t=1800"
    );
    // The binding limit (fewest remaining) is the one the single-policy headers describe.
    assert_eq!(first.header("x-ratelimit-resource"), "report");
    assert_eq!(first.num("x-ratelimit-remaining"), 1);

    assert_eq!(http_get(addr, "/report", &[]).await.status, 200);
    let denied = http_get(addr, "/report", &[]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied.header("ratelimit"),
        "\"per-client\";r=2;t=1440, \"report\";r=0;t=1800"
    );
    assert_eq!(denied.header("x-ratelimit-resource"), "report");
    assert_eq!(denied.num("x-ratelimit-limit"), 2);
    assert_eq!(denied.num("retry-after"), 1800);

    // Other routes only see the router-level limit, which counted all three requests.
    let home = http_get(addr, "/", &[]).await;
    assert_allowed(&home, "per-client", 5, 3600, 1, 720);
}
both_stores!(stacked_layers, route_layer_stacks_with_router_layer);

/// A `ServiceBuilder` stack of two limits is adapted by a wrapping service, a lone `RateLimitLayer` answers in
/// place: nested either way round, every response lists all three policies, outermost first.
async fn wrapped_and_in_place_layers_nest_either_way<St: Store>(store: Arc<St>) {
    let limit =
        |name: &'static str, n| RateLimitLayer::new(name, per_hour(n), store.clone(), PeerIp);
    let pair = || {
        tower::ServiceBuilder::new()
            .layer(limit("outer-of-pair", 10))
            .layer(limit("inner-of-pair", 9))
            .into_inner()
    };
    let in_place_outside: Router = Router::new()
        .route(
            "/",
            get(|| async { "hello" }).layer(HttpLimitLayer::new(pair())),
        )
        .layer(HttpLimitLayer::new(limit("router", 8)));
    let wrapped_outside: Router = Router::new()
        .route(
            "/",
            get(|| async { "hello" }).layer(HttpLimitLayer::new(limit("route", 7))),
        )
        .layer(HttpLimitLayer::new(pair()));

    let reply = http_get(serve(in_place_outside).await, "/", &[]).await;
    assert_eq!(reply.status, 200, "{reply:#?}");
    assert_eq!(
        reply.header("ratelimit-policy"),
        r#""router";q=8;w=3600, "outer-of-pair";q=10;w=3600, "inner-of-pair";q=9;w=3600"#
    );
    assert_eq!(reply.header("x-ratelimit-resource"), "router");
    assert_eq!(reply.num("x-ratelimit-remaining"), 7);

    let reply = http_get(serve(wrapped_outside).await, "/", &[]).await;
    assert_eq!(reply.status, 200, "{reply:#?}");
    assert_eq!(
        reply.header("ratelimit"),
        r#""outer-of-pair";r=8;t=2880, "inner-of-pair";r=7;t=2800, "route";r=6;t=3086"#
    );
    assert_eq!(reply.header("x-ratelimit-resource"), "route");
}
both_stores!(nested_adapters, wrapped_and_in_place_layers_nest_either_way);

async fn a_rejection_shows_every_limit_that_counted_the_request<St: Store>(store: Arc<St>) {
    // Limiters that admitted a request before one further in rejected it have counted it: the 429 must show their
    // fields too (they share one adapter, so the inner ones answer through the default responder `()`).
    let limit =
        |name: &'static str, n| RateLimitLayer::new(name, per_hour(n), store.clone(), PeerIp);
    let pair = tower::ServiceBuilder::new()
        .layer(limit("outer-of-pair", 10))
        .layer(limit("inner-of-pair", 1))
        .into_inner();
    let trio = tower::ServiceBuilder::new()
        .layer(limit("outer-of-trio", 10))
        .layer(limit("middle-of-trio", 5))
        .layer(limit("inner-of-trio", 1))
        .into_inner();
    let paired: Router = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(HttpLimitLayer::new(pair));
    let trebled: Router = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(HttpLimitLayer::new(trio));
    let cases = [
        (
            paired,
            r#""outer-of-pair";r=8;t=2880, "inner-of-pair";r=0;t=3600"#,
            "inner-of-pair",
        ),
        (
            trebled,
            r#""outer-of-trio";r=8;t=2880, "middle-of-trio";r=3;t=2160, "inner-of-trio";r=0;t=3600"#,
            "inner-of-trio",
        ),
    ];
    for (app, fields, binding) in cases {
        let addr = serve(app).await;
        assert_eq!(http_get(addr, "/", &[]).await.status, 200);
        let denied = http_get(addr, "/", &[]).await;
        assert_eq!(denied.status, 429, "{denied:#?}");
        assert_eq!(denied.header("ratelimit"), fields, "{denied:#?}");
        assert_eq!(denied.header("x-ratelimit-resource"), binding);
        assert_eq!(denied.num("retry-after"), 3600);
    }
}
both_stores!(
    rejected_inside,
    a_rejection_shows_every_limit_that_counted_the_request
);

/// A layer that sends no fields of its own still counts in an outer layer's fields, lets an inner layer send its
/// own when it is the outermost, and still answers its own rejections with 429 and `Retry-After`.
async fn header_less_layer_reports_to_the_outer_one<St: Store>(store: Arc<St>) {
    let limit =
        |name: &'static str, n| RateLimitLayer::new(name, per_hour(n), store.clone(), PeerIp);
    let quiet = |name| HttpLimitLayer::new(limit(name, 2)).headers(HeaderSet::NONE);
    let nested: Router = Router::new()
        .route("/", get(|| async { "hello" }).layer(quiet("quiet")))
        .layer(HttpLimitLayer::new(limit("router", 8)));
    let alone: Router = Router::new().route("/", get(|| async { "hello" }).layer(quiet("alone")));
    let quiet_outside: Router = Router::new()
        .route(
            "/",
            get(|| async { "hello" }).layer(HttpLimitLayer::new(limit("loud", 4))),
        )
        .layer(quiet("quiet-outside"));

    let reply = http_get(serve(nested).await, "/", &[]).await;
    assert_eq!(reply.status, 200, "{reply:#?}");
    assert_eq!(
        reply.header("ratelimit"),
        r#""router";r=7;t=3150, "quiet";r=1;t=1800"#
    );
    assert_eq!(reply.header("x-ratelimit-resource"), "quiet");

    let reply = http_get(serve(quiet_outside).await, "/", &[]).await;
    assert_eq!(reply.status, 200, "{reply:#?}");
    assert_eq!(reply.header("ratelimit"), r#""loud";r=3;t=2700"#);
    assert_eq!(reply.header("x-ratelimit-resource"), "loud");

    let addr = serve(alone).await;
    for _ in 0..2 {
        let reply = http_get(addr, "/", &[]).await;
        assert_eq!(reply.status, 200, "{reply:#?}");
        assert!(
            !reply.has("ratelimit") && !reply.has("ratelimit-policy"),
            "{reply:#?}"
        );
        assert!(!reply.has("x-ratelimit-remaining"), "{reply:#?}");
    }
    let denied = http_get(addr, "/", &[]).await;
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.num("retry-after"), 1800);
    assert!(!denied.has("ratelimit"), "{denied:#?}");
}
both_stores!(
    header_less_layers,
    header_less_layer_reports_to_the_outer_one
);

/// A limit switched on or off by configuration (`tower::util::option_layer` of the adapted layer: both sides of
/// the `Either` then answer `Infallible`).
async fn optional_layer_limits_only_when_present<St: Store>(store: Arc<St>) {
    let app = |layer: Option<RateLimitLayer<PeerIp, St>>| {
        Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(tower::util::option_layer(layer.map(HttpLimitLayer::new)))
    };
    let on = serve(app(Some(RateLimitLayer::new(
        "optional",
        per_hour(1),
        store,
        PeerIp,
    ))))
    .await;
    let reply = http_get(on, "/", &[]).await;
    assert_allowed(&reply, "optional", 1, 3600, 0, 3600);
    assert_eq!(http_get(on, "/", &[]).await.status, 429);

    let off = serve(app(None)).await;
    for _ in 0..3 {
        let reply = http_get(off, "/", &[]).await;
        assert_eq!(reply.status, 200, "{reply:#?}");
        assert!(!reply.has("ratelimit"), "{reply:#?}");
    }
}
both_stores!(optional_layers, optional_layer_limits_only_when_present);

async fn spoofed_forwarding_headers_are_ignored<St: Store>(store: Arc<St>) {
    // No trusted proxy: the peer is the client, whatever the headers say.
    let addr = serve(app(RateLimitLayer::new(
        "per-client",
        per_hour(2),
        store,
        ClientIp::new(),
    )))
    .await;
    let spoofs: [&[(&str, &str)]; 6] = [
        &[],
        &[("x-forwarded-for", "1.2.3.4")],
        &[("x-forwarded-for", "5.6.7.8, 9.9.9.9")],
        &[("forwarded", "for=10.0.0.1")],
        &[
            ("forwarded", "for=\"[2001:db8::1]:80\""),
            ("x-real-ip", "8.8.8.8"),
        ],
        &[("x-forwarded-for", "garbage")],
    ];
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for extra in spoofs {
            v.push(http_get(addr, "/", extra).await.status);
        }
        v
    };
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429]);
}
both_stores!(
    spoofing_without_proxy,
    spoofed_forwarding_headers_are_ignored
);

async fn trusted_proxy_yields_the_real_client<St: Store>(store: Arc<St>) {
    // The test client connects from 127.0.0.1, playing the trusted proxy.
    let key = ClientIp::trusting(["127.0.0.0/8".parse().unwrap()]);
    let addr = serve(app(RateLimitLayer::new(
        "per-client",
        per_hour(1),
        store,
        key,
    )))
    .await;
    let xff = |v: &'static str| [("x-forwarded-for", v)];
    assert_eq!(http_get(addr, "/", &xff("203.0.113.1")).await.status, 200);
    assert_eq!(
        http_get(addr, "/", &xff("203.0.113.2")).await.status,
        200,
        "another client, another bucket"
    );
    // A client prepending its own hops still lands in its own bucket: only the proxy's entry is read.
    assert_eq!(
        http_get(addr, "/", &xff("198.51.100.7, 203.0.113.1"))
            .await
            .status,
        429
    );
    assert_eq!(
        http_get(
            addr,
            "/",
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "203.0.113.2")
            ]
        )
        .await
        .status,
        429
    );
    // The proxy writes X-Forwarded-For; a client-written Forwarded is not read (the key is the proxy itself).
    assert_eq!(
        http_get(addr, "/", &[("forwarded", "for=192.0.2.99")])
            .await
            .status,
        200
    );
    assert_eq!(
        http_get(addr, "/", &[("forwarded", "for=192.0.2.100")])
            .await
            .status,
        429
    );
}
both_stores!(trusted_proxy, trusted_proxy_yields_the_real_client);

async fn unmatched_paths_are_limited_as_one_route<St: Store>(store: Arc<St>) {
    // Under `Router::layer` the fallback is limited too: its 404s keep their status, carry the headers, and share
    // one bucket per client whatever the path; routes keep theirs.
    let layer = RateLimitLayer::new("route", per_hour(2), store, (PeerIp, RouteKey));
    let app = Router::new()
        .route("/users/{id}", get(|| async { "user" }))
        .layer(HttpLimitLayer::new(layer));
    let addr = serve(app).await;
    for (path, status, remaining) in [("/nope", 404, 1), ("/users/", 404, 0), ("/a/b/c", 429, 0)] {
        let reply = http_get(addr, path, &[]).await;
        assert_eq!(reply.status, status, "{path}: {reply:#?}");
        assert_eq!(reply.num("x-ratelimit-remaining"), remaining, "{path}");
    }
    for (path, remaining) in [("/users/1", 1), ("/users/2", 0)] {
        let reply = http_get(addr, path, &[]).await;
        assert_eq!(reply.status, 200, "{path}: {reply:#?}");
        assert_eq!(reply.num("x-ratelimit-remaining"), remaining, "{path}");
    }
}
both_stores!(unmatched, unmatched_paths_are_limited_as_one_route);

async fn stacked_layers_asking_for_different_fields_agree<St: Store>(store: Arc<St>) {
    // The outermost layer renders every family any layer asked for, over every verdict: the GitHub fields name the
    // binding limit of both, whichever layer asked for them.
    let limit = |name: &'static str, n, headers| {
        HttpLimitLayer::new(RateLimitLayer::new(
            name,
            per_hour(n),
            store.clone(),
            PeerIp,
        ))
        .headers(headers)
    };
    let ietf_outside: Router = Router::new()
        .route(
            "/",
            get(|| async { "hello" }).layer(limit("inner-github", 5, HeaderSet::GITHUB)),
        )
        .layer(limit("outer-ietf", 2, HeaderSet::IETF));
    let github_outside: Router = Router::new()
        .route(
            "/",
            get(|| async { "hello" }).layer(limit("inner-ietf", 5, HeaderSet::IETF)),
        )
        .layer(limit("outer-github", 2, HeaderSet::GITHUB));
    for (app, outer, inner) in [
        (ietf_outside, "outer-ietf", "inner-github"),
        (github_outside, "outer-github", "inner-ietf"),
    ] {
        let reply = http_get(serve(app).await, "/", &[]).await;
        assert_eq!(reply.status, 200, "{reply:#?}");
        assert_eq!(
            reply.header("ratelimit"),
            format!("\"{outer}\";r=1;t=1800, \"{inner}\";r=4;t=2880"),
            "{reply:#?}"
        );
        assert_eq!(reply.header("x-ratelimit-resource"), outer, "{reply:#?}");
        assert_eq!(reply.num("x-ratelimit-remaining"), 1);
        assert_eq!(reply.num("x-ratelimit-limit"), 2);
    }
}
both_stores!(
    mixed_fields,
    stacked_layers_asking_for_different_fields_agree
);

async fn ipv6_clients_are_limited_by_their_network<St: Store>(store: Arc<St>) {
    // One client given 2001:db8:0:7::/64 can send each request from another address of it: one bucket, unless
    // the limiter is told to key every address apart.
    let proxy = || ClientIp::trusting(["127.0.0.0/8".parse().unwrap()]);
    let by_network = serve(app(RateLimitLayer::new(
        "per-client",
        per_hour(1),
        store.clone(),
        proxy(),
    )))
    .await;
    let by_address = serve(app(RateLimitLayer::new(
        "per-address",
        per_hour(1),
        store,
        proxy().ipv6_prefix(128),
    )))
    .await;
    let from = |client: &'static str| [("x-forwarded-for", client)];
    for (addr, second) in [(by_network, 429), (by_address, 200)] {
        assert_eq!(
            http_get(addr, "/", &from("2001:db8:0:7::1")).await.status,
            200
        );
        assert_eq!(
            http_get(addr, "/", &from("[2001:db8:0:7:9:8:7:6]:443"))
                .await
                .status,
            second
        );
        assert_eq!(
            http_get(addr, "/", &from("2001:db8:0:8::1")).await.status,
            200,
            "the next /64 is another client"
        );
    }
}
both_stores!(ipv6_networks, ipv6_clients_are_limited_by_their_network);

async fn shadow_mode_admits_but_counts<St: Store>(store: Arc<St>) {
    let layer = RateLimitLayer::new("dark", per_hour(2), store, PeerIp).shadow();
    let switch = layer.enforcement();
    let addr = serve(app(layer)).await;
    for _ in 0..4 {
        let reply = http_get(addr, "/", &[]).await;
        assert_eq!(reply.status, 200);
        assert!(
            !reply.has("ratelimit") && !reply.has("x-ratelimit-remaining"),
            "shadow limits are not shown"
        );
    }
    // The shadow requests were counted: enforcing now rejects at once.
    switch.set(Mode::Enforce);
    let denied = http_get(addr, "/", &[]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("ratelimit"), "\"dark\";r=0;t=1800");
}
both_stores!(shadow_mode, shadow_mode_admits_but_counts);

async fn kill_switch_turns_enforcement_off_and_on<St: Store>(store: Arc<St>) {
    let layer = RateLimitLayer::new("api", per_hour(1), store, PeerIp);
    let switch = layer.enforcement();
    let addr = serve(app(layer)).await;
    assert_eq!(http_get(addr, "/", &[]).await.status, 200);
    assert_eq!(http_get(addr, "/", &[]).await.status, 429);
    switch.set(Mode::Off);
    for _ in 0..3 {
        let reply = http_get(addr, "/", &[]).await;
        assert_eq!(reply.status, 200);
        assert!(!reply.has("ratelimit"));
    }
    switch.set(Mode::Enforce);
    assert_eq!(http_get(addr, "/", &[]).await.status, 429);
}
both_stores!(kill_switch, kill_switch_turns_enforcement_off_and_on);

async fn api_keys_are_separate_buckets_and_required<St: Store>(store: Arc<St>) {
    let key = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
    let addr = serve_with(
        app(RateLimitLayer::new("per-key", per_hour(1), store, key)),
        false,
    )
    .await;
    assert_eq!(
        http_get(addr, "/", &[("x-api-key", "alpha")]).await.status,
        200
    );
    assert_eq!(
        http_get(addr, "/", &[("x-api-key", "alpha")]).await.status,
        429
    );
    assert_eq!(
        http_get(addr, "/", &[("x-api-key", "beta")]).await.status,
        200
    );
    let missing = http_get(addr, "/", &[]).await;
    assert_eq!(missing.status, 500);
    assert!(
        missing.body.contains("the x-api-key header is missing"),
        "{}",
        missing.body
    );
}
both_stores!(api_keys, api_keys_are_separate_buckets_and_required);

/// The adapter takes any tower layer: here a foreign one (`MapRequestLayer`) around a limiter, which keys on the
/// header the foreign layer sets (so its running is what the answers show), and a foreign layer alone (as any
/// foreign layer is given, in a `ServiceBuilder`).
async fn foreign_layers_are_adapted_like_tollgate_ones<St: Store>(store: Arc<St>) {
    let tenant = HeaderKey::new(http::HeaderName::from_static("x-tenant"));
    let limiter = RateLimitLayer::new("per-tenant", per_hour(2), store, tenant);
    let set_tenant = tower::util::MapRequestLayer::new(|mut req: axum::extract::Request| {
        let tenant = if req.uri().path() == "/b" { "b" } else { "a" };
        req.headers_mut()
            .insert("x-tenant", http::HeaderValue::from_static(tenant));
        req
    });
    let stack = tower::ServiceBuilder::new()
        .layer(set_tenant)
        .layer(limiter)
        .into_inner();
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .layer(HttpLimitLayer::new(stack))
        .route(
            "/plain",
            get(|| async { "plain" }).layer(HttpLimitLayer::new(
                tower::ServiceBuilder::new().layer(tower::util::MapRequestLayer::new(
                    |req: axum::extract::Request| req,
                )),
            )),
        );
    let addr = serve_with(app, false).await;
    for remaining in [1, 0] {
        let reply = http_get(addr, "/a", &[]).await;
        assert_eq!(reply.status, 200, "{reply:#?}");
        assert_eq!(reply.num("x-ratelimit-remaining"), remaining);
    }
    let denied = http_get(addr, "/a", &[]).await;
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.num("x-ratelimit-limit"), 2);
    assert!(denied.has("retry-after"), "{denied:#?}");
    // The foreign layer gave /b another tenant: a bucket of its own.
    assert_eq!(http_get(addr, "/b", &[]).await.status, 200);
    let plain = http_get(addr, "/plain", &[]).await;
    assert_eq!(plain.status, 200);
    assert!(!plain.has("ratelimit"), "no limiter, no fields: {plain:#?}");
}
both_stores!(
    foreign_layers,
    foreign_layers_are_adapted_like_tollgate_ones
);

async fn missing_peer_address_is_a_configuration_error<St: Store>(store: Arc<St>) {
    let addr = serve_with(
        app(RateLimitLayer::new(
            "per-client",
            per_hour(5),
            store,
            PeerIp,
        )),
        false,
    )
    .await;
    for _ in 0..2 {
        let reply = http_get(addr, "/", &[]).await;
        assert_eq!(reply.status, 500);
        assert_eq!(reply.header("content-type"), "application/problem+json");
        assert!(
            reply.body.contains("into_make_service_with_connect_info"),
            "{}",
            reply.body
        );
    }
}
both_stores!(missing_peer, missing_peer_address_is_a_configuration_error);

/// A Redis nobody listens on: every check fails (connection refused), as in an outage.
async fn unreachable_redis() -> Arc<tollgate_redis::RedisStore> {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let store = tollgate_redis::RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .build()
        .await
        .unwrap();
    // No store failure policy: Redis errors reach the layer, whose `on_store_error` answers.
    Arc::new(store)
}

#[tokio::test]
async fn redis_outage_follows_the_failure_policy() {
    let closed = serve(app(RateLimitLayer::new(
        "api",
        per_hour(1),
        unreachable_redis().await,
        PeerIp,
    )
    .on_store_error(FailurePolicy::Closed)))
    .await;
    let reply = http_get(closed, "/", &[]).await;
    assert_eq!(reply.status, 503, "{reply:#?}");
    assert_eq!(reply.num("retry-after"), 60);
    assert!(reply.body.contains("store_unavailable"), "{}", reply.body);
    assert!(!reply.has("ratelimit"), "no invented numbers");

    let open = serve(app(RateLimitLayer::new(
        "api",
        per_hour(1),
        unreachable_redis().await,
        PeerIp,
    )
    .on_store_error(FailurePolicy::Open)))
    .await;
    for _ in 0..2 {
        let reply = http_get(open, "/", &[]).await;
        assert_eq!(reply.status, 200);
        assert!(!reply.has("ratelimit"));
    }

    // Local by default, as when set.
    let by_default = serve(app(RateLimitLayer::new(
        "api",
        per_hour(1),
        unreachable_redis().await,
        PeerIp,
    )))
    .await;
    let local = serve(app(RateLimitLayer::new(
        "api",
        per_hour(1),
        unreachable_redis().await,
        PeerIp,
    )
    .on_store_error(FailurePolicy::Local)))
    .await;
    for local in [by_default, local] {
        let reply = http_get(local, "/", &[]).await;
        assert_allowed(&reply, "api", 1, 3600, 0, 3600);
        assert_eq!(
            http_get(local, "/", &[]).await.status,
            429,
            "the local fallback enforces the policy"
        );
    }
}
