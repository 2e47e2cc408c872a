//! Several limiters of a policy file deciding a request as one, through `examples/axum_server --config FILE` over
//! real TCP, on the in-process store and on a private Redis: a request is admitted only if every limiter admits,
//! and a refusal spends nothing on the limiters that would have admitted it.

use std::path::PathBuf;

use tollgate_testkit::examples::ExampleServer;
use tollgate_testkit::http::{Reply, get};
use tollgate_testkit::redis::RedisServer;

/// A policy file in the temporary directory, removed when dropped.
struct PolicyFile(PathBuf);

impl PolicyFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "tollgate-several-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).expect("write the policy file");
        Self(path)
    }

    fn serve(&self, store_args: &[&str]) -> ExampleServer {
        let mut args = vec!["--config", self.0.to_str().expect("a UTF-8 path")];
        args.extend_from_slice(store_args);
        ExampleServer::start("axum_server", &args)
    }
}

impl Drop for PolicyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Two limiters on the client's address: "hourly" 5 an hour (token bucket) and "burst" 3 per `burst_period` (sliding
/// window: on Redis, the admission that fills it caches no denial, so the next request is refused by Redis itself
/// after "hourly" has spent on it, and that spend is what must be given back).
fn two_limits(burst_period: &str) -> String {
    format!(
        r#"
[[limiter]]
name = "hourly"
key = "client-ip"
limit = 5
period = "1h"

[[limiter]]
name = "burst"
key = "client-ip"
algorithm = "sliding-window"
limit = 3
period = "{burst_period}"
"#
    )
}

/// What the `RateLimit` field says `limiter` has left, when it lists it.
fn left(reply: &Reply, limiter: &str) -> Option<u64> {
    let field = reply.header("ratelimit")?;
    let item = field
        .split(", ")
        .find(|item| item.starts_with(&format!("\"{limiter}\";")))?;
    let r = item.split(';').find_map(|p| p.strip_prefix("r="))?;
    Some(r.parse().expect("a whole number"))
}

/// The limiter a refusal's problem body names.
fn refused_by(reply: &Reply) -> String {
    let body = &reply.body;
    let at = body
        .find("\"limiter\":\"")
        .expect("a limiter in the problem body")
        + 11;
    body[at..].split('"').next().unwrap_or_default().to_owned()
}

/// Six requests against 5 an hour and 3 an hour: three served, three refused by "burst", and "hourly" shown with
/// the 2 it really has left (the refused requests spent none of it). `listed`: how many refusals list "hourly" —
/// on a shared store the first only: it caches the burst's denial, and a cached denial refuses before any other
/// limiter is asked.
fn six_requests(store_args: &[&str], listed: usize) {
    let file = PolicyFile::new(&format!("six-{}", store_args.len()), &two_limits("1h"));
    let server = file.serve(store_args);
    let replies: Vec<Reply> = (0..6).map(|_| get(server.addr(), "/", &[])).collect();
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429], "{replies:#?}");
    assert_eq!(left(&replies[2], "hourly"), Some(2), "{:#?}", replies[2]);
    for refused in &replies[3..] {
        assert_eq!(refused_by(refused), "burst", "{refused:#?}");
        assert_eq!(left(refused, "burst"), Some(0), "{refused:#?}");
        assert!(refused.header("retry-after").is_some(), "{refused:#?}");
        // Listed (not every refusal lists it: a cached denial refuses before any other limiter is asked), it has
        // what it had before the refusal.
        if let Some(hourly) = left(refused, "hourly") {
            assert_eq!(hourly, 2, "a refusal spends nothing: {refused:#?}");
        }
    }
    for refused in &replies[3..3 + listed] {
        assert_eq!(
            left(refused, "hourly"),
            Some(2),
            "every limit listed: {refused:#?}"
        );
    }
}

#[test]
fn six_requests_against_two_limits_in_process() {
    six_requests(&[], 3);
}

#[test]
fn six_requests_against_two_limits_on_redis() {
    let redis = RedisServer::start();
    six_requests(&["--redis-url", &redis.url()], 1);
}

/// Requests back to back against 5 an hour and 3 per 6 s (a token every 2 s): the burst limit refuses many of
/// them while it refills, and yet exactly 5 are served before "hourly" refuses — whatever the machine's pace,
/// since no refusal spends the hourly limit.
fn refusals_spend_nothing(store_args: &[&str]) {
    let file = PolicyFile::new(&format!("spend-{}", store_args.len()), &two_limits("6s"));
    let server = file.serve(store_args);
    let (mut served, mut by_burst) = (0, 0);
    let last = loop {
        let reply = get(server.addr(), "/", &[]);
        match reply.status {
            200 => served += 1,
            429 if refused_by(&reply) == "burst" => by_burst += 1,
            429 => break reply,
            _ => panic!("{reply:#?}"),
        }
        assert!(served <= 5, "more served than the hourly limit");
    };
    assert_eq!(refused_by(&last), "hourly", "{last:#?}");
    assert_eq!(
        served, 5,
        "{by_burst} refused by the burst limit spent the hourly one"
    );
    assert!(
        by_burst > 0,
        "the burst limit refused nothing: the test proved nothing"
    );
    assert_eq!(left(&last, "hourly"), Some(0), "{last:#?}");
}

#[test]
fn refusals_by_one_limit_spend_nothing_of_another_in_process() {
    refusals_spend_nothing(&[]);
}

#[test]
fn refusals_by_one_limit_spend_nothing_of_another_on_redis() {
    let redis = RedisServer::start();
    refusals_spend_nothing(&["--redis-url", &redis.url()]);
}
