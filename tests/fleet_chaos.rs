//! A chaos run of the fleet, as black boxes over real TCP: four `examples/axum_server --leases` instances (the deny
//! cache on, as it is by default on Redis) find their Redis through three Sentinels and hammer one key, while one
//! instance is SIGKILLed, the primary is restarted without persistence, and Sentinel fails it over.
//!
//! What must hold:
//! - **admissions** (200s), counted per second of the run and over the run so far, stay within the plain path's
//!   bound for every store state the fleet could decide on in that time, plus what the docs say may be re-granted
//!   when Redis forgets (see [`Epoch`] and [`bound`]);
//! - **every request is answered**, with 200, 429 or the failure policy's 503 (`--on-store-error closed`, the
//!   example's default), within the limiter's longest path ([`LIMITER_PATH`]) plus what the machine takes to answer
//!   a request the limiter never sees (`/health`, measured through the run);
//! - no limiter call reaches the demoted primary once Sentinel made it a replica, and the fleet decides on the new
//!   primary afterwards.
//!
//! The primary is restarted for real (SIGKILL, then the same port again, without persistence), not flushed: it
//! comes back within the Sentinels' `down-after-milliseconds`, so it stays the primary, and its replica resyncs
//! from it empty; the failover then promotes that replica.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use tollgate_testkit::examples::ExampleServer;
use tollgate_testkit::redis::{RedisSentinels, SENTINEL_MASTER};

/// The policy the instances run: 100 per second, a bucket of 20, batches of up to half the bucket (10 tokens).
/// A small bucket beside the rate keeps the per-second bound close to what a hammered key is admitted (about the
/// rate), and a batch that large makes what the leases hold at each event matter.
const LIMIT: u64 = 100;
const PERIOD: Duration = Duration::from_secs(1);
const BURST: u64 = 20;
const LEASE_SHARE: &str = "50";

/// How long a token bucket lease lives: `LeaseConfig::new()`'s default, the period (at least 100 ms, at most 10 s).
/// A batch is spent only before its deadline (the instance's send instant + this, less a margin), so the tokens a
/// store state granted are all spent within this of the last instant it granted any.
const LEASE_TTL: Duration = PERIOD;

/// The store's timeout, which the example servers leave at the builder's default: every Redis call (a decision, a
/// lease fetch, connecting included) fails past it, and the failure policy answers.
const STORE_TIMEOUT: Duration = tollgate::redis::DEFAULT_TIMEOUT;

/// How long a request waits for its key's lease fetch under way (`LeaseConfig::wait`'s default, 1 s): past it, or
/// when the fetch fails, the failure policy answers. A request the fetch does not decide then takes the plain path.
const LEASE_WAIT: Duration = Duration::from_secs(1);

/// On the plain path, a request waits for at most 4 flights of the deny cache's single flight on its key (each one
/// store call, bounded by the store's timeout: `docs/design/deny-cache.md`, "Single flight on expiry"), then asks
/// the store itself.
const DENY_CACHE_FLIGHTS: u32 = 4;

/// The longest a request spends in the rate limiter: the lease wait, then the plain path's flights and its own store
/// call. The failure policy answers a store error at once (`closed`: a local 503).
const LIMITER_PATH: Duration = LEASE_WAIT
    .saturating_add(STORE_TIMEOUT.saturating_mul(DENY_CACHE_FLIGHTS))
    .saturating_add(STORE_TIMEOUT);

/// The rate at which the store's clock (Redis's `TIME`, on which the bucket refills) may run ahead of the test's:
/// an NTP daemon slews either clock by at most 500 ppm (Linux's bound; `docs/design/deny-cache.md`).
const DRIFT_PPM: u128 = 500;

/// A request still unanswered after this is reported as unanswered (any answer later than [`LIMITER_PATH`] and the
/// machine's own delay fails the run anyway).
const HANG: Duration = Duration::from_secs(20);

/// Client threads per instance on the limited route, and the pause between two `/health` probes.
const HAMMERS: usize = 2;
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// The instance that is SIGKILLed.
const VICTIM: usize = 3;

/// One answered request: to which instance and route, when it was sent and answered, and its status.
#[derive(Debug, Clone, Copy)]
struct Answer {
    instance: usize,
    path: &'static str,
    sent: Instant,
    answered: Instant,
    status: u16,
}

/// `GET path` over a new connection (`connection: close`), read to its end: the status, or the I/O error.
fn exchange(addr: SocketAddr, path: &str) -> io::Result<u16> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(HANG))?;
    stream.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: example\r\nconnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let head = String::from_utf8_lossy(&response);
    head.lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no status: {head:?}")))
}

/// What one client thread saw: its answers, and the requests that got none (an I/O error, or a hang).
#[derive(Debug, Default)]
struct Seen {
    answers: Vec<Answer>,
    failures: Vec<String>,
}

