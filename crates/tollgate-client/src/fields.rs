//! What one response says about the quota: read from its header fields, never trusted beyond what they can mean.
//!
//! - `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers, revisions -10 and -11: the same
//!   syntax, Lists of Items parsed as Structured Fields by `sfv`). A policy item gives `q`, `qu`, `w` and `pk`; a
//!   service limit item gives `r` and `t` (and `pk`). Both revisions are read the same way: "`r` units may be spent
//!   within `t` seconds".
//! - `X-RateLimit-Limit`, `-Remaining`, `-Reset` (and `-Resource` for the name), read only when no `RateLimit` field
//!   is there. A reset above 10⁹ is epoch seconds (measured from the response's `Date` when it has one, so that a
//!   server whose clock is off by an hour is still understood), a smaller one delta seconds.
//! - `Retry-After`: delay-seconds or an HTTP-date (again measured from `Date`).
//! - For gRPC, the same metadata plus `grpc-status` with the `google.rpc.RetryInfo` detail of
//!   `grpc-status-details-bin` (see [`grpc_refusal`]).
//!
//! A field that does not parse, or a member without a valid `r`, is ignored, as the draft requires of malformed
//! fields: the response is then as if it had said nothing about that policy.

use std::time::{Duration, SystemTime};

use http::header::{DATE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, StatusCode};
use std::convert::Infallible;

use sfv::visitor::{
    EntryVisitor, Ignored, InnerListVisitor, ItemVisitor, ListVisitor, ParameterVisitor,
};
use sfv::{BareItemFromInput, KeyRef, Parser};

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const X_RESOURCE: HeaderName = HeaderName::from_static("x-ratelimit-resource");

/// The name given to the `X-RateLimit-*` limit when the server names no resource.
const X_DEFAULT_NAME: &str = "x-ratelimit";

/// X-RateLimit-Reset values above this are epoch seconds (September 2001), below it delta seconds.
const EPOCH_THRESHOLD: u64 = 1_000_000_000;

/// What a quota unit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Requests (the draft's default unit): each request spends one.
    Requests,
    /// Requests in flight at once (`qu="concurrent-requests"`).
    ConcurrentRequests,
    /// Anything else (`content-bytes`, a unit of the server's own): the layer cannot count it and ignores it.
    Other,
}

/// One `RateLimit-Policy` member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyItem {
    /// The policy's name.
    pub name: String,
    /// `pk`, the partition key, if any.
    pub pk: Option<Vec<u8>>,
    /// `q`: the quota.
    pub quota: u64,
    /// `qu`.
    pub unit: Unit,
    /// `w`: the window, if given (at least one second).
    pub window: Option<Duration>,
}

/// One `RateLimit` member (or the `X-RateLimit-*` triple).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitItem {
    /// The policy's name.
    pub name: String,
    /// `pk`, the partition key, if any.
    pub pk: Option<Vec<u8>>,
    /// `r`: units available.
    pub remaining: u64,
    /// `t`: the time within which `remaining` may be spent; `None` when absent or zero (no usable horizon).
    pub window: Option<Duration>,
}

/// Why the server refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// HTTP 429 Too Many Requests.
    TooManyRequests,
    /// HTTP 503 Service Unavailable.
    Unavailable,
    /// gRPC `RESOURCE_EXHAUSTED`.
    ResourceExhausted,
    /// gRPC `UNAVAILABLE`.
    GrpcUnavailable,
}

impl Refusal {
    /// The label of `tollgate_client_refused_total`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TooManyRequests => "http_429",
            Self::Unavailable => "http_503",
            Self::ResourceExhausted => "grpc_resource_exhausted",
            Self::GrpcUnavailable => "grpc_unavailable",
        }
    }
}

/// Everything one response says about the quota.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// `RateLimit-Policy` members.
    pub policies: Vec<PolicyItem>,
    /// `RateLimit` members, or the `X-RateLimit-*` limit.
    pub limits: Vec<LimitItem>,
    /// The response refused the request.
    pub refusal: Option<Refusal>,
    /// `Retry-After` (or `RetryInfo`), measured from the response.
    pub retry_after: Option<Duration>,
}

