//! [`RedisStore`]: one `EVALSHA` per decision, bounded by a timeout and guarded by a circuit breaker. What to do
//! when Redis cannot answer is the limiter's failure policy: the store returns the error.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Check, Decision, LostCharge, Policy, Store, StoreError, Timestamp};

use crate::backend::Backend;
use crate::circuit::{Admission, Circuit, CircuitState};
use crate::eviction::{self, EvictionCheck};
use crate::observe::{CIRCUIT_OPEN, LATENCY_SECONDS};
use crate::script::{self, Scripts};
use crate::{RedisStoreBuilder, keys};

/// Limiter state in Redis: the same decisions as [`MemoryStore`](tollgate_core::MemoryStore), for a whole fleet.
///
/// Two entry points: [`Store::check`] decides on Redis's clock, [`check_at`](Self::check_at) at an instant the
/// caller gives. Both return Redis's failures (a timeout, an open circuit, a `READONLY` replica) as errors, for the
/// limiter's failure policy to answer.
///
/// Cheap to clone (the pool and circuit are shared). See the [crate docs](crate) for an example.
#[derive(Debug, Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Backend,
    scripts: &'static Scripts,
    /// Follows Sentinel's `+switch-master` while the store lives.
    _watcher: Option<crate::backend::Watcher>,
    namespace: String,
    timeout: Duration,
    circuit: Circuit,
    eviction: OnceLock<EvictionCheck>,
    /// The server does not know `EVALSHA_RO` (Redis before 7): peeks run the same read-only script by `EVALSHA`.
    no_read_only: AtomicBool,
    /// Scripts sent to Redis (see [`RedisStore::script_calls`]).
    script_calls: AtomicU64,
}

