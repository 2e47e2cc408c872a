//! `PAIRED=<rounds>`: every case against governor on one machine state, without criterion. A case is an access pattern
//! (one key, 1 M keys in random order, 1 M keys round robin, and two threads on one key and on the 1 M random keys),
//! an algorithm (token bucket, sliding window; governor has GCRA for both) and a path (admitting: quotas no run
//! exhausts; refusing: one token per hour, spent by the fill). Both stores are filled (every key once), then rounds of
//! `SLICE` checks per contender in turn, which one goes first alternating; each slice is timed. The keys first come in
//! name order (the fill), and the random walks come back in another. Printed per case: the median time per check of
//! each, the median of the rounds' ratios (tollgate ÷ governor) and their quartiles and range: on a loaded machine the
//! ratio of two adjacent slices moves far less than two runs seconds apart. `PAIRED_CASES=<substring>` runs only the
//! cases whose name contains it; `PAIRED_SHARDS=<n>` gives tollgate's store `n` shards (rounded up to a power of two,
//! as the builder does) instead of its default (16 × the available cores).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

use tollgate_core::{MemoryStore, Policy};

use super::{KEYS, governor_keyed, keys, policies, shuffled};

/// Checks per contender per round (per thread in the two-thread cases).
const SLICE: usize = 100_000;

#[derive(Clone, Copy, PartialEq)]
enum Pattern {
    OneKey,
    Random,
    RoundRobin,
    TwoThreadsOneKey,
    TwoThreadsRandom,
}

impl Pattern {
    const ALL: [Self; 5] = [
        Self::OneKey,
        Self::Random,
        Self::RoundRobin,
        Self::TwoThreadsOneKey,
        Self::TwoThreadsRandom,
    ];

    const fn name(self) -> &'static str {
        match self {
            Self::OneKey => "one key",
            Self::Random => "1M keys, random order",
            Self::RoundRobin => "1M keys, round robin",
            Self::TwoThreadsOneKey => "2 threads, one key",
            Self::TwoThreadsRandom => "2 threads, 1M random keys",
        }
    }

    const fn threads(self) -> usize {
        match self {
            Self::TwoThreadsOneKey | Self::TwoThreadsRandom => 2,
            _ => 1,
        }
    }

    /// The keys and the order a walk visits them in.
    fn walk(self) -> (Vec<String>, Vec<usize>) {
        match self {
            Self::OneKey | Self::TwoThreadsOneKey => (vec!["client-0000001".to_owned()], vec![0]),
            Self::Random | Self::TwoThreadsRandom => (keys(KEYS), shuffled(KEYS)),
            Self::RoundRobin => (keys(KEYS), (0..KEYS).collect()),
        }
    }
}

/// The two paths' policies, tollgate's and governor's alike: admitting (the bench's quotas, never exhausted) or
/// refusing (one per hour: the fill spends it, every timed check is refused).
fn contenders(
    algorithm: usize,
    refusing: bool,
) -> (Policy, governor::DefaultKeyedRateLimiter<String>) {
    if !refusing {
        return (policies()[algorithm].1, governor_keyed());
    }
    let (policies, governor) = super::refusing();
    (policies[algorithm], governor)
}

