//! MemoryStore against governor's keyed rate limiter, in one run, on the same keys.
//!
//! `cargo bench --bench memory_store` — criterion prints time per check for each pair side by side; the ratio
//! is tollgate ÷ governor for the same group. Memory per key: `cargo bench --bench bytes_per_key`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota as GQuota, RateLimiter};
use tollgate_core::{MemoryStore, Policy, Quota};

const KEYS: usize = 1_000_000;

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("client-{i:07}")).collect()
}

const BURST: u32 = 1_000_000_000;

/// Quotas no benchmark exhausts, so every check takes the admitting path in both libraries, and slow enough
/// that no key decays back to "fresh" (and is dropped) during a run: both libraries keep every key.
fn policies() -> [(&'static str, Policy); 2] {
    let bucket = Quota::per_hour(1_000)
        .unwrap()
        .with_burst(BURST.into())
        .unwrap();
    let window = Quota::per_hour(BURST.into()).unwrap();
    [
        ("token_bucket", Policy::token_bucket(bucket)),
        ("sliding_window", Policy::sliding_window(window).unwrap()),
    ]
}

fn governor_keyed() -> governor::DefaultKeyedRateLimiter<String> {
    let quota = GQuota::per_hour(NonZeroU32::new(1_000).unwrap())
        .allow_burst(NonZeroU32::new(BURST).unwrap());
    RateLimiter::keyed(quota)
}

fn single_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("single_key");
    let key = "client-0000001".to_owned();
    for (name, policy) in policies() {
        let store = MemoryStore::new();
        group.bench_function(format!("tollgate_{name}"), |b| {
            b.iter(|| black_box(store.check_now(black_box(&key), &policy, 1).unwrap()));
        });
    }
    let governor = governor_keyed();
    group.bench_function("governor_gcra", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&key)).is_ok()))
    });
    group.finish();
}

fn distinct_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("1M_distinct_keys");
    let keys = keys(KEYS);
    for (name, policy) in policies() {
        let store = MemoryStore::builder().max_keys(2 * KEYS).build();
        let mut i = 0;
        group.bench_function(format!("tollgate_{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                black_box(store.check_now(&keys[i], &policy, 1).unwrap())
            });
        });
    }
    let governor = governor_keyed();
    let mut i = 0;
    group.bench_function("governor_gcra", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(governor.check_key(&keys[i]).is_ok())
        });
    });
    group.finish();
}

/// Two threads checking the same key: the cost of contention on one shard.
fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("2_threads_one_key");
    let key = "hot-key".to_owned();
    let run = |iters: u64, check: &(dyn Fn() + Sync)| -> Duration {
        let barrier = Barrier::new(2);
        std::thread::scope(|s| {
            let worker = || {
                barrier.wait();
                let start = Instant::now();
                for _ in 0..iters {
                    check();
                }
                start.elapsed()
            };
            let a = s.spawn(worker);
            let b = s.spawn(worker);
            // Time per check as each thread sees it while the other competes.
            (a.join().unwrap() + b.join().unwrap()) / 2
        })
    };
    for (name, policy) in policies() {
        let store = MemoryStore::new();
        group.bench_function(format!("tollgate_{name}"), |b| {
            b.iter_custom(|iters| {
                run(iters, &|| {
                    drop(black_box(store.check_now(&key, &policy, 1)))
                })
            });
        });
    }
    let governor = governor_keyed();
    group.bench_function("governor_gcra", |b| {
        b.iter_custom(|iters| run(iters, &|| drop(black_box(governor.check_key(&key)))));
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = single_key, distinct_keys, contended
}
criterion_main!(benches);
