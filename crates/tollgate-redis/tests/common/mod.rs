//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use tollgate_core::{Policy, Quota};
use tollgate_redis::RedisStore;

/// A store on `url` under a namespace no other test uses, with a timeout generous enough for a loaded CI
/// machine (tests that exercise the timeout set their own).
pub async fn store(url: &str, test: &str) -> RedisStore {
    RedisStore::builder(url)
        .namespace(tollgate_testkit::redis::unique_prefix(test))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("store builds")
}

/// The documented least-privilege rule for `user` with `password` on `namespace`: the exact line of the crate
/// docs, with only the user, password and namespace substituted.
pub fn least_privilege_rule(user: &str, password: &str, namespace: &str) -> String {
    let line = tollgate_redis::LEAST_PRIVILEGE_ACL;
    assert!(
        line.starts_with("ACL SETUSER tollgate on >PASSWORD "),
        "{line}"
    );
    assert!(line.contains(" ~tollgate:* "), "{line}");
    line.trim_start_matches("ACL SETUSER ")
        .replacen("tollgate on", &format!("{user} on"), 1)
        .replacen(">PASSWORD", &format!(">{password}"), 1)
        .replacen("~tollgate:*", &format!("~{namespace}:*"), 1)
}

/// A private server on which the tests run as the documented least-privilege user, as production should.
pub struct AclRedis {
    pub server: tollgate_testkit::redis::RedisServer,
}

impl AclRedis {
    /// A fresh private server (its default user is the tests' admin).
    pub fn start() -> Self {
        Self {
            server: tollgate_testkit::redis::RedisServer::start(),
        }
    }

    /// The admin URL, for inspecting keys.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// A store (5 s timeout) under a fresh namespace, connected as a user created for it with the documented
    /// least-privilege line.
    pub async fn store(&self, test: &str) -> RedisStore {
        self.builder(test).build().await.expect("store builds")
    }

    /// The builder of [`store`](Self::store), for tests that add settings.
    pub fn builder(&self, test: &str) -> tollgate_redis::RedisStoreBuilder {
        self.builder_in(tollgate_testkit::redis::unique_prefix(test))
    }

    /// A builder under `namespace` (several instances sharing one), as its least-privilege user.
    pub fn builder_in(&self, namespace: String) -> tollgate_redis::RedisStoreBuilder {
        let user = format!("u-{namespace}");
        self.server
            .acl_setuser(&least_privilege_rule(&user, "pw", &namespace));
        RedisStore::builder(self.server.url_as(&user, "pw"))
            .namespace(namespace)
            .timeout(Duration::from_secs(5))
    }
}

/// A request for the tollgate layer in the failure-policy tests: its key.
#[derive(Debug, Clone)]
pub struct Req(pub &'static str);

/// The layer's reply: the verdicts it attached.
#[derive(Debug, Default)]
pub struct Reply(pub tollgate_tower::Verdicts);

impl tollgate_tower::VerdictSink for Reply {
    fn verdicts_mut(&mut self) -> &mut tollgate_tower::Verdicts {
        &mut self.0
    }
}

/// `store` behind a tollgate rate-limit layer answering its errors with `on_error`: the failure policy lives in
/// the layer, the store only reports.
pub fn limited<St: tollgate_core::Store>(
    store: St,
    policy: Policy,
    on_error: tollgate_core::FailurePolicy,
) -> impl tower::Service<Req, Response = Reply, Error = tollgate_tower::BoxError, Future: Send> + Clone
{
    let key = |req: &Req, key: &mut String| {
        key.push_str(req.0);
        Ok::<(), tollgate_tower::KeyError>(())
    };
    tower::ServiceBuilder::new()
        .layer(
            tollgate_tower::RateLimitLayer::new("redis", policy, std::sync::Arc::new(store), key)
                .on_store_error(on_error),
        )
        .service(tower::service_fn(|_: Req| async {
            Ok::<_, tollgate_tower::BoxError>(Reply::default())
        }))
}

/// One call through a layered service.
pub async fn call<S>(svc: &mut S, key: &'static str) -> Result<Reply, tollgate_tower::BoxError>
where
    S: tower::Service<Req, Response = Reply, Error = tollgate_tower::BoxError>,
{
    use tower::ServiceExt;
    svc.ready().await?.call(Req(key)).await
}

/// The rejection a layered call failed with.
pub fn rejection(err: &tollgate_tower::BoxError) -> &tollgate_tower::Rejection {
    err.downcast_ref::<tollgate_tower::Rejection>()
        .unwrap_or_else(|| panic!("expected a Rejection, got {err}"))
}

/// A multi-threaded runtime for tests that want real parallelism.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

/// `limit` per hour: nothing refills during a test.
pub fn hourly_bucket(limit: u64) -> Policy {
    Policy::token_bucket(Quota::per_hour(limit).expect("valid quota"))
}

/// `limit` per hour, sliding window.
pub fn hourly_window(limit: u64) -> Policy {
    Policy::sliding_window(Quota::per_hour(limit).expect("valid quota")).expect("valid policy")
}

/// Sum of `calls=` over every `cmdstat_*` line of `INFO commandstats`, except the commands in `skip`.
pub fn command_calls(info: &str, skip: &[&str]) -> Vec<(String, u64)> {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            (!skip.contains(&name)).then(|| (name.to_owned(), calls))
        })
        .collect()
}

/// A `metrics` recorder that counts: counter increments, and the number of values each histogram recorded,
/// by name and labels (`name{k=v,…}`).
#[derive(Debug, Default)]
pub struct CountingRecorder {
    counts: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Tally>>>,
}

/// One metric's running count.
#[derive(Debug, Default)]
pub struct Tally(std::sync::atomic::AtomicU64);

impl metrics::CounterFn for Tally {
    fn increment(&self, value: u64) {
        self.0
            .fetch_add(value, std::sync::atomic::Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, std::sync::atomic::Ordering::Relaxed);
    }
}

impl metrics::HistogramFn for Tally {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl CountingRecorder {
    /// Installs a global counting recorder once per test binary and returns it.
    pub fn global() -> &'static Self {
        static RECORDER: std::sync::OnceLock<&'static CountingRecorder> =
            std::sync::OnceLock::new();
        RECORDER.get_or_init(|| {
            let recorder: &'static Self = Box::leak(Box::default());
            metrics::set_global_recorder(recorder).expect("no other recorder in this test binary");
            recorder
        })
    }

    fn tally(&self, key: &metrics::Key) -> std::sync::Arc<Tally> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.counts.lock().unwrap().entry(name).or_default().clone()
    }

    /// The sum of every metric whose `name{labels}` contains all of `parts`.
    pub fn sum(&self, parts: &[&str]) -> u64 {
        self.counts
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| parts.iter().all(|p| name.contains(p)))
            .map(|(_, t)| t.0.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }
}

impl metrics::Recorder for CountingRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.tally(key))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.tally(key))
    }
}
