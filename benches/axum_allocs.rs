//! Heap allocations per request, in-process, for the routers `axum_overhead` times: a count that does not depend
//! on how busy the machine is.
//!
//! `cargo bench --bench axum_allocs` — every variant is warmed up (its bucket created), then 100 000 requests are
//! counted by an instrumented global allocator. Building each request (`Request::new`, its `ConnectInfo`) counts
//! the same for every variant; compare the "added" column.

use std::alloc::System;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[path = "support/axum_variants.rs"]
mod axum_variants;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CALLS: usize = 100_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let variants = axum_variants::variants();
    let mut per_request = Vec::new();
    for v in &variants {
        let mut router = (v.router)().with_state(());
        let (allocations, bytes) = runtime.block_on(async {
            for _ in 0..1_000 {
                axum_variants::call(&mut router).await;
            }
            let region = Region::new(GLOBAL);
            for _ in 0..CALLS {
                axum_variants::call(&mut router).await;
            }
            let change = region.change();
            (
                (change.allocations + change.reallocations) as f64 / CALLS as f64,
                change.bytes_allocated as f64 / CALLS as f64,
            )
        });
        per_request.push((allocations, bytes));
    }
    println!(
        "heap allocations per in-process request (axum hello world, {CALLS} requests per variant)"
    );
    println!(
        "{:<26} {:>12} {:>8} {:>8} {:>12}  peer",
        "variant", "allocations", "added", "vs peer", "bytes"
    );
    for (i, v) in variants.iter().enumerate() {
        let (allocations, bytes) = per_request[i];
        println!(
            "{:<26} {allocations:>12.2} {:>+8.2} {:>+8.2} {bytes:>12.0}  {}",
            v.name,
            allocations - per_request[0].0,
            allocations - per_request[v.peer].0,
            variants[v.peer].name
        );
    }
}
