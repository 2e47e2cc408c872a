//! The in-process cost of each limiter of the stack per request, side by side with a bare service and with tower's
//! own (global, keyless) concurrency limit, in one run.
//!
//! `cargo bench -p tollgate-tower --features stack --bench stack_overhead`. Every service resolves at once in process, so requests
//! are driven without a runtime: the figures are the layers' own work (key extraction, lease, permit, body).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate_core::slot::{MemorySlotStore, block_on_ready};
use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_tower::{BoxError, Priority, RateLimitLayer};
use tollgate_tower::{ConcurrencyLimitLayer, FleetShedLayer, StackLayer, WorkerShedLayer};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

type Req = http::Request<()>;

fn handler() -> impl Service<Req, Response = http::Response<&'static str>, Error = BoxError> + Clone
{
    tower::service_fn(|_: Req| async { Ok::<_, BoxError>(http::Response::new("ok")) })
}

/// One request through `svc`, its response (and any permit in its body) dropped at once.
fn run<S: Service<Req>>(svc: &mut S)
where
    S::Error: std::fmt::Debug,
{
    let ready = block_on_ready(svc.ready()).unwrap();
    let response = block_on_ready(ready.call(http::Request::new(()))).unwrap();
    drop(black_box(response));
}

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("stack_overhead");
    let leases = Arc::new(MemorySlotStore::new());
    let rate = || {
        RateLimitLayer::new(
            "rate",
            Policy::token_bucket(Quota::per_second(1_000_000_000).unwrap()),
            Arc::new(MemoryStore::new()),
            "client",
        )
    };
    let concurrency =
        || ConcurrencyLimitLayer::new("in-flight", 1_000, leases.clone(), "client").unwrap();
    let worker = || WorkerShedLayer::new(1_000, Priority::Normal).unwrap();
    let fleet = || FleetShedLayer::new(1_000_000, leases.clone(), Priority::Normal).unwrap();

    let mut bare = handler();
    group.bench_function("bare", |b| b.iter(|| run(&mut bare)));
    let mut tower_limit = ServiceBuilder::new()
        .concurrency_limit(1_000)
        .service(handler());
    group.bench_function("tower_concurrency_limit", |b| {
        b.iter(|| run(&mut tower_limit))
    });
    let mut concurrency_only = ServiceBuilder::new()
        .layer(concurrency())
        .service(handler());
    group.bench_function("tollgate_concurrency_limit", |b| {
        b.iter(|| run(&mut concurrency_only))
    });
    let mut worker_only = ServiceBuilder::new().layer(worker()).service(handler());
    group.bench_function("tollgate_worker_shedder", |b| {
        b.iter(|| run(&mut worker_only))
    });
    let mut rate_only = ServiceBuilder::new().layer(rate()).service(handler());
    group.bench_function("tollgate_rate_limit", |b| b.iter(|| run(&mut rate_only)));
    let stack = StackLayer::new()
        .worker_shedder(worker())
        .rate_limit(rate())
        .concurrency_limit(concurrency())
        .fleet_shedder(fleet());
    let mut full = stack.layer(handler());
    group.bench_function("tollgate_full_stack", |b| b.iter(|| run(&mut full)));
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
