//! The generic layer on a toy request type: keys, costs, modes, failure policies, readiness.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{
    Decision, FailurePolicy, ManualClock, MemoryStore, Outcome, Policy, Quota, Store, StoreError,
    Timestamp,
};
use tollgate_tower::{
    BoxError, KeyError, Mode, RateLimitLayer, Rejection, RejectionKind, VerdictSink, Verdicts,
};
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

#[derive(Debug, Clone)]
struct Req {
    user: Option<&'static str>,
    items: u64,
}

fn req(user: &'static str) -> Req {
    Req {
        user: Some(user),
        items: 1,
    }
}

#[derive(Debug, Default)]
struct Reply(Verdicts);

impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.0
    }
}

type UserKey = fn(&Req, &mut String) -> Result<(), KeyError>;

fn by_user() -> UserKey {
    |req: &Req, key: &mut String| {
        key.push_str(req.user.ok_or_else(|| KeyError::missing("the user"))?);
        Ok(())
    }
}

const T0: u64 = 1_700_000_000_000_000;

fn manual_store() -> (ManualClock, Arc<MemoryStore<ManualClock>>) {
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    (
        clock.clone(),
        Arc::new(MemoryStore::builder().clock(clock).build()),
    )
}

fn echo() -> impl Service<Req, Response = Reply, Error = BoxError, Future: Send> + Clone {
    tower::service_fn(|_: Req| async { Ok::<_, BoxError>(Reply::default()) })
}

async fn call<S>(svc: &mut S, r: Req) -> Result<Reply, BoxError>
where
    S: Service<Req, Response = Reply, Error = BoxError>,
{
    svc.ready().await?.call(r).await
}

fn rejection(err: &BoxError) -> &Rejection {
    err.downcast_ref::<Rejection>()
        .unwrap_or_else(|| panic!("expected a Rejection, got {err}"))
}

#[tokio::test]
async fn admits_up_to_the_limit_then_rejects_with_the_decision() {
    let (_clock, store) = manual_store();
    let policy = Policy::token_bucket(Quota::per_second(3).unwrap());
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new("api", policy, store, by_user()))
        .service(echo());

    for remaining in [2, 1, 0] {
        let reply = call(&mut svc, req("ann")).await.unwrap();
        let verdict = reply.0.iter().next().unwrap();
        assert_eq!(
            (
                &*verdict.limiter,
                verdict.decision.remaining,
                verdict.enforced
            ),
            ("api", remaining, true)
        );
        assert_eq!(verdict.window, Duration::from_secs(1));
    }
    let err = call(&mut svc, req("ann")).await.unwrap_err();
    let rejection = rejection(&err);
    assert_eq!(rejection.kind(), RejectionKind::RateLimited);
    assert_eq!(rejection.limiter(), "api");
    let decision = rejection.decision().unwrap();
    assert_eq!(decision.outcome, Outcome::Limited);
    assert_eq!(
        rejection.retry_after(),
        Some(Duration::from_micros(333_334))
    );
    assert_eq!(rejection.retry_after_secs(), Some(1));
    // Another key has its own bucket.
    assert!(call(&mut svc, req("bob")).await.is_ok());
}

#[tokio::test]
async fn missing_key_is_a_configuration_error_not_a_global_bucket() {
    let (_clock, store) = manual_store();
    let policy = Policy::token_bucket(Quota::per_second(1).unwrap());
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new("api", policy, store.clone(), by_user()))
        .service(echo());
    for _ in 0..3 {
        let err = call(
            &mut svc,
            Req {
                user: None,
                items: 1,
            },
        )
        .await
        .unwrap_err();
        let key_err = err.downcast_ref::<KeyError>().expect("a KeyError");
        assert_eq!(key_err.what(), "the user");
    }
    assert!(
        store.is_empty(),
        "no bucket was created for requests without a key"
    );
}

#[tokio::test]
async fn cost_function_charges_per_item() {
    let (_clock, store) = manual_store();
    let policy = Policy::token_bucket(Quota::per_minute(10).unwrap());
    let layer = RateLimitLayer::new("batch", policy, store, by_user()).cost(|r: &Req| r.items);
    let mut svc = ServiceBuilder::new().layer(layer).service(echo());
    let reply = call(
        &mut svc,
        Req {
            user: Some("ann"),
            items: 7,
        },
    )
    .await
    .unwrap();
    assert_eq!(reply.0.iter().next().unwrap().decision.remaining, 3);
    let err = call(
        &mut svc,
        Req {
            user: Some("ann"),
            items: 4,
        },
    )
    .await
    .unwrap_err();
    assert_eq!(rejection(&err).decision().unwrap().remaining, 3);
    // A cost above the burst can never be admitted: no retry helps.
    let err = call(
        &mut svc,
        Req {
            user: Some("bob"),
            items: 11,
        },
    )
    .await
    .unwrap_err();
    assert_eq!(
        rejection(&err).decision().unwrap().outcome,
        Outcome::CostExceedsCapacity
    );
    assert_eq!(rejection(&err).retry_after_secs(), None);
}

