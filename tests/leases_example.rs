//! `examples/axum_server --leases` as a black box over real TCP and a private Redis: a hot client is admitted
//! from leased batches (a fraction of the script calls), exactly the limit is admitted, and the `RateLimit`
//! header's remaining is this instance's view: it never rises, and never exceeds what the store holds plus the
//! batch. A server stopped with SIGTERM gives its unspent batch back.

use std::process::Command;

use tollgate_testkit::examples::{ExampleServer, example};
use tollgate_testkit::http;
use tollgate_testkit::redis::RedisServer;

/// One GET over its own connection: the status and the `ratelimit` field's remaining (`r=`).
fn get(server: &ExampleServer) -> (u16, Option<u64>) {
    let reply = http::get(server.addr(), "/", &[]);
    (reply.status, reply.remaining())
}

/// The example's flags for 200 per 30 days with batches of up to 20 % of the burst: one token refills every
/// 3.6 hours, so none does during a test however slow the machine — the store's figure can only fall, exactly
/// 200 are admitted, and an instance's remaining has no refill to rise by. A token bucket's batch is at most what
/// its quota refills in half a lease's life, so the leases live the period (the 10 s default would lease none).
fn hot_flags(url: &str) -> Vec<&str> {
    vec![
        "--limit",
        "200",
        "--period",
        "720h",
        "--redis-url",
        url,
        "--leases",
        "--lease-share",
        "20",
        "--lease-ttl",
        "720h",
    ]
}

#[test]
fn leases_admit_a_hot_client_from_batches_exactly_and_remaining_never_rises() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = ExampleServer::start("axum_server", &hot_flags(&url));
    let line = server.first_line();
    assert!(
        line.contains("leases on (batches up to 40: 20 % of the burst at most)"),
        "{line}"
    );
    let before = redis.command_calls("evalsha");
    let mut admitted = 0;
    let mut last = u64::MAX;
    for i in 0..260 {
        let (status, remaining) = get(&server);
        if status == 200 {
            admitted += 1;
        } else {
            assert_eq!(status, 429, "request {i}");
        }
        let remaining = remaining.expect("a remaining on every response");
        // This instance's view never rises between two of its responses (nothing refills here), and
        // never exceeds the global remaining plus its unspent batch, which together are the 200 less what was
        // admitted (this is the only instance).
        assert!(
            remaining <= last,
            "request {i}: remaining rose from {last} to {remaining}"
        );
        assert!(
            remaining <= 200 - admitted,
            "request {i}: remaining {remaining} after {admitted} admitted"
        );
        last = remaining;
    }
    assert_eq!(admitted, 200);
    assert_eq!(last, 0);
    let calls = redis.command_calls("evalsha") - before;
    assert!(calls < 80, "{calls} script calls for 260 requests");
}

/// What a plain (lease-less) instance on the same Redis sees: the tokens no instance holds, less its own request.
fn plain_remaining(url: &str) -> u64 {
    let plain = ExampleServer::start(
        "axum_server",
        &["--limit", "200", "--period", "720h", "--redis-url", url],
    );
    let (status, remaining) = get(&plain);
    assert_eq!(status, 200);
    remaining.expect("a remaining")
}

#[test]
fn a_server_stopped_with_sigterm_returns_its_batch() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut server = ExampleServer::start("axum_server", &hot_flags(&url));
    for i in 0..10 {
        assert_eq!(get(&server).0, 200, "request {i}");
    }
    // The hot client's batch is leased by now: a plain instance would not see it.
    let held = 200 - 10 - 1 - plain_remaining(&url);
    assert!(held > 0, "no batch held after 10 requests");
    server.signal("-TERM");
    // The server exits of its own accord once its batch is back (the test's timeout bounds a hang).
    let status = server.wait();
    assert!(status.success(), "the server exited with {status}");
    // Everything not admitted is the fleet's again: 200 less the 10 and the first plain request, less this one.
    assert_eq!(plain_remaining(&url), 200 - 10 - 1 - 1);
}

#[test]
fn lease_flags_are_checked() {
    for (args, expect) in [
        (&["--lease-share", "20"][..], "needs --leases"),
        (&["--leases", "--lease-share", "0"][..], "from 1 to 100"),
        (&["--leases", "--lease-share", "x"][..], "from 1 to 100"),
        (&["--lease-ttl", "1s"][..], "needs --leases"),
    ] {
        let out = Command::new(example("axum_server"))
            .env_remove("REDIS_URL")
            .args(args)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}
