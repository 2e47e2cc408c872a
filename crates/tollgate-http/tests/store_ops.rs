//! Peek and lockouts over real TCP, on the in-process store and on Redis (both on a manual clock, and Redis on
//! its own clock): `Retry-After` and the RateLimit fields tell the lockout's truth, a "N attempts left" page peeks
//! without spending, and the deny cache stays exact under a lockout.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::routing::get;
use tollgate_core::{Clock, Decision, ManualClock, Policy, Quota, Store, StoreError};
use tollgate_http::HttpLimitLayer;
use tollgate_http::key::PeerIp;
use tollgate_tower::{CostAfter, DenyCacheConfig, FinalCost, RateLimitLayer};

use support::{get as http_get, serve};

/// Two per second (a token every 0.5 s): only the lockout can make a client wait 900 s.
fn login_policy() -> Policy {
    Policy::token_bucket(Quota::per_second(2).unwrap())
        .with_lockout(Duration::from_secs(900))
        .unwrap()
}

/// `GET /login` limited by `layer`; `GET /attempts-left` peeks at the same limit for the same client.
fn login_app<St: Store>(layer: RateLimitLayer<PeerIp, St>) -> Router {
    let peeker = layer.clone();
    Router::new()
        .route("/login", get(|| async { "welcome" }))
        .layer(HttpLimitLayer::new(layer))
        .route(
            "/attempts-left",
            get(move |req: Request| {
                let peeker = peeker.clone();
                // The key is in the request's head (its peer address): the body (not `Sync`) stays behind.
                let head = Request::from_parts(req.into_parts().0, ());
                async move {
                    // What a login would get now: admitted leaves `remaining`, so this one counts too.
                    let d = peeker.peek(&head).await.expect("peek");
                    let attempts = if d.is_allowed() { d.remaining + 1 } else { 0 };
                    let retry = d.retry_after.map_or(0, |r| r.as_secs());
                    format!("{attempts} {retry}")
                }
            }),
        )
}

async fn lockout_headers_tell_the_truth<St: Store>(store: Arc<St>, clock: ManualClock) {
    // On Redis the deny cache is on, as by default, on the test's clock.
    let layer = RateLimitLayer::new("login", login_policy(), store, PeerIp)
        .deny_cache_config(DenyCacheConfig::new().steady_clock(clock.clone()));
    let addr = serve(login_app(layer)).await;
    assert_eq!(http_get(addr, "/attempts-left", &[]).await.body, "2 0");
    assert_eq!(http_get(addr, "/login", &[]).await.status, 200);
    // Peeks spend nothing: asked twice, the same answer.
    assert_eq!(http_get(addr, "/attempts-left", &[]).await.body, "1 0");
    assert_eq!(http_get(addr, "/attempts-left", &[]).await.body, "1 0");
    assert_eq!(http_get(addr, "/login", &[]).await.status, 200);
    // Nothing left: a peek says what the next attempt would get — a lockout of 900 s — and starts none.
    assert_eq!(http_get(addr, "/attempts-left", &[]).await.body, "0 900");
    clock.advance(Duration::from_secs(1));
    assert_eq!(http_get(addr, "/attempts-left", &[]).await.body, "2 0");
    for _ in 0..2 {
        assert_eq!(http_get(addr, "/login", &[]).await.status, 200);
    }

    let denied = http_get(addr, "/login", &[]).await;
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.num("retry-after"), 900);
    assert_eq!(denied.header("ratelimit"), "\"login\";r=0;t=900");
    assert_eq!(denied.num("x-ratelimit-remaining"), 0);
    // The reset is no earlier than the lockout's end.
    let end = clock.now().as_secs_ceil() + 900;
    assert_eq!(denied.num("x-ratelimit-reset"), end);

    // A minute on, the bucket is long full, the key still locked: the retry counts down to the same instant, and
    // refusals neither extend the lockout nor spend.
    clock.advance(Duration::from_secs(60));
    for _ in 0..3 {
        let denied = http_get(addr, "/login", &[]).await;
        assert_eq!(denied.status, 429);
        assert_eq!(denied.num("retry-after"), 840);
        assert_eq!(denied.num("x-ratelimit-reset"), end);
    }
    assert_eq!(http_get(addr, "/attempts-left", &[]).await.body, "0 840");
    clock.advance(Duration::from_secs(839));
    assert_eq!(http_get(addr, "/login", &[]).await.num("retry-after"), 1);
    clock.advance(Duration::from_secs(1));
    let back = http_get(addr, "/login", &[]).await;
    assert_eq!(back.status, 200, "{back:#?}");
    assert_eq!(back.num("x-ratelimit-remaining"), 1);
}
both_clocked_stores!(lockout_headers, lockout_headers_tell_the_truth);

