//! Error responses: `application/problem+json` (RFC 9457) bodies with the right status and `Retry-After`.
//!
//! Rejections carry the problem types the IETF RateLimit draft (draft-ietf-httpapi-ratelimit-headers) registers:
//! a client over its quota (429) gets `https://iana.org/assignments/http-problem-types#quota-exceeded` with a
//! `violated-policies` member naming the limit (for a rate limit, the name its `RateLimit-Policy` entry has); a server
//! protecting itself (503) gets `…#temporary-reduced-capacity`. Every body also names the rejecting `limiter` and
//! the rejection's `kind`. Other failures (500) are `about:blank`. [`ProblemTypes`] replaces the types with your
//! own, per rejection kind, and [`HttpLimitLayer::problem_types`](crate::HttpLimitLayer::problem_types) installs
//! them:
//!
//! ```
//! use tollgate_http::problem::{ProblemType, ProblemTypes};
//! use tollgate_tower::{Rejection, RejectionKind};
//!
//! const OURS: ProblemTypes = ProblemTypes::IETF.with(
//!     RejectionKind::RateLimited,
//!     ProblemType::new("https://example.com/problems/slow-down", "Slow down"),
//! );
//! let response = OURS.rejection_response::<String>(&Rejection::new(RejectionKind::RateLimited, "api"));
//! assert_eq!(response.status(), 429);
//! assert!(response.body().starts_with(r#"{"type":"https://example.com/problems/slow-down","title":"Slow down""#));
//! assert!(response.body().ends_with(r#""violated-policies":["api"],"limiter":"api","kind":"rate_limited"}"#));
//! // The layer would install them with `HttpLimitLayer::new(limit).problem_types(&OURS)`.
//! ```

use std::fmt::Write as _;

use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use tollgate_core::__private::LogGate;
use tollgate_tower::{BoxError, KeyError, Rejection, RejectionKind};

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// One problem type: the `type` URI of a problem body and its `title`, a short summary that stays the same for
/// every occurrence of the type (RFC 9457 section 3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemType {
    uri: &'static str,
    title: &'static str,
}

impl ProblemType {
    /// The IETF draft's "Quota Exceeded" type (429), with a `violated-policies` member.
    pub const QUOTA_EXCEEDED: Self = Self::new(
        "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "Request cannot be satisfied as assigned quota has been exceeded",
    );
    /// The IETF draft's "Temporary Reduced Capacity" type (503).
    pub const TEMPORARY_REDUCED_CAPACITY: Self = Self::new(
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
        "Request cannot be satisfied due to temporary server capacity constraints",
    );

    /// A type of your own: its URI (written into the body as it is, JSON-escaped) and its title.
    #[must_use]
    pub const fn new(uri: &'static str, title: &'static str) -> Self {
        Self { uri, title }
    }

    /// The `type` URI.
    #[must_use]
    pub const fn uri(&self) -> &'static str {
        self.uri
    }

    /// The `title`.
    #[must_use]
    pub const fn title(&self) -> &'static str {
        self.title
    }
}

/// The problem type of each [`RejectionKind`]: [`ProblemTypes::IETF`] by default, your own with
/// [`with`](Self::with). Built in a `const` or `static` so that a layer can hold a `&'static` to it and stay `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemTypes {
    rate_limited: ProblemType,
    concurrency_limited: ProblemType,
    shed: ProblemType,
    store_unavailable: ProblemType,
}

impl ProblemTypes {
    /// The IETF draft's registered types: [`ProblemType::QUOTA_EXCEEDED`] for a client over its quota (rate or
    /// concurrency), [`ProblemType::TEMPORARY_REDUCED_CAPACITY`] when the server sheds load or its limiter's store
    /// failed closed.
    pub const IETF: Self = Self {
        rate_limited: ProblemType::QUOTA_EXCEEDED,
        concurrency_limited: ProblemType::QUOTA_EXCEEDED,
        shed: ProblemType::TEMPORARY_REDUCED_CAPACITY,
        store_unavailable: ProblemType::TEMPORARY_REDUCED_CAPACITY,
    };

    /// These types with `kind`'s replaced by `problem`. (A kind added to tollgate later keeps its IETF type.)
    #[must_use]
    pub const fn with(mut self, kind: RejectionKind, problem: ProblemType) -> Self {
        match kind {
            RejectionKind::RateLimited => self.rate_limited = problem,
            RejectionKind::ConcurrencyLimited => self.concurrency_limited = problem,
            RejectionKind::Shed => self.shed = problem,
            RejectionKind::StoreUnavailable => self.store_unavailable = problem,
            _ => {}
        }
        self
    }

    /// The type of a rejection of `kind`.
    #[must_use]
    pub const fn of(&self, kind: RejectionKind) -> ProblemType {
        match kind {
            RejectionKind::RateLimited => self.rate_limited,
            RejectionKind::ConcurrencyLimited => self.concurrency_limited,
            RejectionKind::Shed => self.shed,
            RejectionKind::StoreUnavailable => self.store_unavailable,
            _ if kind.is_overload() => ProblemType::TEMPORARY_REDUCED_CAPACITY,
            _ => ProblemType::QUOTA_EXCEEDED,
        }
    }

