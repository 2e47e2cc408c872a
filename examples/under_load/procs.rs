//! The child processes of a run, each behind a guard that kills it when dropped (at the end of its case, on an
//! error, on a panic's unwinding, and on Ctrl-C, which drops the whole run): the example server, the CPU hogs and
//! `redis-benchmark`. Also what is asked of the private Redis between cases.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_testkit::redis::RedisServer;

use crate::client;

/// How long a server may take to print its address and answer `/health`.
const STARTUP: Duration = Duration::from_secs(20);

/// Whether `name` can be run (`name --version` starts): the check before anything needs it.
pub(crate) fn runnable(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Kills `child` and reaps it.
fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The example server (`axum_server`), on a loopback port it picks itself; killed on drop.
#[derive(Debug)]
pub(crate) struct Server {
    child: Child,
    /// Where it serves.
    pub(crate) addr: SocketAddr,
    /// Where it serves its Prometheus metrics.
    pub(crate) metrics: SocketAddr,
    /// Its stdout and stderr.
    pub(crate) log: PathBuf,
    /// Its failure policy, from its start-up line (`… on store error local, …`).
    pub(crate) on_store_error: String,
}

impl Server {
    /// Starts `bin` with `args` (plus `--addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --log <level>`), its output
    /// to `log`; returns once it answers `GET /health` with 200. `REDIS_URL` is removed from its environment: a
    /// configuration without `--redis-url` is the in-process store, whatever the caller's shell has.
    pub(crate) async fn start(
        bin: &Path,
        args: &[String],
        level: &str,
        log: &Path,
    ) -> Result<Self, String> {
        let out = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(bin)
            .args([
                "--addr",
                "127.0.0.1:0",
                "--metrics-addr",
                "127.0.0.1:0",
                "--log",
                level,
            ])
            .args(args)
            .env_remove("REDIS_URL")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
            log: log.to_owned(),
            on_store_error: "?".to_owned(),
        };
        let deadline = Instant::now() + STARTUP;
        // The start-up lines: "listening on http://ADDR  (…)", then "metrics on http://ADDR/metrics".
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "{} {} exited at start ({status}): {}",
                    bin.display(),
                    args.join(" "),
                    last_lines(log, 5)
                ));
            }
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let found = |prefix: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(prefix))
                    .and_then(|rest| rest.split(['/', ' ']).next())
                    .and_then(|a| a.parse::<SocketAddr>().ok())
            };
            if let (Some(addr), Some(metrics)) =
                (found("listening on http://"), found("metrics on http://"))
            {
                server.addr = addr;
                server.metrics = metrics;
                server.on_store_error = text
                    .split("on store error ")
                    .nth(1)
                    .and_then(|rest| rest.split([',', ' ', ')']).next())
                    .unwrap_or("?")
                    .to_owned();
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the server printed no address within {STARTUP:?}: {}",
                    last_lines(log, 5)
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        while !matches!(client::get_once(server.addr, "/health").await, Ok(r) if r.status == 200) {
            if Instant::now() > deadline {
                return Err(format!("{} does not answer /health with 200", server.addr));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(server)
    }

    /// Its Prometheus page, or why not.
    pub(crate) async fn scrape(&self) -> Result<String, String> {
        let reply = client::get_once(self.metrics, "/metrics")
            .await
            .map_err(|e| format!("metrics: {e}"))?;
        Ok(String::from_utf8_lossy(&reply.body).into_owned())
    }

    /// Whether it is still running (a server that died under load is the worst result there is).
    pub(crate) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// The last `n` lines of `path`, joined with " | " (for a one-line error).
pub(crate) fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// One busy process per core (`sh -c 'while :; do :; done'`: pure CPU, no I/O), so that the server, Redis and
/// the load compete for the CPU as on a busy machine; killed on drop.
#[derive(Debug)]
pub(crate) struct Hogs(Vec<Child>);

impl Hogs {
    /// As many hogs as the machine has cores.
    pub(crate) fn start() -> Result<Self, String> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let mut hogs = Self(Vec::with_capacity(cores));
        for _ in 0..cores {
            let child = Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start a CPU hog (sh): {e}"))?;
            hogs.0.push(child);
        }
        Ok(hogs)
    }

    /// How many run.
    pub(crate) fn count(&self) -> usize {
        self.0.len()
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.0.iter_mut().for_each(kill);
    }
}

/// The `redis-benchmark` command lines that keep a Redis at 100 % CPU: many small pipelined commands (50 clients,
/// 32 commands in flight each: `SET`, `GET`, `INCR`), and a script that does 200 `INCR`s per call (work for Redis
/// at little cost to the benchmark: on a small machine the first alone is bound by the benchmark's own CPU). Each
/// asks for far more requests than a phase lasts.
const BENCHMARKS: [&[&str]; 2] = [
    &[
        "-c",
        "50",
        "-P",
        "32",
        "-n",
        "100000000",
        "-t",
        "set,get,incr",
        "-q",
    ],
    &[
        "-c",
        "50",
        "-P",
        "8",
        "-n",
        "100000000",
        "-q",
        "EVAL",
        "for i = 1, 200 do redis.call('INCR', 'under-load:busy') end",
        "0",
    ],
];

/// `redis-benchmark` processes keeping a Redis at 100 % CPU ([`BENCHMARKS`]); killed on drop.
#[derive(Debug)]
pub(crate) struct Benchmark(Vec<Child>);

impl Benchmark {
    /// Starts them against the Redis on `port`.
    pub(crate) fn start(port: u16) -> Result<Self, String> {
        let port = port.to_string();
        let mut started = Self(Vec::new());
        for args in BENCHMARKS {
            let child = Command::new("redis-benchmark")
                .args(["-p", &port])
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start redis-benchmark: {e}"))?;
            started.0.push(child);
        }
        Ok(started)
    }
}

impl Drop for Benchmark {
    fn drop(&mut self) {
        self.0.iter_mut().for_each(kill);
    }
}

/// The private Redis's side of a case: emptied before it, its slots counted after it.
#[derive(Debug)]
pub(crate) struct Redis {
    /// The server.
    pub(crate) server: RedisServer,
}

/// The key pattern of the concurrency limiter's slots: `<namespace>:{<key>}:inflight` (crates/tollgate-redis,
/// `slot.rs`), in the servers' default namespace.
const SLOT_KEYS: &str = "tollgate:*:inflight";

impl Redis {
    /// `FLUSHALL`: each case starts with no keys (no bucket, no slot, no benchmark data).
    pub(crate) fn flush(&self) -> Result<(), String> {
        match self.server.cli(&["FLUSHALL"]).as_str() {
            "OK" => Ok(()),
            other => Err(format!("FLUSHALL: {other}")),
        }
    }

    /// The slots held now: the members of every slot set whose expiry (the score, in the server's milliseconds)
    /// is still ahead of the server's clock. Expired members can linger until the set's next acquire; they hold
    /// nothing, so they are not counted.
    pub(crate) fn live_slots(&self) -> Result<u64, String> {
        let time = self.server.cli(&["TIME"]);
        let mut words = time.split_whitespace();
        let (Some(Ok(secs)), Some(Ok(micros))) = (
            words.next().map(str::parse::<u64>),
            words.next().map(str::parse::<u64>),
        ) else {
            return Err(format!("TIME: {time:?}"));
        };
        let now_ms = secs * 1_000 + micros / 1_000;
        let keys = self.server.cli(&["--scan", "--pattern", SLOT_KEYS]);
        let mut live = 0;
        for key in keys.lines().filter(|k| !k.is_empty()) {
            let count = self
                .server
                .cli(&["ZCOUNT", key, &format!("({now_ms}"), "+inf"]);
            live += count
                .parse::<u64>()
                .map_err(|_| format!("ZCOUNT {key}: {count:?}"))?;
        }
        Ok(live)
    }

    /// Commands per second Redis reports now (`instantaneous_ops_per_sec`), to show that it is busy.
    pub(crate) fn ops_per_sec(&self) -> Option<u64> {
        self.server
            .cli(&["INFO", "stats"])
            .lines()
            .find_map(|l| l.trim().strip_prefix("instantaneous_ops_per_sec:"))
            .and_then(|n| n.parse().ok())
    }

    /// `INFO cpu`'s `used_cpu_user` + `used_cpu_sys`: the server's CPU seconds so far.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        let info = self.server.cli(&["INFO", "cpu"]);
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name))
                .and_then(|v| v.parse::<f64>().ok())
        };
        Some(field("used_cpu_user:")? + field("used_cpu_sys:")?)
    }
}