impl Observation {
    /// Whether the response said anything about the quota at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
            && self.limits.is_empty()
            && self.refusal.is_none()
            && self.retry_after.is_none()
    }

    /// Reads an HTTP response's (or gRPC response's) head. `status` decides whether it is a refusal (429, 503).
    #[must_use]
    pub fn read(status: StatusCode, headers: &HeaderMap) -> Self {
        Self::read_at(status, headers, SystemTime::now())
    }

    /// [`read`](Self::read) with the local clock reading `now` (for HTTP-dates when the response has no `Date`).
    #[must_use]
    pub fn read_at(status: StatusCode, headers: &HeaderMap, now: SystemTime) -> Self {
        // Read only for the figures measured from it (an epoch reset, an HTTP-date): most responses have none.
        let date = || {
            headers
                .get(DATE)
                .and_then(|v| httpdate::parse_http_date(v.to_str().ok()?).ok())
                .unwrap_or(now)
        };
        let policies = list(headers, &RATELIMIT_POLICY)
            .into_iter()
            .filter_map(policy_item)
            .collect();
        let mut limits: Vec<LimitItem> = list(headers, &RATELIMIT)
            .into_iter()
            .filter_map(limit_item)
            .collect();
        if limits.is_empty() && !headers.contains_key(RATELIMIT) {
            limits.extend(x_ratelimit(headers, date));
        }
        let refusal = match status {
            StatusCode::TOO_MANY_REQUESTS => Some(Refusal::TooManyRequests),
            StatusCode::SERVICE_UNAVAILABLE => Some(Refusal::Unavailable),
            _ => None,
        };
        Self {
            policies,
            limits,
            refusal,
            retry_after: retry_after(headers, date),
        }
    }
}

/// The Items of every `name` field of `headers`, as one List (a List may be split over several fields); none if
/// any of them does not parse. Read by [`MemberVisitor`] as the parser meets them: only the bare item's string and
/// the parameters the draft defines are kept, and nothing else is built.
fn list(headers: &HeaderMap, name: &HeaderName) -> Vec<Member> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Vec::new();
    };
    let mut members = Members(Vec::new());
    let parsed = match values.next() {
        // One field (the usual case): parsed where it lies.
        None => Parser::new(first.as_bytes()).parse_list_with_visitor(&mut members),
        Some(second) => {
            let mut joined = first.as_bytes().to_vec();
            for value in std::iter::once(second).chain(values) {
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(value.as_bytes());
            }
            Parser::new(&joined).parse_list_with_visitor(&mut members)
        }
    };
    match parsed {
        Ok(()) => members.0.into_iter().filter(|m| !m.inner_list).collect(),
        Err(_) => Vec::new(),
    }
}

/// A parameter the draft defines, as an Item gave it: absent, or the bare item it was (checked by its reader).
#[derive(Debug, Default)]
enum Param {
    #[default]
    Absent,
    Integer(i64),
    String(String),
    Bytes(Vec<u8>),
    /// Any other kind of bare item: never valid for a parameter the draft defines.
    Other,
}

impl Param {
    fn of(value: BareItemFromInput<'_>) -> Self {
        match value {
            BareItemFromInput::Integer(i) => Self::Integer(i64::from(i)),
            BareItemFromInput::String(text) => Self::String(text.as_str().to_owned()),
            BareItemFromInput::ByteSequence(bytes) => Self::Bytes(bytes),
            _ => Self::Other,
        }
    }

    /// `None` when present but not a non-negative integer; `Some(None)` when absent.
    fn non_negative(&self) -> Option<Option<u64>> {
        match self {
            Self::Absent => Some(None),
            Self::Integer(i) => u64::try_from(*i).ok().map(Some),
            _ => None,
        }
    }

    /// `pk`: `None` when present but not a byte sequence; `Some(None)` when absent.
    fn bytes(self) -> Option<Option<Vec<u8>>> {
        match self {
            Self::Absent => Some(None),
            Self::Bytes(bytes) => Some(Some(bytes)),
            _ => None,
        }
    }
}

