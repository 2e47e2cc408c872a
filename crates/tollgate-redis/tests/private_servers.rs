//! RedisStore against private `redis-server` processes that the tests pause, kill, restart, flush and replicate:
//! each fault follows the configured failure policy, no call waits for a dead server, and decisions resume when
//! Redis returns.

mod common;

use std::error::Error as _;
use std::time::{Duration, Instant};

use tollgate_core::{FailurePolicy, Outcome, Policy, Quota, Store, StoreError};
use tollgate_redis::{BackendError, CircuitState, EvictionCheck, RedisStore};
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::RejectionKind;

/// The timeout of the stores that meet a paused server (what those tests exercise).
const TIMEOUT: Duration = Duration::from_millis(100);
/// The timeout of every call that needs a healthy server: generous, so a loaded machine cannot fail it.
const HEALTHY: Duration = Duration::from_secs(5);
const COOL_DOWN: Duration = Duration::from_millis(200);

/// A store whose calls time out quickly, for the tests that pause the server.
async fn fault_store(server: &RedisServer) -> RedisStore {
    store_with_timeout(server, TIMEOUT).await
}

/// A store for a healthy (or killed: refused at once) server.
async fn healthy_store(server: &RedisServer) -> RedisStore {
    store_with_timeout(server, HEALTHY).await
}

async fn store_with_timeout(server: &RedisServer, timeout: Duration) -> RedisStore {
    RedisStore::builder(server.url())
        .namespace("faults")
        .timeout(timeout)
        .circuit_breaker(3, COOL_DOWN)
        .build()
        .await
        .unwrap()
}

