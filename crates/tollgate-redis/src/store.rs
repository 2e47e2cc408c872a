//! [`RedisStore`]: one `EVALSHA` per decision, bounded by a timeout, guarded by a circuit breaker, and a failure
//! policy for when Redis cannot answer.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tollgate_core::{
    Algorithm, Decision, FailurePolicy, MemoryStore, Policy, Store, StoreError, Timestamp,
};

use crate::backend::Backend;
use crate::circuit::{Admission, Circuit, CircuitState};
use crate::degraded::{CIRCUIT_OPEN, DegradedLog, LATENCY_SECONDS};
use crate::eviction::{self, EvictionCheck};
use crate::script::{self, Scripts};
use crate::{RedisStoreBuilder, keys};

/// Limiter state in Redis: the same decisions as [`MemoryStore`], for a whole fleet.
///
/// Cheap to clone (the pool and circuit are shared). See the [crate docs](crate) for an example.
#[derive(Debug, Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Backend,
    scripts: Scripts,
    namespace: String,
    timeout: Duration,
    failure_policy: Option<FailurePolicy>,
    circuit: Circuit,
    local: MemoryStore,
    log: DegradedLog,
    eviction: OnceLock<EvictionCheck>,
}

impl RedisStore {
    /// A builder for a store on one Redis server (a primary), e.g. `redis://127.0.0.1:6379`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::standalone(url.into())
    }

    /// A builder for a store on a Redis Cluster, given some of its nodes' URLs.
    pub fn cluster_builder<I, S>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisStoreBuilder::cluster(nodes.into_iter().map(Into::into).collect())
    }

    /// A store on one server with every default (namespace `tollgate`, 50 ms timeout, errors returned to the
    /// limiter).
    pub async fn connect(url: impl Into<String>) -> Result<Self, crate::BuildError> {
        Self::builder(url).build().await
    }

    pub(crate) fn assemble(
        backend: Backend,
        namespace: String,
        timeout: Duration,
        failure_policy: Option<FailurePolicy>,
        failure_threshold: u32,
        cool_down: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                backend,
                scripts: Scripts::new(),
                namespace,
                timeout,
                failure_policy,
                circuit: Circuit::new(failure_threshold, cool_down),
                local: MemoryStore::new(),
                log: DegradedLog::new(),
                eviction: OnceLock::new(),
            }),
        }
    }

    pub(crate) fn with_eviction_check(self, check: EvictionCheck) -> Self {
        let _ = self.inner.eviction.set(check);
        self
    }

    /// Decides at `now` instead of the server's time (the shared vectors and tests), applying the store's failure
    /// policy, if it has one, like [`Store::check`].
    pub async fn check_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        let result = self.decide(key, policy, cost, Some(now)).await;
        self.or_degrade(result, key, policy, cost, Some(now))
    }

    /// Decides on Redis's clock and returns Redis's failure as an error instead of applying the failure policy
    /// (still bounded by the timeout and skipped while the circuit is open). A `READONLY` reply (a replica) is a
    /// [`StoreError::Backend`] whose source downcasts to [`BackendError::ReadOnly`](crate::BackendError::ReadOnly).
    pub async fn try_check(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.decide(key, policy, cost, None).await
    }

    /// [`try_check`](Self::try_check) at an injected instant.
    pub async fn try_check_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.decide(key, policy, cost, Some(now)).await
    }

    /// The Redis key holding `key`'s state under `algorithm` (for inspection; see the crate docs for the format).
    #[must_use]
    pub fn redis_key(&self, key: &str, algorithm: Algorithm) -> String {
        keys::redis_key(&self.inner.namespace, key, algorithm)
    }

    /// What the start-up check of `maxmemory-policy` found (also logged then, loudly unless `noeviction`).
    #[must_use]
    pub fn eviction_check(&self) -> &EvictionCheck {
        self.inner
            .eviction
            .get_or_init(|| EvictionCheck::Unknown("not checked yet".to_owned()))
    }

    /// Checks `maxmemory-policy` again now, logging the result like the start-up check.
    pub async fn check_eviction_policy(&self) -> EvictionCheck {
        self.check_eviction_policy_within(self.inner.timeout.max(Duration::from_secs(2)))
            .await
    }

    pub(crate) async fn check_eviction_policy_within(&self, limit: Duration) -> EvictionCheck {
        match tokio::time::timeout(limit, eviction::check(&self.inner.backend)).await {
            Ok(check) => check,
            Err(_) => {
                let check =
                    EvictionCheck::Unknown(format!("CONFIG GET did not answer within {limit:?}"));
                tracing::warn!("could not check Redis maxmemory-policy: {check}");
                check
            }
        }
    }

    /// The circuit breaker's state.
    #[must_use]
    pub fn circuit_state(&self) -> CircuitState {
        self.inner.circuit.state()
    }

    /// The store's own failure policy (`None`: errors go to the caller).
    #[must_use]
    pub fn failure_policy(&self) -> Option<FailurePolicy> {
        self.inner.failure_policy
    }

    /// The timeout of every Redis call.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// One decision on Redis, or the reason there is none.
    async fn decide(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<Decision, StoreError> {
        let script = self.inner.scripts.for_algorithm(policy.algorithm());
        let redis_key = keys::redis_key(&self.inner.namespace, key, policy.algorithm());
        // Like the Rust algorithms, decide no later than `Timestamp::LATEST` (2^53 µs): past it Lua's doubles lose
        // integers.
        let args = script::args(policy, cost, now.map(|t| t.min(Timestamp::LATEST)));
        self.run_script(script, &redis_key, &args, |reply| {
            script::parse_reply(policy, reply)
        })
        .await
    }

    /// Runs one script on `redis_key` and parses its reply: skipped while the circuit is open, bounded by the
    /// timeout, its latency recorded and its outcome reported to the circuit. Shared by every script the store
    /// runs (the rate-limit algorithms and the concurrency leases).
    pub(crate) async fn run_script<T>(
        &self,
        script: &script::Script,
        redis_key: &str,
        args: &[String],
        parse: impl FnOnce(&redis::Value) -> Result<T, crate::BackendError>,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let admission = inner.circuit.admit();
        if admission == Admission::Skip {
            return Err(StoreError::CircuitOpen);
        }
        let probe = ProbeGuard {
            circuit: &inner.circuit,
            armed: admission == Admission::Probe,
        };
        let started = Instant::now();
        let result =
            tokio::time::timeout(inner.timeout, inner.backend.run(script, redis_key, args)).await;
        let elapsed = started.elapsed().as_secs_f64();
        probe.disarm();
        let result = match result {
            Ok(Ok(reply)) => parse(&reply).map_err(StoreError::backend),
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout(inner.timeout)),
            Ok(Err(e)) => Err(StoreError::backend(e)),
            Err(_) => Err(StoreError::Timeout(inner.timeout)),
        };
        match &result {
            Ok(_) => {
                metrics::histogram!(LATENCY_SECONDS, "outcome" => "ok").record(elapsed);
                if inner.circuit.succeeded() {
                    metrics::gauge!(CIRCUIT_OPEN).set(0.0);
                    tracing::info!("Redis answers again: rate-limiter circuit closed");
                }
            }
            Err(e) => {
                metrics::histogram!(LATENCY_SECONDS, "outcome" => "error").record(elapsed);
                if inner.circuit.failed(admission) {
                    metrics::gauge!(CIRCUIT_OPEN).set(1.0);
                    tracing::warn!(error = %e, "Redis keeps failing: rate-limiter circuit open, skipping Redis");
                }
            }
        }
        result
    }

    /// The key namespace.
    pub(crate) fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// Applies the failure policy to a failed decision.
    fn or_degrade(
        &self,
        result: Result<Decision, StoreError>,
        key: &str,
        policy: &Policy,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<Decision, StoreError> {
        let error = match result {
            Ok(decision) => return Ok(decision),
            Err(e) => e,
        };
        let inner = &*self.inner;
        let Some(failure_policy) = inner.failure_policy else {
            return Err(error);
        };
        inner.log.record(&error, failure_policy);
        let now = now.unwrap_or_else(|| Timestamp::from(SystemTime::now()));
        if let Some(decision) = failure_policy.synthesize(policy, now) {
            return Ok(decision);
        }
        // A full local table cannot track this key: protect rather than admit blindly.
        inner.local.check_at(key, policy, cost, now).or_else(|_| {
            FailurePolicy::Closed
                .synthesize(policy, now)
                .ok_or(StoreError::CircuitOpen)
        })
    }
}

impl Store for RedisStore {
    /// Decides on Redis's clock. If Redis fails, times out or the circuit is open: with a store failure policy,
    /// answers with it (counted and logged; a local fallback that cannot track one more key answers as if failing
    /// closed); without one, returns the error for the limiter's own policy.
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        let result = self.decide(key, policy, cost, None).await;
        self.or_degrade(result, key, policy, cost, None)
    }

    /// Shared, so rate limiters cache its denials (their deny cache) — unless it has a failure policy of its own,
    /// whose synthesized denials are not Redis's.
    fn is_shared(&self) -> bool {
        self.inner.failure_policy.is_none()
    }
}

/// Frees the half-open probe slot if the probing call is cancelled before it reports.
struct ProbeGuard<'a> {
    circuit: &'a Circuit,
    armed: bool,
}

impl ProbeGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.circuit.abandoned();
        }
    }
}