#[tokio::test]
async fn shadow_mode_admits_and_counts_then_enforces_when_switched() {
    let (_clock, store) = manual_store();
    let policy = Policy::token_bucket(Quota::per_minute(2).unwrap());
    let layer = RateLimitLayer::new("dark", policy, store, by_user()).shadow();
    let switch = layer.enforcement();
    let mut svc = ServiceBuilder::new().layer(layer).service(echo());
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        let reply = call(&mut svc, req("ann")).await.unwrap();
        let verdict = reply.0.iter().next().unwrap();
        assert!(!verdict.enforced);
        outcomes.push(verdict.decision.outcome);
    }
    // Counted: the store's quota was spent exactly as if enforced.
    assert_eq!(
        outcomes,
        [
            Outcome::Allowed,
            Outcome::Allowed,
            Outcome::Limited,
            Outcome::Limited
        ]
    );
    switch.set(Mode::Enforce);
    let err = call(&mut svc, req("ann")).await.unwrap_err();
    assert_eq!(rejection(&err).kind(), RejectionKind::RateLimited);
}

#[tokio::test]
async fn kill_switch_skips_the_store() {
    let (_clock, store) = manual_store();
    let policy = Policy::token_bucket(Quota::per_minute(1).unwrap());
    let layer = RateLimitLayer::new("api", policy, store.clone(), by_user());
    let switch = layer.enforcement();
    let mut svc = ServiceBuilder::new().layer(layer).service(echo());
    call(&mut svc, req("ann")).await.unwrap();
    assert!(call(&mut svc, req("ann")).await.is_err());
    switch.set(Mode::Off);
    for _ in 0..3 {
        let reply = call(&mut svc, req("ann")).await.unwrap();
        assert!(reply.0.is_empty(), "no verdict while the limiter is off");
    }
    call(
        &mut svc,
        Req {
            user: None,
            items: 1,
        },
    )
    .await
    .expect("keys are not even extracted when off");
    switch.set(Mode::Enforce);
    assert!(
        call(&mut svc, req("ann")).await.is_err(),
        "the bucket was not refilled by the bypass"
    );
}

#[tokio::test]
async fn rejection_releases_the_inner_readiness() {
    let (_clock, store) = manual_store();
    let policy = Policy::token_bucket(Quota::per_minute(1).unwrap());
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new("api", policy, store, by_user()))
        .layer(ConcurrencyLimitLayer::new(1))
        .service(echo());
    let mut other = svc.clone();
    call(&mut svc, req("ann")).await.unwrap();
    // Ready (holding the single permit), then rejected: the permit must go back.
    assert!(call(&mut svc, req("ann")).await.is_err());
    let ready = tokio::time::timeout(Duration::from_secs(5), other.ready()).await;
    assert!(
        ready.is_ok(),
        "the rejected call kept the inner service's permit"
    );
    // A missing key releases it too.
    let mut third = svc.clone();
    assert!(
        other
            .call(Req {
                user: None,
                items: 1
            })
            .await
            .is_err()
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(5), third.ready())
            .await
            .is_ok()
    );
}

/// A store that answers only after yielding to the runtime, as a network store does.
struct Remote(MemoryStore<ManualClock>);

impl Store for Remote {
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let decision = self.0.check_now(key, policy, cost);
        async move {
            tokio::task::yield_now().await;
            decision
        }
    }
}