/// Polls until Redis decides again (the circuit's cool-down, a reconnect), for at most 10 s.
async fn until_redis_decides(
    store: &RedisStore,
    key: &str,
    policy: &Policy,
) -> tollgate_core::Decision {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.check(key, policy, 1).await {
            Ok(d) => return d,
            Err(e) => assert!(Instant::now() < deadline, "Redis did not come back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The call came back although the server could not answer: bounded by the timeout, not by the server. (The bound
/// is loose on purpose: it separates "returned after the timeout" from "waited for the server", not fast from slow.)
fn assert_bounded(started: Instant) {
    assert!(
        started.elapsed() < TIMEOUT * 20,
        "a call waited {:?} for a dead server",
        started.elapsed()
    );
}

#[tokio::test]
async fn sigstop_hang_times_out_opens_the_circuit_and_recovers() {
    let server = RedisServer::start();
    let healthy = healthy_store(&server).await;
    let store = fault_store(&server).await;
    let policy = common::hourly_bucket(3);
    assert_eq!(healthy.check("k", &policy, 1).await.unwrap().remaining, 2);

    server.pause();
    let mut kinds = Vec::new();
    for _ in 0..6 {
        let started = Instant::now();
        let err = store.check("k", &policy, 1).await.unwrap_err();
        assert_bounded(started);
        kinds.push(err.kind());
    }
    assert_eq!(
        kinds,
        [
            "timeout",
            "timeout",
            "timeout",
            "circuit_open",
            "circuit_open",
            "circuit_open"
        ]
    );
    assert_eq!(store.circuit_state(), CircuitState::Open);
    // The layer's failure policy answers the store's error: fail open, with no invented numbers.
    let mut open = common::limited(store.clone(), policy, FailurePolicy::Open);
    let started = Instant::now();
    let reply = common::call(&mut open, "k").await.unwrap();
    assert_bounded(started);
    assert!(
        reply.0.is_empty(),
        "a failed-open admission carries no decision"
    );

    server.resume();
    let d = until_redis_decides(&store, "fresh", &policy).await;
    assert_eq!(store.circuit_state(), CircuitState::Closed);
    assert_eq!((d.outcome, d.remaining), (Outcome::Allowed, 2));
    // The state survived the pause. Requests that timed out were already on the wire and ran when the server
    // woke up (as any timed-out write may): at least the first request and this one are counted.
    let d = healthy.check("k", &policy, 1).await.unwrap();
    assert!(d.remaining <= 1, "{d:?}");
}

#[tokio::test]
async fn sigkill_fails_closed_and_a_restarted_empty_server_starts_fresh() {
    let mut server = RedisServer::start();
    let store = healthy_store(&server).await;
    let policy = common::hourly_window(3);
    let mut closed = common::limited(store.clone(), policy, FailurePolicy::Closed);
    for _ in 0..3 {
        let reply = common::call(&mut closed, "k").await.unwrap();
        assert!(reply.0.iter().next().unwrap().decision.is_allowed());
    }
    server.kill();
    // A killed server refuses connections at once: no call waits, whatever the timeout.
    for _ in 0..5 {
        let started = Instant::now();
        let err = common::call(&mut closed, "k").await.unwrap_err();
        assert_bounded(started);
        let rejection = common::rejection(&err);
        assert_eq!(rejection.kind(), RejectionKind::StoreUnavailable);
        assert!(
            rejection.retry_after().unwrap() >= Duration::from_secs(1),
            "{rejection:?}"
        );
    }
    assert!(matches!(
        store.check("k", &policy, 1).await,
        Err(StoreError::CircuitOpen | StoreError::Backend(_) | StoreError::Timeout(_))
    ));

    server.restart();
    // The restarted server is empty (and has no scripts): a fresh window, its scripts loaded again.
    let d = until_redis_decides(&store, "k", &policy).await;
    assert_eq!((d.outcome, d.remaining), (Outcome::Allowed, 2));
}

#[tokio::test]
async fn local_fallback_keeps_a_per_instance_limit_while_redis_is_down() {
    let metrics = common::CountingRecorder::global();
    let mut server = RedisServer::start();
    let store = healthy_store(&server).await;
    let policy = common::hourly_bucket(3);
    let mut local = common::limited(store.clone(), policy, FailurePolicy::Local);
    server.kill();
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        outcomes.push(common::call(&mut local, "k").await.is_ok());
    }
    assert_eq!(outcomes, [true, true, true, false, false]);
    // Every store error is counted once, by kind, by the layer that answered it (only this test uses the local
    // policy); the fallback's admissions are counted as such.
    assert_eq!(
        metrics.sum(&["tollgate_store_errors_total", "failure_policy=local"]),
        5
    );
    assert_eq!(
        metrics.sum(&[
            "tollgate_store_errors_total",
            "failure_policy=local",
            "kind=circuit_open"
        ]),
        2
    );
    assert_eq!(
        metrics.sum(&["tollgate_decisions_total", "outcome=store_error_local"]),
        3
    );
    assert!(metrics.sum(&[tollgate_redis::LATENCY_SECONDS, "outcome=error"]) >= 3);
    server.restart();
    let d = until_redis_decides(&store, "k", &policy).await;
    assert_eq!(
        d.remaining, 2,
        "Redis's own state, not the local one, decides again"
    );
}

#[tokio::test]
async fn script_flush_is_survived_transparently_and_state_is_kept() {
    let server = RedisServer::start();
    let store = healthy_store(&server).await;
    let bucket = common::hourly_bucket(5);
    let window = common::hourly_window(5);
    for policy in [&bucket, &window] {
        assert_eq!(store.check("k", policy, 1).await.unwrap().remaining, 4);
        assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
        assert_eq!(store.check("k", policy, 1).await.unwrap().remaining, 3);
        assert_eq!(store.check("k", policy, 1).await.unwrap().remaining, 2);
    }
    let info = server.cli(&["INFO", "commandstats"]);
    let calls = common::command_calls(&info, &["info", "config", "script", "client", "hello"]);
    let get = |name: &str| calls.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c);
    // The connection loaded every script when it was made, and the start-up probe decision and permission probe
    // ran one EVALSHA each. Then: the
    // bucket's first call is one EVALSHA; after the flush, NOSCRIPT (a failed call, counted in `calls` and
    // `failed_calls`) and one EVAL that runs and reloads the script; then EVALSHA. The flush removed the window's
    // script too, so its first call is NOSCRIPT + EVAL, as is its call after its own flush; then EVALSHA.
    assert_eq!(get("eval"), 3, "{calls:?}");
    assert_eq!(get("evalsha"), 8, "{calls:?}");
    let evalsha = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or_default();
    assert!(evalsha.contains("failed_calls=3"), "{info}");
}

#[tokio::test]
async fn exactly_one_command_per_decision() {
    let server = RedisServer::start();
    let store = healthy_store(&server).await;
    let policy = Policy::token_bucket(Quota::per_second(1_000).unwrap());
    let window = Policy::sliding_window(Quota::per_second(1_000).unwrap()).unwrap();
    // Load both scripts, then count from zero.
    store.check("warm", &policy, 1).await.unwrap();
    store.check("warm", &window, 1).await.unwrap();
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
    let decisions = 200;
    for i in 0..decisions {
        let p = if i % 2 == 0 { &policy } else { &window };
        store.check(&format!("key{}", i % 7), p, 1).await.unwrap();
    }
    let info = server.cli(&["INFO", "commandstats"]);
    // Commands the script runs inside Redis are counted too; what the client sent is everything else.
    let calls = common::command_calls(
        &info,
        &[
            "info",
            "config|resetstat",
            "time",
            "hmget",
            "hset",
            "pexpire",
        ],
    );
    assert_eq!(calls, [("evalsha".to_owned(), decisions)], "{info}");
}

/// `calls=` and `failed_calls=` of one `INFO commandstats` line (0 when the command was not run).
fn calls_of(server: &RedisServer, command: &str) -> (u64, u64) {
    let info = server.cli(&["INFO", "commandstats"]);
    let Some(line) = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
    else {
        return (0, 0);
    };
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("calls="), field("failed_calls="))
}

