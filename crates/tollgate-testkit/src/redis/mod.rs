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

mod cluster;
mod sentinel;
mod server;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::tls::TlsFiles;

pub use cluster::{CLUSTER_NODE_TIMEOUT, RedisCluster};
pub use sentinel::{RedisSentinels, SENTINEL_MASTER, SentinelSetup};
pub use server::{RedisServer, ServerTls};

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
    locate(name).unwrap_or_else(|e| panic!("{e}: {INSTALL_HINT}"))
}

/// Whether the Redis binary `name` can be run (where [`binary`] looks for it).
#[must_use]
pub fn installed(name: &str) -> bool {
    locate(name).is_ok()
}

fn locate(name: &str) -> Result<PathBuf, String> {
    static FOUND: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut found = FOUND
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, path)) = found.iter().find(|(n, _)| n == name) {
        return Ok(path.clone());
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
            Ok(path)
        }
        Err(e) => Err(format!("cannot run `{}` ({e})", path.display())),
    }
}

/// Runs `redis-cli -u <url> <args>` and returns its trimmed output.
///
/// # Panics
/// When `redis-cli` is missing.
#[must_use]
pub fn cli_url(url: &str, args: &[&str]) -> String {
    run_cli(&["-u".to_owned(), url.to_owned()], args)
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
