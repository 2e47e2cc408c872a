//! Error responses: `application/problem+json` (RFC 9457) bodies with the right status and `Retry-After`.

use std::fmt::Write as _;

use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use tollgate_tower::__private::LogGate;
use tollgate_tower::{BoxError, KeyError, Rejection, RejectionKind};

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

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
/// missing key source) or anything else (500). Rate-limit headers are added by the layer afterwards.
pub fn error_response<B: From<String>>(err: &BoxError) -> Response<B> {
    if let Some(rejection) = err.downcast_ref::<Rejection>() {
        return rejection_response(rejection);
    }
    if let Some(key_err) = err.downcast_ref::<KeyError>() {
        if log_gate_open() {
            tracing::error!(error = %key_err, "rate limiter misconfigured (logged once per second at most)");
        }
        return problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "rate-limit-configuration",
            &key_err.to_string(),
            None,
        );
    }
    if log_gate_open() {
        tracing::error!(error = %err, "rate-limited service failed (logged once per second at most)");
    }
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal-error",
        "the service failed",
        None,
    )
}

/// The response for a rejection: 429 or 503, `Retry-After` in whole seconds (never earlier than the reset the
/// rate-limit headers announce), and a problem body naming the limiter.
pub fn rejection_response<B: From<String>>(rejection: &Rejection) -> Response<B> {
    let status = status_for(rejection.kind());
    let mut detail = rejection.to_string();
    let retry = rejection.retry_after_secs();
    if let Some(secs) = retry {
        let _ = write!(detail, "; retry after {secs} s");
    }
    let mut response = problem(
        status,
        rejection.kind().as_str(),
        &detail,
        Some(rejection.limiter()),
    );
    if let Some(secs) = retry {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// One error line per second at most: a misconfiguration fails every request, which must not flood the logs.
fn log_gate_open() -> bool {
    static GATE: LogGate = LogGate::new();
    GATE.open()
}

fn problem<B: From<String>>(
    status: StatusCode,
    kind: &str,
    detail: &str,
    limiter: Option<&str>,
) -> Response<B> {
    let mut body = String::with_capacity(160);
    body.push_str("{\"type\":\"https://tollgate.invalid/problems/");
    body.push_str(kind);
    body.push_str("\",\"title\":");
    push_json_string(&mut body, status.canonical_reason().unwrap_or("Error"));
    let _ = write!(body, ",\"status\":{},\"detail\":", status.as_u16());
    push_json_string(&mut body, detail);
    if let Some(limiter) = limiter {
        body.push_str(",\"limiter\":");
        push_json_string(&mut body, limiter);
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