/// One List member as [`MemberVisitor`] read it.
#[derive(Debug, Default)]
struct Member {
    /// The bare item, when a String (a member of the draft's fields names its policy so).
    name: Option<String>,
    /// An Inner List: no member of the draft's fields is one, so it is dropped.
    inner_list: bool,
    q: Param,
    qu: Param,
    w: Param,
    r: Param,
    t: Param,
    pk: Param,
}

struct Members(Vec<Member>);

impl<'de> ListVisitor<'de> for &mut Members {
    type Out = ();
    type Error = Infallible;

    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Self::Error> {
        self.0.push(Member::default());
        let member = self.0.last_mut().expect("a member was just pushed");
        Ok(MemberVisitor(member))
    }

    fn finish(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Fills one [`Member`]: its bare item, then its parameters (a key given twice keeps its last value, as a parsed
/// Parameters map would).
struct MemberVisitor<'a>(&'a mut Member);

impl<'de> EntryVisitor<'de> for MemberVisitor<'_> {
    type Error = Infallible;

    fn item(self) -> Result<impl ItemVisitor<'de>, Self::Error> {
        Ok(self)
    }

    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Self::Error> {
        self.0.inner_list = true;
        Ok(Ignored)
    }
}

impl<'de> ItemVisitor<'de> for MemberVisitor<'_> {
    type Out = ();
    type Error = Infallible;

    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de, Out = ()>, Self::Error> {
        if let BareItemFromInput::String(name) = bare_item {
            self.0.name = Some(name.as_str().to_owned());
        }
        Ok(self)
    }
}

impl<'de> ParameterVisitor<'de> for MemberVisitor<'_> {
    type Out = ();
    type Error = Infallible;

    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Self::Error> {
        let member = &mut *self.0;
        let slot = match key.as_str() {
            "q" => &mut member.q,
            "qu" => &mut member.qu,
            "w" => &mut member.w,
            "r" => &mut member.r,
            "t" => &mut member.t,
            "pk" => &mut member.pk,
            _ => return Ok(()),
        };
        *slot = Param::of(value);
        Ok(())
    }

    fn finish(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

fn policy_item(member: Member) -> Option<PolicyItem> {
    let quota = member.q.non_negative()??;
    let window = match member.w.non_negative()? {
        Some(0) => return None,
        Some(w) => Some(Duration::from_secs(w)),
        None => None,
    };
    let unit = match &member.qu {
        Param::Absent => Unit::Requests,
        Param::String(unit) => match unit.as_str() {
            "requests" => Unit::Requests,
            "concurrent-requests" => Unit::ConcurrentRequests,
            _ => Unit::Other,
        },
        _ => return None,
    };
    Some(PolicyItem {
        pk: member.pk.bytes()?,
        name: member.name?,
        quota,
        unit,
        window,
    })
}

fn limit_item(member: Member) -> Option<LimitItem> {
    let remaining = member.r.non_negative()??;
    let window = member
        .t
        .non_negative()?
        .filter(|&t| t > 0)
        .map(Duration::from_secs);
    Some(LimitItem {
        pk: member.pk.bytes()?,
        name: member.name?,
        remaining,
        window,
    })
}

fn whole(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The `X-RateLimit-*` limit: remaining (required), reset as epoch or delta seconds, limit for sanity.
fn x_ratelimit(headers: &HeaderMap, date: impl Fn() -> SystemTime) -> Option<LimitItem> {
    let remaining = whole(headers, &X_REMAINING)?;
    let limit = whole(headers, &X_LIMIT);
    let window = whole(headers, &X_RESET).and_then(|reset| {
        if reset > EPOCH_THRESHOLD {
            let at = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(reset))?;
            at.duration_since(date()).ok()
        } else {
            Some(Duration::from_secs(reset))
        }
    });
    let name = headers
        .get(X_RESOURCE)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .unwrap_or(X_DEFAULT_NAME)
        .to_owned();
    Some(LimitItem {
        name,
        pk: None,
        remaining: limit.map_or(remaining, |limit| remaining.min(limit)),
        window: window.filter(|w| !w.is_zero()),
    })
}

/// `Retry-After` as delay-seconds or an HTTP-date measured from `date`. A date in the past is no wait; a negative
/// or unreadable value is none.
fn retry_after(headers: &HeaderMap, date: impl Fn() -> SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(date()).unwrap_or(Duration::ZERO))
}

