//! The real `tollgate-rls` binary over TCP, asked by a tonic client built from the same protos: flags and bad
//! files, health, decisions on the in-process store and on Redis (two replicas sharing one limit), a directory
//! reload (and a bad change that keeps the loaded set), the deny cache and token leases on Redis, and a SIGTERM
//! with requests in flight.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_testkit::redis::{RedisServer, redis_url, unique_prefix};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate-rls");

/// A configuration directory of its own, removed at the end.
struct ConfigDir(PathBuf);

impl ConfigDir {
    fn new(files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(unique_prefix("tollgate-rls-config"));
        std::fs::create_dir_all(&dir).unwrap();
        let dir = Self(dir);
        for (name, text) in files {
            dir.write(name, text);
        }
        dir
    }

    fn write(&self, name: &str, text: &str) {
        // Written beside, then renamed: a reload never reads half a file.
        let tmp = self.0.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.0.join(name)).unwrap();
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `tollgate-rls`, killed when dropped.
struct Rls {
    child: Child,
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
    stderr: Arc<Mutex<Vec<String>>>,
}

fn address_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(marker)? + marker.len()..];
    rest.split(|c: char| c.is_whitespace() || c == '/')
        .next()?
        .parse()
        .ok()
}

impl Rls {
    fn start(config: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(["--listen", "127.0.0.1:0", "--config-dir"])
            .arg(config)
            .args(args)
            .env_remove("REDIS_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tollgate-rls");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&stderr);
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[tollgate-rls] {line}");
                lines.lock().unwrap().push(line);
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let addr = address_after(&first, "listening on ").unwrap_or_else(|| {
            panic!(
                "unexpected first line {first:?}; stderr {:?}",
                stderr.lock().unwrap()
            )
        });
        let metrics = if args.contains(&"--metrics-addr") {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            Some(address_after(&line, "metrics on http://").expect("the metrics line"))
        } else {
            None
        };
        // Keep reading (a closed pipe would fail the server's later lines).
        std::thread::spawn(move || for _ in out.lines().map_while(Result::ok) {});
        Self {
            child,
            addr,
            metrics,
            stderr,
        }
    }

    async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to tollgate-rls")
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit.
    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "tollgate-rls did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr_has(&self, text: &str) -> bool {
        self.stderr.lock().unwrap().iter().any(|l| l.contains(text))
    }

    /// The value of a metric series (its line's last field), 0 when absent.
    fn metric(&self, series: &str) -> f64 {
        let reply =
            tollgate_testkit::http::get(self.metrics.expect("--metrics-addr"), "/metrics", &[]);
        reply
            .body
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .map_or(0.0, |v| v.parse().unwrap())
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn request(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

async fn code(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    r: &RateLimitRequest,
) -> Code {
    client
        .should_rate_limit(r.clone())
        .await
        .expect("an answer")
        .into_inner()
        .overall_code()
}

async fn codes(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    r: &RateLimitRequest,
    n: usize,
) -> Vec<Code> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(code(client, r).await);
    }
    out
}

const PER_HOUR_3: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n";

use Code::{Ok as OK, OverLimit as OVER};

