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

use crate::tls::TlsFiles;

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

/// `redis-cli` with `tool_args` (where and how to connect) and then `args`; trimmed stdout, then stderr.
fn run_cli(tool_args: &[String], args: &[&str]) -> String {
    let out = Command::new(binary("redis-cli"))
        .args(tool_args)
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

/// `redis-cli`'s TLS arguments: the client certificate, the server's not verified.
fn tls_cli_args(files: &TlsFiles) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    vec![
        "--tls".into(),
        "--insecure".into(),
        "--cacert".into(),
        path(&files.ca),
        "--cert".into(),
        path(&files.client_cert),
        "--key".into(),
        path(&files.client_key),
    ]
}

/// A directory no other private server uses.
fn fresh_dir(what: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-redis-{}-{what}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("cannot create a directory for a private Redis");
    dir
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
    tls: Option<ServerTls>,
    /// The certificates' directory when this server generated them (removed with the server).
    cert_dir: Option<PathBuf>,
    child: Option<Child>,
}

/// A TLS-only server's certificates and whether it asks clients for theirs.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The PEM files the server and its clients use.
    pub files: TlsFiles,
    /// `tls-auth-clients yes`: mutual TLS.
    pub auth_clients: bool,
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
        Self::start_inner(extra, None)
    }

    /// A TLS-only server (`--port 0 --tls-port <port>`) with a fresh CA and a certificate for `localhost` and
    /// `127.0.0.1`; with `auth_clients`, it also demands a client certificate (`tls-auth-clients yes`).
    ///
    /// # Panics
    /// When `redis-server` is missing, built without TLS, or does not start.
    #[must_use]
    pub fn start_tls(auth_clients: bool) -> Self {
        Self::start_tls_for(&TlsFiles::LOCAL_NAMES, false, auth_clients, &[])
    }

    /// A TLS-only server whose certificate names `names` (and has already expired when `expired`).
    ///
    /// # Panics
    /// When `redis-server` is missing, built without TLS, or does not start.
    #[must_use]
    pub fn start_tls_for(
        names: &[&str],
        expired: bool,
        auth_clients: bool,
        extra: &[&str],
    ) -> Self {
        let files = TlsFiles::generate(&fresh_dir("certs"), names, expired);
        Self::start_inner(
            extra,
            Some(ServerTls {
                files,
                auth_clients,
            }),
        )
    }

    /// A server with `extra` arguments and, with `tls`, TLS only.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not start.
    #[must_use]
    pub fn start_inner(extra: &[&str], tls: Option<ServerTls>) -> Self {
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = fresh_dir(&port.to_string());
            let mut server = Self {
                port,
                dir,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                tls: tls.clone(),
                cert_dir: None,
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

    /// `redis-server` arguments for the port: plaintext, or TLS only with its certificates.
    fn port_args(&self) -> Vec<String> {
        let port = self.port.to_string();
        let Some(tls) = &self.tls else {
            return vec!["--port".into(), port];
        };
        let path = |p: &Path| p.display().to_string();
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port,
            "--tls-cert-file".into(),
            path(&tls.files.server_cert),
            "--tls-key-file".into(),
            path(&tls.files.server_key),
            "--tls-ca-cert-file".into(),
            path(&tls.files.ca),
            "--tls-auth-clients".into(),
            if tls.auth_clients { "yes" } else { "no" }.into(),
            "--tls-replication".into(),
            "yes".into(),
            "--tls-cluster".into(),
            "yes".into(),
        ]
    }

    /// `redis-cli` arguments reaching this server (TLS with the client certificate; the test's assertions are
    /// about tollgate's client, so the tool does not verify the server's).
    fn cli_args(&self) -> Vec<String> {
        let mut args = vec![
            "-h".to_owned(),
            "127.0.0.1".to_owned(),
            "-p".to_owned(),
            self.port.to_string(),
        ];
        if let Some(tls) = &self.tls {
            args.extend(tls_cli_args(&tls.files));
        }
        args
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = self.dir.join("redis.log");
        let child = Command::new(binary("redis-server"))
            .args(self.port_args())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
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

    /// `redis://127.0.0.1:<port>`, or `rediss://127.0.0.1:<port>` for a TLS server.
    #[must_use]
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// `redis://…` even for a TLS server (what a plaintext client would try).
    #[must_use]
    pub fn plain_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis://<user>:<password>@127.0.0.1:<port>` (`rediss` for a TLS server).
    #[must_use]
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{user}:{password}@127.0.0.1:{}", self.port)
    }

    /// The certificates of a TLS server.
    #[must_use]
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref().map(|t| &t.files)
    }

    /// Runs `ACL SETUSER` with the words of `rules` (e.g. `alice on >secret ~app:* +get`).
    ///
    /// # Panics
    /// When the server does not answer `OK`.
    pub fn acl_setuser(&self, rules: &str) {
        let mut args = vec!["ACL", "SETUSER"];
        args.extend(rules.split_whitespace());
        let reply = self.cli(&args);
        assert_eq!(reply, "OK", "ACL SETUSER {rules}: {reply}");
    }

    /// The process id, while the server runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Runs `redis-cli` against this server (as the default user) and returns its trimmed output.
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> String {
        run_cli(&self.cli_args(), args)
    }

    /// How many times this server has run `command` (lower case, as `INFO commandstats` names it: `evalsha`).
    #[must_use]
    pub fn command_calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a number of calls"))
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
    pub fn wait_until(&self, what: &str, ready: impl FnMut() -> bool) {
        self.wait_until_for(what, STARTUP, ready);
    }

    /// Polls `ready` every 20 ms for up to `within`.
    ///
    /// # Panics
    /// When `ready` never holds.
    pub fn wait_until_for(&self, what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while !ready() {
            assert!(
                Instant::now() < deadline,
                "redis on port {}: no {what} after {within:?}",
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
        if let Some(dir) = &self.cert_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A private Redis Cluster of primaries without replicas, made with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The certificates' directory of a TLS cluster (removed with the cluster).
    cert_dir: Option<PathBuf>,
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        if let Some(dir) = &self.cert_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl RedisCluster {
    /// `masters` cluster-enabled servers (at least 3), joined and with every slot assigned.
    ///
    /// # Panics
    /// When the servers do not start or the cluster does not form within 20 s.
    #[must_use]
    pub fn start(masters: usize) -> Self {
        Self::start_inner(masters, None)
    }

    /// A Cluster whose nodes speak TLS only (clients and the cluster bus), with one CA and one certificate.
    ///
    /// # Panics
    /// When the servers do not start or the cluster does not form within 20 s.
    #[must_use]
    pub fn start_tls(masters: usize) -> Self {
        let dir = fresh_dir("cluster-certs");
        let files = TlsFiles::generate(&dir, &TlsFiles::LOCAL_NAMES, false);
        let mut cluster = Self::start_inner(
            masters,
            Some(ServerTls {
                files,
                auth_clients: false,
            }),
        );
        cluster.cert_dir = Some(dir);
        cluster
    }

    fn start_inner(masters: usize, tls: Option<ServerTls>) -> Self {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 primaries"
        );
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_inner(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ],
                    tls.clone(),
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let tool_args = tls
            .as_ref()
            .map(|t| tls_cli_args(&t.files))
            .unwrap_or_default();
        let out = Command::new(binary("redis-cli"))
            .args(&tool_args)
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
        let cluster = Self {
            nodes,
            cert_dir: None,
        };
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
        let tool_args = self.nodes[0]
            .tls
            .as_ref()
            .map(|t| tls_cli_args(&t.files))
            .unwrap_or_default();
        let out = Command::new(binary("redis-cli"))
            .args(&tool_args)
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

/// The master name the private Sentinel setups monitor.
pub const SENTINEL_MASTER: &str = "tollgate-primary";

/// How a private Sentinel setup is made: [`RedisSentinels::start_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SentinelSetup {
    /// Everything speaks TLS only, with certificates from one CA, and every server and Sentinel demands a client
    /// certificate: the primary and the replica (replication over TLS too), and the Sentinels to their clients, to
    /// the servers and to each other. The clients use [`RedisSentinels::tls`].
    pub tls: bool,
    /// A demoted primary keeps its clients. Sentinel ends its reconfiguration of a demoted primary with
    /// `CLIENT KILL TYPE normal`, so clients connected to it have to reconnect and ask Sentinel again; here the
    /// Sentinels send a harmless `EXISTS` instead of `CLIENT` (`sentinel rename-command`), so only a client that
    /// follows Sentinel's announcements leaves the demoted server.
    pub keep_clients_on_demotion: bool,
}

/// One `redis-sentinel` process; killed on drop.
#[derive(Debug)]
struct SentinelProcess {
    port: u16,
    dir: PathBuf,
    tls: Option<TlsFiles>,
    child: Option<Child>,
}

impl SentinelProcess {
    fn start(
        primary_port: u16,
        down_after: Duration,
        setup: SentinelSetup,
        tls: Option<&TlsFiles>,
    ) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = fresh_dir(&format!("sentinel-{port}"));
            let conf = dir.join("sentinel.conf");
            let log = dir.join("sentinel.log");
            let mut text = match tls {
                None => format!("port {port}\n"),
                // `tls-replication`: Sentinel's own connections (to the servers and to the other Sentinels) use
                // TLS, presenting `tls-cert-file` as their client certificate.
                Some(files) => format!(
                    "port 0\ntls-port {port}\ntls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                     tls-auth-clients yes\ntls-replication yes\n",
                    cert = files.server_cert.display(),
                    key = files.server_key.display(),
                    ca = files.ca.display(),
                ),
            };
            text.push_str(&format!(
                "bind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} {down}\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 10000\n\
                 sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
                dir = dir.display(),
                log = log.display(),
                down = down_after.as_millis(),
            ));
            if setup.keep_clients_on_demotion {
                // `CLIENT KILL TYPE normal` becomes `EXISTS KILL TYPE normal` (and `CLIENT SETNAME …` on
                // Sentinel's own links `EXISTS SETNAME …`): a command of any arity that changes nothing, so the
                // `MULTI` block that demotes a primary still runs.
                text.push_str(&format!(
                    "sentinel rename-command {SENTINEL_MASTER} CLIENT EXISTS\n"
                ));
            }
            std::fs::write(&conf, text).expect("cannot write sentinel.conf");
            let child = Command::new(binary("redis-sentinel"))
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start redis-sentinel ({e}): install it (Debian/Ubuntu: `sudo apt-get install -y \
                         redis-sentinel`; scripts/test.sh does)"
                    )
                });
            let mut sentinel = Self {
                port,
                dir,
                tls: tls.cloned(),
                child: Some(child),
            };
            let deadline = Instant::now() + STARTUP;
            while Instant::now() < deadline {
                if let Some(Ok(Some(_))) = sentinel.child.as_mut().map(Child::try_wait) {
                    break;
                }
                if sentinel.cli(&["PING"]) == "PONG" {
                    return sentinel;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            last = std::fs::read_to_string(&log).unwrap_or_default();
        }
        panic!("redis-sentinel did not start; its log:\n{last}");
    }

    fn cli(&self, args: &[&str]) -> String {
        let mut tool_args = vec![
            "-h".into(),
            "127.0.0.1".into(),
            "-p".into(),
            self.port.to_string(),
        ];
        if let Some(files) = &self.tls {
            tool_args.extend(tls_cli_args(files));
        }
        run_cli(&tool_args, args)
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private Sentinel setup: one primary, one replica and three `redis-sentinel` processes (quorum 2)
/// monitoring [`SENTINEL_MASTER`] with a short `down-after-milliseconds`, so a failover takes seconds.
///
/// The servers run with `replica-read-only no`: a client that kept writing to a demoted primary would succeed
/// there silently (instead of getting `READONLY`), which is what the tests must be able to see.
#[derive(Debug)]
pub struct RedisSentinels {
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    /// The certificates' directory of a TLS setup (removed with the setup).
    cert_dir: Option<PathBuf>,
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        self.sentinels.clear();
        self.servers.clear();
        if let Some(dir) = &self.cert_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl RedisSentinels {
    /// Starts the servers and Sentinels and waits until every Sentinel knows the replica and the other two.
    ///
    /// # Panics
    /// When a process does not start or the Sentinels do not agree within 20 s.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(SentinelSetup::default())
    }

    /// [`start`](Self::start), with TLS only everywhere ([`SentinelSetup::tls`]).
    ///
    /// # Panics
    /// When a process does not start or the Sentinels do not agree within 20 s.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start_with(SentinelSetup {
            tls: true,
            ..SentinelSetup::default()
        })
    }

    /// [`start`](Self::start) as `setup` says.
    ///
    /// # Panics
    /// When a process does not start or the Sentinels do not agree within 20 s.
    #[must_use]
    pub fn start_with(setup: SentinelSetup) -> Self {
        let cert_dir = setup.tls.then(|| fresh_dir("sentinel-certs"));
        let tls = cert_dir.as_ref().map(|dir| ServerTls {
            files: TlsFiles::generate(dir, &TlsFiles::LOCAL_NAMES, false),
            auth_clients: true,
        });
        let primary = RedisServer::start_inner(&["--replica-read-only", "no"], tls.clone());
        let _ = primary.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        let port = primary.port().to_string();
        let replica = RedisServer::start_inner(
            &[
                "--replicaof",
                "127.0.0.1",
                &port,
                "--replica-read-only",
                "no",
            ],
            tls.clone(),
        );
        let _ = replica.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
        replica.wait_until("replication link up", || {
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        let files = tls.as_ref().map(|t| &t.files);
        let sentinels = (0..3)
            .map(|_| {
                SentinelProcess::start(primary.port(), Duration::from_millis(1_000), setup, files)
            })
            .collect();
        let started = Self {
            servers: vec![primary, replica],
            sentinels,
            cert_dir,
        };
        started.wait_until_known();
        started
    }

    /// The certificates of a TLS setup: one CA signed the servers' and the Sentinels' certificate and the client
    /// certificate, which every server and Sentinel demands.
    #[must_use]
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.servers[0].tls()
    }

    fn wait_until_known(&self) {
        let deadline = Instant::now() + STARTUP;
        for s in &self.sentinels {
            loop {
                let peers = s.cli(&["SENTINEL", "SENTINELS", SENTINEL_MASTER]);
                let replicas = s.cli(&["SENTINEL", "REPLICAS", SENTINEL_MASTER]);
                let known_peers = peers.lines().filter(|l| *l == "runid").count();
                if known_peers >= 2 && replicas.lines().any(|l| l == "slave") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "Sentinel on {} does not know its peers and the replica: {peers} / {replicas}",
                    s.port
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The Sentinels' addresses, `127.0.0.1:<port>`.
    #[must_use]
    pub fn addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// The port of the primary the first answering Sentinel names now.
    ///
    /// # Panics
    /// When no Sentinel answers.
    #[must_use]
    pub fn primary_port(&self) -> u16 {
        for s in &self.sentinels {
            let reply = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER]);
            if let Some(port) = reply.lines().nth(1).and_then(|p| p.trim().parse().ok()) {
                return port;
            }
        }
        panic!("no Sentinel names the primary");
    }

    /// The server on `port` (the primary or the replica, whichever it is now).
    ///
    /// # Panics
    /// When neither server has that port.
    #[must_use]
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server on port {port}"))
    }

    /// The server Sentinel names as the primary now.
    #[must_use]
    pub fn primary(&self) -> &RedisServer {
        self.server(self.primary_port())
    }

    /// The other server.
    #[must_use]
    pub fn replica(&self) -> &RedisServer {
        let primary = self.primary_port();
        self.servers
            .iter()
            .find(|s| s.port() != primary)
            .expect("two servers")
    }

    /// Runs `redis-cli` against the `i`-th Sentinel (in the order of [`addrs`](Self::addrs)) and returns its
    /// trimmed output.
    #[must_use]
    pub fn sentinel_cli(&self, i: usize, args: &[&str]) -> String {
        self.sentinels[i].cli(args)
    }

    /// `SENTINEL FAILOVER` on the first Sentinel: the replica is promoted without the primary failing.
    ///
    /// # Panics
    /// When the Sentinel refuses.
    pub fn failover(&self) {
        let reply = self.sentinels[0].cli(&["SENTINEL", "FAILOVER", SENTINEL_MASTER]);
        assert_eq!(reply, "OK", "SENTINEL FAILOVER: {reply}");
    }

    /// SIGKILLs the current primary; the Sentinels notice after `down-after-milliseconds` and promote the replica.
    pub fn kill_primary(&mut self) {
        let port = self.primary_port();
        if let Some(server) = self.servers.iter_mut().find(|s| s.port() == port) {
            server.kill();
        }
    }

    /// Starts the server on `port` again after [`kill_primary`](Self::kill_primary) (or restarts it): empty, since
    /// nothing is persisted, on the same port and with the same arguments. A primary that comes back within the
    /// Sentinels' `down-after-milliseconds` stays the primary, and its replica resyncs from it (so forgets too).
    ///
    /// # Panics
    /// When neither server has that port, or it does not come back.
    pub fn restart(&mut self, port: u16) {
        let server = self
            .servers
            .iter_mut()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server on port {port}"));
        server.restart();
        // The setting `start_with` made is gone with the process (the replica's full resync would wait 5 s).
        let _ = server.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    }

    /// The longest a failover of these Sentinels may take, the old primary's reconfiguration as a replica
    /// included: their `failover-timeout` is 10 s, and Sentinel tries a failover that did not complete again
    /// after twice that; 60 s is an attempt that fails, the retry and its reconfiguration (a loaded machine's
    /// Sentinels can miss the first attempt's deadline).
    pub const FAILOVER_WITHIN: Duration = Duration::from_secs(60);

    /// Waits until the Sentinels name a primary other than `old` that reports `role:master`; returns how long that
    /// took.
    ///
    /// # Panics
    /// After [`FAILOVER_WITHIN`](Self::FAILOVER_WITHIN) without a new primary.
    #[must_use]
    pub fn wait_for_new_primary(&self, old: u16) -> Duration {
        let started = Instant::now();
        loop {
            let port = self.primary_port();
            if port != old && self.server(port).cli(&["ROLE"]).starts_with("master") {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Self::FAILOVER_WITHIN,
                "no failover away from port {old} after {:?}",
                Self::FAILOVER_WITHIN
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