/// A gRPC refusal in `headers` (a trailers-only response's head, or the trailers): `RESOURCE_EXHAUSTED` or
/// `UNAVAILABLE`, with the `google.rpc.RetryInfo` delay when the status details carry one.
#[must_use]
pub fn grpc_refusal(headers: &HeaderMap) -> Option<(Refusal, Option<Duration>)> {
    use tonic_types::StatusExt as _;
    let status = tonic::Status::from_header_map(headers)?;
    let refusal = match status.code() {
        tonic::Code::ResourceExhausted => Refusal::ResourceExhausted,
        tonic::Code::Unavailable => Refusal::GrpcUnavailable,
        _ => return None,
    };
    let delay = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay);
    Some((refusal, delay))
}

/// The `violated-policies` of a problem details body (RFC 9457 with the draft's problem types), if it is one.
#[must_use]
pub fn violated_policies(body: &[u8]) -> Vec<String> {
    let Ok(serde_json::Value::Object(problem)) = serde_json::from_slice(body) else {
        return Vec::new();
    };
    let Some(serde_json::Value::Array(names)) = problem.get("violated-policies") else {
        return Vec::new();
    };
    names
        .iter()
        .filter_map(|name| name.as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(fields: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn read(fields: &[(&str, &str)]) -> Observation {
        Observation::read_at(
            StatusCode::OK,
            &headers(fields),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        )
    }

    /// The draft's own examples (-10's text; -11 keeps the syntax).
    #[test]
    fn reads_the_drafts_examples() {
        let o = read(&[
            (
                "ratelimit-policy",
                r#""permin";q=50;w=60,"perhr";q=1000;w=3600"#,
            ),
            ("ratelimit", r#""permin";r=50;t=30"#),
        ]);
        assert_eq!(o.policies.len(), 2);
        assert_eq!(o.policies[1].quota, 1000);
        assert_eq!(o.policies[1].window, Some(Duration::from_secs(3600)));
        assert_eq!(
            o.limits,
            [LimitItem {
                name: "permin".into(),
                pk: None,
                remaining: 50,
                window: Some(Duration::from_secs(30)),
            }]
        );
        let o = read(&[
            (
                "ratelimit-policy",
                r#""peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:"#,
            ),
            ("ratelimit", r#""default";r=999;pk=:dHJpYWwxMjEzMjM=:"#),
        ]);
        assert_eq!(o.policies[0].unit, Unit::Other);
        assert!(o.policies[0].pk.is_some());
        assert_eq!(o.limits[0].pk.as_deref(), Some(&b"trial121323"[..]));
        assert_eq!(o.limits[0].window, None);
    }

    #[test]
    fn a_list_split_over_two_fields_is_one_list() {
        let o = read(&[
            ("ratelimit", r#""a";r=1;t=2"#),
            ("ratelimit", r#""b";r=3;t=4"#),
        ]);
        assert_eq!(o.limits.len(), 2);
        assert_eq!(o.limits[1].name, "b");
    }

    /// Malformed fields are ignored whole; a member without a valid `r` is dropped; `t=0` gives no horizon.
    #[test]
    fn malformed_fields_are_ignored() {
        for garbage in [
            "garbage",
            r#""a";r=1;t=2, ,"#,
            "r=5, t=10",
            r#""a";r=-1;t=5"#,
            r#""a";r="5";t=5"#,
            r#""a";r=1.5"#,
            r#"a;r=5"#,
            r#""a";t=5"#,
            "\"a\";r=99999999999999999999",
        ] {
            let o = read(&[("ratelimit", garbage)]);
            assert!(o.limits.is_empty(), "{garbage}: {o:?}");
        }
        let o = read(&[("ratelimit", r#""a";r=4;t=0"#)]);
        assert_eq!(o.limits[0].window, None);
        let o = read(&[("ratelimit-policy", r#""a";q=4;w=0, "b";w=4, "c";q=1"#)]);
        assert_eq!(o.policies.len(), 1, "{o:?}");
        assert_eq!(o.policies[0].name, "c");
    }

    #[test]
    fn x_ratelimit_resets_are_epoch_or_delta_seconds() {
        let epoch = read(&[
            ("x-ratelimit-limit", "60"),
            ("x-ratelimit-remaining", "7"),
            ("x-ratelimit-reset", "1700000042"),
        ]);
        assert_eq!(epoch.limits[0].remaining, 7);
        assert_eq!(epoch.limits[0].window, Some(Duration::from_secs(42)));
        assert_eq!(epoch.limits[0].name, "x-ratelimit");
        let delta = read(&[
            ("x-ratelimit-remaining", "7"),
            ("x-ratelimit-reset", "42"),
            ("x-ratelimit-resource", "core"),
        ]);
        assert_eq!(delta.limits[0].window, Some(Duration::from_secs(42)));
        assert_eq!(delta.limits[0].name, "core");
        // Measured from the server's Date: its clock is an hour behind ours, and still understood.
        let behind = read(&[
            ("date", "Tue, 14 Nov 2023 21:13:20 GMT"), // 1699996400, an hour before our clock
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1699996430"),
        ]);
        assert_eq!(behind.limits[0].window, Some(Duration::from_secs(30)));
        // A reset in the past is no horizon; remaining above the limit is cut to it.
        let past = read(&[
            ("x-ratelimit-limit", "5"),
            ("x-ratelimit-remaining", "500"),
            ("x-ratelimit-reset", "1600000000"),
        ]);
        assert_eq!(past.limits[0].window, None);
        assert_eq!(past.limits[0].remaining, 5);
        // Ignored beside the IETF field.
        let both = read(&[
            ("ratelimit", r#""api";r=3;t=1"#),
            ("x-ratelimit-remaining", "3"),
        ]);
        assert_eq!(both.limits.len(), 1);
        assert_eq!(both.limits[0].name, "api");
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        assert_eq!(
            read(&[("retry-after", "120")]).retry_after,
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            read(&[
                ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
                ("retry-after", "Tue, 14 Nov 2023 22:14:00 GMT")
            ])
            .retry_after,
            Some(Duration::from_secs(40))
        );
        // Without Date, from our clock (1700000000 = 22:13:20).
        assert_eq!(
            read(&[("retry-after", "Tue, 14 Nov 2023 22:13:25 GMT")]).retry_after,
            Some(Duration::from_secs(5))
        );
        // A date in the past: no wait. Negative or garbage: none.
        assert_eq!(
            read(&[("retry-after", "Tue, 14 Nov 2000 22:13:25 GMT")]).retry_after,
            Some(Duration::ZERO)
        );
        assert_eq!(read(&[("retry-after", "-5")]).retry_after, None);
        assert_eq!(read(&[("retry-after", "soon")]).retry_after, None);
    }

    #[test]
    fn refusals_are_429_and_503() {
        let h = HeaderMap::new();
        assert_eq!(
            Observation::read(StatusCode::TOO_MANY_REQUESTS, &h).refusal,
            Some(Refusal::TooManyRequests)
        );
        assert_eq!(
            Observation::read(StatusCode::SERVICE_UNAVAILABLE, &h).refusal,
            Some(Refusal::Unavailable)
        );
        assert!(Observation::read(StatusCode::OK, &h).is_empty());
    }

    #[test]
    fn grpc_refusals_carry_retry_info() {
        use tonic_types::{ErrorDetails, StatusExt as _};
        let status = tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            "slow down",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(1500))),
        );
        let mut headers = HeaderMap::new();
        status.add_header(&mut headers).unwrap();
        assert_eq!(
            grpc_refusal(&headers),
            Some((
                Refusal::ResourceExhausted,
                Some(Duration::from_millis(1500))
            ))
        );
        let mut ok = HeaderMap::new();
        tonic::Status::ok("").add_header(&mut ok).unwrap();
        assert_eq!(grpc_refusal(&ok), None);
    }

    #[test]
    fn problem_details_name_the_violated_policies() {
        let body = br#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"t","violated-policies":["daily","bandwidth"]}"#;
        assert_eq!(violated_policies(body), ["daily", "bandwidth"]);
        assert!(violated_policies(b"not json").is_empty());
        assert!(violated_policies(br#"{"violated-policies":"daily"}"#).is_empty());
    }
}
