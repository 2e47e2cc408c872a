//! The concurrent-requests limiter's RateLimit fields over real TCP (axum, hyper client), in process and on the
//! shared Redis: every admission and every rejection states `q` (the most in flight) in the draft's quota unit
//! `qu="concurrent-requests"` and `r` (the slots left after the request), with no window (`w`, `t`); stacked
//! behind a rate limiter, both limits are listed, the outermost first.

mod support;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tollgate_core::slot::{MemorySlotStore, SlotStore};
use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_http::HttpLimitLayer;
use tollgate_http::key::HeaderKey;
use tollgate_testkit::redis::{cli_url, redis_url, unique_prefix};
use tollgate_tower::{ConcurrencyLimitLayer, KeyExtractor, RateLimitLayer, StackLayer};

use support::{Gate, Reply, app, get, redis_instance, serve};

const ANN: &[(&str, &str)] = &[("x-client", "ann")];

const POLICY: &str = r#""in-flight";q=3;qu="concurrent-requests""#;

fn client_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-client"))
}

fn layer<L: SlotStore>(limit: u64, store: Arc<L>) -> ConcurrencyLimitLayer<HeaderKey, L> {
    ConcurrencyLimitLayer::new("in-flight", limit, store, client_key()).unwrap()
}

/// The concurrency limiter's fields only: no window, and no GitHub-style fields (they describe a window's quota).
fn assert_fields(reply: &Reply, r: u64) {
    assert_eq!(reply.header("ratelimit-policy"), POLICY, "{reply:#?}");
    assert_eq!(
        reply.header("ratelimit"),
        format!(r#""in-flight";r={r}"#),
        "{reply:#?}"
    );
    for name in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(reply.headers.get(name).is_none(), "{name}: {reply:#?}");
    }
}

/// Admits ann's `/hold` requests one at a time, so that the `n`th one admitted is known.
async fn hold_one_by_one(
    addr: std::net::SocketAddr,
    gate: &Gate,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Reply>> {
    let mut held = Vec::new();
    for i in 0..n {
        held.push(tokio::spawn(async move { get(addr, "/hold", ANN).await }));
        gate.wait_entered(i + 1).await;
    }
    held
}

/// Waits until `in_flight` says no slot is held (a shared store's release is a spawned task).
async fn until_released(in_flight: &impl Fn() -> u64) {
    for _ in 0..500 {
        if in_flight() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a slot was never released");
}

async fn admissions_and_rejections_state_the_slots_left<L: SlotStore>(
    store: Arc<L>,
    in_flight: impl Fn() -> u64,
) {
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| {
        r.layer(HttpLimitLayer::new(layer(3, store)))
    }))
    .await;

    // Nothing in flight: this request leaves 2 of 3.
    let first = get(addr, "/fast", ANN).await;
    assert_eq!(first.status, 200, "{first:#?}");
    assert_fields(&first, 2);
    until_released(&in_flight).await;
    // Three held, admitted in turn: they leave 2, 1 and 0 (each says what was left when it was admitted).
    let held = hold_one_by_one(addr, &gate, 3).await;
    let refused = get(addr, "/fast", ANN).await;
    assert_eq!(refused.status, 429, "{refused:#?}");
    assert_fields(&refused, 0);
    assert_eq!(refused.header("retry-after"), "1");
    gate.release(3);
    for (held, r) in held.into_iter().zip([2, 1, 0]) {
        let reply = held.await.unwrap();
        assert_eq!(reply.status, 200, "{reply:#?}");
        assert_fields(&reply, r);
    }
}

/// The store key of ann's slots.
fn ann_key() -> String {
    let req = http::Request::builder()
        .header("x-client", "ann")
        .body(())
        .unwrap();
    let mut key = "in-flight:".to_owned();
    client_key().extract(&req, &mut key).unwrap();
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_admissions_and_rejections_state_the_slots_left() {
    let store = Arc::new(MemorySlotStore::new());
    let probe = store.clone();
    admissions_and_rejections_state_the_slots_left(store, move || probe.in_flight(&ann_key()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_admissions_and_rejections_state_the_slots_left() {
    let store = redis_instance(&unique_prefix("cc-fields")).await;
    let redis_key = store.slot_key(&ann_key());
    admissions_and_rejections_state_the_slots_left(store, move || {
        cli_url(&redis_url(), &["ZCARD", &redis_key])
            .parse()
            .unwrap()
    })
    .await;
}

/// Behind a rate limiter: both limits in both fields, the rate limiter (outermost) first; the GitHub-style fields
/// describe the rate limiter, the only quota with a window.
async fn stacked_behind_a_rate_limiter<S, L>(rates: Arc<S>, slots: Arc<L>)
where
    S: Store,
    L: SlotStore,
{
    let stack = StackLayer::new()
        .rate_limit(RateLimitLayer::new(
            "per-client",
            Policy::token_bucket(Quota::per_hour(10).unwrap()),
            rates,
            client_key(),
        ))
        .concurrency_limit(layer(1, slots));
    let gate = Gate::new();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(stack)))).await;
    let both_policies = r#""per-client";q=10;w=3600, "in-flight";q=1;qu="concurrent-requests""#;

    let held = tokio::spawn(async move { get(addr, "/hold", ANN).await });
    gate.wait_entered(1).await;
    // Counted by the rate limiter (8 left), refused by the concurrency limiter: both say so.
    let refused = get(addr, "/fast", ANN).await;
    assert_eq!(refused.status, 429, "{refused:#?}");
    assert!(refused.body.contains("concurrency_limited"), "{refused:#?}");
    assert_eq!(refused.header("ratelimit-policy"), both_policies);
    assert_eq!(
        refused.header("ratelimit"),
        r#""per-client";r=8;t=2880, "in-flight";r=0"#
    );
    assert_eq!(refused.header("x-ratelimit-resource"), "per-client");
    assert_eq!(refused.header("x-ratelimit-remaining"), "8");
    gate.release(1);
    let held = held.await.unwrap();
    assert_eq!(held.status, 200, "{held:#?}");
    assert_eq!(held.header("ratelimit-policy"), both_policies);
    assert_eq!(
        held.header("ratelimit"),
        r#""per-client";r=9;t=3240, "in-flight";r=0"#
    );
    assert_eq!(held.header("x-ratelimit-resource"), "per-client");
    assert_eq!(held.header("x-ratelimit-remaining"), "9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_stacked_behind_a_rate_limiter() {
    stacked_behind_a_rate_limiter(
        Arc::new(MemoryStore::new()),
        Arc::new(MemorySlotStore::new()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stacked_behind_a_rate_limiter() {
    let store = redis_instance(&unique_prefix("cc-fields-stack")).await;
    stacked_behind_a_rate_limiter(store.clone(), store).await;
}

/// A shadow limiter decides but shows nothing: its verdicts are not enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_concurrency_limiter_shows_no_fields() {
    let gate = Gate::new();
    let shadow = layer(1, Arc::new(MemorySlotStore::new())).shadow();
    let addr = serve(app(&gate, |r| r.layer(HttpLimitLayer::new(shadow)))).await;
    let held = tokio::spawn(async move { get(addr, "/hold", ANN).await });
    gate.wait_entered(1).await;
    let over = get(addr, "/fast", ANN).await;
    assert_eq!(over.status, 200, "shadow mode admits: {over:#?}");
    gate.release(1);
    for reply in [over, held.await.unwrap()] {
        assert!(reply.headers.get("ratelimit").is_none(), "{reply:#?}");
        assert!(
            reply.headers.get("ratelimit-policy").is_none(),
            "{reply:#?}"
        );
    }
}
