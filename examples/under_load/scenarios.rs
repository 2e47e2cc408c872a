//! The four scenarios, each a list of cases; a case is one fresh server, one load, one [`Row`].
//!
//! Every server runs the rate limiter and the concurrency limiter with limits far above the offered load, so that
//! a refusal can only mean that the limiter itself failed (its store was too slow, it broke): 100 000 000 requests
//! per second and 1000 in flight per client, on the private Redis (or through a latency proxy to it), or in
//! process. Redis failures are answered by the server's failure policy (its default, or `--on-store-error`):
//! `closed` shows a failing store as a 503, `local` decides per instance meanwhile, `open` admits.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tollgate::tower::limit::concurrency::DEFAULT_SLOT_TTL;
use tollgate_testkit::proxy::LatencyProxy;

use crate::client;
use crate::load::{self, Load, Until};
use crate::procs::{Benchmark, Hogs, Redis, Server};
use crate::report::Row;
use crate::watch;

/// The rate limit, per second: far above what this machine can offer.
pub(crate) const LIMIT: u64 = 100_000_000;

/// The concurrency limit per client: above the most connections a scenario opens (all from one client IP).
pub(crate) const CONCURRENCY: u64 = 1_000;

/// Connections of the latency and busy-Redis cases: enough to keep the server busy while each request waits for
/// a slow Redis.
const SLOW_CONNECTIONS: usize = 16;

/// Requests before the load on one connection, not counted: the server's Redis connections are made, its scripts
/// loaded, so the load measures the steady state.
const WARM_UP: u64 = 200;

/// When slots are counted after the load stops.
const SLOTS_AFTER: Duration = Duration::from_secs(2);

/// What the scenarios share.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// The `axum_server` binary.
    pub(crate) server_bin: PathBuf,
    /// Its `--log` level.
    pub(crate) server_log: String,
    /// Where each case's server log (and metrics) go.
    pub(crate) log_dir: PathBuf,
    /// The private Redis.
    pub(crate) redis: Redis,
    /// `GET /` requests per configuration in (a) and (b).
    pub(crate) requests: u64,
    /// Connections of (b).
    pub(crate) connections: usize,
    /// How long a slow phase lasts in (c) and (d).
    pub(crate) phase: Duration,
    /// How long the load goes on after Redis is well again.
    pub(crate) window: Duration,
    /// A `GET /health` after every this many `GET /`.
    pub(crate) health_every: u64,
    /// The servers' `--on-store-error` (`None`: their default).
    pub(crate) on_store_error: Option<String>,
}

/// A server configuration of (a) and (b).
#[derive(Debug, Clone, Copy)]
enum Config {
    Redis,
    RedisLeases,
    InProcess,
}

impl Config {
    const ALL: [Self; 3] = [Self::Redis, Self::RedisLeases, Self::InProcess];

    fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::RedisLeases => "redis+leases",
            Self::InProcess => "in-process",
        }
    }
}

/// The server's flags: the limits, and the store (`None`: in process). (The failure policy is added by `Ctx::server`.)
fn server_args(redis_url: Option<&str>, leases: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--limit",
        &LIMIT.to_string(),
        "--period",
        "1s",
        "--concurrency",
        &CONCURRENCY.to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(url) = redis_url {
        args.extend(["--redis-url".to_owned(), url.to_owned()]);
    }
    if leases {
        args.push("--leases".to_owned());
    }
    args
}

impl Ctx {
    /// The log file of a case: `<dir>/<scenario>-<config>.log`, spaces dashed.
    fn log(&self, scenario: &str, config: &str) -> PathBuf {
        self.log_dir
            .join(format!("{scenario}-{}.log", config.replace(' ', "-")))
    }

    /// Starts a case's server, on an empty Redis, and warms it up.
    async fn server(
        &self,
        scenario: &str,
        config: &str,
        args: &[String],
    ) -> Result<Server, String> {
        tokio::task::block_in_place(|| self.redis.flush())?;
        let mut args = args.to_vec();
        if let Some(policy) = &self.on_store_error {
            args.extend(["--on-store-error".to_owned(), policy.clone()]);
        }
        let server = Server::start(
            &self.server_bin,
            &args,
            &self.server_log,
            &self.log(scenario, config),
        )
        .await?;
        let warm = load::start(server.addr, 1, Until::Count(WARM_UP), 0)
            .join()
            .await?;
        if let Some(bad) = warm.samples.iter().find_map(|s| s.refusal.as_deref()) {
            eprintln!(
                "  warning: the warm-up was refused ({bad}): see {}",
                server.log.display()
            );
        }
        Ok(server)
    }