    /// [`error_response`] with these types.
    pub fn error_response<B: From<String>>(&self, err: &BoxError) -> Response<B> {
        if let Some(rejection) = err.downcast_ref::<Rejection>() {
            return self.rejection_response(rejection);
        }
        if let Some(key_err) = err.downcast_ref::<KeyError>() {
            if log_gate_open() {
                tracing::error!(error = %key_err, "rate limiter misconfigured (logged once per second at most)");
            }
            return problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                &key_err.to_string(),
                None,
            );
        }
        if log_gate_open() {
            tracing::error!(error = %err, "rate-limited service failed (logged once per second at most)");
        }
        problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "the service failed",
            None,
        )
    }

    /// [`rejection_response`] with these types.
    pub fn rejection_response<B: From<String>>(&self, rejection: &Rejection) -> Response<B> {
        let kind = rejection.kind();
        let status = status_for(kind);
        let mut detail = rejection.to_string();
        let retry = rejection.retry_after_secs();
        if let Some(secs) = retry {
            let _ = write!(detail, "; retry after {secs} s");
        }
        let mut response = problem(
            status,
            Some(self.of(kind)),
            &detail,
            Some((rejection.limiter(), kind)),
        );
        if let Some(secs) = retry {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl Default for ProblemTypes {
    fn default() -> Self {
        Self::IETF
    }
}

/// The status a rejection is answered with: 429 when the client is over its quota (rate or concurrency), 503
/// when the server protects itself (shedding, or a store that failed closed).
#[must_use]
pub fn status_for(kind: RejectionKind) -> StatusCode {
    if kind.is_overload() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

/// The response for a limiter's error: a [`Rejection`] (429/503 with `Retry-After`), a [`KeyError`] (500 naming the
/// missing key source) or anything else (500). Rate-limit headers are added by the layer afterwards. The problem
/// types are [`ProblemTypes::IETF`]; [`ProblemTypes::error_response`] takes your own.
pub fn error_response<B: From<String>>(err: &BoxError) -> Response<B> {
    ProblemTypes::IETF.error_response(err)
}

/// The response for a rejection: 429 or 503, `Retry-After` in whole seconds (never earlier than the reset the
/// rate-limit headers announce), and a problem body naming the limiter (see the [module docs](self)).
pub fn rejection_response<B: From<String>>(rejection: &Rejection) -> Response<B> {
    ProblemTypes::IETF.rejection_response(rejection)
}

/// One error line per second at most: a misconfiguration fails every request, which must not flood the logs.
fn log_gate_open() -> bool {
    static GATE: LogGate = LogGate::new();
    GATE.open()
}

/// A problem body. `rejected` (the limiter and the kind) adds the `limiter` and `kind` members, and for a client over
/// its quota (429) the `violated-policies` member the IETF draft defines: the limiter is the policy the
/// `RateLimit-Policy` field names. Without a type the body is `about:blank`, titled by the status.
pub(crate) fn problem<B: From<String>>(
    status: StatusCode,
    problem_type: Option<ProblemType>,
    detail: &str,
    rejected: Option<(&str, RejectionKind)>,
) -> Response<B> {
    let reason = status.canonical_reason().unwrap_or("Error");
    let (uri, title) = problem_type.map_or(("about:blank", reason), |t| (t.uri, t.title));
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    push_json_string(&mut body, uri);
    body.push_str(",\"title\":");
    push_json_string(&mut body, title);
    let _ = write!(body, ",\"status\":{},\"detail\":", status.as_u16());
    push_json_string(&mut body, detail);
    if let Some((limiter, kind)) = rejected {
        if !kind.is_overload() {
            body.push_str(",\"violated-policies\":[");
            push_json_string(&mut body, limiter);
            body.push(']');
        }
        body.push_str(",\"limiter\":");
        push_json_string(&mut body, limiter);
        body.push_str(",\"kind\":");
        push_json_string(&mut body, kind.as_str());
    }
    body.push('}');
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
}

fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn overload_is_temporary_reduced_capacity_without_violated_policies() {
        let shed =
            Rejection::new(RejectionKind::Shed, "workers").with_retry_after(Duration::from_secs(2));
        let response = rejection_response::<String>(&shed);
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        assert_eq!(
            response.body(),
            r#"{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Request cannot be satisfied due to temporary server capacity constraints","status":503,"detail":"request shed by \"workers\" to protect the service; retry after 2 s","limiter":"workers","kind":"shed"}"#
        );
    }

    #[test]
    fn concurrency_is_quota_exceeded_and_other_errors_are_about_blank() {
        let busy = Rejection::new(RejectionKind::ConcurrencyLimited, "in-flight");
        let body = rejection_response::<String>(&busy).into_body();
        assert!(
            body.starts_with(
                r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#
            ),
            "{body}"
        );
        assert!(body.ends_with(r#""violated-policies":["in-flight"],"limiter":"in-flight","kind":"concurrency_limited"}"#), "{body}");
        let err: BoxError = "boom".into();
        let response = error_response::<String>(&err);
        assert_eq!(response.status(), 500);
        assert_eq!(
            response.body(),
            r#"{"type":"about:blank","title":"Internal Server Error","status":500,"detail":"the service failed"}"#
        );
    }

    #[test]
    fn own_types_replace_one_kind_only() {
        const OURS: ProblemTypes =
            ProblemTypes::IETF.with(RejectionKind::Shed, ProblemType::new("urn:shed", "Shed"));
        assert_eq!(OURS.of(RejectionKind::Shed).uri(), "urn:shed");
        assert_eq!(
            OURS.of(RejectionKind::StoreUnavailable),
            ProblemType::TEMPORARY_REDUCED_CAPACITY
        );
        assert_eq!(
            OURS.of(RejectionKind::RateLimited),
            ProblemType::QUOTA_EXCEEDED
        );
        assert_eq!(ProblemTypes::default(), ProblemTypes::IETF);
    }
}
