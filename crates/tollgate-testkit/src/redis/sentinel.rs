//! Private Sentinel setups: a primary, its replica and the `redis-sentinel` processes that watch them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tls::TlsFiles;

use super::server::{RedisServer, ServerTls};
use super::{STARTUP, binary, free_port, fresh_dir, run_cli, tls_cli_args};

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
