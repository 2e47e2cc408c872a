//! `examples/axum_server --config FILE` as a black box over real TCP: the shipped policy file (3 then 429 for an
//! ordinary key, 6 for `gold`, `internal` never limited and counted as exempt), `SIGHUP` reloads (a key whose
//! policy is unchanged keeps its state, an invalid file keeps the old set and says where it is wrong), and an
//! invalid file at start, on the in-process store and on a private Redis.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_testkit::examples::{ExampleServer, example};
use tollgate_testkit::http::{Reply, get};
use tollgate_testkit::redis::RedisServer;

/// The policy file shipped with the examples: the documented example as written.
const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/policy.toml");

/// `axum_server --config FILE` running, asked over TCP.
struct Server(ExampleServer);

impl Server {
    fn start(config: &Path, args: &[&str]) -> Self {
        let config = config.to_str().expect("a UTF-8 path");
        let args: Vec<&str> = ["--config", config]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        Self(ExampleServer::start("axum_server", &args))
    }

    fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    fn get(&self, key: &str) -> Reply {
        get(self.addr(), "/", &[("x-api-key", key)])
    }

    /// `n` requests with API key `key`, and how long they took from the first sent to the last answered.
    fn statuses(&self, key: &str, n: usize) -> (Vec<u16>, Duration) {
        let sent = Instant::now();
        let statuses = (0..n).map(|_| self.get(key).status).collect();
        (statuses, sent.elapsed())
    }

    /// Sends SIGHUP and returns the line the server answers it with.
    fn reload(&mut self) -> String {
        self.0.signal("-HUP");
        self.0.next_line()
    }

    fn metric(&self, series: &str) -> Option<u64> {
        let text = get(self.0.metrics_addr(), "/metrics", &[]).body;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }
}

/// The most a token bucket of `burst` refilling `limit` per `period` can admit in `elapsed`: the burst, plus the
/// whole tokens accrued (a fraction of a token admits nothing).
fn at_most(burst: u64, limit: u64, period: Duration, elapsed: Duration) -> usize {
    let accrued = elapsed.as_secs_f64() * limit as f64 / period.as_secs_f64();
    (burst + accrued as u64) as usize
}

/// `statuses` start with `burst` admissions, admit no more than the bucket can in `elapsed`, and refuse the rest.
fn assert_bucket(statuses: &[u16], burst: usize, limit: u64, period: Duration, elapsed: Duration) {
    assert!(
        statuses[..burst].iter().all(|s| *s == 200),
        "the first {burst} are admitted: {statuses:?}"
    );
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    let most = at_most(burst as u64, limit, period, elapsed);
    assert!(
        admitted <= most,
        "{admitted} admitted, at most {most} in {elapsed:?}: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    if statuses.len() > most {
        assert!(statuses.contains(&429), "{statuses:?}");
    }
}

fn the_issue_example(store_args: &[&str]) {
    let mut args = vec!["--metrics-addr", "127.0.0.1:0"];
    args.extend_from_slice(store_args);
    let server = Server::start(Path::new(POLICY), &args);
    let period = Duration::from_secs(10);

    let (ordinary, elapsed) = server.statuses("ordinary", 5);
    assert_bucket(&ordinary, 3, 3, period, elapsed);
    let denied = server.get("ordinary");
    assert_eq!(denied.status, 429);
    assert!(denied.header("retry-after").is_some(), "{denied:#?}");
    assert_eq!(denied.header("x-ratelimit-limit"), Some("3"));

    let (gold, elapsed) = server.statuses("gold", 9);
    assert_bucket(&gold, 6, 6, period, elapsed);
    assert_eq!(server.get("gold").header("x-ratelimit-limit"), Some("6"));

    let (internal, _) = server.statuses("internal", 20);
    assert_eq!(internal, [200; 20], "exempt keys are never limited");
    let exempt = server.get("internal");
    assert_eq!(exempt.header("ratelimit"), None, "no limit, no fields");
    assert_eq!(
        server.metric(r#"tollgate_decisions_total{limiter="per-key",outcome="exempt"}"#),
        Some(21),
        "every exemption counted"
    );
    // A request without the key's header is a configuration error, not a free pass.
    assert_eq!(get(server.addr(), "/", &[]).status, 500);
    assert_eq!(get(server.addr(), "/health", &[]).status, 200);
}

#[test]
fn the_issue_example_in_process() {
    the_issue_example(&[]);
}

#[test]
fn the_issue_example_on_redis() {
    let redis = RedisServer::start();
    the_issue_example(&["--redis-url", &redis.url()]);
}

/// A policy file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> Self {
        Self(std::env::temp_dir().join(format!(
            "tollgate-policy-{}-{name}.toml",
            std::process::id()
        )))
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.0, text).expect("write the policy file");
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The issue's policy with hour-long periods (no token comes back during the test) and `gold` at `gold`.
fn hourly(gold: u64, extra: &str) -> String {
    std::fs::read_to_string(POLICY)
        .expect("the example policy")
        .replace("\"10s\"", "\"1h\"")
        .replace("limit = 6", &format!("limit = {gold}"))
        .replace("burst = 6", &format!("burst = {gold}"))
        + extra
}

