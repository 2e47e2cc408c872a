//! Evictions are counted in `tollgate_evictions_total{limiter}` under the store's name. Alone in its test binary:
//! it installs the global recorder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tollgate_core::store::{BoundedTable, EVICTIONS_TOTAL, Expiry};
use tollgate_core::{ManualClock, MemoryStore, Policy, Quota, Timestamp};

#[derive(Clone, Default)]
struct Counts(Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>);

impl Counts {
    fn get(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl Recorder for Counts {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Counter::from_arc(self.0.lock().unwrap().entry(name).or_default().clone())
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

struct Until(u64);

impl Expiry for Until {
    fn expires_at(&self) -> u64 {
        self.0
    }
}

#[test]
fn evictions_are_counted_under_the_name_of_the_store_or_table() {
    let counts = Counts::default();
    metrics::set_global_recorder(counts.clone()).expect("the only recorder in this test binary");

    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = MemoryStore::builder()
        .clock(clock)
        .max_keys(10)
        .name("per-client")
        .build();
    let policy = Policy::token_bucket(Quota::per_second(5).unwrap());
    for i in 0..25 {
        store.check_now(&format!("k{i}"), &policy, 1).unwrap();
    }
    assert_eq!(
        counts.get(&format!("{EVICTIONS_TOTAL}{{limiter=per-client}}")),
        15
    );

    let table = BoundedTable::builder()
        .max_keys(3)
        .name("deny-cache")
        .build();
    for i in 0..5u64 {
        table
            .insert(table.digest(&i.to_le_bytes()), Until(10), 0)
            .unwrap();
    }
    assert_eq!(
        counts.get(&format!("{EVICTIONS_TOTAL}{{limiter=deny-cache}}")),
        2
    );

    let unnamed = MemoryStore::builder().max_keys(1).build();
    for i in 0..3 {
        unnamed.check_now(&format!("k{i}"), &policy, 1).unwrap();
    }
    assert_eq!(
        counts.get(&format!("{EVICTIONS_TOTAL}{{limiter=memory_store}}")),
        2
    );
}