    /// (a) and (b): `connections` connections back to back, [`Ctx::requests`] requests per configuration, a CPU
    /// hog on every core meanwhile.
    pub(crate) async fn connections(
        &self,
        scenario: &'static str,
        connections: usize,
        emit: &mut dyn FnMut(Row) -> Result<(), String>,
    ) -> Result<(), String> {
        for config in Config::ALL {
            let url = self.redis.server.url();
            let on_redis = !matches!(config, Config::InProcess);
            let args = server_args(
                on_redis.then_some(url.as_str()),
                matches!(config, Config::RedisLeases),
            );
            let mut server = self.server(scenario, config.name(), &args).await?;
            let hogs = Hogs::start()?;
            eprintln!(
                "{scenario} {}: {} requests on {connections} connection(s), {} CPU hogs",
                config.name(),
                self.requests,
                hogs.count()
            );
            let load = load::start(
                server.addr,
                connections,
                Until::Count(self.requests),
                self.health_every,
            )
            .join()
            .await?;
            drop(hogs);
            let case = Case {
                scenario,
                config: config.name().to_owned(),
                restored: None,
                on_redis,
                degraded: Vec::new(),
                note: String::new(),
            };
            emit(self.finish(case, &mut server, load).await?)?;
        }
        Ok(())
    }

    /// (c): Redis behind a proxy that delays every reply by 1, 5, 20 and 60 ms, or stalls for 100 ms and 1 s.
    pub(crate) async fn latency(
        &self,
        emit: &mut dyn FnMut(Row) -> Result<(), String>,
    ) -> Result<(), String> {
        let cases = [
            Slow::Delay(1, false),
            Slow::Delay(5, false),
            Slow::Delay(20, false),
            Slow::Delay(60, true),
            Slow::Stall(Duration::from_millis(100)),
            Slow::Stall(Duration::from_secs(1)),
        ];
        for slow in cases {
            let config = slow.name();
            let proxy = LatencyProxy::start(
                &format!("127.0.0.1:{}", self.redis.server.port()),
                Duration::ZERO,
            );
            let mut server = self
                .server("latency", &config, &server_args(Some(&proxy.url()), false))
                .await?;
            eprintln!("latency {config}: {SLOW_CONNECTIONS} connections");
            let run = |server: &Server| {
                load::start(
                    server.addr,
                    SLOW_CONNECTIONS,
                    Until::Stopped,
                    self.health_every,
                )
            };
            let (load, restored, degraded) = match slow {
                Slow::Delay(ms, recover) => {
                    proxy.set_delay(Duration::from_millis(ms));
                    let run = run(&server);
                    let watch = watch::start(server.metrics, run.started);
                    tokio::time::sleep(self.phase).await;
                    // Back to on time: the recovery is measured from here.
                    let restored = recover.then(|| {
                        proxy.set_delay(Duration::ZERO);
                        run.started.elapsed()
                    });
                    if restored.is_some() {
                        tokio::time::sleep(self.window).await;
                    }
                    run.stop();
                    (run.join().await?, restored, watch.stop().await)
                }
                Slow::Stall(length) => {
                    let run = run(&server);
                    let watch = watch::start(server.metrics, run.started);
                    tokio::time::sleep(self.phase / 2).await;
                    proxy.stall(length);
                    // The stall's end: the recovery is measured from there.
                    let restored = run.started.elapsed() + length;
                    tokio::time::sleep(length + self.window).await;
                    run.stop();
                    (run.join().await?, Some(restored), watch.stop().await)
                }
            };
            let case = Case {
                scenario: "latency",
                config,
                restored,
                on_redis: true,
                degraded,
                note: String::new(),
            };
            emit(self.finish(case, &mut server, load).await?)?;
        }
        Ok(())
    }