const EVERYONE: &str = "
[[limiter]]
name = \"everyone\"
key = \"global\"
limit = 1000
period = \"1h\"
";

fn sighup_reloads(name: &str, store_args: &[&str]) {
    let file = TempFile::new(name);
    file.write(&hourly(6, ""));
    let mut server = Server::start(&file.0, store_args);
    let (a, _) = server.statuses("a", 4);
    assert_eq!(a, [200, 200, 200, 429]);
    let (gold, _) = server.statuses("gold", 2);
    assert_eq!(gold, [200, 200]);

    // gold's plan changes and a limiter is added; the limiter's own policy stays.
    file.write(&hourly(10, EVERYONE));
    assert_eq!(
        server.reload(),
        "reloaded the policy file: kept -; changed per-key; added everyone; removed -"
    );
    assert_eq!(
        server.get("a").status,
        429,
        "an unchanged policy keeps its keys' state"
    );
    let (gold, _) = server.statuses("gold", 11);
    assert_eq!(
        &gold[..10],
        [200; 10],
        "a changed plan starts afresh: {gold:?}"
    );
    assert_eq!(gold[10], 429);
    let b = server.get("b");
    assert_eq!(b.status, 200);
    assert_eq!(
        b.header("ratelimit-policy"),
        Some(r#""per-key";q=3;w=3600, "everyone";q=1000;w=3600"#),
        "the added limiter applies: {b:#?}"
    );

    // Nothing changes: everything is kept.
    assert_eq!(
        server.reload(),
        "reloaded the policy file: kept per-key, everyone; changed -; added -; removed -"
    );
    assert_eq!(server.get("a").status, 429);

    // An invalid file: refused with its place, the set in force stays.
    let invalid = hourly(10, EVERYONE).replace("limit = 1000", "limit = \"lots\"");
    file.write(&invalid);
    let refused = server.reload();
    let line = invalid
        .lines()
        .position(|l| l.contains("lots"))
        .expect("the line")
        + 1;
    let place = format!(
        "{}:{line}:9: invalid type: string \"lots\", expected u64",
        file.0.display()
    );
    assert_eq!(
        refused,
        format!("reload refused, the limits in force stay: {place}")
    );
    assert_eq!(server.get("a").status, 429);
    assert_eq!(server.get("gold").status, 429);
    assert_eq!(
        server.get("c").header("ratelimit-policy"),
        Some(r#""per-key";q=3;w=3600, "everyone";q=1000;w=3600"#)
    );

    // Removing a limiter.
    file.write(&hourly(10, ""));
    assert_eq!(
        server.reload(),
        "reloaded the policy file: kept per-key; changed -; added -; removed everyone"
    );
    assert_eq!(
        server.get("d").header("ratelimit-policy"),
        Some(r#""per-key";q=3;w=3600"#)
    );
}

#[test]
fn sighup_reloads_in_process() {
    sighup_reloads("memory", &[]);
}

#[test]
fn sighup_reloads_on_redis() {
    let redis = RedisServer::start();
    sighup_reloads("redis", &["--redis-url", &redis.url()]);
}

/// The fields of both families on `reply`: (IETF `RateLimit-Policy`, GitHub-style `X-RateLimit-Limit`).
fn families(reply: &Reply) -> (Option<&str>, Option<&str>) {
    (
        reply.header("ratelimit-policy"),
        reply.header("x-ratelimit-limit"),
    )
}

/// `headers = ...` edited and SIGHUP sent: the next responses, admitted and refused, write the new families, and
/// the limiter (its policy unchanged) is kept with its keys' state.
fn sighup_changes_the_header_families(name: &str, store_args: &[&str]) {
    let file = TempFile::new(name);
    file.write(&hourly(6, ""));
    let mut server = Server::start(&file.0, store_args);
    let policy = r#""per-key";q=3;w=3600"#;
    assert_eq!(
        families(&server.get("a")),
        (Some(policy), Some("3")),
        "all by default"
    );

    file.write(&(String::from("headers = [\"ietf\"]\n") + &hourly(6, "")));
    assert_eq!(
        server.reload(),
        "reloaded the policy file: kept per-key; changed -; added -; removed -; new header families"
    );
    assert_eq!(families(&server.get("a")), (Some(policy), None));

    // `RateLimit` alone: the state without the policy.
    file.write(&(String::from("headers = [\"ratelimit\"]\n") + &hourly(6, "")));
    assert!(server.reload().ends_with("; new header families"));
    let other = server.get("c");
    assert_eq!(families(&other), (None, None));
    assert!(
        other
            .header("ratelimit")
            .is_some_and(|v| v.starts_with(r#""per-key";r=2;t="#)),
        "{other:#?}"
    );

    file.write(&(String::from("headers = [\"github\"]\n") + &hourly(6, "")));
    assert!(server.reload().ends_with("; new header families"));
    let third = server.get("a");
    assert_eq!(
        third.status, 200,
        "the key's state is kept: its third request"
    );
    assert_eq!(families(&third), (None, Some("3")));
    assert_eq!(third.header("x-ratelimit-remaining"), Some("0"));
    let refused = server.get("a");
    assert_eq!(refused.status, 429);
    assert_eq!(families(&refused), (None, Some("3")));

    file.write(&(String::from("headers = [\"none\"]\n") + &hourly(6, "")));
    assert!(server.reload().ends_with("; new header families"));
    let refused = server.get("a");
    assert_eq!(refused.status, 429);
    assert_eq!(families(&refused), (None, None));
    assert!(refused.header("retry-after").is_some(), "{refused:#?}");
    assert_eq!(families(&server.get("b")), (None, None));

    // Back to the default (no `headers`): both again.
    file.write(&hourly(6, ""));
    assert!(server.reload().ends_with("; new header families"));
    assert_eq!(families(&server.get("b")), (Some(policy), Some("3")));
}

#[test]
fn sighup_changes_the_header_families_in_process() {
    sighup_changes_the_header_families("families-memory", &[]);
}

#[test]
fn sighup_changes_the_header_families_on_redis() {
    let redis = RedisServer::start();
    sighup_changes_the_header_families("families-redis", &["--redis-url", &redis.url()]);
}

#[test]
fn an_invalid_file_at_start_exits_non_zero_with_its_place() {
    let file = TempFile::new("invalid");
    file.write(
        "[[limiter]]\nname = \"a\"\nkey = \"header:x-api-key\"\nlimit = 3\nperiod = \"10 s\"\n",
    );
    let out = Command::new(example("axum_server"))
        .env_remove("REDIS_URL")
        .args(["--addr", "127.0.0.1:0", "--config"])
        .arg(&file.0)
        .output()
        .expect("run the example server");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        format!(
            "axum_server: {}:5:10: \"10 s\": expected a duration such as 500ms, 10s, 15m, 1h or 1d",
            file.0.display()
        )
    );
    assert!(out.stdout.is_empty(), "it never listened");
}
