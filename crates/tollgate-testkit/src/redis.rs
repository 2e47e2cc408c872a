//! Real Redis servers for tests: the shared one at `REDIS_URL`, and private `redis-server` processes.
//!
//! Tests that only decide use the shared server with a [`unique_prefix`] each, so they run in parallel. Tests that
//! pause, kill, restart, flush, replicate or cluster a server start a private one on a free port; it is killed
//! and its files removed when the handle is dropped. A missing `redis-server` or `redis-cli` is a panic naming
//! the package to install: a test that needs Redis fails, it is never skipped.
//!
//! ```no_run
//! use tollgate_testkit::redis::{RedisServer, redis_url};
//!
//! let shared = redis_url(); // REDIS_URL, or redis://127.0.0.1:6379
//! let private = RedisServer::start();
//! assert_eq!(private.cli(&["PING"]), "PONG");
//! private.pause(); // SIGSTOP: the server hangs
//! private.resume(); // SIGCONT
//! ```

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const INSTALL_HINT: &str = "install Redis (Debian/Ubuntu: `sudo apt-get install -y redis-server`, which also \
     provides redis-cli and redis-benchmark; macOS: `brew install redis`), or point TOLLGATE_REDIS_BIN_DIR at the \
     directory holding the binaries";

/// How long a private server may take to start or a cluster to settle.
const STARTUP: Duration = Duration::from_secs(20);

/// The shared test server: `REDIS_URL`, or `redis://127.0.0.1:6379`.
#[must_use]
pub fn redis_url() -> String {
    std::env::var("REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into())
}

/// A key prefix no other test (or test run) uses: `<name>-<pid>-<counter>-<time>`.
#[must_use]
pub fn unique_prefix(name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{name}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Path of a Redis binary (`redis-server`, `redis-cli`, `redis-benchmark`).
///
/// # Panics
/// When the binary cannot be run, with the command that installs it.
#[must_use]
pub fn binary(name: &str) -> PathBuf {
    static FOUND: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut found = FOUND
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, path)) = found.iter().find(|(n, _)| n == name) {
        return path.clone();
    }
    let path = std::env::var_os("TOLLGATE_REDIS_BIN_DIR")
        .map_or_else(|| PathBuf::from(name), |d| Path::new(&d).join(name));
    match Command::new(&path)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {
            found.push((name.to_owned(), path.clone()));
            path
        }
        Err(e) => panic!("cannot run `{}` ({e}): {INSTALL_HINT}", path.display()),
    }
}

/// Runs `redis-cli -u <url> <args>` and returns its trimmed output.
///
/// # Panics
/// When `redis-cli` is missing.
#[must_use]
pub fn cli_url(url: &str, args: &[&str]) -> String {
    let out = Command::new(binary("redis-cli"))
        .arg("-u")
        .arg(url)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("redis-cli failed to run: {e}"));
    let mut text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.trim().is_empty() {
        text.push_str(err.trim());
    }
    text
}

