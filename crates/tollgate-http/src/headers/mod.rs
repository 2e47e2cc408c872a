//! Rate-limit header fields, rendered from [`Verdicts`] and nothing else: HTTP response headers for
//! `tollgate-http` and response metadata for `tollgate-grpc`, by the same code.
//!
//! - IETF ([`draft::REVISION`], draft-ietf-httpapi-ratelimit-headers-11):
//!   `RateLimit-Policy: "<name>";q=<limit>;w=<window s>` (a period that is not whole seconds is announced over the
//!   whole seconds that cover it, its limit scaled to them and rounded down: "10 per 500 ms" is `q=20;w=1`) and
//!   `RateLimit: "<name>";r=<available>;t=<effective window s>`, one list member per enforced limiter, outermost
//!   limiter first. `r` is what the limiter would admit now; `t` the time within which the client should spend no
//!   more than `r` ([`draft::effective_window_secs`]: for `r > 0` the time the limit takes to accrue `r`).
//!   A concurrency limiter's quota ([`QuotaUnit::ConcurrentRequests`](tollgate_tower::QuotaUnit)) has no window:
//!   `RateLimit-Policy: "<name>";q=<most in flight>;qu="concurrent-requests"` and `RateLimit: "<name>";r=<slots
//!   left after this request>`, without `w` or `t`.
//! - GitHub style, for the binding limiter among those with a window (a denial first, else the fewest remaining;
//!   a concurrency limiter alone writes none of them): `X-RateLimit-Limit`,
//!   `-Remaining`, `-Reset` (epoch seconds of the stored reset, rounded up), `-Used` (`limit − remaining`) and
//!   `-Resource` (the limiter's name).
//!
//! `t` is measured on the decision's clock (the decider's, e.g. Redis's), never mixed with the local one.
//!
//! The limit is the quota's burst and the window the time it takes to accrue
//! ([`Quota::window`](tollgate_core::Quota::window)): for the default burst, the policy's limit and period; for
//! "10 per second with bursts of 20", `q=20;w=2` and `X-RateLimit-Limit: 20`, so that the remaining count is
//! never above the limit beside it and `Used` counts the requests still held against the bucket.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Decision, Outcome, Timestamp};
//! use tollgate_http::headers::HeaderSet;
//! use tollgate_tower::{Verdict, Verdicts};
//!
//! let mut verdicts = Verdicts::default();
//! verdicts.push(Verdict::new("api", Duration::from_secs(60), Decision {
//!     outcome: Outcome::Allowed,
//!     limit: 100,
//!     remaining: 98,
//!     reset: Timestamp::from_micros(1_700_000_001_200_000),
//!     retry_after: None,
//!     now: Timestamp::from_micros(1_700_000_000_000_000),
//! }));
//! let mut headers = http::HeaderMap::new();
//! HeaderSet::ALL.render(&verdicts, &mut headers);
//! assert_eq!(headers["ratelimit-policy"], r#""api";q=100;w=60"#);
//! // Draft -11: 98 available, spent within the 59 s the limit takes to accrue them (98 × 60 s ÷ 100).
//! assert_eq!(headers["ratelimit"], r#""api";r=98;t=59"#);
//! assert_eq!(headers["x-ratelimit-reset"], "1700000002");
//! assert_eq!(headers["x-ratelimit-used"], "2");
//! ```

pub mod draft;
mod single;

pub use draft::{RATELIMIT, RATELIMIT_POLICY};

use crate::sf::{push_sf_string, visible_char};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tollgate_tower::{Verdict, Verdicts};

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (epoch seconds).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `X-RateLimit-Used`.
pub const X_RATELIMIT_USED: HeaderName = HeaderName::from_static("x-ratelimit-used");
/// `X-RateLimit-Resource`.
pub const X_RATELIMIT_RESOURCE: HeaderName = HeaderName::from_static("x-ratelimit-resource");

/// Which header fields a layer writes (every one by default): the IETF pair, `RateLimit-Policy` and `RateLimit`,
/// and the GitHub-style `X-RateLimit-*` family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeaderSet {
    policy: bool,
    state: bool,
    github: bool,
}

impl HeaderSet {
    /// The IETF fields and the GitHub-style ones.
    pub const ALL: Self = Self {
        policy: true,
        state: true,
        github: true,
    };
    /// `RateLimit-Policy` and `RateLimit` only.
    pub const IETF: Self = Self {
        policy: true,
        state: true,
        github: false,
    };
    /// `RateLimit` only: what each limit has left and within which time, without the policies (which the draft
    /// lets a server leave out: they change only with the configuration). The one field a client needs to pace
    /// itself, at a fraction of the cost of every field.
    pub const RATELIMIT_ONLY: Self = Self {
        policy: false,
        state: true,
        github: false,
    };
    /// `X-RateLimit-*` only.
    pub const GITHUB: Self = Self {
        policy: false,
        state: false,
        github: true,
    };
    /// No rate-limit fields (`Retry-After` is still sent on rejections).
    pub const NONE: Self = Self {
        policy: false,
        state: false,
        github: false,
    };