    /// (d): Redis kept at 100 % CPU by `redis-benchmark` for a phase, the server on it; then the benchmark stops.
    pub(crate) async fn redis_busy(
        &self,
        emit: &mut dyn FnMut(Row) -> Result<(), String>,
    ) -> Result<(), String> {
        let config = "benchmark".to_owned();
        let mut server = self
            .server(
                "redis-busy",
                &config,
                &server_args(Some(&self.redis.server.url()), false),
            )
            .await?;
        eprintln!(
            "redis-busy: {SLOW_CONNECTIONS} connections, redis-benchmark for {:?}",
            self.phase
        );
        let run = load::start(
            server.addr,
            SLOW_CONNECTIONS,
            Until::Stopped,
            self.health_every,
        );
        let watch = watch::start(server.metrics, run.started);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cpu_before = tokio::task::block_in_place(|| self.redis.cpu_seconds());
        let busy_from = Instant::now();
        let benchmark = Benchmark::start(self.redis.server.port())?;
        tokio::time::sleep(self.phase / 2).await;
        let ops = tokio::task::block_in_place(|| self.redis.ops_per_sec());
        tokio::time::sleep(self.phase / 2).await;
        let cpu_after = tokio::task::block_in_place(|| self.redis.cpu_seconds());
        let busy_for = busy_from.elapsed();
        drop(benchmark);
        // The load on Redis has stopped: the recovery is measured from here.
        let restored = run.started.elapsed();
        tokio::time::sleep(self.window).await;
        run.stop();
        let load = run.join().await?;
        let degraded = watch.stop().await;
        let cpu = match (cpu_before, cpu_after) {
            (Some(a), Some(b)) => format!("{:.0} %", (b - a) / busy_for.as_secs_f64() * 100.0),
            _ => "?".to_owned(),
        };
        let note = format!(
            "Redis at {cpu} CPU and {} commands/s while busy",
            ops.map_or_else(|| "?".to_owned(), |n| n.to_string())
        );
        let case = Case {
            scenario: "redis-busy",
            config,
            restored: Some(restored),
            on_redis: true,
            degraded,
            note,
        };
        emit(self.finish(case, &mut server, load).await?)
    }

    /// The row of a finished load: the counts, the latencies, the recovery after `restored`, and the slots held
    /// [`SLOTS_AFTER`] the load stopped (and, when some are, after their TTL). The server's metrics are saved
    /// beside its log.
    async fn finish(&self, mut case: Case, server: &mut Server, load: Load) -> Result<Row, String> {
        let stopped = Instant::now();
        if !server.running() {
            case.note.push_str("the server died; ");
        }
        match server.scrape().await {
            Ok(page) => {
                let _ = std::fs::write(server.log.with_extension("metrics"), page);
            }
            Err(e) => case.note.push_str(&format!("{e}; ")),
        }
        tokio::time::sleep_until((stopped + SLOTS_AFTER).into()).await;
        let (held, by) = if case.on_redis {
            (
                tokio::task::block_in_place(|| self.redis.live_slots()),
                "redis",
            )
        } else {
            (probe_slots(server).await, "ratelimit-header")
        };
        let held = held
            .map_err(|e| case.note.push_str(&format!("slots: {e}; ")))
            .ok();
        // Slots still held at 2 s may be releases that failed: on Redis they must be gone once their TTL is
        // over (in process there is no TTL: a slot is held until its request ends).
        let past_ttl = match held {
            Some(n) if n > 0 && case.on_redis => {
                eprintln!(
                    "  {n} slots held {SLOTS_AFTER:?} after the load: waiting for their TTL ({DEFAULT_SLOT_TTL:?})"
                );
                tokio::time::sleep_until(
                    (stopped + DEFAULT_SLOT_TTL + Duration::from_secs(1)).into(),
                )
                .await;
                tokio::task::block_in_place(|| self.redis.live_slots())
                    .map_err(|e| case.note.push_str(&format!("slots after the TTL: {e}; ")))
                    .ok()
            }
            _ => None,
        };
        let slots = Slots { held, by, past_ttl };
        Ok(row(case, server, &load, slots))
    }
}

/// What one case is, besides its load.
#[derive(Debug)]
struct Case {
    scenario: &'static str,
    /// The configuration or the slow Redis.
    config: String,
    /// When Redis was well again, from the start of the load (`None`: no recovery to measure).
    restored: Option<Duration>,
    /// Whether the slots are in Redis (else in process).
    on_redis: bool,
    /// The server's degraded decisions while the load ran (cases with a recovery).
    degraded: Vec<(Duration, u64)>,
    /// What to say about it.
    note: String,
}

/// The slots counted after a load.
#[derive(Debug)]
struct Slots {
    /// [`SLOTS_AFTER`] the load.
    held: Option<u64>,
    /// How.
    by: &'static str,
    /// After their TTL, when some were held at first.
    past_ttl: Option<u64>,
}

/// A slow Redis of (c).
#[derive(Debug, Clone, Copy)]
enum Slow {
    /// Every reply this many ms late for a phase; with `true`, then on time again (and the recovery measured).
    Delay(u64, bool),
    /// On time, then nothing for this long mid-phase.
    Stall(Duration),
}

impl Slow {
    fn name(self) -> String {
        match self {
            Self::Delay(ms, _) => format!("delay {ms}ms"),
            Self::Stall(d) if d.subsec_millis() == 0 => format!("stall {}s", d.as_secs()),
            Self::Stall(d) => format!("stall {}ms", d.as_millis()),
        }
    }
}

