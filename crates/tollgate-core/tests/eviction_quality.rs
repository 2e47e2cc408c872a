//! How the store's eviction (CLOCK with decayed entries first) does against exact LRU, on traces of a hot set of
//! active clients in a flood of one-time keys: the hit ratio of the active clients (the share of their requests,
//! past each one's first, that find their own state) and the chance an eviction takes an active client (the share
//! of evictions that did: each of an active client's misses is one). The store is measured itself (one shard, a
//! manual clock that never moves, so nothing decays: every eviction is of a live key, the case that matters);
//! exact LRU is a model. Deterministic (a fixed-seed generator). `cargo test -p tollgate-core --all-features
//! --release --test eviction_quality -- --nocapture` prints the table in `docs/design/eviction.md`.

use std::collections::{BTreeMap, HashMap, HashSet};

use tollgate_core::{ManualClock, MemoryStore, Policy, Quota, Timestamp};

/// The shard's bound.
const SLOTS: usize = 1_000;
const WARM_UP: usize = 20_000;
const STEPS: usize = 200_000;
const BURST: u64 = 1_000_000;

/// splitmix64: a fixed seed, the same trace on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Exact LRU of `SLOTS` keys: each access says whether the key was held, and which key it evicted.
#[derive(Default)]
struct ExactLru {
    clock: u64,
    stamps: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl ExactLru {
    fn access(&mut self, key: u64) -> (bool, Option<u64>) {
        self.clock += 1;
        if let Some(stamp) = self.stamps.insert(key, self.clock) {
            self.order.remove(&stamp);
            self.order.insert(self.clock, key);
            return (true, None);
        }
        self.order.insert(self.clock, key);
        if self.stamps.len() > SLOTS {
            let (_, victim) = self.order.pop_first().expect("full");
            self.stamps.remove(&victim);
            return (false, Some(victim));
        }
        (false, None)
    }
}

/// A trace: each request is a new one-time key with probability `flood`, else one of `hot` active clients,
/// chosen uniformly at random or, `periodic`, in turn (a client that polls: the same number of requests between
/// its own, the flood's keys falling at random among them).
#[derive(Clone, Copy, Debug)]
struct Trace {
    hot: u64,
    flood: f64,
    periodic: bool,
}

/// What the active clients got, over the measured steps.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Quality {
    /// The share of their requests (past each client's first) that found their own state.
    hit_ratio: f64,
    /// The share of all evictions that took an active client (each of its misses is one).
    of_evictions: f64,
}

fn requests(trace: Trace) -> impl Iterator<Item = (bool, u64)> {
    let mut rng = Rng(0x5eed);
    let mut next_new = 1u64 << 32;
    let mut turn = 0;
    (0..WARM_UP + STEPS).map(move |_| {
        if (rng.below(1 << 20) as f64) < trace.flood * f64::from(1 << 20) {
            next_new += 1;
            (false, next_new)
        } else if trace.periodic {
            turn += 1;
            (true, turn % trace.hot)
        } else {
            (true, rng.below(trace.hot))
        }
    })
}

/// Runs the trace on `held` (whether the key was held, and the evictions so far).
fn measure(mut held: impl FnMut(u64) -> (bool, u64), trace: Trace) -> Quality {
    let (mut hits, mut asked) = (0u64, 0u64);
    let mut seen = HashSet::new();
    let mut evictions_at_warm_up = 0;
    let mut evictions = 0;
    for (i, (hot, key)) in requests(trace).enumerate() {
        let hit;
        (hit, evictions) = held(key);
        if i + 1 == WARM_UP {
            evictions_at_warm_up = evictions;
        }
        if hot && !seen.insert(key) && i >= WARM_UP {
            asked += 1;
            hits += u64::from(hit);
        }
    }
    Quality {
        hit_ratio: hits as f64 / asked as f64,
        of_evictions: (asked - hits) as f64 / (evictions - evictions_at_warm_up) as f64,
    }
}

fn store_quality(trace: Trace) -> Quality {
    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = MemoryStore::builder()
        .clock(clock)
        .max_keys(SLOTS)
        .shards(1)
        .build();
    let policy = Policy::token_bucket(Quota::per_hour(1).unwrap().with_burst(BURST).unwrap());
    measure(
        |key| {
            let d = store.check_now(&key.to_string(), &policy, 1).unwrap();
            assert!(
                store.len() <= SLOTS,
                "a flood grew the store past its bound"
            );
            let e = store.evictions();
            assert_eq!(e.decayed, 0);
            // A fresh bucket has spent only this request's token.
            (d.remaining < BURST - 1, e.live)
        },
        trace,
    )
}

fn lru_quality(trace: Trace) -> Quality {
    let mut lru = ExactLru::default();
    let mut evictions = 0;
    measure(
        |key| {
            let (hit, evicted) = lru.access(key);
            evictions += u64::from(evicted.is_some());
            (hit, evictions)
        },
        trace,
    )
}

const fn trace(hot: u64, flood: f64, periodic: bool) -> Trace {
    Trace {
        hot,
        flood,
        periodic,
    }
}

const TRACES: [Trace; 12] = [
    trace(100, 0.5, false),
    trace(100, 0.9, false),
    trace(200, 0.8, false),
    trace(500, 0.5, false),
    trace(50, 0.99, false),
    trace(100, 0.8, true),
    trace(100, 0.9, true),
    trace(200, 0.8, true),
    trace(250, 0.75, true),
    trace(500, 0.5, true),
    trace(300, 0.6, true),
    trace(500, 0.4, true),
];

#[test]
fn clock_against_exact_lru_on_a_hot_set_in_a_flood() {
    println!(
        "| active clients, chosen | flood share | new keys between a client's requests (mean) | hit ratio, exact LRU | \
         hit ratio, CLOCK | evictions that took an active client, exact LRU | the same, CLOCK |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for trace in TRACES {
        let (lru, clock) = (lru_quality(trace), store_quality(trace));
        let gap = trace.hot as f64 * trace.flood / (1.0 - trace.flood);
        let chosen = if trace.periodic {
            "in turn"
        } else {
            "at random"
        };
        println!(
            "| {} {chosen} | {:.2} | {gap:.0} | {:.4} | {:.4} | {:.4} | {:.4} |",
            trace.hot,
            trace.flood,
            lru.hit_ratio,
            clock.hit_ratio,
            lru.of_evictions,
            clock.of_evictions
        );
        // On these traces (one-time keys, clients of equal weight) CLOCK keeps the active clients at least as
        // well as exact LRU: a one-time key gets one revolution of the hand, where LRU keeps it a whole window.
        assert!(
            clock.hit_ratio >= lru.hit_ratio,
            "{trace:?}: {clock:?} against {lru:?}"
        );
        // The promise: a client that comes back within `SLOTS − hot` new keys (the revolution of the hand when
        // every active client is visited) is never evicted.
        if trace.periodic && (gap as u64) < (SLOTS as u64 - trace.hot) {
            assert_eq!(clock.hit_ratio, 1.0, "{trace:?}");
        }
    }
}