#[tokio::test]
async fn asynchronous_store_decides_in_the_response_future() {
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    let store = Arc::new(Remote(MemoryStore::builder().clock(clock).build()));
    let policy = Policy::sliding_window(Quota::per_minute(2).unwrap()).unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new("remote", policy, store, by_user()))
        .layer(ConcurrencyLimitLayer::new(1))
        .service(echo());
    let mut other = svc.clone();
    for remaining in [1, 0] {
        let reply = call(&mut svc, req("ann")).await.unwrap();
        assert_eq!(reply.0.iter().next().unwrap().decision.remaining, remaining);
    }
    assert!(call(&mut svc, req("ann")).await.is_err());
    assert!(
        tokio::time::timeout(Duration::from_secs(5), other.ready())
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn store_failure_follows_the_failure_policy() {
    // A real store failure: a MemoryStore that can track one key, configured to refuse a second one.
    let policy = Policy::token_bucket(Quota::per_minute(1).unwrap());
    let full_store = || {
        let store = Arc::new(
            MemoryStore::builder()
                .max_keys(1)
                .shards(1)
                .on_full(tollgate_core::OnFull::Refuse)
                .build(),
        );
        store.check_now("api:someone-else", &policy, 1).unwrap();
        store
    };

    let mut open = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new("api", policy, full_store(), by_user())
                .on_store_error(FailurePolicy::Open),
        )
        .service(echo());
    for _ in 0..3 {
        let reply = call(&mut open, req("ann")).await.unwrap();
        assert!(
            reply.0.is_empty(),
            "a failed-open admission carries no invented numbers"
        );
    }

    let mut closed = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new("api", policy, full_store(), by_user())
                .on_store_error(FailurePolicy::Closed),
        )
        .service(echo());
    let err = call(&mut closed, req("ann")).await.unwrap_err();
    assert_eq!(rejection(&err).kind(), RejectionKind::StoreUnavailable);
    assert_eq!(rejection(&err).retry_after(), Some(Duration::from_secs(60)));

    let mut local = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new("api", policy, full_store(), by_user())
                .on_store_error(FailurePolicy::Local),
        )
        .service(echo());
    let reply = call(&mut local, req("ann")).await.unwrap();
    assert_eq!(reply.0.iter().next().unwrap().decision.remaining, 0);
    let err = call(&mut local, req("ann")).await.unwrap_err();
    assert_eq!(
        rejection(&err).kind(),
        RejectionKind::RateLimited,
        "the local fallback enforces the policy"
    );
}

#[tokio::test]
async fn stacked_layers_each_add_their_verdict() {
    let (_clock, store) = manual_store();
    let per_user = RateLimitLayer::new(
        "per-user",
        Policy::token_bucket(Quota::per_minute(5).unwrap()),
        store.clone(),
        by_user(),
    );
    let global = RateLimitLayer::new(
        "global",
        Policy::token_bucket(Quota::per_minute(2).unwrap()),
        store,
        "all",
    );
    let mut svc = ServiceBuilder::new()
        .layer(per_user)
        .layer(global)
        .service(echo());
    let reply = call(&mut svc, req("ann")).await.unwrap();
    let names: Vec<_> = reply
        .0
        .iter()
        .map(|v| (&*v.limiter, v.decision.remaining))
        .collect();
    assert_eq!(names, [("global", 1), ("per-user", 4)]);
    assert_eq!(&*reply.0.binding().unwrap().limiter, "global");
    call(&mut svc, req("bob")).await.unwrap();
    let err = call(&mut svc, req("cid")).await.unwrap_err();
    assert_eq!(rejection(&err).limiter(), "global");
}

/// An inner service whose readiness fails once, then answers.
#[derive(Clone)]
struct FailsReadinessOnce(bool);

impl Service<Req> for FailsReadinessOnce {
    type Response = Reply;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Reply, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        if std::mem::replace(&mut self.0, false) {
            return std::task::Poll::Ready(Err("warming up".into()));
        }
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        std::future::ready(Ok(Reply::default()))
    }
}

#[tokio::test]
async fn a_readiness_error_is_reported_by_the_next_call_without_spending_quota() {
    let (_clock, store) = manual_store();
    let policy = Policy::token_bucket(Quota::per_second(1).unwrap());
    let mut svc =
        RateLimitLayer::new("api", policy, store, by_user()).layer(FailsReadinessOnce(true));
    let err = call(&mut svc, req("ann")).await.unwrap_err();
    assert_eq!(err.to_string(), "warming up");
    // The failed call was not decided: the one token per second is still there.
    let reply = call(&mut svc, req("ann")).await.expect("ready again");
    assert_eq!(reply.0.iter().next().unwrap().decision.remaining, 0);
}

#[tokio::test]
async fn a_finished_future_polled_again_answers_an_error() {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    let (_clock, store) = manual_store();
    let policy = Policy::token_bucket(Quota::per_second(1).unwrap());
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new("api", policy, store, by_user()))
        .service(echo());
    let mut cx = Context::from_waker(Waker::noop());
    // Admitted, then rejected: each future answers once, and again only with an error.
    for admitted in [true, false] {
        let mut fut = pin!(svc.ready().await.unwrap().call(req("ann")));
        let Poll::Ready(first) = fut.as_mut().poll(&mut cx) else {
            panic!("the in-process store and the echo service answer at once");
        };
        assert_eq!(first.is_ok(), admitted);
        let Poll::Ready(Err(again)) = fut.as_mut().poll(&mut cx) else {
            panic!("a second poll must answer an error");
        };
        assert!(
            again.to_string().contains("polled after completion"),
            "{again}"
        );
    }
}