/// The scripts a connection loads: the token bucket and the sliding window, each also wrapped in the store
/// operations (peek, lockouts), as its charge after the response and as its token lease; the fixed window and its
/// store operations; several limits decided as one; the start-up permission probe; and the three concurrency-lease
/// scripts.
const PINNED: u64 = 15;

#[tokio::test]
async fn scripts_are_loaded_at_start_and_after_a_reconnect_so_a_decision_is_one_evalsha() {
    let mut server = RedisServer::start();
    let store = healthy_store(&server).await;
    // Start-up: one connection, which loaded every script, then the probe decision and the permission probe.
    assert_eq!(calls_of(&server, "script|load"), (PINNED, 0));
    assert_eq!(calls_of(&server, "evalsha"), (2, 0));
    let bucket = common::hourly_bucket(5);
    let window = common::hourly_window(5);
    let four_decisions = |prefix: &'static str| {
        let store = store.clone();
        async move {
            for policy in [&bucket, &window] {
                for remaining in [4, 3] {
                    let d = store.check(prefix, policy, 1).await.unwrap();
                    assert_eq!(d.remaining, remaining);
                }
            }
        }
    };
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
    four_decisions("before").await;
    assert_eq!(
        calls_of(&server, "evalsha"),
        (4, 0),
        "one EVALSHA per decision"
    );
    assert_eq!(calls_of(&server, "eval"), (0, 0));

    // A restarted server is empty, scripts included: the store's new connection loads them before deciding.
    server.restart();
    let _ = until_redis_decides(&store, "reconnect", &bucket).await;
    let (loads, failed) = calls_of(&server, "script|load");
    assert!(
        loads >= PINNED && loads % PINNED == 0 && failed == 0,
        "{loads} loads"
    );
    assert_eq!(
        calls_of(&server, "evalsha").1,
        0,
        "no NOSCRIPT after the reconnect"
    );
    assert_eq!(calls_of(&server, "eval"), (0, 0), "no EVAL fallback needed");
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
    four_decisions("after").await;
    assert_eq!(
        calls_of(&server, "evalsha"),
        (4, 0),
        "one EVALSHA per decision"
    );
    assert_eq!(calls_of(&server, "eval"), (0, 0));
}

#[tokio::test]
async fn a_replica_answers_readonly_which_is_reported_and_handled_by_the_failure_policy() {
    let primary = RedisServer::start();
    let replica = RedisServer::replica_of(&primary);
    let store = RedisStore::builder(replica.url())
        .namespace("replica")
        .timeout(HEALTHY)
        .build()
        .await
        .unwrap();
    let policy = common::hourly_bucket(3);
    let err = store.check("k", &policy, 1).await.unwrap_err();
    let backend = err
        .source()
        .and_then(|s| s.downcast_ref::<BackendError>())
        .expect("a backend error");
    assert!(matches!(backend, BackendError::ReadOnly(_)), "{backend:?}");
    assert!(err.to_string().contains("replica"), "{err}");
    let mut closed = common::limited(store, policy, FailurePolicy::Closed);
    let err = common::call(&mut closed, "k").await.unwrap_err();
    assert_eq!(
        common::rejection(&err).kind(),
        RejectionKind::StoreUnavailable,
        "fail closed"
    );
    assert_eq!(replica.cli(&["DBSIZE"]), "0");
    assert_eq!(primary.cli(&["DBSIZE"]), "0");
}

/// Connections the server has accepted so far (counting the one `redis-cli` opens to ask).
fn connections_received(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "stats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has total_connections_received")
}

#[tokio::test]
async fn a_connection_the_server_closed_while_idle_costs_no_decision() {
    // `timeout 1`: the server drops a client idle for a second, as proxies and load balancers do after theirs.
    let server = RedisServer::start_with(&["--timeout", "1"]);
    let store = healthy_store(&server).await;
    let policy = common::hourly_bucket(10);
    let before = connections_received(&server);
    for remaining in [9, 8, 7] {
        // Long enough for the server to close the idle connection (it checks its clients about every 100 ms).
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let d = store.check("k", &policy, 1).await.unwrap();
        assert_eq!(d.remaining, remaining);
    }
    assert_eq!(store.circuit_state(), CircuitState::Closed);
    // The server did close the store's connection, three times: each decision came on a new one (and the
    // `redis-cli` that asks opens one more).
    let after = connections_received(&server);
    assert!(
        after - before > 3,
        "{before} connections before, {after} after"
    );
}