    /// The fields as three bits (a rate-limit set keeps the fields it was given in one atomic byte).
    pub(crate) const fn bits(self) -> u8 {
        self.policy as u8 | (self.github as u8) << 1 | (self.state as u8) << 2
    }

    /// The fields of [`bits`](Self::bits).
    pub(crate) const fn from_bits(bits: u8) -> Self {
        Self {
            policy: bits & 1 != 0,
            github: bits & 2 != 0,
            state: bits & 4 != 0,
        }
    }

    /// The fields of either set.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Self {
            policy: self.policy || other.policy,
            state: self.state || other.state,
            github: self.github || other.github,
        }
    }

    /// Writes the chosen fields for `verdicts` into `headers`, replacing earlier values (an outer layer re-renders
    /// with the inner layers' verdicts included). Nothing is written when no verdict is enforced.
    pub fn render(self, verdicts: &Verdicts, headers: &mut HeaderMap) {
        if self == Self::NONE {
            return;
        }
        if let Some(only) = verdicts.only()
            && self.render_single(only, headers).is_some()
        {
            return;
        }
        self.render_general(verdicts, headers);
    }

    /// [`render`](Self::render) for one limiter's verdict, without gathering it into [`Verdicts`].
    pub fn render_one(self, verdict: &Verdict, headers: &mut HeaderMap) {
        if self == Self::NONE || !verdict.enforced {
            return;
        }
        if self.render_single(verdict, headers).is_none() {
            self.render_general(&Verdicts::from(verdict.clone()), headers);
        }
    }

    /// [`render`](Self::render) for any number of verdicts, formatting every field.
    fn render_general(self, verdicts: &Verdicts, headers: &mut HeaderMap) {
        if verdicts.enforced().next().is_none() {
            return;
        }
        // Grow the map once, and format every value in one scratch buffer.
        headers.reserve(self.fields());
        let mut buf = String::with_capacity(64);
        if self.policy {
            for (i, v) in verdicts.enforced().rev().enumerate() {
                push_name(&mut buf, i, &v.limiter);
                push_param(&mut buf, draft::QUOTA, v.window_limit());
                if draft::windowed(v) {
                    push_param(&mut buf, draft::WINDOW, v.window_secs());
                } else {
                    buf.push_str(draft::CONCURRENT_REQUESTS);
                }
            }
            insert_str(headers, RATELIMIT_POLICY, &buf);
            buf.clear();
        }
        if self.state {
            for (i, v) in verdicts.enforced().rev().enumerate() {
                push_name(&mut buf, i, &v.limiter);
                push_param(&mut buf, draft::AVAILABLE, v.decision.remaining);
                if draft::windowed(v) {
                    push_param(
                        &mut buf,
                        draft::EFFECTIVE_WINDOW,
                        draft::effective_window_secs(v),
                    );
                }
            }
            insert_str(headers, RATELIMIT, &buf);
            buf.clear();
        }
        // Only quotas per window are described there (see `Verdicts::binding`).
        if let (true, Some(binding)) = (self.github, verdicts.binding()) {
            render_github(binding, headers, &mut buf);
        }
    }

    /// How many fields `render` writes.
    fn fields(self) -> usize {
        usize::from(self.policy) + usize::from(self.state) + 5 * usize::from(self.github)
    }
}

/// Starts one list member: `"name"`, preceded by `, ` unless it is the first.
fn push_name(buf: &mut String, index: usize, name: &str) {
    if index > 0 {
        buf.push_str(", ");
    }
    push_sf_string(buf, name);
}

/// Appends one integer parameter, `;a=x` (`a` is `;a=`).
fn push_param(buf: &mut String, a: &str, x: u64) {
    buf.push_str(a);
    push_u64(buf, x);
}

pub(crate) fn push_u64(buf: &mut String, n: u64) {
    buf.push_str(itoa::Buffer::new().format(n));
}

impl Default for HeaderSet {
    fn default() -> Self {
        Self::ALL
    }
}

fn render_github(v: &Verdict, headers: &mut HeaderMap, buf: &mut String) {
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(v.decision.limit));
    headers.insert(
        X_RATELIMIT_REMAINING,
        HeaderValue::from(v.decision.remaining),
    );
    headers.insert(
        X_RATELIMIT_RESET,
        HeaderValue::from(v.decision.reset.as_secs_ceil()),
    );
    headers.insert(X_RATELIMIT_USED, HeaderValue::from(v.used()));
    buf.extend(v.limiter.chars().map(visible_char));
    insert_str(headers, X_RATELIMIT_RESOURCE, buf);
}

fn insert_str(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    // Every character was made visible ASCII above, so this cannot fail; skipping beats panicking regardless.
    // `from_str` copies into an exact-size buffer, cheaper to encode and free than a converted `String`.
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(name, value);
    }
}
