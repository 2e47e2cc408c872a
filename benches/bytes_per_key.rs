//! Resident memory per tracked key at 1 M keys: tollgate's MemoryStore against governor's keyed limiter.
//!
//! `cargo bench --bench bytes_per_key` — each contender runs in a fresh child process, which reads its own
//! resident set size (VmRSS) before and after tracking 1 M keys `client-0000000` … `client-0999999`. The
//! `_at_bound` contenders flood a store bounded at 1 M keys with 4 M distinct keys (it evicts at the bound, by
//! CLOCK): resident growth ÷ the keys it holds at the end. The `_locked` contenders lock every key out
//! (a lockout policy, each key denied once).

use std::num::NonZeroU32;
use std::process::Command;
use std::time::Duration;

use governor::{Quota as GQuota, RateLimiter};
use tollgate_core::{MemoryStore, Policy, Quota};

const KEYS: usize = 1_000_000;
const CONTENDERS: [&str; 7] = [
    "tollgate_token_bucket",
    "tollgate_sliding_window",
    "governor_gcra",
    "tollgate_token_bucket_at_bound",
    "tollgate_sliding_window_at_bound",
    "tollgate_token_bucket_locked",
    "tollgate_sliding_window_locked",
];

fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status")
        .expect("reading /proc/self/status (Linux only)");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc/self/status");
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS value");
    kib * 1024
}

fn measure(contender: &str) -> usize {
    // Slow enough that no key decays back to "fresh" (and is dropped) while the table fills.
    let quota = Quota::per_hour(1_000).unwrap();
    let mut key = String::with_capacity(16);
    let flood = if contender.ends_with("_at_bound") {
        4
    } else {
        1
    };
    let mut fill = |check: &mut dyn FnMut(&str)| {
        for i in 0..KEYS * flood {
            key.clear();
            std::fmt::Write::write_fmt(&mut key, format_args!("client-{i:07}")).unwrap();
            check(&key);
        }
    };
    let before = rss_bytes();
    let after = match contender {
        "governor_gcra" => {
            let limiter = RateLimiter::keyed(GQuota::per_hour(NonZeroU32::new(1_000).unwrap()));
            fill(&mut |k| assert!(limiter.check_key(&k.to_owned()).is_ok()));
            let rss = rss_bytes();
            assert_eq!(limiter.len(), KEYS);
            rss
        }
        name => {
            // `_locked`: one request an hour and a lockout of an hour, two requests per key: every key is locked
            // out (its lockout end is in the shard's side table, beside its entry).
            let locked = name.ends_with("_locked");
            let quota = if locked {
                Quota::per_hour(1).unwrap()
            } else {
                quota
            };
            let policy = if name.contains("token_bucket") {
                Policy::token_bucket(quota)
            } else {
                Policy::sliding_window(quota).unwrap()
            };
            let policy = if locked {
                policy.with_lockout(Duration::from_secs(3_600)).unwrap()
            } else {
                policy
            };
            let bound = if flood > 1 { KEYS } else { 2 * KEYS };
            let store = MemoryStore::builder().max_keys(bound).build();
            fill(&mut |k| {
                assert!(store.check_now(k, &policy, 1).unwrap().is_allowed());
                if locked {
                    let denied = store.check_now(k, &policy, 1).unwrap();
                    assert!(denied.retry_after >= Some(Duration::from_secs(3_599)));
                }
            });
            let rss = rss_bytes();
            // Unbounded: every key; at the bound: each shard full (the bound, rounded up to the shards).
            assert!(
                store.len() >= KEYS && store.len() <= KEYS + 64,
                "{}",
                store.len()
            );
            if flood > 1 {
                // Per key held: the figure is per tracked key in every row.
                return (rss - before) * KEYS / store.len();
            }
            rss
        }
    };
    after - before
}

fn main() {
    if let Some(contender) = std::env::args().skip_while(|a| a != "--contender").nth(1) {
        println!("{}", measure(&contender));
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    println!("bytes per key at {KEYS} keys (resident memory growth / keys held):");
    let mut results = Vec::new();
    for contender in CONTENDERS {
        let out = Command::new(&exe)
            .args(["--contender", contender])
            .output()
            .expect("spawn child");
        assert!(
            out.status.success(),
            "{contender}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bytes: usize = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("child output");
        let per_key = bytes as f64 / KEYS as f64;
        println!("  {contender:<26} {per_key:>7.1} B/key");
        results.push(per_key);
    }
    println!(
        "  ratio tollgate_token_bucket / governor_gcra = {:.2}",
        results[0] / results[2]
    );
    println!(
        "  ratio tollgate_sliding_window / governor_gcra = {:.2}",
        results[1] / results[2]
    );
}
