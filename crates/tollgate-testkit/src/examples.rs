//! The example binaries the black-box tests run, and [`ExampleServer`], one of them running.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};

/// Runs example `name` with `args` to its end; what it printed.
///
/// # Panics
/// If it cannot be run, or exits unsuccessfully (with its stdout and stderr in the message).
pub fn run_example<S: AsRef<OsStr>>(name: &str, args: impl IntoIterator<Item = S>) -> Output {
    let out = Command::new(example(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run the {name} example: {e}"));
    assert!(
        out.status.success(),
        "{name} exited with {}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The path of example `name` as built for the running test's profile (`target/<profile>/examples/<name>`).
///
/// # Panics
/// If the binary is missing: `scripts/test.sh` builds every example before the tests (`cargo test` alone does not
/// build a `test = true` example such as `fleet` as a binary).
pub fn example(name: &str) -> PathBuf {
    // Integration tests run from target/<profile>/deps.
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join(name))
        .expect("target/<profile>/examples");
    assert!(
        path.exists(),
        "{} is missing: build the examples first (`cargo build --workspace --all-features --examples`, as \
         scripts/test.sh does)",
        path.display()
    );
    path
}

/// A running example server (`axum_server`, `grpc_server`), started on an ephemeral port and killed when dropped.
///
/// It reads the server's first lines: the `listening on …` line gives [`addr`](Self::addr), and when the
/// arguments ask for `--metrics-addr`, the `metrics on http://…/metrics` line gives
/// [`metrics_addr`](Self::metrics_addr), perhaps after other start-up lines. Later lines (a reload's answer) come from [`next_line`](Self::next_line).
#[derive(Debug)]
pub struct ExampleServer {
    child: Child,
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
    first_line: String,
    // Kept open: the server writes more lines, and a closed pipe would make it fail.
    stdout: BufReader<ChildStdout>,
}

impl ExampleServer {
    /// Starts example `name` with `--addr 127.0.0.1:0` and then `args`, without the test's `REDIS_URL` (which the
    /// servers would take for `--redis-url`: a server uses Redis only when `args` say so).
    ///
    /// # Panics
    /// If the binary is missing or does not start, or its first lines are not the expected ones.
    pub fn start(name: &str, args: &[&str]) -> Self {
        let mut child = Command::new(example(name))
            .env_remove("REDIS_URL")
            .args(["--addr", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let stdout = BufReader::new(child.stdout.take().expect("its stdout"));
        let mut server = Self {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            metrics: None,
            first_line: String::new(),
            stdout,
        };
        let first = server.next_line();
        server.addr = address_after(&first, "listening on http://")
            .or_else(|| address_after(&first, "listening on "))
            .unwrap_or_else(|| panic!("unexpected first line {first:?} from {name} {args:?}"));
        server.first_line = first;
        if args.contains(&"--metrics-addr") {
            // Other start-up lines (what the stack holds) may come before it.
            let mut seen = Vec::new();
            while server.metrics.is_none() {
                let line = server.next_line();
                server.metrics = address_after(&line, "metrics on http://");
                seen.push(line);
                assert!(
                    seen.len() < 16,
                    "no metrics line from {name} {args:?} in {seen:?}"
                );
            }
        }
        server
    }

    /// The address the server listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of its `/metrics` endpoint.
    ///
    /// # Panics
    /// If it was started without `--metrics-addr`.
    #[must_use]
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics.expect("started without --metrics-addr")
    }

    /// The server's first line (`listening on …`, with what it runs).
    #[must_use]
    pub fn first_line(&self) -> &str {
        &self.first_line
    }

    /// The next line the server prints, without its line end.
    ///
    /// # Panics
    /// If the server closed its output.
    pub fn next_line(&mut self) -> String {
        let mut line = String::new();
        let read = self
            .stdout
            .read_line(&mut line)
            .expect("a line from the server");
        assert!(read > 0, "the server ended its output");
        line.trim_end().to_owned()
    }

    /// Sends `signal` (`-HUP`, `-TERM`) to the server through the `kill` program.
    ///
    /// # Panics
    /// If `kill` fails.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "kill {signal} failed: {status:?}"
        );
    }

    /// Waits for the server to exit (after a signal) and returns its status.
    ///
    /// # Panics
    /// If waiting fails.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait().expect("wait for the server")
    }
}

impl Drop for ExampleServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The socket address right after `prefix` in `line`, up to a space or a `/`.
fn address_after(line: &str, prefix: &str) -> Option<SocketAddr> {
    line.strip_prefix(prefix)?
        .split(|c: char| c.is_whitespace() || c == '/')
        .next()?
        .parse()
        .ok()
}
