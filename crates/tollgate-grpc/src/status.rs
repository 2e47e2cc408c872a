//! From a limiter's answer to what a gRPC client sees: a status code, `google.rpc` error details and the
//! rate-limit fields as metadata.
//!
//! Any gRPC library can read the result: the code and message are the standard `grpc-status` and
//! `grpc-message`; `grpc-status-details-bin` holds a `google.rpc.Status` whose details are a
//! `google.rpc.RetryInfo` (how long to wait, exactly the decision's `retry_after`) and a `google.rpc.ErrorInfo`
//! (why: `reason`, `domain = "tollgate"`, the limiter's name); the numbers are ASCII metadata with the same names
//! and syntax as the HTTP adapter's headers.
//!
//! | rejection | code |
//! |---|---|
//! | [`RateLimited`](RejectionKind::RateLimited), [`ConcurrencyLimited`](RejectionKind::ConcurrencyLimited) | `RESOURCE_EXHAUSTED` |
//! | [`Shed`](RejectionKind::Shed), [`StoreUnavailable`](RejectionKind::StoreUnavailable) | `UNAVAILABLE` |
//! | a missing key source ([`KeyError`]) | `INTERNAL` (a configuration error, never a global bucket) |
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_grpc::status::rejection_status;
//! use tollgate_tower::{Rejection, Verdict};
//! use tonic::Code;
//! use tonic_types::StatusExt;
//!
//! let store = MemoryStore::new();
//! let policy = Policy::token_bucket(Quota::per_second(1)?);
//! store.check_now("client", &policy, 1)?;
//! let denied = store.check_now("client", &policy, 1)?;
//! let rejection = Rejection::rate_limited(Verdict::new("per-client", Duration::from_secs(1), denied));
//!
//! let status = rejection_status(&rejection);
//! assert_eq!(status.code(), Code::ResourceExhausted);
//! let retry = status.get_details_retry_info().expect("a RetryInfo detail");
//! assert_eq!(retry.retry_delay, denied.retry_after);
//! assert_eq!(status.get_details_error_info().unwrap().reason, "RATE_LIMIT_EXCEEDED");
//! assert_eq!(status.metadata().get("x-ratelimit-remaining").unwrap(), "0");
//! assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;

use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate_http::HeaderSet;
use tollgate_tower::{KeyError, Rejection, RejectionKind, Verdicts};
use tonic::Code;
use tonic::metadata::MetadataMap;
use tonic_types::{ErrorDetails, StatusExt};

/// `google.rpc.ErrorInfo.domain` of every rejection tollgate sends.
pub const ERROR_DOMAIN: &str = "tollgate";

/// The gRPC status code for a rejection of `kind`.
///
/// `RESOURCE_EXHAUSTED` when the client's own quota is spent (it should slow down); `UNAVAILABLE` when the server
/// protects itself or cannot decide (retrying later may succeed).
#[must_use]
pub const fn code_for(kind: RejectionKind) -> Code {
    if kind.is_overload() {
        Code::Unavailable
    } else {
        Code::ResourceExhausted
    }
}

/// The `google.rpc.ErrorInfo.reason` for a rejection of `kind`: UPPER_SNAKE_CASE and stable, for programs to
/// match on.
#[must_use]
pub const fn reason_for(kind: RejectionKind) -> &'static str {
    match kind {
        RejectionKind::RateLimited => "RATE_LIMIT_EXCEEDED",
        RejectionKind::ConcurrencyLimited => "CONCURRENCY_LIMIT_EXCEEDED",
        RejectionKind::Shed => "LOAD_SHED",
        RejectionKind::StoreUnavailable => "LIMITER_UNAVAILABLE",
        _ => "REJECTED",
    }
}

