//! Sentinel: private setups of one primary, one replica and three `redis-sentinel` processes. While requests flow
//! through three tollgate layers (failing open, closed and to a local limit), the primary is failed over with
//! `SENTINEL FAILOVER` or killed with SIGKILL. Under each policy, decisions come from Redis again within 10 s; no
//! limiter call reaches a replica (the servers run with `replica-read-only no`, so one would succeed there
//! silently and be counted); and the limit holds afterwards on the new primary. The `SENTINEL FAILOVER` case runs
//! over TLS too (servers and Sentinels TLS-only, mutual TLS, one CA), where a wrong CA or a missing client
//! certificate is a typed start-up error. Where the demoted primary keeps its clients (Sentinel's `CLIENT KILL`
//! neutralized), only the store's `+switch-master` watcher moves it: every call after the watcher logs the switch
//! is decided on the new primary.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{Decision, FailurePolicy, Policy, Store, StoreError};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::{RedisSentinels, SENTINEL_MASTER, SentinelSetup, unique_prefix};

/// How soon decisions come from Redis again once the Sentinels name the new primary.
const RESUME_WITHIN: Duration = Duration::from_secs(10);

/// A store that remembers when each of its Redis calls succeeded or failed, and passes every answer on.
#[derive(Clone)]
struct Recording {
    inner: RedisStore,
    log: Arc<Mutex<Vec<(Instant, bool)>>>,
}

impl Store for Recording {
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
        let result = self.inner.check(key, policy, cost).await;
        self.log
            .lock()
            .unwrap()
            .push((Instant::now(), result.is_ok()));
        result
    }
}

impl Recording {
    /// Redis deciding again: the first success after the new primary was named (`switched`) and after every
    /// failure since the failover began (`since`).
    fn resumed_after(&self, since: Instant, switched: Instant) -> Option<Instant> {
        let log = self.log.lock().unwrap();
        let last_failure = log
            .iter()
            .filter(|(at, ok)| *at >= since && !ok)
            .map(|(at, _)| *at)
            .max()
            .unwrap_or(since)
            .max(switched);
        log.iter()
            .find(|(at, ok)| *ok && *at > last_failure)
            .map(|(at, _)| *at)
    }
}

/// The store's builder for `setup`: over TLS (the setup's CA and client certificate) when the setup speaks it.
fn sentinel_builder(setup: &RedisSentinels, namespace: &str) -> tollgate_redis::RedisStoreBuilder {
    let builder = RedisStore::sentinel_builder(setup.addrs(), SENTINEL_MASTER)
        .namespace(namespace)
        .timeout(Duration::from_secs(2))
        .circuit_breaker(3, Duration::from_millis(200));
    match setup.tls() {
        Some(files) => builder
            .tls_ca_file(&files.ca)
            .tls_client_cert_files(&files.client_cert, &files.client_key),
        None => builder,
    }
}

async fn sentinel_store(setup: &RedisSentinels, namespace: &str) -> RedisStore {
    sentinel_builder(setup, namespace)
        .build()
        .await
        .expect("the Sentinel store builds")
}

