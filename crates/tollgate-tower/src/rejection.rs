//! Typed rejections, downcastable from [`tower::BoxError`](crate::BoxError).
//!
//! Every tollgate limiter rejects with a [`Rejection`]; its [`RejectionKind`] tells adapters how to answer:
//! HTTP 429 / gRPC `RESOURCE_EXHAUSTED` for a client over its quota, HTTP 503 / gRPC `UNAVAILABLE` when the
//! server protects itself ([`RejectionKind::is_overload`]).
//!
//! ```
//! use std::time::Duration;
//! use tollgate_tower::{BoxError, Rejection, RejectionKind};
//!
//! let err: BoxError = Box::new(
//!     Rejection::new(RejectionKind::Shed, "worker").with_retry_after(Duration::from_millis(1500)),
//! );
//! let rejection = err.downcast_ref::<Rejection>().expect("a tollgate rejection");
//! assert!(rejection.kind().is_overload());
//! assert_eq!(rejection.retry_after_secs(), Some(2));
//! ```

use std::fmt;
use std::time::Duration;

use tollgate_core::Decision;

use crate::Name;
use crate::Verdict;
use crate::verdict::ceil_secs;

/// Why a request was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The client is over its request-rate quota (HTTP 429, gRPC `RESOURCE_EXHAUSTED`).
    RateLimited,
    /// The client has too many requests in flight (HTTP 429, gRPC `RESOURCE_EXHAUSTED`).
    ConcurrencyLimited,
    /// A load shedder dropped the request to protect the service (HTTP 503, gRPC `UNAVAILABLE`).
    Shed,
    /// The limiter's store failed and its failure policy is closed (HTTP 503, gRPC `UNAVAILABLE`).
    StoreUnavailable,
}

impl RejectionKind {
    /// Whether the server is protecting itself (503 / `UNAVAILABLE`) rather than the client being over its
    /// quota (429 / `RESOURCE_EXHAUSTED`).
    #[must_use]
    pub const fn is_overload(self) -> bool {
        matches!(self, Self::Shed | Self::StoreUnavailable)
    }

    /// A short stable name for metrics, logs and problem types.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::ConcurrencyLimited => "concurrency_limited",
            Self::Shed => "shed",
            Self::StoreUnavailable => "store_unavailable",
        }
    }
}

impl fmt::Display for RejectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request rejected by a tollgate limiter.
#[derive(Debug, Clone)]
pub struct Rejection {
    kind: RejectionKind,
    limiter: Name,
    retry_after: Option<Duration>,
    verdict: Option<Verdict>,
    admitted: Vec<Verdict>,
}

impl Rejection {
    /// A rejection of `kind` by the limiter named `limiter`.
    pub fn new(kind: RejectionKind, limiter: impl Into<Name>) -> Self {
        Self {
            kind,
            limiter: limiter.into(),
            retry_after: None,
            verdict: None,
            admitted: Vec::new(),
        }
    }

    /// A rate-limit rejection from a denied verdict; the retry delay is the decision's.
    #[must_use]
    pub fn rate_limited(verdict: Verdict) -> Self {
        Self {
            kind: RejectionKind::RateLimited,
            limiter: verdict.limiter.clone(),
            retry_after: verdict.decision.retry_after,
            verdict: Some(verdict),
            admitted: Vec::new(),
        }
    }

    /// Sets how long the client should wait before retrying.
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// Attaches the rejecting limiter's verdict (rendered in headers).
    #[must_use]
    pub fn with_verdict(mut self, verdict: Verdict) -> Self {
        self.verdict = Some(verdict);
        self
    }

    /// Why the request was rejected.
    #[must_use]
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The rejecting limiter's name.
    #[must_use]
    pub fn limiter(&self) -> &str {
        &self.limiter
    }

    /// The exact delay after which the same request may be admitted, when known.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The rejecting limiter's verdict, when it has one.
    #[must_use]
    pub fn verdict(&self) -> Option<&Verdict> {
        self.verdict.as_ref()
    }

    /// The verdicts of the limiters further out that had admitted (and counted) the request before it was
    /// rejected, innermost first. Limiters answering through the default responder (`()`) add theirs as the
    /// rejection passes them on its way out, so that the answer shows every limit the request was counted against.
    #[must_use]
    pub fn admitted(&self) -> &[Verdict] {
        &self.admitted
    }

    /// Adds the verdict of a limiter that admitted the request before this rejection (see
    /// [`admitted`](Self::admitted)).
    pub fn push_admitted(&mut self, verdict: Verdict) {
        self.admitted.push(verdict);
    }

    /// The rejecting limiter's decision, when it has one.
    #[must_use]
    pub fn decision(&self) -> Option<&Decision> {
        self.verdict.as_ref().map(|v| &v.decision)
    }

    /// The `Retry-After` value in whole seconds: the retry delay rounded up, and never earlier than the reset
    /// the rejecting verdict announces (`t` in the `RateLimit` field), so the two headers never disagree.
    /// `None` when a retry cannot help (the cost exceeds what the policy ever admits at once).
    #[must_use]
    pub fn retry_after_secs(&self) -> Option<u64> {
        let retry = ceil_secs(self.retry_after?);
        let reset = self.verdict.as_ref().map_or(0, Verdict::reset_secs);
        Some(retry.max(reset).max(1))
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            RejectionKind::RateLimited => write!(f, "rate limit {:?} exceeded", self.limiter)?,
            RejectionKind::ConcurrencyLimited => {
                write!(
                    f,
                    "too many concurrent requests for limit {:?}",
                    self.limiter
                )?;
            }
            RejectionKind::Shed => write!(
                f,
                "request shed by {:?} to protect the service",
                self.limiter
            )?,
            RejectionKind::StoreUnavailable => {
                write!(
                    f,
                    "limit {:?} could not be checked: its store is unavailable",
                    self.limiter
                )?;
            }
        }
        // The retry delay is left to the adapters, which round it for their protocol.
        Ok(())
    }
}

impl std::error::Error for Rejection {}