/// Time per check (ns) of `SLICE` checks on each of `threads` threads, the threads `order.len() / threads` apart
/// in the walk; `at` is where the walk resumes.
fn slice(
    threads: usize,
    at: &mut usize,
    keys: &[String],
    order: &[usize],
    check: &(dyn Fn(&String) + Sync),
) -> f64 {
    let from = *at;
    *at = (*at + SLICE) % order.len();
    if threads == 1 {
        let start = Instant::now();
        let mut i = from;
        for _ in 0..SLICE {
            i += 1;
            if i == order.len() {
                i = 0;
            }
            check(&keys[order[i]]);
        }
        return start.elapsed().as_secs_f64() * 1e9 / SLICE as f64;
    }
    let barrier = Barrier::new(threads);
    let total: f64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut i = (from + t * order.len() / threads) % order.len();
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..SLICE {
                        i += 1;
                        if i == order.len() {
                            i = 0;
                        }
                        check(&keys[order[i]]);
                    }
                    start.elapsed().as_secs_f64()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    // Time per check as each thread sees it while the other competes.
    total / threads as f64 * 1e9 / SLICE as f64
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

pub(super) fn run(rounds: usize) {
    let only = std::env::var("PAIRED_CASES").unwrap_or_default();
    let names: Vec<String> = Pattern::ALL
        .iter()
        .flat_map(|pattern| {
            ["token bucket", "sliding window"]
                .into_iter()
                .flat_map(move |algorithm| {
                    ["admitting", "refusing"]
                        .map(|path| format!("{}, {algorithm}, {path}", pattern.name()))
                })
        })
        .collect();
    if !names.iter().any(|name| name.contains(only.as_str())) {
        eprintln!(
            "memory_store: PAIRED_CASES=<substring> matches no case, not '{only}'; the cases:\n  {}",
            names.join("\n  ")
        );
        std::process::exit(2);
    }
    let shards = super::env_number("PAIRED_SHARDS", "shards");
    println!(
        "{rounds} rounds of {SLICE} checks per contender (per thread), alternating; time per check, median; \
         ratio tollgate ÷ governor: median [quartiles] (range); tollgate's shards: {}",
        shards.map_or_else(|| "the default".to_owned(), |n| format!("{n} asked"))
    );
    for pattern in Pattern::ALL {
        let (keys, order) = pattern.walk();
        for (algorithm, algorithm_name) in [(0, "token bucket"), (1, "sliding window")] {
            for refusing in [false, true] {
                let path = if refusing { "refusing" } else { "admitting" };
                let name = format!("{}, {algorithm_name}, {path}", pattern.name());
                if !name.contains(only.as_str()) {
                    continue;
                }
                let (policy, governor) = contenders(algorithm, refusing);
                let builder = MemoryStore::builder().max_keys(2 * KEYS);
                let store = match shards {
                    Some(n) => builder.shards(n),
                    None => builder,
                }
                .build();
                // Every key once, in name order: the order the walk comes back in is not the one the keys
                // first came in (for one key, or round robin, it is).
                for key in &keys {
                    drop(black_box(store.check_now(key, &policy, 1)));
                    drop(black_box(governor.check_key(key)));
                }
                let t = |k: &String| drop(black_box(store.check_now(k, &policy, 1)));
                let g = |k: &String| drop(black_box(governor.check_key(k)));
                let threads = pattern.threads();
                let (mut at_t, mut at_g) = (0, 0);
                let (mut ts, mut gs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
                for round in 0..rounds {
                    let (a, b) = if round % 2 == 0 {
                        let a = slice(threads, &mut at_t, &keys, &order, &t);
                        (a, slice(threads, &mut at_g, &keys, &order, &g))
                    } else {
                        let b = slice(threads, &mut at_g, &keys, &order, &g);
                        (slice(threads, &mut at_t, &keys, &order, &t), b)
                    };
                    ts.push(a);
                    gs.push(b);
                    ratios.push(a / b);
                }
                for v in [&mut ts, &mut gs, &mut ratios] {
                    v.sort_by(f64::total_cmp);
                }
                println!(
                    "{name:<48} tollgate {:6.1} ns  governor {:6.1} ns  ratio {:.3} [{:.3}–{:.3}] ({:.3}–{:.3})",
                    quantile(&ts, 0.5),
                    quantile(&gs, 0.5),
                    quantile(&ratios, 0.5),
                    quantile(&ratios, 0.25),
                    quantile(&ratios, 0.75),
                    ratios[0],
                    ratios[ratios.len() - 1],
                );
            }
        }
    }
}
