//! The example servers' Redis connection flags (`--redis-ca`, `--redis-cert`/`--redis-key`,
//! `--redis-password-file`, `--redis-sentinel`/`--redis-master`), run as processes against private TLS and ACL
//! servers: a production-shaped configuration starts, and each configuration error stops the server with a
//! non-zero exit and one line naming the cause.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_testkit::redis::{RedisServer, unique_prefix};
use tollgate_testkit::tls::TlsFiles;

const SERVERS: [&str; 2] = ["axum_server", "grpc_server"];

use tollgate_testkit::examples::example;

/// Runs `server` with `args` on a free port and expects it to fail: its exit code and stderr.
fn fails(server: &str, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(example(server))
        .env_remove("REDIS_URL")
        .args(["--addr", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitable") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{server} {args:?} kept running: a configuration error must stop it");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
    (status.code().unwrap_or(-1), stderr)
}

/// Asserts one line of stderr that contains `cause`, and a non-zero exit.
fn fails_with(server: &str, args: &[&str], cause: &str) {
    let (code, stderr) = fails(server, args);
    assert_ne!(code, 0, "{server} {args:?} exited 0");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "{server} {args:?}: one line, got {stderr:?}"
    );
    assert!(
        lines[0].contains(cause),
        "{server} {args:?}: {:?} does not name {cause:?}",
        lines[0]
    );
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique_prefix("flags"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn path(p: &std::path::Path) -> String {
    p.display().to_string()
}

#[test]
fn tls_with_an_acl_user_and_a_password_file_starts_both_servers() {
    let redis = RedisServer::start_tls(true);
    let files = redis.tls().unwrap().clone();
    for (i, server) in SERVERS.into_iter().enumerate() {
        let namespace = format!("tollgate-{}-server", if i == 0 { "axum" } else { "grpc" });
        redis.acl_setuser(&format!(
            "app{i} on >pw{i} resetkeys ~{namespace}:* resetchannels -@all +evalsha +eval +script|load +time \
             +hmget +hset +hgetall +hdel +pexpire +pexpireat +pttl +zadd +zcount +zrange +zrem +zremrangebyscore +zscore"
        ));
        let password = temp_file("password", &format!("pw{i}\n"));
        let url = format!("rediss://app{i}@127.0.0.1:{}", redis.port());
        let mut child = Command::new(example(server))
            .env_remove("REDIS_URL")
            .args(["--addr", "127.0.0.1:0", "--redis-url", &url])
            .args(["--redis-namespace", &namespace])
            .args(["--redis-ca", &path(&files.ca)])
            .args(["--redis-cert", &path(&files.client_cert)])
            .args(["--redis-key", &path(&files.client_key)])
            .args(["--redis-password-file", &path(&password)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the example starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let mut stderr = String::new();
        let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
        assert!(
            line.starts_with("listening on"),
            "{server}: {line:?} {stderr}"
        );
        assert!(
            line.contains("app0:") || line.contains(&format!("app{i}@")),
            "{line}"
        );
        assert!(
            !line.contains(&format!("pw{i}")),
            "the password is never printed: {line}"
        );
        // (A warning that the 50 ms start-up probe was slow on a loaded machine is fine; an error is not.)
        assert!(
            !stderr.contains(&format!("{server}:")),
            "{server} failed: {stderr}"
        );
    }
}

#[test]
fn each_configuration_error_stops_the_server_with_one_line() {
    let redis = RedisServer::start_tls(false);
    let files = redis.tls().unwrap().clone();
    let other_ca =
        TlsFiles::unrelated_ca(&std::env::temp_dir().join(format!("{}.pem", unique_prefix("ca"))));
    let namespace_rule = "resetkeys ~tollgate-*:* resetchannels -@all +evalsha +eval +script|load +time +hmget \
                          +hset +pexpire";
    redis.acl_setuser(&format!("app on >right {namespace_rule}"));
    redis.acl_setuser("noperm on >right resetkeys ~tollgate-*:* -@all +script|load");
    let wrong = temp_file("password", "wrong\n");
    let right = temp_file("password", "right\n");
    let url = |user: &str| format!("rediss://{user}@127.0.0.1:{}", redis.port());
    let ca = path(&files.ca);
    for server in SERVERS {
        fails_with(
            server,
            &["--redis-url", &url("app"), "--redis-ca", &path(&other_ca)],
            "not trusted",
        );
        fails_with(
            server,
            &[
                "--redis-url",
                &url("app"),
                "--redis-ca",
                &ca,
                "--redis-password-file",
                &path(&wrong),
            ],
            "refused the credentials",
        );
        fails_with(
            server,
            &[
                "--redis-url",
                &url("noperm"),
                "--redis-ca",
                &ca,
                "--redis-password-file",
                &path(&right),
            ],
            "lacks a permission",
        );
        fails_with(
            server,
            &[
                "--redis-url",
                &url("app"),
                "--redis-ca",
                &ca,
                "--redis-password-file",
                "/nonexistent/pw",
            ],
            "/nonexistent/pw",
        );
        fails_with(server, &["--redis-url", &redis.plain_url()], "rediss://");
        fails_with(
            server,
            &["--redis-sentinel", "127.0.0.1:26379"],
            "--redis-master",
        );
        fails_with(
            server,
            &["--redis-ca", &ca],
            "need --redis-url or --redis-sentinel",
        );
        fails_with(
            server,
            &["--redis-url", &url("app"), "--redis-cert", &ca],
            "--redis-cert and --redis-key go together",
        );
    }
}
