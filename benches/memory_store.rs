//! MemoryStore against governor's keyed rate limiter, in one run, on the same keys.
//!
//! `cargo bench --bench memory_store` — criterion prints time per check for each pair side by side; the ratio
//! is tollgate ÷ governor for the same group. Memory per key: `cargo bench --bench bytes_per_key`.
//!
//! `PAIRED=<rounds>` runs every case against governor in alternating slices, without criterion (see [`paired`]).
//! `COUNT=<group>/<contender> N=<checks>` runs one contender without criterion, for valgrind (see `count`); there a
//! contender `tollgate_<algorithm>_lockout` is that policy with a lockout, and `<contender>_refusing` refuses every
//! counted check.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use governor::{Quota as GQuota, RateLimiter};
use tollgate_core::{MemoryStore, Policy, Quota};

#[path = "memory_store/paired.rs"]
mod paired;

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

/// The refusing path's policies, tollgate's (`[token bucket, sliding window]`) and governor's: one request an hour,
/// which a setup spends, so that every timed or counted check is refused.
fn refusing() -> ([Policy; 2], governor::DefaultKeyedRateLimiter<String>) {
    let one = Quota::per_hour(1).unwrap();
    let policies = [
        Policy::token_bucket(one),
        Policy::sliding_window(one).unwrap(),
    ];
    (
        policies,
        RateLimiter::keyed(GQuota::per_hour(NonZeroU32::new(1).unwrap())),
    )
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

/// The 1 M keys again, each visited once per pass in a random order (fixed seed): clients do not come back in
/// the order they first came (in name order, before the timing), so a structure whose hits touch memory in
/// insertion order (a slab, the keys a map copies when it inserts) gets no help from the prefetcher here.
fn random_order(c: &mut Criterion) {
    let mut group = c.benchmark_group("1M_keys_random_order");
    let keys = keys(KEYS);
    let order = shuffled(KEYS);
    let (_, policy) = policies().into_iter().next().unwrap();
    let store = MemoryStore::builder().max_keys(2 * KEYS).build();
    let governor = governor_keyed();
    for k in &keys {
        drop(black_box(store.check_now(k, &policy, 1)));
        drop(black_box(governor.check_key(k)));
    }
    let mut i = 0;
    group.bench_function("tollgate_token_bucket", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(store.check_now(&keys[order[i]], &policy, 1).unwrap())
        });
    });
    let mut i = 0;
    group.bench_function("governor_gcra", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(governor.check_key(&keys[order[i]]).is_ok())
        });
    });
    group.finish();
}

/// 0..n in a random order (xorshift, fixed seed: the same order in every run).
fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// The bound of the flood group's stores: small enough that a flood fills it at once.
const FLOOD_BOUND: usize = 1 << 16;