#[test]
fn help_lists_every_flag_and_bad_flags_or_files_exit_2_with_one_line() {
    let help = Command::new(BIN).arg("--help").output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--listen",
        "--config-dir",
        "--algorithm",
        "--merge-domains",
        "--reload-interval",
        "--redis-url",
        "--redis-namespace",
        "--redis-timeout",
        "--redis-password-file",
        "--redis-ca",
        "--redis-cert",
        "--redis-key",
        "--redis-sentinel",
        "--redis-master",
        "--redis-cluster",
        "--no-deny-cache",
        "--leases",
        "--lease-share",
        "--lease-ttl",
        "--max-keys",
        "--on-store-error",
        "--response-headers",
        "--shadow-mode",
        "--all-or-nothing",
        "--metrics-addr",
        "--log",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env_remove("REDIS_URL")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, err) = run(&["--config-dir", "/nonexistent", "--no-such-flag"]);
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("--no-such-flag"), "{err}");
    let (status, err) = run(&["--config-dir", "/x", "--algorithm", "leaky"]);
    assert_eq!(status, Some(2), "{err}");
    let bad = ConfigDir::new(&[(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight }\n",
    )]);
    let (status, err) = run(&[
        "--config-dir",
        bad.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(status, Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("edge.yaml:4:25: invalid rate limit unit 'fortnight'"),
        "{err}"
    );
    let (status, err) = run(&[
        "--config-dir",
        "/nonexistent-dir",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("/nonexistent-dir"), "{err}");
    let (status, err) = run(&["--config-dir", bad.path().to_str().unwrap(), "--leases"]);
    assert_eq!(status, Some(2), "{err}");
    assert!(
        err.contains("--leases") && err.contains("--redis-url"),
        "{err}"
    );
    let dir = bad.path().to_str().unwrap();
    for (flag, value) in [("--lease-share", "20"), ("--lease-ttl", "5s")] {
        let (status, err) = run(&["--config-dir", dir, flag, value]);
        assert_eq!(status, Some(2), "{err}");
        assert!(err.contains(flag) && err.contains("--leases"), "{err}");
    }
    let (status, err) = run(&["--config-dir", dir, "--leases", "--lease-share", "0"]);
    assert_eq!(status, Some(2), "{err}");
    assert!(err.contains("--lease-share"), "{err}");
}

#[tokio::test]
async fn in_process_decisions_and_health_over_tcp() {
    let dir = ConfigDir::new(&[("edge.yaml", PER_HOUR_3)]);
    let rls = Rls::start(dir.path(), &[]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", rls.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            status.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving
        );
    }
    let mut client = rls.client().await;
    let ann = request("edge", &[("user", "ann")]);
    assert_eq!(codes(&mut client, &ann, 4).await, [OK, OK, OK, OVER]);
    assert_eq!(
        code(&mut client, &request("edge", &[("user", "bob")])).await,
        OK
    );
    assert_eq!(
        code(&mut client, &request("other", &[("user", "ann")])).await,
        OK,
        "unknown domain"
    );
    let empty = client
        .should_rate_limit(RateLimitRequest::default())
        .await
        .unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn two_replicas_on_one_redis_share_the_limit() {
    let namespace = unique_prefix("rls-shared");
    let dir = ConfigDir::new(&[("edge.yaml", PER_HOUR_3)]);
    let url = redis_url();
    let args = [
        "--redis-url",
        url.as_str(),
        "--redis-namespace",
        namespace.as_str(),
    ];
    let (a, b) = (Rls::start(dir.path(), &args), Rls::start(dir.path(), &args));
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let ann = request("edge", &[("user", "ann")]);
    let mut admitted = 0;
    for i in 0..8 {
        let client = if i % 2 == 0 { &mut ca } else { &mut cb };
        admitted += usize::from(code(client, &ann).await == OK);
    }
    assert_eq!(admitted, 3, "3 per hour for the fleet, not per replica");
    // The fixed window on Redis too, and its keys under the namespace.
    let fixed = "domain: fw\nalgorithm: fixed_window\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let dir = ConfigDir::new(&[("fw.yaml", fixed)]);
    let c = Rls::start(dir.path(), &args);
    let mut cc = c.client().await;
    assert_eq!(
        codes(&mut cc, &request("fw", &[("k", "v")]), 3).await,
        [OK, OK, OVER]
    );
    let keys =
        tollgate_testkit::redis::cli_url(&url, &["--scan", "--pattern", &format!("{namespace}:*")]);
    assert!(keys.lines().any(|k| k.ends_with(":fw")), "{keys}");
    assert!(keys.lines().any(|k| k.ends_with(":sw")), "{keys}");
}

/// `--all-or-nothing` on Redis: a request refused by one descriptor gives the other its hit back, so the hourly
/// limit is spent only by requests served.
#[tokio::test]
async fn all_or_nothing_on_redis_spends_nothing_for_a_refused_request() {
    let namespace = unique_prefix("rls-all-or-nothing");
    let two = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n  - key: burst\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let dir = ConfigDir::new(&[("edge.yaml", two)]);
    let url = redis_url();
    let rls = Rls::start(
        dir.path(),
        &[
            "--redis-url",
            url.as_str(),
            "--redis-namespace",
            namespace.as_str(),
            "--all-or-nothing",
        ],
    );
    let mut client = rls.client().await;
    let mut both = request("edge", &[("user", "ann")]);
    both.descriptors
        .extend(request("edge", &[("burst", "ann")]).descriptors);
    let mut left = Vec::new();
    for _ in 0..5 {
        let reply = client
            .should_rate_limit(both.clone())
            .await
            .expect("an answer")
            .into_inner();
        left.push((reply.overall_code(), reply.statuses[0].limit_remaining));
    }
    // Two served; the three refused by `burst` leave `user` at 3.
    assert_eq!(left, [(OK, 4), (OK, 3), (OVER, 3), (OVER, 3), (OVER, 3)]);
    let user = request("edge", &[("user", "ann")]);
    assert_eq!(codes(&mut client, &user, 4).await, [OK, OK, OK, OVER]);
}

/// How many decision scripts `server` has run (`EVALSHA` calls, from `INFO commandstats`).
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .map_or(0, |rest| {
            rest.split(',')
                .next()
                .unwrap_or("0")
                .parse()
                .expect("a count")
        })
}

/// A request of three descriptors on Redis is one script call (its descriptors decided in one script), as Envoy
/// counts (every descriptor's hits) and all or nothing alike; the answers are those of separate calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_descriptors_on_redis_are_one_script_call() {
    let three = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n  - key: org\n    rate_limit: { unit: hour, requests_per_unit: 4 }\n  - key: burst\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let dir = ConfigDir::new(&[("edge.yaml", three)]);
    let server = RedisServer::start();
    let url = server.url();
    for (mode, expected, expected_calls) in [
        // Envoy's counting: refused requests still spend `user` and `org`. The fourth request finds `burst`'s
        // denial in the deny cache, which answers it: `user` and `org` are then a call each.
        (
            None,
            [(OK, 4, 3), (OK, 3, 2), (OVER, 2, 1), (OVER, 1, 0)],
            [1, 1, 1, 2],
        ),
        // All or nothing: a refused request spends nothing; `user` and `org` report what they have left, from the
        // one call that also refuses `burst`.
        (
            Some("--all-or-nothing"),
            [(OK, 4, 3), (OK, 3, 2), (OVER, 3, 2), (OVER, 3, 2)],
            [1, 1, 1, 1],
        ),
    ] {
        let namespace = unique_prefix("rls-one-call");
        let mut args = vec![
            "--redis-url",
            url.as_str(),
            "--redis-namespace",
            namespace.as_str(),
        ];
        args.extend(mode);
        let rls = Rls::start(dir.path(), &args);
        let mut client = rls.client().await;
        let mut all = request("edge", &[("user", "ann")]);
        for (key, value) in [("org", "acme"), ("burst", "ann")] {
            all.descriptors
                .extend(request("edge", &[(key, value)]).descriptors);
        }
        let (mut seen, mut calls) = (Vec::new(), Vec::new());
        for _ in 0..4 {
            let before = script_calls(&server);
            let reply = client
                .should_rate_limit(all.clone())
                .await
                .expect("an answer")
                .into_inner();
            let left = |i: usize| reply.statuses[i].limit_remaining;
            seen.push((reply.overall_code(), left(0), left(1)));
            calls.push(script_calls(&server) - before);
        }
        assert_eq!(seen, expected, "{mode:?}");
        assert_eq!(calls, expected_calls, "{mode:?}: script calls per request");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_directory_is_applied_without_a_restart_and_a_bad_change_keeps_the_loaded_set() {
    let dir = ConfigDir::new(&[("edge.yaml", PER_HOUR_3)]);
    let rls = Rls::start(
        dir.path(),
        &["--reload-interval", "50ms", "--metrics-addr", "127.0.0.1:0"],
    );
    let mut client = rls.client().await;
    assert_eq!(
        codes(&mut client, &request("edge", &[("user", "ann")]), 4).await,
        [OK, OK, OK, OVER]
    );
    assert_eq!(
        code(&mut client, &request("api", &[("route", "r")])).await,
        OK,
        "no such domain yet"
    );
    dir.write("api.yaml", "domain: api\ndescriptors:\n  - key: route\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    let route = request("api", &[("route", "r2")]);
    // The new domain applies once the change is read (each probe spends a request of its own value).
    let mut probe = 0;
    loop {
        probe += 1;
        let r = request("api", &[("route", &format!("probe{probe}"))]);
        let first = code(&mut client, &r).await;
        if first == OK && code(&mut client, &r).await == OVER {
            break;
        }
        assert!(Instant::now() < deadline, "the new file was never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(codes(&mut client, &route, 2).await, [OK, OVER]);
    assert_eq!(
        rls.metric("tollgate_rls_config_loads_total{result=\"ok\"}"),
        2.0
    );
    // A bad change: said why, and the loaded set stays.
    dir.write("api.yaml", "domain: api\ndescriptors:\n  - key: route\n    rate_limit: { unit: lightyear, requests_per_unit: 1 }\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !rls.stderr_has("invalid rate limit unit 'lightyear'") {
        assert!(Instant::now() < deadline, "the bad change was not reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rls.stderr_has("api.yaml:4:25"), "the place is named");
    assert_eq!(
        rls.metric("tollgate_rls_config_loads_total{result=\"error\"}"),
        1.0
    );
    assert_eq!(
        code(&mut client, &request("api", &[("route", "r3")])).await,
        OK
    );
    assert_eq!(
        code(&mut client, &request("api", &[("route", "r3")])).await,
        OVER,
        "the old set still decides"
    );
    assert_eq!(
        code(&mut client, &request("edge", &[("user", "ann")])).await,
        OVER,
        "and its counts stay"
    );
    // SIGHUP reads the directory at once (here: the fixed file again).
    dir.write("api.yaml", "domain: api\n");
    rls.signal("-HUP");
    let deadline = Instant::now() + Duration::from_secs(20);
    while code(&mut client, &request("api", &[("route", "r3")])).await == OVER {
        assert!(Instant::now() < deadline, "the fix was never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one replica asks Redis for `n` requests of one descriptor limited to 3 an hour: the answers, the
/// status of the last one, and the scripts Redis ran for them.
async fn flood_on(redis: &RedisServer, extra: &[&str], n: usize) -> (Vec<Code>, (u32, u32), u64) {
    let dir = ConfigDir::new(&[("edge.yaml", PER_HOUR_3)]);
    let url = redis.url();
    let namespace = unique_prefix("rls-deny");
    let mut args = vec![
        "--redis-url",
        url.as_str(),
        "--redis-namespace",
        namespace.as_str(),
    ];
    args.extend_from_slice(extra);
    let rls = Rls::start(dir.path(), &args);
    let mut client = rls.client().await;
    let ann = request("edge", &[("user", "ann")]);
    // Start-up's own script calls are over once it listens.
    let before = redis.command_calls("evalsha");
    let got = codes(&mut client, &ann, n).await;
    let calls = redis.command_calls("evalsha") - before;
    let last = client
        .should_rate_limit(ann)
        .await
        .expect("an answer")
        .into_inner();
    let status = &last.statuses[0];
    let limit = status
        .current_limit
        .as_ref()
        .expect("the limit")
        .requests_per_unit;
    (got, (limit, status.limit_remaining), calls)
}

#[tokio::test]
async fn the_deny_cache_refuses_what_redis_refused_without_asking_it_again() {
    let redis = RedisServer::start();
    let n = 40;
    let (cached, cached_last, cached_calls) = flood_on(&redis, &[], n).await;
    let (plain, plain_last, plain_calls) = flood_on(&redis, &["--no-deny-cache"], n).await;
    let expected: Vec<Code> = (0..n).map(|i| if i < 3 { OK } else { OVER }).collect();
    assert_eq!(cached, expected);
    assert_eq!(plain, expected, "the same answers without the cache");
    assert_eq!(
        cached_last, plain_last,
        "the cached denial's status is Redis's"
    );
    assert_eq!(cached_last, (3, 0));
    // The next admission is about 20 minutes away: after the first denial nothing more reaches Redis.
    assert_eq!(cached_calls, 4, "3 admissions and the first denial");
    assert_eq!(
        plain_calls, n as u64,
        "without the cache, every request is a script call"
    );
}

/// Two replicas with `--leases` on one Redis, one hot descriptor limited to 100 an hour: 60 requests through
/// the two are all admitted, most from leased batches (the metric says so) with under half as many script calls;
/// SIGTERM makes each return its unspent batch, so a third replica without leases then admits exactly the 40 the
/// fleet did not spend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_leases_share_the_limit_in_fewer_redis_calls_and_give_back_what_they_hold() {
    let redis = RedisServer::start();
    let url = redis.url();
    let namespace = unique_prefix("rls-leases");
    let per_hour_100 = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 100 }\n";
    let dir = ConfigDir::new(&[("edge.yaml", per_hour_100)]);
    let args = [
        "--redis-url",
        url.as_str(),
        "--redis-namespace",
        namespace.as_str(),
        "--leases",
        "--lease-share",
        "20",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let mut replicas = [Rls::start(dir.path(), &args), Rls::start(dir.path(), &args)];
    let mut clients = [replicas[0].client().await, replicas[1].client().await];
    let ann = request("edge", &[("user", "ann")]);
    let before = redis.command_calls("evalsha");
    for i in 0..60 {
        assert_eq!(code(&mut clients[i % 2], &ann).await, OK, "request {i}");
    }
    let calls = redis.command_calls("evalsha") - before;
    assert!(calls * 2 < 60, "{calls} script calls for 60 requests");
    let local: f64 = replicas
        .iter()
        .map(|r| {
            r.metric(
                "tollgate_token_lease_local_total{limiter=\"tollgate-rls\",outcome=\"allowed\"}",
            )
        })
        .sum();
    assert!(local > 30.0, "{local} of 60 admitted from leased batches");
    for rls in &mut replicas {
        rls.signal("-TERM");
        let status = rls.wait();
        assert!(status.success(), "{status:?}");
    }
    let third = Rls::start(
        dir.path(),
        &[
            "--redis-url",
            url.as_str(),
            "--redis-namespace",
            namespace.as_str(),
        ],
    );
    let got = codes(&mut third.client().await, &ann, 41).await;
    let expected: Vec<Code> = (0..41).map(|i| if i < 40 { OK } else { OVER }).collect();
    assert_eq!(got, expected, "what the two did not spend is back in Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_requests_in_flight_then_exits() {
    let redis = RedisServer::start();
    let dir = ConfigDir::new(&[("edge.yaml", PER_HOUR_3)]);
    let url = redis.url();
    let mut rls = Rls::start(
        dir.path(),
        &[
            "--redis-url",
            &url,
            "--redis-timeout",
            "30s",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let client = rls.client().await;
    // Redis paused: the requests wait in the server for their answers.
    redis.pause();
    let mut pending = Vec::new();
    for i in 0..6 {
        let mut client = client.clone();
        let r = request("edge", &[("user", &format!("u{i}"))]);
        pending.push(tokio::spawn(
            async move { client.should_rate_limit(r).await },
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while rls.metric("tollgate_rls_requests_in_flight") < 6.0 {
        assert!(
            Instant::now() < deadline,
            "the requests never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rls.signal("-TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !rls.stderr_has("shutting down") {
        assert!(Instant::now() < deadline, "SIGTERM was not taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        rls.child.try_wait().unwrap().is_none(),
        "it waits for the requests in flight"
    );
    redis.resume();
    for answer in pending {
        let reply = answer
            .await
            .unwrap()
            .expect("every request in flight is answered");
        assert_eq!(reply.into_inner().overall_code(), OK);
    }
    let status = rls.wait();
    assert!(status.success(), "{status:?}");
}
