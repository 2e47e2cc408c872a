//! One `tracing` span per decision, and one event inside it, at `DEBUG` on the target `tollgate::decision`, both
//! with the decision's fields; a subscriber that filters `DEBUG` out gets neither (the hot path never builds them).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_tower::observe::DECISION_TARGET;
use tollgate_tower::{BoxError, KeyError, Mode, RateLimitLayer, VerdictSink, Verdicts};
use tower::{Service, ServiceBuilder, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

type Fields = BTreeMap<String, String>;

/// Records every event's fields; lets `DEBUG` through only while `debug` is set.
#[derive(Clone, Default)]
struct Events {
    seen: Arc<Mutex<Vec<(String, Fields)>>>,
    spans: Arc<Mutex<Vec<(String, Fields)>>>,
    debug: Arc<AtomicBool>,
}

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl Subscriber for Events {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::INFO || self.debug.load(Ordering::Relaxed)
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        None
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut fields = Fields::new();
        attrs.record(&mut Collect(&mut fields));
        let target = attrs.metadata().target().to_owned();
        self.spans.lock().unwrap().push((target, fields));
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        let target = event.metadata().target().to_owned();
        self.seen.lock().unwrap().push((target, fields));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[derive(Debug, Default)]
struct Reply(Verdicts);

impl VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        &mut self.0
    }
}

#[tokio::test]
async fn every_decision_is_one_span_and_one_event_with_its_fields() {
    let events = Events::default();
    tracing::subscriber::set_global_default(events.clone()).expect("the only subscriber here");
    let by_user = |user: &&'static str, key: &mut String| {
        key.push_str(user);
        Ok::<_, KeyError>(())
    };
    let policy = Policy::sliding_window(Quota::per_minute(2).unwrap()).unwrap();
    let layer = RateLimitLayer::new("events", policy, Arc::new(MemoryStore::new()), by_user);
    let switch = layer.enforcement();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: &'static str| async { Ok::<_, BoxError>(Reply::default()) });
    let mut call = async |user| svc.ready().await.unwrap().call(user).await.is_ok();

    // A subscriber that stops at INFO sees no decision.
    assert!(call("ann").await);
    assert!(events.seen.lock().unwrap().is_empty());
    assert!(events.spans.lock().unwrap().is_empty());

    events.debug.store(true, Ordering::Relaxed);
    tracing::callsite::rebuild_interest_cache();
    assert!(call("ann").await);
    assert!(!call("ann").await);
    switch.set(Mode::Shadow);
    assert!(call("ann").await);

    let seen = events.seen.lock().unwrap().clone();
    let decisions: Vec<&Fields> = seen
        .iter()
        .filter(|(target, _)| target == DECISION_TARGET)
        .map(|(_, fields)| fields)
        .collect();
    let field = |i: usize, name: &str| decisions[i].get(name).map(String::as_str);
    assert_eq!(decisions.len(), 3, "{seen:?}");
    for i in 0..3 {
        assert_eq!(field(i, "limiter"), Some("events"));
        assert_eq!(field(i, "algorithm"), Some("sliding_window"));
        assert_eq!(field(i, "store"), Some("MemoryStore"));
        assert!(
            field(i, "store_latency_us").is_some(),
            "the store call was timed"
        );
    }
    assert_eq!(
        (0..3)
            .map(|i| (field(i, "outcome"), field(i, "remaining")))
            .collect::<Vec<_>>(),
        [
            (Some("allowed"), Some("0")),
            (Some("limited"), Some("0")),
            (Some("shadow_limited"), Some("0")),
        ]
    );
    // The span of each decision carries the same fields as its event.
    let spans: Vec<Fields> = events
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|(target, _)| target == DECISION_TARGET)
        .map(|(_, fields)| fields.clone())
        .collect();
    assert_eq!(spans.len(), 3, "one span per decision: {spans:?}");
    for (span, event) in spans.iter().zip(&decisions) {
        let mut event = (*event).clone();
        event.remove("message");
        assert_eq!(*span, event);
    }
}