/// A new-key flood at the bound: keys cycle over four times the bound, so (for LRU or CLOCK) every check is for a
/// key the store does not hold, at a full table — each one an eviction, or a refusal for a refusing store.
/// governor has no bound: it keeps all of them, so every check after the first pass is a hit for it (the
/// competitor's cost with unbounded memory).
fn new_key_flood(c: &mut Criterion) {
    let mut group = c.benchmark_group("new_key_flood_at_bound");
    let keys = keys(4 * FLOOD_BOUND);
    for (name, policy) in policies() {
        let store = MemoryStore::builder().max_keys(FLOOD_BOUND).build();
        let mut i = 0;
        group.bench_function(format!("tollgate_{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                drop(black_box(store.check_now(&keys[i], &policy, 1)))
            });
        });
    }
    let governor = governor_keyed();
    let mut i = 0;
    group.bench_function("governor_gcra", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
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

/// `COUNT=<group>/<contender> N=<checks>`: no criterion, only the group's setup and then N checks, for counting
/// instructions and simulated cache misses with valgrind (deterministic on a loaded machine, unlike time): the
/// difference between two counts, N = 2 M and N = 1 M, is what 1 M checks cost after the setup.
fn count(what: &str, n: usize) {
    const GROUPS: [&str; 4] = [
        "single_key",
        "1M_distinct_keys",
        "1M_keys_random_order",
        "new_key_flood_at_bound",
    ];
    let known = |c: &str| {
        let base = c
            .strip_suffix("_lockout")
            .or_else(|| c.strip_suffix("_refusing"))
            .unwrap_or(c);
        [
            "tollgate_token_bucket",
            "tollgate_sliding_window",
            "governor_gcra",
        ]
        .contains(&base)
            && !(base == "governor_gcra" && c.ends_with("_lockout"))
    };
    let Some((group, contender)) = what
        .split_once('/')
        .filter(|(g, c)| GROUPS.contains(g) && known(c))
    else {
        eprintln!(
            "memory_store: COUNT=<group>/<contender>: a group of {GROUPS:?} and a contender \
             tollgate_token_bucket, tollgate_sliding_window (either with _lockout or _refusing), governor_gcra \
             or governor_gcra_refusing, not '{what}'"
        );
        std::process::exit(2);
    };
    let [(_, bucket), (_, window)] = policies();
    let policy = if contender.contains("sliding_window") {
        window
    } else {
        bucket
    };
    // Under valgrind a pass over 1 M keys takes longer than the bench quota's 3.6 s per token, so its keys would
    // decay and be swept and inserted again between passes (a path a real-time run does not take): off the single
    // key, the token bucket refills a token per hour instead, the same arithmetic on the same path.
    let policy = if group != "single_key" && !contender.contains("sliding_window") {
        Policy::token_bucket(Quota::per_hour(1).unwrap().with_burst(1_000_000).unwrap())
    } else {
        policy
    };
    // `tollgate_<algorithm>_lockout`: the same policy with a lockout, which these quotas never start: what a
    // lockout policy's check pays for its lockout (the read of the shard's lockout table, the wrapper's branches).
    let policy = if contender.ends_with("_lockout") {
        policy.with_lockout(Duration::from_secs(60)).unwrap()
    } else {
        policy
    };
    // `…_refusing` (tollgate's and governor's): one request an hour, spent by the setup, so that every counted
    // check is refused, as on the paired mode's refusing path.
    let ([one_bucket, one_window], governor_refusing) = refusing();
    let policy = match (
        contender.ends_with("_refusing"),
        contender.contains("sliding_window"),
    ) {
        (false, _) => policy,
        (true, false) => one_bucket,
        (true, true) => one_window,
    };
    let (keys, bound) = match group {
        "single_key" => (
            vec!["client-0000001".to_owned()],
            tollgate_core::DEFAULT_MAX_KEYS,
        ),
        "1M_distinct_keys" | "1M_keys_random_order" => (keys(KEYS), 2 * KEYS),
        "new_key_flood_at_bound" => (keys(4 * FLOOD_BOUND), FLOOD_BOUND),
        _ => unreachable!("the group was checked above"),
    };
    let check: Box<dyn Fn(&String)> = match contender {
        "governor_gcra_refusing" => {
            Box::new(move |k| drop(black_box(governor_refusing.check_key(k))))
        }
        "governor_gcra" => {
            let governor = governor_keyed();
            Box::new(move |k| drop(black_box(governor.check_key(k))))
        }
        _ => {
            let store = MemoryStore::builder().max_keys(bound).build();
            Box::new(move |k| drop(black_box(store.check_now(k, &policy, 1))))
        }
    };
    // The random order indexes the keys as `random_order` does (the strings where they were allocated, in
    // order), so a check there also misses on its key as it does under criterion; the keys first come in name order.
    if group == "1M_keys_random_order" {
        let order = shuffled(KEYS);
        for k in &keys {
            check(k);
        }
        for i in 0..n {
            check(&keys[order[i % KEYS]]);
        }
        return;
    }
    // The setup: every key once (the table full, for the flood), as criterion's warm-up does.
    for k in &keys {
        check(k);
    }
    for i in 0..n {
        check(&keys[i % keys.len()]);
    }
}

/// Two threads on the 1 M keys in random order (one walk of `random_order`, the threads half of it apart): the
/// cost of a miss-bound check when two cores share the shards.
fn contended_random(c: &mut Criterion) {
    let mut group = c.benchmark_group("2_threads_1M_keys_random_order");
    let keys = keys(KEYS);
    let order = shuffled(KEYS);
    let run = |iters: u64, check: &(dyn Fn(&String) + Sync)| -> Duration {
        let barrier = Barrier::new(2);
        let (keys, order) = (&keys, &order);
        std::thread::scope(|s| {
            let worker = |from: usize| {
                let barrier = &barrier;
                move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut i = from;
                    for _ in 0..iters {
                        i = (i + 1) % KEYS;
                        check(&keys[order[i]]);
                    }
                    start.elapsed()
                }
            };
            let a = s.spawn(worker(0));
            let b = s.spawn(worker(KEYS / 2));
            (a.join().unwrap() + b.join().unwrap()) / 2
        })
    };
    let (_, policy) = policies().into_iter().next().unwrap();
    let store = MemoryStore::builder().max_keys(2 * KEYS).build();
    let governor = governor_keyed();
    // The keys first come in name order, as in `random_order`.
    for k in &keys {
        drop(black_box(store.check_now(k, &policy, 1)));
        drop(black_box(governor.check_key(k)));
    }
    group.bench_function("tollgate_token_bucket", |b| {
        b.iter_custom(|iters| run(iters, &|k| drop(black_box(store.check_now(k, &policy, 1)))));
    });
    group.bench_function("governor_gcra", |b| {
        b.iter_custom(|iters| run(iters, &|k| drop(black_box(governor.check_key(k)))));
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = single_key, distinct_keys, random_order, new_key_flood, contended, contended_random
}

/// The whole number the environment variable `name` holds, if it is set; a value that is not one ends the run
/// with `name=<what>` and exit status 2.
fn env_number(name: &str, what: &str) -> Option<usize> {
    let value = std::env::var(name).ok()?;
    match value.parse() {
        Ok(n) => Some(n),
        Err(_) => {
            eprintln!("memory_store: {name}=<{what}> takes a whole number, not '{value}'");
            std::process::exit(2);
        }
    }
}

fn main() {
    if let Some(rounds) = env_number("PAIRED", "rounds") {
        if rounds == 0 {
            eprintln!("memory_store: PAIRED=<rounds> takes at least 1 round");
            std::process::exit(2);
        }
        return paired::run(rounds);
    }
    if let Ok(what) = std::env::var("COUNT") {
        let Some(n) = env_number("N", "checks") else {
            eprintln!("memory_store: COUNT=<group>/<contender> needs N=<checks>");
            std::process::exit(2);
        };
        return count(&what, n);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