impl RedisStore {
    /// A builder for a store on one Redis server (a primary), e.g. `redis://127.0.0.1:6379`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::standalone(url.into())
    }

    /// A builder for a store on the primary that Redis Sentinel names `master`, given some Sentinels as
    /// `host:port` or `redis://` / `rediss://` URLs (bare addresses use TLS when a CA or client certificate is
    /// configured). Limiter calls only ever go to the primary; a failover is followed (see the crate docs).
    /// Feature `sentinel`.
    #[cfg(feature = "sentinel")]
    pub fn sentinel_builder<I, S>(sentinels: I, master: impl Into<String>) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisStoreBuilder::sentinel(
            sentinels.into_iter().map(Into::into).collect(),
            master.into(),
        )
    }

    /// A builder for a store on a user's existing deadpool-redis pool (feature `deadpool-redis`). Its TLS and
    /// credentials are the pool's. deadpool-redis's manager sends `PING` (pipelined with `UNWATCH`) on every
    /// checkout, so each decision costs two round trips instead of one: the built-in pool is faster (figures in
    /// `docs/BENCHMARKS.md`). Its connections do not load the scripts when made, so after a server restart the
    /// first call of each script is answered by `EVAL` after `NOSCRIPT`.
    #[cfg(feature = "deadpool-redis")]
    pub fn from_deadpool(pool: deadpool_redis::Pool) -> RedisStoreBuilder {
        RedisStoreBuilder::deadpool(pool)
    }

    /// A builder for a store on a Redis Cluster, given some of its nodes' URLs (feature `cluster`).
    #[cfg(feature = "cluster")]
    pub fn cluster_builder<I, S>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisStoreBuilder::cluster(nodes.into_iter().map(Into::into).collect())
    }

    /// A store on one server with every default (namespace `tollgate`, 250 ms timeout).
    pub async fn connect(url: impl Into<String>) -> Result<Self, crate::BuildError> {
        Self::builder(url).build().await
    }

    pub(crate) fn assemble(
        backend: Backend,
        namespace: String,
        timeout: Duration,
        failure_threshold: u32,
        cool_down: Duration,
        watcher: Option<crate::backend::Watcher>,
    ) -> Self {
        // Registered at once (unchanged), so dashboards and alerts see the gauge before any circuit opens.
        metrics::gauge!(CIRCUIT_OPEN).increment(0.0);
        Self {
            inner: Arc::new(Inner {
                backend,
                scripts: Scripts::shared(),
                _watcher: watcher,
                namespace,
                timeout,
                circuit: Circuit::new(failure_threshold, cool_down),
                eviction: OnceLock::new(),
                no_read_only: AtomicBool::new(false),
                script_calls: AtomicU64::new(0),
            }),
        }
    }

    /// The start-up check: connect (loading the scripts), run one decision on a probe key of its own (one token
    /// of a million-per-second bucket: the script writes, and the key expires after 1 ms), then every other
    /// command the scripts run on another key of its own (`lua/startup_probe.lua`, which leaves it absent), so
    /// that a configuration error (credentials, certificates, permissions) stops start-up instead of failing
    /// requests later. An outage is logged, and the store is built.
    pub(crate) async fn verify(
        &self,
        limit: Duration,
        target: Option<crate::builder::ProbeTarget>,
    ) -> Result<(), crate::BuildError> {
        let policy = crate::builder::probe_policy();
        let script = self.inner.scripts.for_algorithm(policy.algorithm());
        let key = keys::redis_key(
            &self.inner.namespace,
            "tollgate-startup-probe",
            policy.algorithm(),
        );
        let args = script::args(&policy, 1, None);
        let probe_key = keys::startup_probe_key(&self.inner.namespace);
        let backend = &self.inner.backend;
        let attempt = async {
            backend.pin_scripts().await?;
            let reply = backend.run(script, &key, &args).await?;
            // Every other command the scripts run (leases, slots), so that a permission only they need is
            // missed at start-up, not on the first lease.
            let commands = self.inner.scripts.startup_probe();
            backend.run(commands, &probe_key, &[]).await?;
            Ok(reply)
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(Ok(reply)) => match script::parse_reply(&policy, &reply) {
                Ok(_) => Ok(()),
                Err(e) => {
                    tracing::warn!("the start-up probe decision came back unreadable: {e}");
                    Ok(())
                }
            },
            Ok(Err(e)) => {
                crate::builder::judge_startup_failure(Some(&e), target.as_ref()).await?;
                tracing::warn!(
                    error = %e,
                    "Redis is not answering at start-up ({e}): the store is built, its calls fail until Redis \
                     answers (the limiter's failure policy decides meanwhile), and it connects when Redis is up"
                );
                Ok(())
            }
            Err(_) => {
                crate::builder::judge_startup_failure(None, target.as_ref()).await?;
                tracing::warn!(
                    "Redis did not answer within {limit:?} at start-up: the store is built, its calls fail until \
                     Redis answers, and it connects when Redis is up"
                );
                Ok(())
            }
        }
    }

    pub(crate) fn with_eviction_check(self, check: EvictionCheck) -> Self {
        let _ = self.inner.eviction.set(check);
        self
    }

    /// Decides at `now` instead of the server's time (the shared vectors, tests, replays). Like [`Store::check`],
    /// it is bounded by the timeout, skipped while the circuit is open, and returns Redis's failure as an error: a
    /// `READONLY` reply (a replica) is a [`StoreError::Backend`] whose source downcasts to
    /// [`BackendError::ReadOnly`](crate::BackendError::ReadOnly).
    pub async fn check_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.decide(key, policy, cost, Some(now), None).await
    }

    /// [`Store::check_held`] at `now` instead of the server's time (for tests and replays, as
    /// [`check_at`](Self::check_at)).
    pub async fn check_held_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        hold: Duration,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.decide(key, policy, cost, Some(now), Some(hold)).await
    }

    /// What a request of `cost` on `key` would get at `now` (instead of the server's time), without writing: see
    /// [`Store::peek`].
    pub async fn peek_at(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.peek_inner(key, policy, cost, Some(now)).await
    }

    /// Charges `delta` (a refund if negative) at `now` instead of the server's time: see [`Store::charge`].
    pub async fn charge_at(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.charge_inner(key, policy, delta, decided_at, Some(now))
            .await
    }

    /// [`Store::check_all`] at `now` instead of the server's time (for tests and replays, as
    /// [`check_at`](Self::check_at)); `None` where one script call cannot decide `checks` (see `check_all`).
    pub fn check_all_at(
        &self,
        checks: &[Check<'_>],
        now: Timestamp,
    ) -> Option<impl Future<Output = Result<Vec<Decision>, StoreError>> + Send> {
        let (keys, args) = self.set_call(checks, Some(now))?;
        Some(async move { self.decide_all(checks, &keys, &args).await })
    }

    /// The keys and arguments of the one set script call that decides `checks`, or `None` where one call cannot:
    /// fewer than two checks, a policy with a lockout (its script of its own), two checks on one key (the set
    /// holds a limit's writes back, so a second look at its key would not see them), keys in different hash
    /// slots of a Cluster.
    fn set_call(
        &self,
        checks: &[Check<'_>],
        now: Option<Timestamp>,
    ) -> Option<(Vec<String>, Vec<String>)> {
        if checks.len() < 2 || checks.iter().any(|c| c.policy.lockout_micros() > 0) {
            return None;
        }
        let namespace = &self.inner.namespace;
        let keys: Vec<String> = checks
            .iter()
            .map(|c| keys::redis_key(namespace, c.key, c.policy.algorithm()))
            .collect();
        let distinct = keys.iter().enumerate().all(|(i, k)| !keys[..i].contains(k));
        if !distinct || !self.inner.backend.one_call(&keys) {
            return None;
        }
        let now = now.map(|t| t.min(Timestamp::LATEST));
        Some((keys, script::set_args(checks, now)))
    }

    /// One set script call (see [`set_call`](Self::set_call)).
    async fn decide_all(
        &self,
        checks: &[Check<'_>],
        keys: &[String],
        args: &[String],
    ) -> Result<Vec<Decision>, StoreError> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let parse = |reply: &redis::Value| script::parse_set_reply(checks, reply);
        self.run_script_mode(self.inner.scripts.set(), &keys, args, false, parse)
            .await
    }

    async fn charge_inner(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        now: Option<Timestamp>,
    ) -> Result<Decision, StoreError> {
        let Some(script) = self.inner.scripts.charge_for_algorithm(policy.algorithm()) else {
            return Err(StoreError::Unsupported(
                "a charge after the response on a fixed window",
            ));
        };
        let redis_key = keys::redis_key(&self.inner.namespace, key, policy.algorithm());
        let now = now.map(|t| t.min(Timestamp::LATEST));
        let args = script::charge_args(policy, delta, decided_at, now);
        self.run_script(script, &redis_key, &args, |reply| {
            script::parse_charge_reply(policy, reply)
        })
        .await
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

    /// The scripts this store and its clones have sent to Redis so far: one per decision of
    /// [`Store::check`], per peek, per charge after the response and per concurrency-lease call, the start-up
    /// check's included (a `NOSCRIPT` reload or an `EVALSHA_RO` retried as `EVALSHA` counts once), none while the
    /// circuit is open. What capacity planning divides by: the calls per decision
    /// a limiter costs Redis (the deny cache answers some decisions without any).
    #[must_use]
    pub fn script_calls(&self) -> u64 {
        self.inner.script_calls.load(Ordering::Relaxed)
    }

    /// The circuit breaker's state.
    #[must_use]
    pub fn circuit_state(&self) -> CircuitState {
        self.inner.circuit.state(Instant::now())
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
        hold: Option<Duration>,
    ) -> Result<Decision, StoreError> {
        let redis_key = keys::redis_key(&self.inner.namespace, key, policy.algorithm());
        // Like the Rust algorithms, decide no later than `Timestamp::LATEST` (2^53 µs): past it Lua's doubles lose
        // integers.
        let now = now.map(|t| t.min(Timestamp::LATEST));
        let parse = |reply: &redis::Value| script::parse_reply(policy, reply);
        if policy.lockout_micros() > 0 {
            // The lockout is kept in the same script call: the algorithm wrapped in the store operations.
            let script = self.inner.scripts.ops_for_algorithm(policy.algorithm());
            let args = script::ops_args(policy, cost, now, false);
            return self.run_script(script, &redis_key, &args, parse).await;
        }
        let script = self.inner.scripts.for_algorithm(policy.algorithm());
        let (plain, held);
        let args: &[String] = match hold {
            Some(hold) if !hold.is_zero() && policy.algorithm() == Algorithm::TokenBucket => {
                held = script::held_args(policy, cost, now, hold);
                &held
            }
            _ => {
                plain = script::args(policy, cost, now);
                &plain
            }
        };
        self.run_script(script, &redis_key, args, parse).await
    }

    /// One peek on Redis: the wrapped script in peek mode, run read-only.
    async fn peek_inner(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<Decision, StoreError> {
        let script = self.inner.scripts.ops_for_algorithm(policy.algorithm());
        let redis_key = keys::redis_key(&self.inner.namespace, key, policy.algorithm());
        let args = script::ops_args(policy, cost, now.map(|t| t.min(Timestamp::LATEST)), true);
        self.run_script_mode(script, &[&redis_key], &args, true, |reply| {
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
        self.run_script_mode(script, &[redis_key], args, false, parse)
            .await
    }

    /// [`run_script`](Self::run_script) on `keys`, read-only (`EVALSHA_RO`) if `read_only` and the server has it.
    async fn run_script_mode<T>(
        &self,
        script: &script::Script,
        keys: &[&str],
        args: &[String],
        read_only: bool,
        parse: impl FnOnce(&redis::Value) -> Result<T, crate::BackendError>,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let admission = inner.circuit.admit(Instant::now());
        if admission == Admission::Skip {
            return Err(StoreError::CircuitOpen);
        }
        let probe = ProbeGuard {
            circuit: &inner.circuit,
            armed: admission == Admission::Probe,
        };
        inner.script_calls.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let call = async {
            let read_only = read_only && !inner.no_read_only.load(Ordering::Relaxed);
            match inner.backend.run_mode(script, keys, args, read_only).await {
                Err(e) if read_only && e.is_unknown_command() => {
                    // Redis before 7: the script writes nothing in peek mode by construction; the server just
                    // cannot enforce it.
                    inner.no_read_only.store(true, Ordering::Relaxed);
                    tracing::info!(
                        "Redis does not know EVALSHA_RO (before 7.0): peeks run their read-only script by EVALSHA"
                    );
                    inner.backend.run_mode(script, keys, args, false).await
                }
                other => other,
            }
        };
        let result = crate::deadline::within(inner.timeout, call).await;
        let elapsed = started.elapsed().as_secs_f64();
        probe.disarm();
        let result = match result {
            Some(Ok(reply)) => parse(&reply).map_err(StoreError::backend),
            Some(Err(e)) if e.is_timeout() => Err(StoreError::Timeout(inner.timeout)),
            Some(Err(e)) => Err(StoreError::backend(e)),
            None => Err(StoreError::Timeout(inner.timeout)),
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
                if inner.circuit.failed(admission, Instant::now()) {
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
}

impl Store for RedisStore {
    /// Decides on Redis's clock. If Redis fails, times out or the circuit is open, returns the error: the
    /// limiter's failure policy answers (and counts and logs it).
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.decide(key, policy, cost, None, None).await
    }

    /// One round trip, as [`check`](Store::check): a token bucket's request admitted within `hold` comes back
    /// held (the lockout's script takes no hold: a policy with a lockout is decided as by `check`).
    async fn check_held(
        &self,
        key: &str,
        policy: &Policy,
        cost: u64,
        hold: Duration,
    ) -> Result<Decision, StoreError> {
        self.decide(key, policy, cost, None, Some(hold)).await
    }

    /// One script call (`SET_LUA`) for every check, where the checks allow one (see
    /// [`check_all_at`](RedisStore::check_all_at)): the limits' writes are made only if every enforced limit admits.
    fn check_all(
        &self,
        checks: &[Check<'_>],
    ) -> Option<impl Future<Output = Result<Vec<Decision>, StoreError>> + Send> {
        let (keys, args) = self.set_call(checks, None)?;
        Some(async move { self.decide_all(checks, &keys, &args).await })
    }

    /// Shared, so rate limiters cache its denials (their deny cache): every denial it returns is Redis's own (a
    /// failure is an error, answered by the layer's failure policy, never a made-up denial).
    fn is_shared(&self) -> bool {
        true
    }

    /// A token lease call on Redis's clock (see [`RedisStore::lease_tokens_at`]).
    async fn lease_tokens(
        &self,
        key: &str,
        policy: &Policy,
        request: &tollgate_core::token_lease::TokenLeaseRequest,
    ) -> Result<tollgate_core::token_lease::TokenLeaseGrant, StoreError> {
        self.lease(key, policy, request, None).await
    }

    fn supports_token_leases(&self) -> bool {
        true
    }

    /// One read-only round trip on Redis's clock: the decision script in peek mode by `EVALSHA_RO`, which the
    /// server refuses to let write (Redis 7 and later; before, the same script by `EVALSHA`, which writes nothing
    /// in peek mode). From the primary, like every call. Errors as [`check`](Store::check)'s (the circuit and
    /// the timeout apply).
    async fn peek(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        self.peek_inner(key, policy, cost, None).await
    }

    /// Spawned on the current tokio runtime (the response is not held back for the round trip); a failure, or no
    /// runtime, is logged.
    fn charge_detached(
        &self,
        key: String,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
        lost: LostCharge,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "a charge after the response needs a tokio runtime to reach Redis: it is lost"
            );
            lost.report(&StoreError::Unsupported("a charge without a tokio runtime"));
            return;
        };
        let (store, policy) = (self.clone(), *policy);
        runtime.spawn(async move {
            if let Err(e) = store.charge(&key, &policy, delta, decided_at).await {
                tracing::warn!(error = %e, "a charge after the response failed on Redis; it is lost");
                lost.report(&e);
            }
        });
    }

    /// One script call on Redis's clock: the charge (or refund) and its TTL in one atomic step.
    async fn charge(
        &self,
        key: &str,
        policy: &Policy,
        delta: i64,
        decided_at: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.charge_inner(key, policy, delta, decided_at, None)
            .await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{self, Connector};

    fn store() -> RedisStore {
        // Never connected: the futures are only built, not polled.
        let client = redis::Client::open("redis://127.0.0.1:1").expect("a valid URL");
        let timeout = Duration::from_millis(50);
        let pool = backend::pool(Connector::Client(client), 1, timeout).expect("a pool");
        RedisStore::assemble(
            Backend::Pooled(pool),
            "size".to_owned(),
            timeout,
            3,
            Duration::from_secs(1),
            None,
        )
    }

    /// The limiter moves a decision's future into a box per request (a memcpy of its whole size), so it must stay
    /// small. With the connect future held inline in every checkout it was 7 976 bytes (11 384 with
    /// `deadpool-redis`); now 1 872 with every feature, debug or release. The bound leaves room for toolchains.
    #[test]
    fn a_decision_future_stays_small() {
        const BOUND: usize = 3 * 1024;
        let store = store();
        let policy = Policy::token_bucket(tollgate_core::Quota::per_second(10).expect("a quota"));
        let check = std::mem::size_of_val(&Store::check(&store, "k", &policy, 1));
        let peek = std::mem::size_of_val(&Store::peek(&store, "k", &policy, 1));
        let charge = std::mem::size_of_val(&Store::charge(
            &store,
            "k",
            &policy,
            1,
            Timestamp::from_micros(0),
        ));
        assert!(
            check <= BOUND,
            "RedisStore::check's future is {check} bytes"
        );
        assert!(peek <= BOUND, "RedisStore::peek's future is {peek} bytes");
        assert!(
            charge <= BOUND,
            "RedisStore::charge's future is {charge} bytes"
        );
    }
}