/// The status for a rejected call: code, message, `RetryInfo` + `ErrorInfo` details and rate-limit metadata.
///
/// `RetryInfo.retry_delay` is the rejection's exact retry delay (microsecond precision); it is left out when a
/// retry cannot help (a cost the policy can never admit), which gRPC clients read as "do not retry". The
/// `retry-after` metadata is the same delay in whole seconds, rounded up and never before the announced reset, as
/// the HTTP adapter sends it.
#[must_use]
pub fn rejection_status(rejection: &Rejection) -> tonic::Status {
    let kind = rejection.kind();
    let mut details = match rejection.retry_after() {
        Some(delay) => ErrorDetails::with_retry_info(Some(delay)),
        None => ErrorDetails::new(),
    };
    let mut info = HashMap::from([("limiter".to_owned(), rejection.limiter().to_owned())]);
    if let Some(decision) = rejection.decision() {
        info.insert("limit".to_owned(), decision.limit.to_string());
        info.insert("remaining".to_owned(), decision.remaining.to_string());
    }
    details.set_error_info(reason_for(kind), ERROR_DOMAIN, info);

    let mut headers = HeaderMap::new();
    match (rejection.verdict(), rejection.admitted()) {
        (Some(verdict), []) => HeaderSet::ALL.render_one(verdict, &mut headers),
        // Limiters further out had admitted (and counted) the call: their fields too.
        (rejected, admitted) => {
            let mut verdicts = Verdicts::default();
            verdicts.extend(rejected.into_iter().chain(admitted).cloned());
            HeaderSet::ALL.render(&verdicts, &mut headers);
        }
    }
    if let Some(secs) = rejection.retry_after_secs() {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    tonic::Status::with_error_details_and_metadata(
        code_for(kind),
        message_for(rejection),
        details,
        MetadataMap::from_headers(headers),
    )
}

/// The `grpc-message`: which limiter said no and why, and the retry delay when there is one.
fn message_for(rejection: &Rejection) -> String {
    let name = rejection.limiter();
    let cost_too_high = rejection
        .decision()
        .is_some_and(|d| d.outcome == tollgate_core::Outcome::CostExceedsCapacity);
    let mut message = match rejection.kind() {
        RejectionKind::RateLimited if cost_too_high => {
            format!("the call costs more than rate limit {name:?} ever admits at once")
        }
        RejectionKind::RateLimited => format!("rate limit {name:?} exceeded"),
        RejectionKind::ConcurrencyLimited => format!("too many calls in flight for limit {name:?}"),
        RejectionKind::Shed => format!("call shed by {name:?} to protect the service"),
        RejectionKind::StoreUnavailable => {
            format!("limit {name:?} could not be checked: its store is unavailable")
        }
        _ => format!("rejected by {name:?}"),
    };
    if let Some(retry) = rejection.retry_after() {
        let _ = write!(message, "; retry after {retry:?}");
    }
    message
}

/// The status for a call whose rate-limit key could not be found: `INTERNAL`, since the server's limiter is
/// configured to read a key the request does not carry (e.g. an API-key metadata entry). The message names
/// what is missing, so the client's developer can add it.
#[must_use]
pub fn key_error_status(err: &KeyError) -> tonic::Status {
    tonic::Status::internal(err.to_string())
}

/// Sets the rate-limit fields of every enforced verdict in `headers` (response metadata), replacing earlier values.
///
/// - `ratelimit-policy: "<name>";q=<limit>;w=<window seconds>` and `ratelimit: "<name>";r=<available>;t=<effective
///   window seconds>`, one list item per limiter, outermost first (draft-ietf-httpapi-ratelimit-headers-11);
/// - `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (epoch seconds of the stored reset
///   instant), `x-ratelimit-used`, `x-ratelimit-resource` for the binding verdict (the one closest to its limit).
///
/// The same names and values as the HTTP adapter's headers, written by the same code
/// ([`HeaderSet`]). Shadow-mode verdicts are not shown; with no enforced
/// verdict nothing is written.
pub fn insert_verdicts(headers: &mut HeaderMap, verdicts: &Verdicts) {
    HeaderSet::ALL.render(verdicts, headers);
}

const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{Decision, Outcome, Timestamp};
    use tollgate_tower::Verdict;

    use super::*;

    fn decision(outcome: Outcome, remaining: u64, retry_ms: Option<u64>) -> Decision {
        Decision {
            outcome,
            limit: 10,
            remaining,
            reset: Timestamp::from_micros(5_250_000),
            retry_after: retry_ms.map(Duration::from_millis),
            now: Timestamp::from_micros(4_000_000),
        }
    }

    #[test]
    fn overload_rejections_are_unavailable_and_keep_their_retry_delay() {
        let rejection = Rejection::new(RejectionKind::Shed, "worker")
            .with_retry_after(Duration::from_millis(1_500));
        let status = rejection_status(&rejection);
        assert_eq!(status.code(), Code::Unavailable);
        let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
        assert_eq!(delay, Some(Duration::from_millis(1_500)));
        assert_eq!(status.get_details_error_info().unwrap().reason, "LOAD_SHED");
        assert_eq!(status.metadata().get("retry-after").unwrap(), "2");
        assert!(
            status.metadata().get("ratelimit").is_none(),
            "no verdict, no numbers"
        );
    }

    #[test]
    fn a_cost_beyond_capacity_has_no_retry_info() {
        let denied = decision(Outcome::CostExceedsCapacity, 10, None);
        let rejection =
            Rejection::rate_limited(Verdict::new("big", Duration::from_secs(1), denied));
        let status = rejection_status(&rejection);
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.get_details_retry_info().is_none());
        assert!(status.metadata().get("retry-after").is_none());
        assert_eq!(
            status.message(),
            "the call costs more than rate limit \"big\" ever admits at once"
        );
    }

    #[test]
    fn rate_limit_fields_for_every_enforced_verdict() {
        let mut verdicts = Verdicts::default();
        verdicts.push(Verdict::new(
            "per-method",
            Duration::from_millis(500),
            decision(Outcome::Allowed, 3, None),
        ));
        verdicts.push(Verdict::new(
            "per \"client\"",
            Duration::from_secs(60),
            decision(Outcome::Allowed, 7, None),
        ));
        let mut shadow = Verdict::new(
            "shadow",
            Duration::from_secs(1),
            decision(Outcome::Allowed, 0, None),
        );
        shadow.enforced = false;
        verdicts.push(shadow);

        let mut headers = HeaderMap::new();
        insert_verdicts(&mut headers, &verdicts);
        // Outermost (last pushed) first, names escaped as sf-strings, the shadow verdict left out; 10 per 500 ms
        // is announced per second.
        let policy = r#""per \"client\"";q=10;w=60, "per-method";q=20;w=1"#;
        assert_eq!(headers["ratelimit-policy"], policy);
        // Draft -11's effective windows: 7 of 10 per minute accrue in 42 s, 3 of 10 per 500 ms in 0.15 s.
        assert_eq!(
            headers["ratelimit"],
            r#""per \"client\"";r=7;t=42, "per-method";r=3;t=1"#
        );
        assert_eq!(headers["x-ratelimit-remaining"], "3");
        assert_eq!(headers["x-ratelimit-used"], "7");
        assert_eq!(headers["x-ratelimit-reset"], "6");
        assert_eq!(headers["x-ratelimit-resource"], "per-method");
    }

    #[test]
    fn a_missing_key_is_internal_and_says_what_is_missing() {
        let status = key_error_status(&KeyError::missing("the x-api-key metadata"));
        assert_eq!(status.code(), Code::Internal);
        assert!(
            status.message().contains("x-api-key"),
            "{}",
            status.message()
        );
    }
}
