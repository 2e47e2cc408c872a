//! What an operator sees: `examples/axum_server` and `examples/grpc_server` with `--metrics-addr`, scraped over
//! TCP after known traffic (exact counts per outcome, the near-limit boundary), and every series the Grafana
//! dashboard `docs/grafana/tollgate.json` queries found in a live scrape.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use tollgate_testkit::examples::{ExampleServer, example};
use tollgate_testkit::http::get;
use tollgate_testkit::redis::RedisServer;

/// An example server with `--metrics-addr`, asked over TCP and scraped.
struct Server(ExampleServer);

impl Server {
    fn start(name: &str, args: &[&str]) -> Self {
        let args: Vec<&str> = ["--metrics-addr", "127.0.0.1:0"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        Self(ExampleServer::start(name, &args))
    }

    fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    fn scrape(&self) -> Scrape {
        let reply = get(self.0.metrics_addr(), "/metrics", &[]);
        assert_eq!(reply.status, 200, "{}", reply.body);
        Scrape::parse(&reply.body)
    }
}

/// A Prometheus text exposition: every sample by name and labels.
#[derive(Debug)]
struct Scrape {
    samples: BTreeMap<(String, BTreeMap<String, String>), f64>,
}

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut samples = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}').expect("closing brace")),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (k, v) = l.split_once('=').expect("label=value");
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("a number in {line:?}"));
            samples.insert((name.to_owned(), labels), value);
        }
        Self { samples }
    }

    /// The sample `name{labels}` (exactly those labels); 0 if it is not there.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .get(&(name.to_owned(), labels))
            .copied()
            .unwrap_or(0.0)
    }

    fn decisions(&self, limiter: &str, outcome: &str) -> f64 {
        self.get(
            "tollgate_decisions_total",
            &[("limiter", limiter), ("outcome", outcome)],
        )
    }

    fn near_limit(&self, limiter: &str) -> f64 {
        self.get("tollgate_near_limit_total", &[("limiter", limiter)])
    }

    fn names(&self) -> BTreeSet<&str> {
        self.samples.keys().map(|(name, _)| name.as_str()).collect()
    }

    /// Every outcome of `limiter` with its count, zeros left out.
    fn outcomes(&self, limiter: &str) -> BTreeMap<String, f64> {
        self.samples
            .iter()
            .filter(|((name, labels), v)| {
                name == "tollgate_decisions_total"
                    && labels.get("limiter").map(String::as_str) == Some(limiter)
                    && **v != 0.0
            })
            .map(|((_, labels), v)| (labels["outcome"].clone(), *v))
            .collect()
    }
}

const CRITICAL: [(&str, &str); 1] = [("x-priority", "critical")];

/// The axum server with every limiter of the stack on a private Redis, fed traffic whose every decision is known:
/// the rate limit (10 per hour per client, so nothing refills), the concurrency limit (1 in flight), the fleet
/// shedder (capacity 5, all of it reserved: only critical requests pass, and more than one at a time, so a lease
/// whose release is still on its way never sheds the next one) and the worker shedder (never busy).
fn stack_server(redis: &RedisServer) -> Server {
    let url = redis.url();
    Server::start(
        "axum_server",
        &[
            "--limit",
            "10",
            "--period",
            "1h",
            "--redis-url",
            &url,
            "--concurrency",
            "1",
            "--fleet-capacity",
            "5",
            "--fleet-reserve",
            "100",
            "--worker-capacity",
            "1000",
        ],
    )
}