/// Requests `path` on `addr` one after the other until `stop`, pausing `pause` between two. A request to the victim
/// that fails after it was killed (`killed` set before the signal is sent) ends the thread: a dead process answers
/// nothing, and what it admitted before is counted from the answers that arrived.
fn client(
    instance: usize,
    addr: SocketAddr,
    path: &'static str,
    pause: Duration,
    stop: &AtomicBool,
    killed: &OnceLock<Instant>,
) -> Seen {
    let mut seen = Seen::default();
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        match exchange(addr, path) {
            Ok(status) => seen.answers.push(Answer {
                instance,
                path,
                sent,
                answered: Instant::now(),
                status,
            }),
            Err(_) if instance == VICTIM && killed.get().is_some() => break,
            Err(e) => seen.failures.push(format!(
                "instance {instance} {path}: no answer after {:?} ({e})",
                sent.elapsed()
            )),
        }
        if !pause.is_zero() {
            thread::sleep(pause);
        }
    }
    seen
}

/// One state of the key in Redis: from the instant the fleet could first decide on it to the last (`None`: the
/// end of the run).
///
/// The store side's proof (`token_bucket_lease`, `docs/design/token-leases.md`, "Why the fleet stays exact"):
/// leased tokens hold the bucket below its capacity, so a state's content plus the tokens its lease book counts
/// as leased are at most the burst at any instant. What the fleet spends of one state's tokens in an interval D is
/// therefore at most the burst plus what that state refills while it is alive within D, at the bucket's rate (on
/// the store's clock: [`DRIFT_PPM`]); and its batches are spent within [`LEASE_TTL`] of its end. A new state —
/// Redis forgot, so the bucket is full again — is what the plain path admits through the same loss (the burst
/// again); the batches the instances still hold from the state before are that state's tokens, spent at most until
/// their deadlines (each grant cuts an instance's batch to what the new state's record holds for it: "When the
/// store forgets"), which its burst term covers. States overlap where the fleet may decide on two servers at once:
/// between the promotion of the replica and the old primary's last limiter call.
#[derive(Debug, Clone, Copy)]
struct Epoch {
    what: &'static str,
    from: Instant,
    until: Option<Instant>,
}

/// The most the fleet can admit in `[from, to)` (decisions, local instants) over the store states `epochs`: for
/// each state whose tokens can be spent then, the burst plus its refill while alive within the interval. (Nothing
/// else adds: the deny cache only refuses — under-admission when tokens come back early; a SIGKILLed instance's
/// batch is lost, never re-granted, as its record expires at its deadline.)
fn bound(epochs: &[Epoch], from: Instant, to: Instant) -> u64 {
    let period = PERIOD.as_micros();
    // In units of a token / (period in µs × 1e6): exact integers, floored once.
    let mut scaled: u128 = 0;
    for e in epochs {
        let spent_until = e.until.map(|z| z + LEASE_TTL);
        if spent_until.is_some_and(|z| z <= from) || e.from >= to {
            continue;
        }
        scaled += u128::from(BURST) * period * 1_000_000;
        let alive_from = from.max(e.from);
        let alive_to = e.until.map_or(to, |z| z.min(to));
        let alive = alive_to.saturating_duration_since(alive_from).as_micros();
        scaled += u128::from(LIMIT) * alive * (1_000_000 + DRIFT_PPM);
    }
    u64::try_from(scaled / (period * 1_000_000)).expect("a bound in u64")
}

