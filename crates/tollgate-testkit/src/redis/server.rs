//! A private `redis-server` process.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tls::TlsFiles;

use super::{INSTALL_HINT, STARTUP, binary, free_port, fresh_dir, run_cli, tls_cli_args};

/// A private `redis-server` on a free loopback port, without persistence; killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    pub(super) tls: Option<ServerTls>,
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