#[tokio::test]
async fn a_primary_demoted_to_replica_has_its_connection_replaced() {
    // A failover turns the primary into a replica and keeps its clients connected: every decision is READONLY
    // until the connection is made again (to the host name, which the failover may now point elsewhere).
    let primary = RedisServer::start();
    let other = RedisServer::start();
    let store = healthy_store(&primary).await;
    let policy = common::hourly_bucket(3);
    assert_eq!(store.check("k", &policy, 1).await.unwrap().remaining, 2);
    let port = other.url().rsplit(':').next().unwrap().to_owned();
    assert_eq!(primary.cli(&["REPLICAOF", "127.0.0.1", &port]), "OK");
    let before = connections_received(&primary);
    for _ in 0..2 {
        let err = store.check("k", &policy, 1).await.unwrap_err();
        let backend = err.source().and_then(|s| s.downcast_ref::<BackendError>());
        assert!(matches!(backend, Some(BackendError::ReadOnly(_))), "{err}");
    }
    // Less the one `redis-cli` opens to ask.
    let made = connections_received(&primary) - before - 1;
    assert!(
        made >= 1,
        "the connection that answered READONLY was used again"
    );
}

#[tokio::test]
async fn the_eviction_policy_is_checked_at_start_up() {
    let safe = RedisServer::start();
    let store = healthy_store(&safe).await;
    assert_eq!(store.eviction_check(), &EvictionCheck::NoEviction);

    let lru = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let store = healthy_store(&lru).await;
    assert_eq!(
        store.eviction_check(),
        &EvictionCheck::Evicting("allkeys-lru".into())
    );
    assert_eq!(
        store.check_eviction_policy().await,
        EvictionCheck::Evicting("allkeys-lru".into())
    );

    // Managed services often forbid CONFIG: the check says it could not tell.
    let locked = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    let store = healthy_store(&locked).await;
    assert!(
        matches!(store.eviction_check(), EvictionCheck::Unknown(why) if why.contains("CONFIG") || why.contains("unknown command")),
        "{:?}",
        store.eviction_check()
    );
    // Deciding does not need CONFIG.
    assert!(
        store
            .check("k", &common::hourly_bucket(1), 1)
            .await
            .unwrap()
            .is_allowed()
    );
}

#[tokio::test]
async fn the_store_returns_its_errors_to_the_limiter() {
    let mut server = RedisServer::start();
    let store = healthy_store(&server).await;
    let policy = common::hourly_bucket(3);
    assert!(store.check("k", &policy, 1).await.unwrap().is_allowed());
    server.kill();
    let started = Instant::now();
    let err = store.check("k", &policy, 1).await.unwrap_err();
    assert_bounded(started);
    assert!(
        matches!(err, StoreError::Backend(_)),
        "refused at once: {err:?}"
    );
    let err = store
        .check_at("k", &policy, 1, tollgate_core::Timestamp::from_micros(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Backend(_) | StoreError::CircuitOpen),
        "{err:?}"
    );
}

/// The count of `EVALSHA` and `EVAL` calls a private server has served.
fn server_script_calls(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let rest = l
                .strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| l.strip_prefix("cmdstat_eval:calls="))?;
            rest.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// `script_calls` counts what Redis itself counts: every decision one script, shared by the store's clones, and
/// none while the circuit is open.
#[tokio::test]
async fn script_calls_are_the_servers_own_count() {
    let server = RedisServer::start();
    let store = healthy_store(&server).await;
    let clone = store.clone();
    let policy = Policy::token_bucket(Quota::per_second(3).unwrap());
    let (ours, theirs) = (store.script_calls(), server_script_calls(&server));
    for i in 0..10 {
        let s = if i % 2 == 0 { &store } else { &clone };
        s.check("k", &policy, 1).await.unwrap();
    }
    assert_eq!(store.script_calls() - ours, 10);
    assert_eq!(server_script_calls(&server) - theirs, 10);
    assert_eq!(clone.script_calls(), store.script_calls());
    // Paused: three timeouts open the circuit (for a minute: open for the rest of the test however slow the
    // machine), after which the store sends nothing.
    let faulty = RedisStore::builder(server.url())
        .namespace("calls")
        .timeout(TIMEOUT)
        .circuit_breaker(3, Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let before = faulty.script_calls();
    server.pause();
    for _ in 0..3 {
        assert!(faulty.check("k", &policy, 1).await.is_err());
    }
    assert!(matches!(
        faulty.check("k", &policy, 1).await,
        Err(StoreError::CircuitOpen)
    ));
    server.resume();
    assert_eq!(faulty.script_calls() - before, 3);
}
