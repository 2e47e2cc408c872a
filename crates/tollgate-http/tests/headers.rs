//! The header fields stay exact past the number of limiters whose constant fields are kept for the process (a
//! custom store may return a different limit per key): the rest are formatted per response. Its own process, so
//! that filling the kept set does not change what other tests exercise.

use std::time::Duration;

use http::HeaderMap;
use tollgate_core::{Decision, Outcome, Timestamp};
use tollgate_http::HeaderSet;
use tollgate_tower::{Verdict, Verdicts};

fn render(name: &'static str, limit: u64) -> HeaderMap {
    let verdict = Verdict::new(
        name,
        Duration::from_secs(60),
        Decision {
            outcome: Outcome::Allowed,
            limit,
            remaining: limit - 1,
            reset: Timestamp::from_micros(1_700_000_060_000_000),
            retry_after: None,
            now: Timestamp::from_micros(1_700_000_000_000_000),
        },
    );
    let mut headers = HeaderMap::new();
    HeaderSet::ALL.render(&Verdicts::from(verdict), &mut headers);
    headers
}

#[test]
fn fields_stay_exact_for_thousands_of_distinct_limits() {
    for limit in 1..=3_000 {
        let headers = render("tier", limit);
        assert_eq!(
            headers["ratelimit-policy"],
            format!(r#""tier";q={limit};w=60"#)
        );
        // Draft -11's `t`: the time `limit − 1` take to accrue at `limit` per minute; with none left, until the
        // reset (60 s here).
        let t = if limit == 1 {
            60
        } else {
            ((limit - 1) * 60).div_ceil(limit)
        };
        assert_eq!(
            headers["ratelimit"],
            format!(r#""tier";r={};t={t}"#, limit - 1)
        );
        assert_eq!(headers["x-ratelimit-limit"], limit.to_string().as_str());
        assert_eq!(headers["x-ratelimit-used"], "1");
        assert_eq!(headers["x-ratelimit-resource"], "tier");
    }
    // A limiter first seen after that is rendered as exactly.
    let late = render("late", 5);
    assert_eq!(late["ratelimit-policy"], r#""late";q=5;w=60"#);
    assert_eq!(late["x-ratelimit-remaining"], "4");
}
