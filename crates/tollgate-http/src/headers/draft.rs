//! The revision of the IETF RateLimit fields tollgate renders, and everything that depends on it, in one place:
//! the field names, the parameter names, and how `t` is derived. A later revision is a change to this file (and
//! to the test vectors, which name the revision they follow).
//!
//! draft-ietf-httpapi-ratelimit-headers-11 keeps -10's syntax and changes its meaning: `r` is the **available
//! quota** and `t` the **effective window**, the time within which the client can use no more than the available
//! quota (no longer "seconds until the quota resets": a token bucket, GCRA or sliding window has no reset instant),
//! and a `Retry-After` should not point before the end of the effective window. Names proposed after -11 and not
//! in any published revision (`a`, `w` and `c` on `RateLimit`, a `RateLimit-Partition` field) are not emitted.
//!
//! How `t` is derived, and why a client that spends `r` within `t` is never refused by the limiter that said it:
//! `docs/design/ratelimit-fields.md`. In short, for a rate limiter's decision:
//!
//! - `r > 0`: `t = ⌈r × window ÷ limit⌉` s, the time the limiter takes to give `r` back at its sustained rate
//!   (the policy's `q` per `w`): a client that spreads `r` over `t`, and follows each newer answer, paces itself at
//!   the policy's rate. A sliding window counter whose current window holds requests (it says it is held for
//!   longer than a window) gives nothing back before its next window: there `t` runs until a unit is surely
//!   back once `r` is spent, so that the request a client sends when `t` is over is admitted;
//! - `r = 0`, admitted: `t = ⌈reset − now⌉` s (at least 1): by then the limiter holds nothing of the key — the
//!   bucket is full, the window's counts have decayed — so quota is surely back;
//! - refused: the smaller of that and `⌈retry_after⌉` (at least 1), so that `Retry-After` (`⌈retry_after⌉`) never
//!   points before the end of `t`.
//!
//! A concurrency limiter's quota ([`QuotaUnit::ConcurrentRequests`]) is announced in the draft's quota unit
//! `qu="concurrent-requests"` (a String, one of the three units the draft defines): `q` the most requests in flight,
//! `r` how many more may start. It has no window, so neither `w` (optional) nor `t` (optional) is sent: no time
//! would bring a slot back but a request in flight finishing.

use std::time::Duration;

use http::HeaderName;

use tollgate_tower::{QuotaUnit, Verdict};

/// The revision whose meaning the fields carry.
pub const REVISION: &str = "draft-ietf-httpapi-ratelimit-headers-11";

/// `RateLimit-Policy` (draft -11).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft -11).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// `RateLimit-Policy`'s quota parameter, as it follows a member's name.
pub(super) const QUOTA: &str = ";q=";
/// `RateLimit-Policy`'s window parameter.
pub(super) const WINDOW: &str = ";w=";
/// `RateLimit`'s available quota parameter.
pub(super) const AVAILABLE: &str = ";r=";
/// `RateLimit`'s effective window parameter.
pub(super) const EFFECTIVE_WINDOW: &str = ";t=";
/// `RateLimit-Policy`'s quota unit parameter with the unit of a concurrency limiter's quota.
pub(super) const CONCURRENT_REQUESTS: &str = ";qu=\"concurrent-requests\"";

/// Whether `v`'s quota has a window (`w` and `t` are sent): requests per window, not requests in flight.
#[must_use]
pub(super) fn windowed(v: &Verdict) -> bool {
    v.unit != QuotaUnit::ConcurrentRequests
}

/// `t`: the effective window of `v`, in whole seconds (see the module docs).
#[must_use]
pub fn effective_window_secs(v: &Verdict) -> u64 {
    let d = &v.decision;
    let busy = d.reset_after();
    let by_quota = match d.remaining {
        0 => ceil_secs(busy).max(1),
        // Held longer than a window: a sliding window counter whose current window holds requests. Its count
        // weighs on the next window too, so a unit is surely back only once the next window is a share of one
        // unit in: `busy − window + window ÷ limit` (with `r` spent now, at most `limit` count in it).
        _ if busy > v.window && d.limit > 0 => {
            let share = v.window / u32::try_from(d.limit).unwrap_or(u32::MAX);
            ceil_secs(busy - v.window + share).max(1)
        }
        r => spend_secs(r, v.window, d.limit),
    };
    match d.retry_after {
        Some(retry) if !d.is_allowed() => by_quota.min(ceil_secs(retry).max(1)),
        _ => by_quota,
    }
}