#[test]
fn scrape_counts_every_outcome_and_the_near_limit_boundary() {
    let redis = RedisServer::start();
    let server = stack_server(&redis);
    let status = |headers: &[(&str, &str)]| get(server.addr(), "/", headers).status;

    // Six critical requests, back to back: 9 … 4 of the 10 left, far from the limit. Each one's concurrency lease
    // is released by a task after its response; the next one, should it meet that lease, waits for the release.
    for _ in 0..6 {
        assert_eq!(status(&CRITICAL), 200);
    }
    // A normal one passes the rate and concurrency limits (3 left) and is shed by the fleet: no share for it.
    assert_eq!(status(&[]), 503);
    // A slow critical request takes 2 left — exactly 20 % of the limit, which is not less than 20 % — and holds the
    // client's one concurrency lease (it sleeps a minute; the server is killed long before).
    let addr = server.addr();
    std::thread::spawn(move || {
        // Sent and left hanging: the answer (or the server's end) is read and dropped, whatever it is.
        let mut stream = TcpStream::connect(addr).expect("connect");
        let request =
            "GET /slow?ms=60000 HTTP/1.1\r\nhost: example\r\nx-priority: critical\r\n\r\n";
        stream.write_all(request.as_bytes()).expect("send");
        let _ = stream.read_to_end(&mut Vec::new());
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut scrape = server.scrape();
    while scrape.decisions("fleet", "allowed") < 7.0 {
        assert!(
            Instant::now() < deadline,
            "the slow request never arrived: {scrape:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
        scrape = server.scrape();
    }
    assert_eq!(scrape.decisions("per-client", "allowed"), 8.0);
    assert_eq!(
        scrape.near_limit("per-client"),
        0.0,
        "2 of 10 left is not near"
    );

    // The next two take 1 and 0 left (near the limit: under 2) and are over the concurrency limit.
    assert_eq!(status(&CRITICAL), 429);
    assert_eq!(
        server.scrape().near_limit("per-client"),
        1.0,
        "1 of 10 left"
    );
    assert_eq!(status(&CRITICAL), 429);
    // The rate limit is spent.
    assert_eq!(status(&CRITICAL), 429);
    assert_eq!(status(&[]), 429);

    let scrape = server.scrape();
    let counts = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
        pairs.iter().map(|(o, n)| ((*o).to_owned(), *n)).collect()
    };
    assert_eq!(
        scrape.outcomes("per-client"),
        counts(&[("allowed", 10.0), ("limited", 2.0)])
    );
    assert_eq!(scrape.near_limit("per-client"), 2.0);
    // Every request the rate limiter admitted reached the concurrency limiter; with a limit of 1, every admission
    // leaves 0 free: near the limit.
    assert_eq!(
        scrape.outcomes("concurrency"),
        counts(&[("allowed", 8.0), ("limited", 2.0)])
    );
    assert_eq!(scrape.near_limit("concurrency"), 8.0);
    // The fleet: six critical requests and the slow one admitted (1 of 5 in flight each: never near), one shed.
    assert_eq!(
        scrape.outcomes("fleet"),
        counts(&[("allowed", 7.0), ("shed", 1.0)])
    );
    assert_eq!(scrape.near_limit("fleet"), 0.0);
    // The worker shedder saw every request and shed none.
    assert_eq!(scrape.outcomes("worker"), counts(&[("allowed", 12.0)]));
    assert_eq!(scrape.near_limit("worker"), 0.0, "no near-limit signal");

    // Store latency is a histogram (buckets, a count), with Redis round trips in it; the circuit is closed.
    let bucket_count = scrape.get("tollgate_store_latency_seconds_count", &[("outcome", "ok")]);
    assert!(bucket_count >= 10.0, "{bucket_count} Redis round trips");
    assert_eq!(
        scrape.get(
            "tollgate_store_latency_seconds_bucket",
            &[("outcome", "ok"), ("le", "+Inf")]
        ),
        bucket_count
    );
    assert_eq!(scrape.get("tollgate_store_circuit_open", &[]), 0.0);
}

/// Every series name in the dashboard's queries: the `tollgate_…` identifiers of every `expr` and variable query.
fn dashboard_series() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana/tollgate.json");
    let text = std::fs::read_to_string(path).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let targets = panel["targets"]
            .as_array()
            .expect("every panel has targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            queries.push(target["expr"].as_str().expect("a PromQL expr").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["query"]["query"].as_str() {
            queries.push(query.to_owned());
        }
    }
    let mut names = BTreeSet::new();
    for query in &queries {
        let mut rest = query.as_str();
        while let Some(at) = rest.find("tollgate_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    assert!(names.len() >= 5, "{names:?} from {queries:?}");
    names
}

#[test]
fn every_dashboard_query_names_a_live_series() {
    let redis = RedisServer::start();
    let server = stack_server(&redis);
    for headers in [&CRITICAL[..], &[]] {
        let _ = get(server.addr(), "/", headers);
    }
    let scrape = server.scrape();
    let live = scrape.names();
    let missing: Vec<_> = dashboard_series()
        .into_iter()
        .filter(|name| !live.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which the server does not expose; it has {live:?}"
    );
}

#[test]
fn the_grpc_server_exposes_its_decisions() {
    let server = Server::start("grpc_server", &["--limit", "3", "--period", "1h"]);
    let out = Command::new(example("grpc_client"))
        .args([
            "--addr",
            &format!("http://{}", server.addr()),
            "--count",
            "5",
        ])
        .output()
        .expect("run the gRPC client");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scrape = server.scrape();
    let mut outcomes = scrape.outcomes("say-hello");
    outcomes.retain(|_, n| *n != 0.0);
    assert_eq!(
        outcomes,
        [("allowed".to_owned(), 3.0), ("limited".to_owned(), 2.0)]
            .into_iter()
            .collect()
    );
    assert_eq!(scrape.near_limit("say-hello"), 1.0, "0 of 3 left, once");
}