/// A store reporting itself shared (so the layer's deny cache is on), counting the calls that reach it.
struct Shared<St> {
    inner: Arc<St>,
    calls: AtomicU64,
}

impl<St: Store> Store for Shared<St> {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.check(key, policy, cost).await
    }

    fn is_shared(&self) -> bool {
        true
    }
}

/// The deny cache holds a lockout's denial until the lockout's end, exactly: refusals in between never reach
/// the store, and the first request the store would admit is admitted.
async fn deny_cache_is_exact_under_a_lockout<St: Store>(store: Arc<St>, clock: ManualClock) {
    let shared = Arc::new(Shared {
        inner: store,
        calls: AtomicU64::new(0),
    });
    let policy = Policy::token_bucket(Quota::per_second(2).unwrap())
        .with_lockout(Duration::from_secs(60))
        .unwrap();
    let layer = RateLimitLayer::new("login", policy, shared.clone(), PeerIp)
        .deny_cache_config(DenyCacheConfig::new().clock(clock.clone()));
    let addr = serve(login_app(layer)).await;
    for _ in 0..2 {
        assert_eq!(http_get(addr, "/login", &[]).await.status, 200);
    }
    let denied = http_get(addr, "/login", &[]).await;
    assert_eq!(denied.num("retry-after"), 60);
    assert_eq!(shared.calls.load(Ordering::Relaxed), 3);
    // Half-way and just before the end, less the cache's drift margin: answered locally, counting down.
    let margin = tollgate_tower::limit::rate::deny_cache::drift_margin(Duration::from_secs(60));
    for (advance, retry) in [
        (Duration::from_secs(30), 30),
        (
            Duration::from_secs(30) - margin - Duration::from_micros(1),
            1,
        ),
    ] {
        clock.advance(advance);
        let denied = http_get(addr, "/login", &[]).await;
        assert_eq!(denied.status, 429);
        assert_eq!(denied.num("retry-after"), retry);
    }
    assert_eq!(shared.calls.load(Ordering::Relaxed), 3);
    // At the lockout's end the store is asked again, and admits.
    clock.advance(margin + Duration::from_micros(1));
    assert_eq!(http_get(addr, "/login", &[]).await.status, 200);
    assert_eq!(shared.calls.load(Ordering::Relaxed), 4);
}
both_clocked_stores!(deny_cache_lockout, deny_cache_is_exact_under_a_lockout);

/// Redis on its own clock (`TIME`), with its deny cache on by default: the lockout's `Retry-After` is the lockout
/// itself, then counts down to the same instant; a peek agrees.
#[tokio::test]
async fn lockout_on_redis_time() {
    let store = support::redis_store().await;
    let policy = Policy::sliding_window(Quota::per_second(2).unwrap())
        .unwrap()
        .with_lockout(Duration::from_secs(600))
        .unwrap();
    let layer = RateLimitLayer::new("login", policy, store, PeerIp);
    let addr = serve(login_app(layer)).await;
    let mut denied = None;
    // Two per rolling second: within at most a few requests one is refused (a second boundary may let one more
    // through), and that refusal starts the lockout.
    for _ in 0..6 {
        let reply = http_get(addr, "/login", &[]);
        let reply = reply.await;
        if reply.status == 429 {
            denied = Some((reply, std::time::Instant::now()));
            break;
        }
    }
    let (denied, at) = denied.expect("a third request within a second is refused");
    assert_eq!(denied.num("retry-after"), 600, "{denied:#?}");
    assert_eq!(denied.header("ratelimit"), "\"login\";r=0;t=600");
    let reset = denied.num("x-ratelimit-reset");
    // Refused again (by the deny cache, or by Redis: the same numbers), counting down to the same end.
    let again = http_get(addr, "/login", &[]).await;
    let waited = at.elapsed().as_secs() + 1;
    assert_eq!(again.status, 429);
    let retry = again.num("retry-after");
    assert!(retry <= 600 && retry >= 600 - waited, "{again:#?}");
    assert_eq!(again.num("x-ratelimit-reset"), reset);
    let peek = http_get(addr, "/attempts-left", &[]).await.body;
    let (remaining, retry) = peek.split_once(' ').unwrap();
    assert_eq!(remaining, "0");
    let retry: u64 = retry.parse().unwrap();
    assert!(
        retry <= 600 && retry + at.elapsed().as_secs() + 1 >= 600,
        "{peek}"
    );
}

/// `GET /gen` limited by `layer` (adapted in place, or inside a `ServiceBuilder` by the adapter's own service if
/// `generic`: the limiter's own responder or the default `()` reads the real cost), answering with the real cost
/// the request header `x-want` asks for, in the header `x-cost` and in the `FinalCost` extension; `GET /left`
/// peeks at what a request of cost 1 would get.
fn generation_app<St: Store>(layer: RateLimitLayer<PeerIp, St>) -> Router {
    generation_app_with(layer, false)
}