/// A free loopback port whose cluster bus port (`port + 10000`) is free too.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind a loopback port");
        let port = listener
            .local_addr()
            .expect("bound socket has an address")
            .port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A private `redis-server` on a free loopback port, without persistence; killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// A standalone server.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not start.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with extra `redis-server` arguments, e.g. `["--maxmemory-policy", "allkeys-lru"]`.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not start.
    #[must_use]
    pub fn start_with(extra: &[&str]) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!(
                "tollgate-redis-{}-{port}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("cannot create a directory for a private Redis");
            let mut server = Self {
                port,
                dir,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(log) => last_log = log, // most likely the port was taken meanwhile: try another
            }
        }
        panic!("a private redis-server did not start; its log:\n{last_log}");
    }

    /// A replica of `primary` (`--replicaof`), once its link to the primary is up.
    ///
    /// # Panics
    /// When it does not start or does not sync within 20 s.
    #[must_use]
    pub fn replica_of(primary: &Self) -> Self {
        // Redis waits 5 s by default before a diskless full sync, hoping for more replicas to join.
        let _ = primary.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        let port = primary.port.to_string();
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &port]);
        replica.wait_until("replication link up", || {
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        replica
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = self.dir.join("redis.log");
        let child = Command::new(binary("redis-server"))
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server ({e}): {INSTALL_HINT}"));
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP;
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(std::fs::read_to_string(&log).unwrap_or_default());
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() && self.cli(&["PING"]) == "PONG"
            {
                // The port was free when picked, not reserved: another test's server may have taken it, and
                // answered. Ours is the one with our child's pid.
                let ours = self.pid().map(|pid| pid.to_string());
                let answering = self.cli(&["INFO", "server"]);
                let pid = answering
                    .lines()
                    .find_map(|line| line.trim().strip_prefix("process_id:"));
                if pid.map(str::to_owned) == ours {
                    return Ok(());
                }
                self.kill();
                return Err(format!(
                    "port {} answers for another redis-server (pid {pid:?})",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(format!(
            "not answering PING after {STARTUP:?}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        ))
    }

    /// The server's port.
    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, while the server runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Runs `redis-cli` against this server and returns its trimmed output.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> String {
        cli_url(&self.url(), args)
    }

    /// Sends `signal` (`-STOP`, `-CONT`) through the `kill` program (procps; `scripts/test.sh` installs it where a
    /// minimal image lacks it), which the test runs before the server handle is dropped.
    fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let status = Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
            assert!(
                matches!(status, Ok(s) if s.success()),
                "kill {signal} {pid} failed: {status:?} (is procps installed? `apt-get install procps`)"
            );
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the server (SIGKILL) and waits for it to exit; [`restart`](Self::restart) starts it on the same port
    /// (free again, though nothing reserves it meanwhile).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port after [`kill`](Self::kill): empty, since nothing is persisted
    /// (a Cluster node keeps its identity from `nodes.conf`).
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.spawn() {
            panic!("redis-server on port {} did not restart:\n{log}", self.port);
        }
    }

    /// Polls `ready` every 20 ms for up to 20 s.
    ///
    /// # Panics
    /// When `ready` never holds.
    pub fn wait_until(&self, what: &str, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + STARTUP;
        while !ready() {
            assert!(
                Instant::now() < deadline,
                "redis on port {}: no {what} after {STARTUP:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL (through std, no program needed) ends a stopped process too; nothing here may panic, or the
        // server and its directory would outlive the test.
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private Redis Cluster of primaries without replicas, made with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` cluster-enabled servers (at least 3), joined and with every slot assigned.
    ///
    /// # Panics
    /// When the servers do not start or the cluster does not form within 20 s.
    #[must_use]
    pub fn start(masters: usize) -> Self {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 primaries"
        );
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new(binary("redis-cli"))
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli --cluster create failed to run: {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_settled();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and agrees that every slot is served.
    ///
    /// # Panics
    /// After 20 s without agreement.
    pub fn wait_settled(&self) {
        for node in &self.nodes {
            node.wait_until("cluster_state:ok", || {
                let info = node.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
        }
        let sign = |n: &RedisServer| {
            let mut lines: Vec<String> = n
                .cli(&["CLUSTER", "NODES"])
                .lines()
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    format!(
                        "{} {}",
                        f.first().unwrap_or(&""),
                        f.get(8..).map(|s| s.join(" ")).unwrap_or_default()
                    )
                })
                .collect();
            lines.sort();
            lines
        };
        let first = &self.nodes[0];
        first.wait_until("agreement on the slot map", || {
            self.nodes.iter().all(|n| sign(n) == sign(first))
        });
    }

    /// Seed URLs of every node.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The `i`-th node.
    #[must_use]
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// The `i`-th node, mutably (to kill or restart it).
    #[must_use]
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Index of the node serving `slot`.
    ///
    /// # Panics
    /// When no node claims it.
    #[must_use]
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let id = self.slot_owner_id(slot);
        self.nodes
            .iter()
            .position(|n| n.cli(&["CLUSTER", "MYID"]) == id)
            .unwrap_or_else(|| panic!("no node serves slot {slot}"))
    }

    fn slot_owner_id(&self, slot: u16) -> String {
        for line in self.nodes[0].cli(&["CLUSTER", "NODES"]).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            for range in f.iter().skip(8) {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>())
                    && (lo..=hi).contains(&slot)
                {
                    return f[0].to_owned();
                }
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// Moves `count` slots (with their keys) from node `from` to node `to` with `redis-cli --cluster reshard`, and
    /// waits for the cluster to settle: clients holding the old slot map now get `MOVED`.
    ///
    /// # Panics
    /// When the reshard fails.
    pub fn reshard(&self, from: usize, to: usize, count: usize) {
        let from_id = self.nodes[from].cli(&["CLUSTER", "MYID"]);
        let to_id = self.nodes[to].cli(&["CLUSTER", "MYID"]);
        let out = Command::new(binary("redis-cli"))
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", self.nodes[0].port()),
            ])
            .args(["--cluster-from", &from_id, "--cluster-to", &to_id])
            .args(["--cluster-slots", &count.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli --cluster reshard failed to run: {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_settled();
    }
}