/// The slots the in-process concurrency limiter holds, from its own count: one `GET /` whose `RateLimit` field
/// carries `"concurrency";r=<slots left after this request>` and whose `RateLimit-Policy` carries
/// `"concurrency";q=<limit>`. Held by others: `q − r − 1` (this request holds one), or `q` if it was refused.
async fn probe_slots(server: &Server) -> Result<u64, String> {
    let reply = client::get_once(server.addr, "/")
        .await
        .map_err(|e| format!("slot probe: {e}"))?;
    let param = |header: &str, name: &str| {
        reply
            .header(header)
            .and_then(|v| structured_param(v, "concurrency", name))
            .ok_or_else(|| {
                format!(
                    "slot probe: no \"concurrency\";{name}= in {header} ({:?})",
                    reply.header(header)
                )
            })
    };
    let left = param("ratelimit", "r")?;
    let limit = param("ratelimit-policy", "q")?;
    Ok(match reply.status {
        200 => limit.saturating_sub(left + 1),
        _ => limit.saturating_sub(left),
    })
}

/// The integer parameter `param` of the list member `"member"` of a structured field: `"a";q=5, "b";r=2`.
fn structured_param(field: &str, member: &str, param: &str) -> Option<u64> {
    let quoted = format!("\"{member}\"");
    field.split(',').map(str::trim).find_map(|m| {
        let mut parts = m.split(';');
        (parts.next()? == quoted).then_some(())?;
        parts.find_map(|p| p.strip_prefix(param)?.strip_prefix('=')?.parse().ok())
    })
}

/// Milliseconds of a duration, to the microsecond.
fn millis(d: Duration) -> f64 {
    thousandths(d.as_secs_f64() * 1_000.0)
}

/// `v` rounded to three decimals (the JSON shows what was measured, not float noise).
fn thousandths(v: f64) -> f64 {
    (v * 1_000.0).round() / 1_000.0
}

/// The row of one case.
fn row(case: Case, server: &Server, load: &Load, slots: Slots) -> Row {
    let limited: Vec<_> = load.samples.iter().filter(|s| !s.health).collect();
    let mut refusals = BTreeMap::new();
    for kind in load.samples.iter().filter_map(|s| s.refusal.as_deref()) {
        *refusals.entry(kind.to_owned()).or_insert(0_u64) += 1;
    }
    let refused = refusals.values().sum();
    // A case with a recovery: the latencies while Redis was slow (answered before it was well again), which the
    // requests after it would otherwise outnumber and hide.
    let slow = match case.restored {
        Some(at) => &load.samples[..load.samples.partition_point(|s| s.done < at)],
        None => &load.samples[..],
    };
    let path = load::latencies(slow, false);
    let health = load::latencies(slow, true);
    let p = |sorted: &[Duration], q: f64| millis(load::percentile(sorted, q));
    // Recovered once nothing is refused and nothing is answered by the failure policy any more (a `local` or
    // `open` policy refuses nothing while Redis is out: only its count says when Redis decides again).
    let recover = case.restored.map(|at| {
        let answered = load::recovery(&load.samples, at)?;
        let on_redis = watch::back_on_redis(&case.degraded, at)?;
        Some(answered.max(on_redis))
    });
    // A token bucket admits at most its burst (the limit: the bucket starts full) plus what refills meanwhile.
    let bound = LIMIT.saturating_add((LIMIT as f64 * load.elapsed.as_secs_f64()).ceil() as u64);
    Row {
        scenario: case.scenario,
        config: case.config,
        requests: limited.len() as u64,
        health_requests: (load.samples.len() - limited.len()) as u64,
        ok: load.samples.iter().filter(|s| s.refusal.is_none()).count() as u64,
        refused,
        refusals,
        admitted: limited.iter().filter(|s| s.refusal.is_none()).count() as u64,
        bound,
        on_store_error: server.on_store_error.clone(),
        slots_held: slots.held,
        slots_by: slots.by,
        slots_past_ttl: slots.past_ttl,
        added_p50_ms: thousandths(p(&path, 50.0) - p(&health, 50.0)),
        added_p99_ms: thousandths(p(&path, 99.0) - p(&health, 99.0)),
        p50_ms: p(&path, 50.0),
        p99_ms: p(&path, 99.0),
        health_p50_ms: p(&health, 50.0),
        health_p99_ms: p(&health, 99.0),
        duration_s: thousandths(load.elapsed.as_secs_f64()),
        recover_s: recover.flatten().map(|d| thousandths(d.as_secs_f64())),
        recovered: recover.map(|r| r.is_some()),
        log: server.log.clone(),
        note: case.note.trim_end_matches("; ").to_owned(),
    }
}