fn generation_app_with<St: Store>(layer: RateLimitLayer<PeerIp, St>, generic: bool) -> Router {
    let peeker = layer.clone();
    let generate = Router::new().route(
        "/gen",
        get(|req: Request| async move {
            let want: u64 = req.headers()["x-want"].to_str().unwrap().parse().unwrap();
            (
                [("x-cost", want.to_string())],
                axum::Extension(FinalCost(want)),
                "generated",
            )
        }),
    );
    let generate = if generic {
        generate.layer(HttpLimitLayer::new(
            tower::ServiceBuilder::new().layer(layer),
        ))
    } else {
        generate.layer(HttpLimitLayer::new(layer))
    };
    generate.route(
        "/left",
        get(move |req: Request| {
            let peeker = peeker.clone();
            let head = Request::from_parts(req.into_parts().0, ());
            async move {
                let d = peeker.peek(&head).await.expect("peek");
                let left = if d.is_allowed() { d.remaining + 1 } else { 0 };
                format!("{left} {}", d.retry_after.map_or(0, |r| r.as_secs()))
            }
        }),
    )
}

/// Peeks until `/left` says `want`: a shared store's charge runs as a task after the response, so the next
/// request may arrive before it lands. Waits for the event, bounded, and never sleeps for a time being tested.
async fn wait_for_left(addr: std::net::SocketAddr, want: &str) {
    for _ in 0..500 {
        if http_get(addr, "/left", &[]).await.body == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "/left never said {want:?}: {:?}",
        http_get(addr, "/left", &[]).await.body
    );
}

async fn cost_after_the_response_overdraws_and_refunds<St: Store>(
    store: Arc<St>,
    clock: ManualClock,
) {
    overdraws_and_refunds(store, clock, false).await;
}

/// The same through the generic adapter: the limiter forwards its verdict, and the default responder `()` reads the
/// real cost.
async fn cost_after_through_the_generic_adapter<St: Store>(store: Arc<St>, clock: ManualClock) {
    overdraws_and_refunds(store, clock, true).await;
}
both_clocked_stores!(cost_after_generic, cost_after_through_the_generic_adapter);

async fn overdraws_and_refunds<St: Store>(store: Arc<St>, clock: ManualClock, generic: bool) {
    // 10 per minute: a token every 6 s, whole seconds in every header.
    let policy = Policy::token_bucket(Quota::per_minute(10).unwrap());
    let layer = RateLimitLayer::new("gen", policy, store, PeerIp)
        .cost_after(CostAfter::Header("x-cost".into()));
    let addr = serve(generation_app_with(layer, generic)).await;
    assert_eq!(http_get(addr, "/left", &[]).await.body, "10 0");
    // Charged 1 up front, 0 in the end: refunded, the bucket is full again.
    let free = http_get(addr, "/gen", &[("x-want", "0")]).await;
    assert_eq!(free.status, 200);
    assert_eq!(
        free.num("x-ratelimit-remaining"),
        9,
        "the admission's own numbers"
    );
    wait_for_left(addr, "10 0").await;
    // 15 in the end: 14 more, 5 beyond the bucket. The response shows its admission with the charge: nothing left,
    // and the bucket full again once the 15 tokens accrue (90 s).
    let big = http_get(addr, "/gen", &[("x-want", "15")]).await;
    assert_eq!((big.status, big.num("x-ratelimit-remaining")), (200, 0));
    assert_eq!(big.header("ratelimit"), "\"gen\";r=0;t=90");
    // 5 owed and 1 for the next request: 6 tokens, 36 s.
    wait_for_left(addr, "0 36").await;
    let denied = http_get(addr, "/gen", &[("x-want", "1")]).await;
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.num("retry-after"), 36);
    assert_eq!(denied.num("x-ratelimit-remaining"), 0);
    assert_eq!(denied.header("ratelimit"), "\"gen\";r=0;t=36");
    clock.advance(Duration::from_secs(35));
    assert_eq!(
        http_get(addr, "/gen", &[("x-want", "1")])
            .await
            .num("retry-after"),
        1
    );
    clock.advance(Duration::from_secs(1));
    let repaid = http_get(addr, "/gen", &[("x-want", "1")]).await;
    assert_eq!(
        (repaid.status, repaid.num("x-ratelimit-remaining")),
        (200, 0)
    );
}
both_clocked_stores!(cost_after, cost_after_the_response_overdraws_and_refunds);