#[tokio::test]
async fn limiters_sharing_an_in_process_store_never_share_a_bucket() {
    // As text, "a" + ":" + "b:c" and "a:b" + ":" + "c" are one string; by digest the name is length-prefixed.
    let (_clock, store) = manual_store();
    let one = Policy::token_bucket(Quota::per_minute(1).unwrap());
    let mut first = ServiceBuilder::new()
        .layer(RateLimitLayer::new("a", one, store.clone(), by_user()))
        .service(echo());
    let mut second = ServiceBuilder::new()
        .layer(RateLimitLayer::new("a:b", one, store.clone(), by_user()))
        .service(echo());
    call(&mut first, req("b:c")).await.unwrap();
    call(&mut second, req("c")).await.unwrap();
    assert_eq!(store.len(), 2);
    assert!(call(&mut first, req("b:c")).await.is_err());
    assert!(call(&mut second, req("c")).await.is_err());
}

/// The in-process store without its digest path: the limiter must build the key's text, as for Redis.
struct TextOnly(MemoryStore<ManualClock>);

impl Store for TextOnly {
    fn check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(self.0.check_now(key, policy, cost))
    }

    fn check_immediate(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        Some(self.0.check_now(key, policy, cost))
    }
}

#[tokio::test]
async fn the_digest_and_text_key_paths_decide_alike() {
    for policy in [
        Policy::token_bucket(Quota::per_second(5).unwrap().with_burst(8).unwrap()),
        Policy::sliding_window(Quota::per_second(5).unwrap()).unwrap(),
    ] {
        let clock = ManualClock::new(Timestamp::from_micros(T0));
        let digest_store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
        let text_store = Arc::new(TextOnly(
            MemoryStore::builder().clock(clock.clone()).build(),
        ));
        let cost = || |r: &Req| r.items;
        let mut by_digest = ServiceBuilder::new()
            .layer(RateLimitLayer::new("api", policy, digest_store.clone(), by_user()).cost(cost()))
            .service(echo());
        let mut by_text = ServiceBuilder::new()
            .layer(RateLimitLayer::new("api", policy, text_store.clone(), by_user()).cost(cost()))
            .service(echo());
        let users = [
            "ann", "bob", "ann", "cid", "ann", "ann", "bob", "ann", "ann", "cid",
        ];
        let (mut admitted, mut rejected) = (0, 0);
        for step in 0..200_u64 {
            let r = Req {
                user: Some(users[(step % 10) as usize]),
                items: step % 3,
            };
            let outcome = |result: Result<Reply, BoxError>| match result {
                Ok(reply) => Ok(reply.0.iter().next().map(|v| v.decision)),
                Err(err) => Err(rejection(&err).verdict().map(|v| v.decision)),
            };
            let digest = outcome(call(&mut by_digest, r.clone()).await);
            let text = outcome(call(&mut by_text, r).await);
            assert_eq!(digest, text, "step {step}");
            match digest {
                Ok(_) => admitted += 1,
                Err(_) => rejected += 1,
            }
            clock.advance(Duration::from_millis(37 * (step % 4)));
        }
        assert!(
            admitted > 0 && rejected > 0,
            "{admitted} admitted, {rejected} rejected"
        );
        // One bucket per user on either path.
        assert_eq!(digest_store.len(), 3);
        assert_eq!(text_store.0.len(), 3);
    }
}

/// A request through a limiter can run in a spawned task: its response future is `Send` (the inner service's
/// error bound, `Into<BoxError>`, is not asked again for every lifetime inside the task), for a lone limiter and a
/// set alike.
#[tokio::test]
async fn a_request_runs_in_a_spawned_task() {
    use tollgate_tower::limit::rate::RateLimitSetLayer;
    let policy = Policy::token_bucket(Quota::per_second(1).unwrap());
    let layer = RateLimitLayer::new("spawned", policy, Arc::new(MemoryStore::new()), by_user());
    let set = RateLimitSetLayer::new([(layer.clone(), true)]);
    let one = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Req| async { Ok::<_, BoxError>(Reply::default()) });
    let many = ServiceBuilder::new()
        .layer(set)
        .service_fn(|_: Req| async { Ok::<_, BoxError>(Reply::default()) });
    let spawned = tokio::spawn(async move {
        let (mut one, mut many) = (one, many);
        let first = one.ready().await?.call(req("ann")).await.map(|_| ());
        let second = many.ready().await?.call(req("ann")).await.map(|_| ());
        Ok::<_, BoxError>((first, second))
    });
    let (first, second) = spawned.await.unwrap().unwrap();
    assert!(first.is_ok());
    // The set's entry shares the lone limiter's state: the second request finds the bucket empty.
    assert!(second.is_err());
}
