//! Per-key overrides and exemptions on the rate limiter built in code, on both stores: the in-process store's
//! digest path and Redis's key-text path (with its deny cache), through `RateLimit` itself.

mod support;

use std::sync::Arc;

use tollgate_core::{MemoryStore, Policy, Quota, Store};
use tollgate_http::key::HeaderKey;
use tollgate_tower::limit::rate::Overrides;
use tollgate_tower::{BoxError, RateLimitLayer, Rejection, VerdictSink};
use tower::{Service, ServiceBuilder, ServiceExt};

fn hourly(n: u64) -> Policy {
    Policy::token_bucket(Quota::per_hour(n).unwrap())
}

async fn plans<St: Store>(store: Arc<St>) {
    let layer = RateLimitLayer::new(
        "plans",
        hourly(2),
        store,
        HeaderKey::parse("x-api-key").unwrap(),
    )
    .overrides(Overrides::new().key("gold", hourly(4)).exempt("internal"));
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: http::Request<()>| async { Ok::<_, BoxError>(http::Response::new(())) });
    // Each key's outcomes: the limit its verdicts announce, or `None` for an admission without one.
    let mut run = async |key: &str, n: usize| {
        let mut limits = Vec::new();
        for _ in 0..n {
            let req = http::Request::builder()
                .header("x-api-key", key)
                .body(())
                .unwrap();
            match svc.ready().await.unwrap().call(req).await {
                Ok(mut response) => {
                    limits.push(Ok(response
                        .verdicts_mut()
                        .iter()
                        .next()
                        .map(|v| v.decision.limit)));
                }
                Err(err) => {
                    let rejection = err.downcast_ref::<Rejection>().expect("a rejection");
                    assert_eq!(rejection.limiter(), "plans");
                    limits.push(Err(rejection.decision().map(|d| d.limit)));
                }
            }
        }
        limits
    };
    assert_eq!(
        run("ann", 3).await,
        [Ok(Some(2)), Ok(Some(2)), Err(Some(2))]
    );
    assert_eq!(
        run("gold", 5).await,
        [
            Ok(Some(4)),
            Ok(Some(4)),
            Ok(Some(4)),
            Ok(Some(4)),
            Err(Some(4))
        ],
        "gold's own policy, in a bucket of its own"
    );
    assert_eq!(
        run("internal", 6).await,
        [Ok(None); 6],
        "exempt: never limited, no verdict"
    );
    // And again after the deny cache (Redis) has seen the denials.
    assert_eq!(run("ann", 1).await, [Err(Some(2))]);
    assert_eq!(run("gold", 1).await, [Err(Some(4))]);
}

#[tokio::test]
async fn overrides_and_exemptions_in_process() {
    plans(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn overrides_and_exemptions_on_redis() {
    let namespace = tollgate_testkit::redis::unique_prefix("overrides");
    plans(support::redis_instance(&namespace).await).await;
}