/// The `r` a response shows after its charge is spent in full and admitted, and one more is refused: the shown
/// value is what the key has left once the charge is taken, wherever the charge lands among the requests that
/// spend it (on Redis it lands later, as a task). Token bucket and sliding window, each adapter.
async fn the_shown_r_after_a_charge_is_admitted<St: Store>(
    store: Arc<St>,
    policy: Policy,
    generic: bool,
) {
    let layer = RateLimitLayer::new("gen", policy, store, PeerIp)
        .cost_after(CostAfter::Header("x-cost".into()));
    let addr = serve(generation_app_with(layer, generic)).await;
    // 1 up front, 4 in the end: of 10, 9 left at the decision and 6 once the 3 more are charged.
    let charged = http_get(addr, "/gen", &[("x-want", "4")]).await;
    assert_eq!(charged.status, 200, "{charged:#?}");
    assert_eq!(charged.num("x-ratelimit-remaining"), 6);
    let r: u64 = charged
        .header("ratelimit")
        .split(";r=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(r, 6, "{charged:#?}");
    // The clock is frozen: all within `t`. Each spends 1 (1 up front, 1 in the end).
    for i in 0..r {
        let spent = http_get(addr, "/gen", &[("x-want", "1")]).await;
        assert_eq!(
            spent.status, 200,
            "request {i} of the {r} shown: {spent:#?}"
        );
    }
    // Then nothing is left: once the charge has landed, the next is refused.
    for _ in 0..500 {
        if http_get(addr, "/left", &[]).await.body.starts_with("0 ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(http_get(addr, "/gen", &[("x-want", "1")]).await.status, 429);
}

async fn shown_r_after_a_charge_token_bucket<St: Store>(store: Arc<St>, _: ManualClock) {
    let policy = Policy::token_bucket(Quota::per_minute(10).unwrap());
    the_shown_r_after_a_charge_is_admitted(store, policy, false).await;
}
both_clocked_stores!(shown_r_charged_bucket, shown_r_after_a_charge_token_bucket);

async fn shown_r_after_a_charge_sliding_window<St: Store>(store: Arc<St>, _: ManualClock) {
    let policy = Policy::sliding_window(Quota::per_minute(10).unwrap()).unwrap();
    the_shown_r_after_a_charge_is_admitted(store, policy, true).await;
}
both_clocked_stores!(
    shown_r_charged_window,
    shown_r_after_a_charge_sliding_window
);

async fn cost_after_from_an_extension<St: Store>(store: Arc<St>, clock: ManualClock) {
    let policy = Policy::sliding_window(Quota::per_minute(10).unwrap()).unwrap();
    let layer = RateLimitLayer::new("gen", policy, store, PeerIp).cost_after(CostAfter::Extension);
    let addr = serve(generation_app(layer)).await;
    // 1 up front, 4 after: 6 of 10 left.
    assert_eq!(http_get(addr, "/gen", &[("x-want", "4")]).await.status, 200);
    wait_for_left(addr, "6 0").await;
    // 30 after: the count stops at twice the limit (20), so the key waits for the windows to decay.
    assert_eq!(
        http_get(addr, "/gen", &[("x-want", "30")]).await.status,
        200
    );
    // A request of 1 is admitted in the next window once 20 × (1 − e / 60 s) + 1 ≤ 10: e = 33 s into it.
    let into_window = clock.now().as_micros() / 1_000_000 % 60;
    wait_for_left(addr, &format!("0 {}", 60 + 33 - into_window)).await;
}
both_clocked_stores!(cost_after_extension, cost_after_from_an_extension);

/// Redis on its own clock: a charge after the response lands (as a task), and the next request waits it out.
#[tokio::test]
async fn cost_after_on_redis_time() {
    let store = support::redis_store().await;
    let policy = Policy::token_bucket(Quota::per_hour(10).unwrap());
    let layer = RateLimitLayer::new("gen", policy, store, PeerIp)
        .cost_after(CostAfter::Header("x-cost".into()));
    let addr = serve(generation_app(layer)).await;
    let sent = std::time::Instant::now();
    assert_eq!(
        http_get(addr, "/gen", &[("x-want", "12")]).await.status,
        200
    );
    // 2 owed and 1 for the next request: 3 tokens of one per 6 minutes, 1080 s less what passed.
    let mut left = String::new();
    for _ in 0..500 {
        left = http_get(addr, "/left", &[]).await.body;
        if left.starts_with("0 ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let retry: u64 = left
        .strip_prefix("0 ")
        .expect("the charge landed")
        .parse()
        .unwrap();
    // Whole seconds, rounded down by the page: below 1080 by at most what passed since the charge.
    assert!(
        retry <= 1080 && retry + sent.elapsed().as_secs() + 1 >= 1080,
        "{left}"
    );
    let denied = http_get(addr, "/gen", &[("x-want", "1")]).await;
    assert_eq!(denied.status, 429);
    let retry = denied.num("retry-after");
    assert!(
        retry <= 1080 && retry + sent.elapsed().as_secs() + 1 >= 1080,
        "{denied:#?}"
    );
}