/// Whole seconds in `d`, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// `⌈r × window ÷ limit⌉` seconds: how long the limit takes to accrue `r` (the whole window if the limit is 0).
fn spend_secs(r: u64, window: Duration, limit: u64) -> u64 {
    if limit == 0 {
        return ceil_secs(window).max(1);
    }
    let nanos = u128::from(r)
        .saturating_mul(window.as_nanos())
        .div_ceil(u128::from(limit));
    let secs = nanos.div_ceil(1_000_000_000);
    u64::try_from(secs).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{Decision, Outcome, Timestamp};

    use super::effective_window_secs;
    use crate::headers::HeaderSet;
    use tollgate_tower::{Verdict, Verdicts};

    fn v(
        outcome: Outcome,
        limit: u64,
        window_ms: u64,
        remaining: u64,
        reset_ms: u64,
        retry_ms: Option<u64>,
    ) -> Verdict {
        Verdict::new(
            "v",
            Duration::from_millis(window_ms),
            Decision {
                outcome,
                limit,
                remaining,
                reset: Timestamp::from_micros(reset_ms * 1_000),
                retry_after: retry_ms.map(Duration::from_millis),
                now: Timestamp::from_micros(0),
            },
        )
    }

    /// Vectors of draft -11's `t` (the effective window).
    #[test]
    fn effective_windows_of_draft_11() {
        use Outcome::{Allowed, CostExceedsCapacity, Limited};
        let cases = [
            // The full quota: the whole window.
            (v(Allowed, 100, 60_000, 100, 0, None), 60),
            // 98 of 100 per minute: 58.8 s of accrual.
            (v(Allowed, 100, 60_000, 98, 1_200, None), 59),
            // One left of 20 per second: a twentieth of a second, rounded up.
            (v(Allowed, 20, 1_000, 1, 950, None), 1),
            // The last one spent: until the bucket is full (or the window decayed).
            (v(Allowed, 3, 3_600_000, 0, 1_200_000, None), 1_200),
            (v(Allowed, 3, 3_600_000, 0, 0, None), 1),
            // Refused: the retry, never after it (`Retry-After` is the retry).
            (
                v(Limited, 3, 3_600_000, 0, 3_600_000, Some(1_200_000)),
                1_200,
            ),
            (v(Limited, 10, 10_000, 0, 10_000, Some(1)), 1),
            // Refused a cost of 5 with 3 left: 3 accrue in 3 s but the 5 are back in 2.
            (v(Limited, 10, 10_000, 3, 7_000, Some(2_000)), 2),
            // A cost above the burst: no retry; by the quota.
            (v(CostExceedsCapacity, 10, 10_000, 10, 0, None), 10),
            // A sliding window of 5 per second, its current window (from 0) holding requests: held until 2 s.
            // Four spent now, the next window still counts them nearly whole; a fifth is surely in after 1.2 s.
            (v(Allowed, 5, 1_000, 4, 2_000, None), 2),
            // 20 per minute, 55 s into the window, 3 left: until the next window (in 5 s) is 3 s in.
            (v(Allowed, 20, 60_000, 3, 65_000, None), 8),
            // Degenerate numbers stay finite.
            (v(Allowed, 0, 1_000, 5, 0, None), 1),
            (v(Allowed, 1, 1_000_000_000, u64::MAX, 0, None), u64::MAX),
            (v(Allowed, 1, u64::MAX, u64::MAX, 0, None), u64::MAX),
        ];
        for (verdict, t) in cases {
            assert_eq!(effective_window_secs(&verdict), t, "{verdict:?}");
        }
    }

    /// A concurrency limiter's quota in the draft's unit, without a window; beside a rate limiter's, each member
    /// keeps its own parameters, and the GitHub-style fields describe the rate limiter's.
    #[test]
    fn a_concurrency_quota_is_announced_in_its_unit_without_a_window() {
        let now = Timestamp::from_micros(1_700_000_000_000_000);
        let slots = Verdict::in_flight("slots", 5, 4, None, now);
        let mut headers = http::HeaderMap::new();
        HeaderSet::ALL.render(&Verdicts::from(slots.clone()), &mut headers);
        assert_eq!(
            headers["ratelimit-policy"],
            r#""slots";q=5;qu="concurrent-requests""#
        );
        assert_eq!(headers["ratelimit"], r#""slots";r=4"#);
        assert_eq!(headers.len(), 2, "no X-RateLimit-*: {headers:?}");

        let refused = Verdict::in_flight("slots", 5, 0, Some(Duration::from_secs(1)), now);
        let mut verdicts = Verdicts::from(refused);
        verdicts.push(v(Outcome::Allowed, 100, 60_000, 98, 1_200, None));
        let mut headers = http::HeaderMap::new();
        HeaderSet::ALL.render(&verdicts, &mut headers);
        assert_eq!(
            headers["ratelimit-policy"],
            r#""v";q=100;w=60, "slots";q=5;qu="concurrent-requests""#
        );
        assert_eq!(headers["ratelimit"], r#""v";r=98;t=59, "slots";r=0"#);
        assert_eq!(headers["x-ratelimit-resource"], "v");
        assert_eq!(headers["x-ratelimit-remaining"], "98");
        assert!(verdicts.binding().is_some_and(|b| &*b.limiter == "v"));
    }
}
