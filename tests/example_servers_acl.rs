//! The example servers run as exactly the documented least-privilege ACL user (`LEAST_PRIVILEGE_ACL`, the line the
//! README shows), on a private Redis: with the default `--redis-namespace` the line is used as written; with another
//! namespace the line's `~tollgate:*` follows it, and nothing else changes.

use std::process::Command;

use tollgate::redis::{DEFAULT_NAMESPACE, LEAST_PRIVILEGE_ACL};
use tollgate_testkit::examples::{ExampleServer, example};
use tollgate_testkit::http::get;
use tollgate_testkit::redis::RedisServer;

/// The documented line for `password`, with its key pattern for `namespace`: the README's text with only the
/// password (and, for another namespace, the namespace) substituted.
fn documented_user(password: &str, namespace: &str) -> String {
    let line = LEAST_PRIVILEGE_ACL;
    let pattern = format!(" ~{DEFAULT_NAMESPACE}:* ");
    assert!(line.contains(&pattern), "{line}");
    line.strip_prefix("ACL SETUSER ")
        .expect("an ACL SETUSER line")
        .replacen(">PASSWORD", &format!(">{password}"), 1)
        .replacen(&pattern, &format!(" ~{namespace}:* "), 1)
}

/// `axum_server` as the documented user decides on Redis (the rate limiter and the concurrency limiter's slots),
/// and `grpc_server` too, under `namespace` (`None`: the default, not given on the command line).
fn both_servers_run_as_the_documented_user(namespace: Option<&str>) {
    let redis = RedisServer::start();
    redis.acl_setuser(&documented_user(
        "s3cret",
        namespace.unwrap_or(DEFAULT_NAMESPACE),
    ));
    let url = redis.url_as("tollgate", "s3cret");
    let mut args = vec!["--limit", "2", "--period", "1h", "--redis-url", &url];
    if let Some(namespace) = namespace {
        args.extend(["--redis-namespace", namespace]);
    }

    let mut http = args.clone();
    http.extend(["--concurrency", "4"]);
    let server = ExampleServer::start("axum_server", &http);
    let statuses: Vec<u16> = (0..3)
        .map(|_| get(server.addr(), "/", &[]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429], "{namespace:?}");

    let server = ExampleServer::start("grpc_server", &args);
    let out = Command::new(example("grpc_client"))
        .args([
            "--addr",
            &format!("http://{}", server.addr()),
            "--count",
            "3",
        ])
        .output()
        .expect("run the gRPC client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let calls: Vec<&str> = stdout.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(calls.len(), 3, "{stdout}");
    assert!(
        calls[0].starts_with("#1 OK") && calls[1].starts_with("#2 OK"),
        "{stdout}"
    );
    assert!(calls[2].starts_with("#3 ResourceExhausted"), "{stdout}");

    // The keys are where the namespace says, and nowhere else.
    let keys = redis.cli(&["--scan", "--pattern", "*"]);
    let prefix = format!("{}:", namespace.unwrap_or(DEFAULT_NAMESPACE));
    assert!(!keys.trim().is_empty(), "the servers wrote their state");
    for key in keys.lines().filter(|k| !k.is_empty()) {
        assert!(key.starts_with(&prefix), "{key} outside {prefix}*");
    }
}

#[test]
fn the_example_servers_run_as_the_documented_acl_user() {
    both_servers_run_as_the_documented_user(None);
}

#[test]
fn the_documented_line_follows_the_namespace() {
    both_servers_run_as_the_documented_user(Some("myapp"));
}