/// The sum of the samples of `name` whose labels include `label` in an instance's `/metrics`.
fn scraped(server: &ExampleServer, name: &str, label: &str) -> f64 {
    let reply = tollgate_testkit::http::get(server.metrics_addr(), "/metrics", &[]);
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
        .body
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// `calls=` of `cmdstat_evalsha` and `cmdstat_eval` together: the limiter's script calls a server ran.
fn script_calls(server: &tollgate_testkit::redis::RedisServer) -> u64 {
    server.command_calls("evalsha") + server.command_calls("eval")
}

#[test]
fn the_fleet_stays_within_its_bound_through_a_kill_a_redis_restart_and_a_failover() {
    let begun = Instant::now();
    let mut setup = RedisSentinels::start();
    let first_primary = setup.primary_port();
    let sentinels = setup.addrs().join(",");
    let limit = LIMIT.to_string();
    let burst = BURST.to_string();
    let flags = [
        "--limit",
        &limit,
        "--period",
        "1s",
        "--burst",
        &burst,
        "--redis-sentinel",
        &sentinels,
        "--redis-master",
        SENTINEL_MASTER,
        "--leases",
        "--lease-share",
        LEASE_SHARE,
        "--metrics-addr",
        "127.0.0.1:0",
        // The bound holds through the outage: refused while no primary answers (local would admit per instance).
        "--on-store-error",
        "closed",
    ];
    let first_state = Instant::now();
    let mut servers: Vec<ExampleServer> = (0..4)
        .map(|_| ExampleServer::start("axum_server", &flags))
        .collect();
    for server in &servers {
        let line = server.first_line();
        assert!(
            line.contains(
                "on store error closed, deny cache on, leases on (batches up to 10: 50 % of the burst at most)"
            ),
            "{line}"
        );
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(ExampleServer::addr).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(OnceLock::new());
    let started = Instant::now();
    let mut threads = Vec::new();
    for (instance, &addr) in addrs.iter().enumerate() {
        let routes =
            std::iter::repeat_n(("/", Duration::ZERO), HAMMERS).chain([("/health", PROBE_EVERY)]);
        for (path, pause) in routes {
            let (stop, killed) = (Arc::clone(&stop), Arc::clone(&killed));
            threads.push(thread::spawn(move || {
                client(instance, addr, path, pause, &stop, &killed)
            }));
        }
    }

    // The events, a few seconds apart, each once the fleet has decided for a while since the one before.
    thread::sleep(Duration::from_secs(2));
    killed.set(Instant::now()).expect("killed once");
    servers[VICTIM].signal("-KILL");
    let _ = servers[VICTIM].wait();

    thread::sleep(Duration::from_secs(2));
    setup.kill_primary();
    let forgotten = Instant::now();
    setup.restart(first_primary);
    assert_eq!(
        setup.primary_port(),
        first_primary,
        "the restarted primary must come back as the primary (within down-after-milliseconds)"
    );
    let replica = setup.replica();
    replica.wait_until("replication link up after the restart", || {
        replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
    });

    thread::sleep(Duration::from_secs(2));
    let asked = Instant::now();
    let mut refused = Vec::new();
    // Sentinel may still be refreshing what it knows of the replica after the restart: it refuses until then. The
    // replica is promoted after the Sentinel accepts, so no sooner than the attempt it accepted.
    let failover = loop {
        // A failover of the Sentinels' own (the primary unanswering for down-after-milliseconds) would promote the
        // replica before the instant the bound counts from.
        assert_eq!(
            setup.primary_port(),
            first_primary,
            "Sentinel failed over before it was asked"
        );
        let attempt = Instant::now();
        let reply = setup.sentinel_cli(0, &["SENTINEL", "FAILOVER", SENTINEL_MASTER]);
        if reply == "OK" {
            break attempt;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "SENTINEL FAILOVER: {reply}"
        );
        refused.push(reply);
        thread::sleep(Duration::from_millis(100));
    };
    let _ = setup.wait_for_new_primary(first_primary);
    let promoted = Instant::now();
    let new_primary = setup.primary_port();
    // The old primary decides for whichever instance still reaches it until Sentinel demotes it (on its next look
    // at it, some 10 s later): how many limiter calls it has run, each count with an instant taken after it was
    // read, polled until one read after the demotion was seen.
    let demoted = setup.server(first_primary);
    let mut calls_on_old = Vec::new();
    let demotion = loop {
        let replica = demoted.cli(&["ROLE"]).starts_with("slave");
        let seen = Instant::now();
        let calls = script_calls(demoted);
        calls_on_old.push((Instant::now(), calls));
        if replica {
            break seen;
        }
        assert!(
            failover.elapsed() < RedisSentinels::FAILOVER_WITHIN,
            "the old primary was not demoted within {:?} of the failover",
            RedisSentinels::FAILOVER_WITHIN
        );
        thread::sleep(Duration::from_millis(50));
    };

    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    let mut failures = Vec::new();
    for thread in threads {
        let seen = thread.join().expect("a client thread");
        answers.extend(seen.answers);
        failures.extend(seen.failures);
    }
    let ended = Instant::now();

    // Every request to a live instance was answered.
    assert!(
        failures.is_empty(),
        "{} requests got no answer: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let (health, limited): (Vec<Answer>, Vec<Answer>) =
        answers.into_iter().partition(|a| a.path == "/health");
    for a in &health {
        assert_eq!(
            a.status, 200,
            "instance {}: /health answered {}",
            a.instance, a.status
        );
    }
    // ... with the failure policy's statuses, within the limiter's longest path plus the machine's own delay.
    let overhead = health
        .iter()
        .map(|a| a.answered - a.sent)
        .max()
        .expect("health probes");
    let within = LIMITER_PATH + overhead;
    let mut statuses = [0_u64; 3];
    let mut slowest = Duration::ZERO;
    for a in &limited {
        let i = match a.status {
            200 => 0,
            429 => 1,
            503 => 2,
            other => panic!("instance {}: status {other}", a.instance),
        };
        statuses[i] += 1;
        let took = a.answered - a.sent;
        slowest = slowest.max(took);
        assert!(
            took <= within,
            "instance {}: answered {} after {took:?} (at {:?} into the run), beyond {LIMITER_PATH:?} + the \
             slowest /health answer {overhead:?}",
            a.instance,
            a.status,
            a.sent - started
        );
    }

    // The old primary ran its last limiter call before the first poll that already counted every call it ever ran
    // (the count only grows): that poll ends its state. None reached it once it was a replica (the last poll, read
    // after the demotion, counted them all); the fleet decided on the new one.
    let calls_at_end = script_calls(setup.server(first_primary));
    let left_old = calls_on_old
        .iter()
        .find(|(_, calls)| *calls == calls_at_end)
        .map(|(at, _)| *at)
        .unwrap_or_else(|| {
            panic!(
                "{calls_at_end} limiter calls reached the old primary, {} of them after it became a replica",
                calls_at_end - calls_on_old.last().map_or(0, |(_, c)| *c)
            )
        });
    assert_ne!(
        setup.server(new_primary).cli(&["DBSIZE"]),
        "0",
        "no state on the new primary"
    );
    // The leases and the deny cache were at work: each live instance admitted from leased batches.
    let mut from_batches = Vec::new();
    let mut cached_denials = 0.0;
    for (i, server) in servers.iter().enumerate().filter(|(i, _)| *i != VICTIM) {
        let local = scraped(
            server,
            "tollgate_token_lease_local_total",
            "outcome=\"allowed\"",
        );
        assert!(local > 0.0, "instance {i} admitted nothing from a batch");
        from_batches.push(local);
        cached_denials += scraped(server, "tollgate_deny_cache_hits_total", "limiter=");
    }
    let mut admitted: Vec<Answer> = limited.into_iter().filter(|a| a.status == 200).collect();
    admitted.sort_by_key(|a| a.answered);
    assert!(
        admitted.iter().any(|a| a.sent > demotion),
        "no admission after the failover"
    );

    // The store states the fleet decided on: the first primary's until it was killed; the restarted primary's
    // (empty) from then until its last limiter call, which the new primary's overlaps from the failover on (it began
    // as the replica's copy of that state, and the old primary may decide meanwhile).
    let epochs = [
        Epoch {
            what: "first primary",
            from: first_state,
            until: Some(forgotten),
        },
        Epoch {
            what: "restarted primary",
            from: forgotten,
            until: Some(left_old),
        },
        Epoch {
            what: "promoted replica",
            from: failover,
            until: None,
        },
    ];
    let seconds = (ended - started).as_secs() + 1;
    let mut report = Vec::new();
    for k in 0..seconds {
        let (start, end) = (
            started + Duration::from_secs(k),
            started + Duration::from_secs(k + 1),
        );
        // The admissions answered in this second were decided between their send and their answer.
        let second: Vec<&Answer> = admitted
            .iter()
            .filter(|a| a.answered >= start && a.answered < end)
            .collect();
        let upto = admitted.iter().filter(|a| a.answered < end).count() as u64;
        let Some(from) = second.iter().map(|a| a.sent).min() else {
            report.push(format!("{k}: 0"));
            continue;
        };
        let count = second.len() as u64;
        let allowed = bound(&epochs, from, end);
        let overall = bound(&epochs, started, end);
        let states: Vec<&str> = epochs
            .iter()
            .filter(|e| e.from < end && e.until.is_none_or(|z| z + LEASE_TTL > from))
            .map(|e| e.what)
            .collect();
        report.push(format!("{k}: {count}/{allowed} ({upto}/{overall} so far)"));
        assert!(
            count <= allowed,
            "second {k}: {count} admitted, beyond the bound {allowed} over {:?} ({states:?}); per second: {report:?}",
            end - from
        );
        assert!(
            upto <= overall,
            "up to second {k}: {upto} admitted, beyond the bound {overall}; per second: {report:?}"
        );
    }
    eprintln!(
        "fleet chaos: {} admitted, {} refused, {} failed closed in {:?} (run {:?}; kill at {:?}, restart at {:?}, \
         failover at {:?} ({} refusals first), new primary by {:?}, last call on the old one by {:?}, demotion at \
         {:?}); slowest answer {slowest:?} (allowed {within:?}); admitted from batches by the live instances \
         {from_batches:?}, refused by their deny caches {cached_denials}; admitted/bound per second: {report:?}",
        statuses[0],
        statuses[1],
        statuses[2],
        begun.elapsed(),
        ended - started,
        *killed.get().expect("killed") - started,
        forgotten - started,
        failover - started,
        refused.len(),
        promoted - started,
        left_old - started,
        demotion - started,
    );
}
