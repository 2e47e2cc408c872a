//! A rejected request must not keep the readiness the inner service granted it: with a `tower` concurrency limit
//! of 1 inside, a clone of the service whose request was rejected would otherwise hold the only slot forever.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::slot::MemorySlotStore;
use tollgate_tower::{BoxError, Priority, Rejection, RejectionKind};
use tollgate_tower::{ConcurrencyLimitLayer, WorkerShedLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

type Req = http::Request<&'static str>;

fn inner() -> impl Service<Req, Response = http::Response<&'static str>, Error = BoxError> + Clone {
    ServiceBuilder::new()
        .concurrency_limit(1)
        .service_fn(|_: Req| async { Ok::<_, BoxError>(http::Response::new("ok")) })
}

async fn ready_soon<S: Service<Req>>(svc: &mut S) -> &mut S
where
    S::Error: std::fmt::Debug,
{
    tokio::time::timeout(Duration::from_secs(10), svc.ready())
        .await
        .expect("the inner service's slot was released")
        .unwrap()
}

#[tokio::test]
async fn a_concurrency_rejection_releases_the_inner_readiness() -> Result<(), BoxError> {
    let by_body = |req: &Req, key: &mut String| {
        key.push_str(req.body());
        Ok(())
    };
    let layer =
        ConcurrencyLimitLayer::new("in-flight", 1, Arc::new(MemorySlotStore::new()), by_body)?;
    let mut a = ServiceBuilder::new().layer(layer).service(inner());
    let mut b = a.clone();

    let held = ready_soon(&mut a)
        .await
        .call(http::Request::new("ann"))
        .await?;
    let err = ready_soon(&mut b)
        .await
        .call(http::Request::new("ann"))
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<Rejection>().unwrap().kind(),
        RejectionKind::ConcurrencyLimited
    );
    // b's slot in the inner limit went back with the rejection: a can be ready again.
    ready_soon(&mut a).await;
    drop(held);
    Ok(())
}

#[tokio::test]
async fn a_shed_request_releases_the_inner_readiness() -> Result<(), BoxError> {
    // Capacity 2: Low's line (60 %) is 1 in flight, so the held request fills it and the next one is shed.
    let shedder = WorkerShedLayer::new(2, Priority::Low)?
        .interval(Duration::from_millis(1))
        .step_percent(100)?;
    let mut a = ServiceBuilder::new().layer(shedder).service(inner());
    let mut b = a.clone();

    let held = ready_soon(&mut a)
        .await
        .call(http::Request::new("x"))
        .await?;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let err = ready_soon(&mut b)
        .await
        .call(http::Request::new("x"))
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<Rejection>().unwrap().kind(),
        RejectionKind::Shed
    );
    ready_soon(&mut a).await;
    drop(held);
    Ok(())
}
