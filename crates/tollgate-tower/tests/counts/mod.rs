//! A metrics recorder that counts, for tests that read the counters a limiter records.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Counters by `name{label=value,...}`, labels sorted.
#[derive(Default, Clone)]
pub struct Counts(Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>);

impl Counts {
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let key = format!("{name}{{{}}}", labels.join(","));
        let map = self.0.lock().unwrap();
        map.get(&key).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

impl Recorder for Counts {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let counter = self.0.lock().unwrap().entry(name).or_default().clone();
        Counter::from_arc(counter)
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