/// `calls=` of `cmdstat_evalsha` and `cmdstat_eval` together on `server`.
fn script_calls(server: &tollgate_testkit::redis::RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

async fn failover_while_requests_flow(kill: bool, tls: bool) {
    let mut setup = tokio::task::block_in_place(|| {
        if tls {
            RedisSentinels::start_tls()
        } else {
            RedisSentinels::start()
        }
    });
    let old_primary = setup.primary_port();
    let namespace = unique_prefix("sentinel");
    let plenty = common::hourly_bucket(1_000_000);
    let policies = [
        FailurePolicy::Open,
        FailurePolicy::Closed,
        FailurePolicy::Local,
    ];
    let mut recordings = Vec::new();
    let mut flows = Vec::new();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for on_error in policies {
        let recording = Recording {
            inner: sentinel_store(&setup, &namespace).await,
            log: Arc::default(),
        };
        let mut svc = common::limited(recording.clone(), plenty, on_error);
        recordings.push(recording);
        let stop = Arc::clone(&stop);
        flows.push(tokio::spawn(async move {
            let mut answered = 0_u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Every request gets an answer: from Redis, or from the failure policy.
                let _ = common::call(&mut svc, "flow").await;
                answered += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            answered
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for r in &recordings {
        assert!(
            r.log.lock().unwrap().iter().any(|(_, ok)| *ok),
            "decisions flow before the failover"
        );
    }

    let started = Instant::now();
    if kill {
        setup.kill_primary();
    } else {
        setup.failover();
    }
    let switched = tokio::task::block_in_place(|| setup.wait_for_new_primary(old_primary));
    let new_primary = setup.primary_port();
    // Resumed: for each policy, a successful Redis decision after the last failure since the failover began.
    // Counted from the Sentinels' switch: the store cannot resume on a primary before there is one.
    let deadline = started + switched + RESUME_WITHIN;
    let mut resumed = Vec::new();
    for (r, policy) in recordings.iter().zip(policies) {
        loop {
            if let Some(at) = r.resumed_after(started, started + switched) {
                resumed.push((policy, at - started));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{policy}: no decision from Redis within {RESUME_WITHIN:?} of the new primary"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let demoted = (!kill).then_some(old_primary);
    if let Some(port) = demoted {
        // The old primary becomes a replica once Sentinel reconfigures it; from then on no limiter call may
        // reach it.
        let server = setup.server(port);
        tokio::task::block_in_place(|| {
            server.wait_until_for(
                "demotion to replica",
                RedisSentinels::FAILOVER_WITHIN,
                || server.cli(&["ROLE"]).starts_with("slave"),
            );
        });
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for flow in flows {
        assert!(flow.await.unwrap() > 0);
    }

    // The limit holds afterwards, decided on the new primary.
    let store = &recordings[1].inner;
    let limit = common::hourly_bucket(3);
    for remaining in [2, 1, 0] {
        assert_eq!(
            store.check("after", &limit, 1).await.unwrap().remaining,
            remaining
        );
    }
    assert!(!store.check("after", &limit, 1).await.unwrap().is_allowed());
    let key = store.redis_key("after", limit.algorithm());
    let primary = setup.server(new_primary);
    assert_eq!(
        primary.cli(&["EXISTS", &key]),
        "1",
        "the state is on the new primary"
    );
    if let Some(port) = demoted {
        assert_eq!(
            script_calls(setup.server(port)),
            0,
            "a limiter call reached the demoted primary after it became a replica"
        );
    }
    eprintln!(
        "failover ({}{}): Sentinel named the new primary after {switched:?}; decisions resumed after {resumed:?}",
        if kill {
            "SIGKILL of the primary"
        } else {
            "SENTINEL FAILOVER"
        },
        if tls { ", over TLS" } else { "" }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_while_requests_flow() {
    failover_while_requests_flow(false, false).await;
}

/// The same over TLS only: the store finds the primary through Sentinels it reaches over TLS, trusting the setup's
/// CA and presenting its client certificate to the Sentinels and the servers alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_over_tls_while_requests_flow() {
    failover_while_requests_flow(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_primary_while_requests_flow() {
    failover_while_requests_flow(true, false).await;
}

#[tokio::test]
async fn an_unknown_master_name_or_no_sentinel_is_reported() {
    let err = RedisStore::sentinel_builder(Vec::<String>::new(), SENTINEL_MASTER)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, tollgate_redis::BuildError::InvalidSetting(_)),
        "{err:?}"
    );
    let err = RedisStore::sentinel_builder(["127.0.0.1"], SENTINEL_MASTER)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, tollgate_redis::BuildError::InvalidUrl(_)),
        "{err:?}"
    );
}

/// Over TLS, a set-up mistake is the same typed error as against a standalone TLS server: a CA that did not sign
/// the Sentinels' certificates, or no client certificate where the Sentinels demand one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mistakes_towards_the_sentinels_are_typed() {
    let setup = tokio::task::block_in_place(RedisSentinels::start_tls);
    let files = setup.tls().expect("a TLS setup").clone();
    let namespace = unique_prefix("sentinel-tls");
    let dir = std::env::temp_dir().join(unique_prefix("sentinel-other-ca"));
    std::fs::create_dir_all(&dir).unwrap();
    let other = tollgate_testkit::tls::TlsFiles::unrelated_ca(&dir.join("ca.pem"));
    let err = sentinel_builder(&setup, &namespace)
        .tls_ca_file(&other)
        .build()
        .await
        .unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        matches!(err, tollgate_redis::BuildError::CertificateUntrusted(_)),
        "{err:?}"
    );
    let err = RedisStore::sentinel_builder(setup.addrs(), SENTINEL_MASTER)
        .namespace(&namespace)
        .timeout(Duration::from_secs(2))
        .tls_ca_file(&files.ca)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, tollgate_redis::BuildError::Tls(_)), "{err:?}");
    // The right material builds and decides.
    let store = sentinel_store(&setup, &namespace).await;
    let limit = common::hourly_bucket(1);
    assert!(store.check("k", &limit, 1).await.unwrap().is_allowed());
    assert!(!store.check("k", &limit, 1).await.unwrap().is_allowed());
}

/// The store's log lines announcing a switch (the `switch` field: `<master> <old ip> <old port> <new ip> <new
/// port>`), each with the instant it was logged.
static SWITCHES: Mutex<Vec<(Instant, String)>> = Mutex::new(Vec::new());

/// A tracing subscriber that records the store's `Sentinel announced a new primary` lines in [`SWITCHES`] and
/// nothing else: the watcher logs one once it has moved the pool on, which is the instant the test measures from.
struct SwitchLog;

struct SwitchField(Option<String>);

impl tracing::field::Visit for SwitchField {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "switch" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl tracing::Subscriber for SwitchLog {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "tollgate_redis::sentinel" && metadata.is_event()
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut switch = SwitchField(None);
        event.record(&mut switch);
        if let Some(switch) = switch.0 {
            SWITCHES.lock().unwrap().push((Instant::now(), switch));
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// When the store logged the switch from port `old` to port `new`.
async fn switch_logged(old: u16, new: u16) -> Instant {
    let wanted = format!("{SENTINEL_MASTER} 127.0.0.1 {old} 127.0.0.1 {new}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((at, _)) = SWITCHES.lock().unwrap().iter().find(|(_, s)| *s == wanted) {
            return *at;
        }
        assert!(
            Instant::now() < deadline,
            "the store never logged the switch {wanted:?}: {:?}",
            SWITCHES.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Sentinels' `+switch-master` is what moves the store when nothing else does: here the demoted primary keeps
/// its clients (the Sentinels' `CLIENT KILL` is neutralized) and, running `replica-read-only no`, keeps accepting
/// their writes, so a store that did not follow the announcement would go on deciding on the demoted server,
/// silently, for good. Every call that starts after the store logs the switch (the watcher logs it once it has
/// moved the pool on) must be decided on the new primary: its key is there. And once the old primary is a
/// replica, no call reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_switch_master_every_call_is_decided_on_the_new_primary() {
    every_call_after_the_switch_on_the_new_primary(false).await;
}

/// The same over TLS: the watcher subscribes to Sentinels that speak TLS only and demand a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_switch_master_over_tls_every_call_is_decided_on_the_new_primary() {
    every_call_after_the_switch_on_the_new_primary(true).await;
}

async fn every_call_after_the_switch_on_the_new_primary(tls: bool) {
    let _ = tracing::subscriber::set_global_default(SwitchLog);
    let setup = tokio::task::block_in_place(|| {
        RedisSentinels::start_with(SentinelSetup {
            tls,
            keep_clients_on_demotion: true,
        })
    });
    let old_primary = setup.primary_port();
    let store = sentinel_store(&setup, &unique_prefix("sentinel-watch")).await;
    // The watcher subscribes in the background: an announcement before that would be missed.
    tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !setup
            .sentinel_cli(0, &["CLIENT", "LIST"])
            .lines()
            .any(|l| l.split_whitespace().any(|f| f == "sub=1"))
        {
            assert!(
                Instant::now() < deadline,
                "the store's watcher did not subscribe to the first Sentinel"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    });

    // One call at a time, each on a key of its own, so where each was decided can be read off the servers (a
    // bucket of 2 an hour keeps a key it spent from for half an hour).
    let policy = common::hourly_bucket(2);
    let calls: Arc<Mutex<Vec<(String, Instant, bool)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flow = {
        let (store, calls, stop) = (store.clone(), Arc::clone(&calls), Arc::clone(&stop));
        tokio::spawn(async move {
            for n in 0_u64.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let key = format!("call-{n}");
                let started = Instant::now();
                let ok = store.check(&key, &policy, 1).await.is_ok();
                calls.lock().unwrap().push((key, started, ok));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    // Waits until `count` calls started after `since` were decided by Redis.
    let decided = async |count: usize, since: Instant| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let done = calls
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, at, ok)| *ok && *at > since)
                .count();
            if done >= count {
                return;
            }
            assert!(Instant::now() < deadline, "{done} of {count} calls decided");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    decided(5, Instant::now()).await;

    let failover = Instant::now();
    setup.failover();
    let _ = tokio::task::block_in_place(|| setup.wait_for_new_primary(old_primary));
    let new_primary = setup.primary_port();
    let switched = switch_logged(old_primary, new_primary).await;
    // The demoted primary keeps the store's old connection; from its demotion on, nothing may reach it.
    let demoted = setup.server(old_primary);
    tokio::task::block_in_place(|| {
        demoted.wait_until_for(
            "demotion to replica",
            RedisSentinels::FAILOVER_WITHIN,
            || demoted.cli(&["ROLE"]).starts_with("slave"),
        );
    });
    assert_eq!(demoted.cli(&["CONFIG", "RESETSTAT"]), "OK");
    decided(20, Instant::now()).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flow.await.unwrap();

    let after: Vec<String> = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, at, ok)| *ok && *at > switched)
        .map(|(key, _, _)| store.redis_key(key, policy.algorithm()))
        .collect();
    assert!(
        after.len() >= 20,
        "calls decided after the switch: {after:?}"
    );
    let reached_demoted = script_calls(demoted);
    // A key on the new primary was written there: it stopped replicating from the old one (`REPLICAOF NO ONE`)
    // before Sentinel announced the switch.
    let primary = setup.server(new_primary);
    let mut exists = vec!["EXISTS"];
    exists.extend(after.iter().map(String::as_str));
    let missing: Vec<&String> = if primary.cli(&exists) == after.len().to_string() {
        Vec::new()
    } else {
        after
            .iter()
            .filter(|key| primary.cli(&["EXISTS", key]) != "1")
            .collect()
    };
    assert!(
        missing.is_empty() && reached_demoted == 0,
        "{} of {} calls started after the store logged the switch were not decided on the new primary ({:?}…); \
         {reached_demoted} limiter calls reached the demoted primary after it became a replica",
        missing.len(),
        after.len(),
        &missing[..missing.len().min(3)]
    );
    eprintln!(
        "watcher{}: {} calls started after the store logged the switch ({:?} after SENTINEL FAILOVER), each \
         decided on the new primary",
        if tls { " over TLS" } else { "" },
        after.len(),
        switched - failover
    );
}
