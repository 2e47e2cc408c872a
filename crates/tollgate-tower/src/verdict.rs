//! What each limiter decided, carried on the response so adapters can render headers.
//!
//! Every limiter that admits a request pushes its [`Verdict`] onto the response through [`VerdictSink`]
//! (for `http::Response`, into its extensions, with the `http` feature), unless its
//! [`Respond`](crate::respond::Respond)er consumes the verdict itself (the HTTP adapter renders a lone limiter's
//! verdict straight into headers). Stacked layers — a per-client limit around a per-route one — each add their own
//! entry, so the HTTP adapter can list every policy in the `RateLimit` fields. A rejection carries the rejecting
//! limiter's verdict in the [`Rejection`](crate::Rejection).
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Decision, Outcome, Timestamp};
//! use tollgate_tower::{Verdict, Verdicts};
//!
//! let decision = |remaining| Decision {
//!     outcome: Outcome::Allowed,
//!     limit: 10,
//!     remaining,
//!     reset: Timestamp::from_micros(2_500_000),
//!     retry_after: None,
//!     now: Timestamp::from_micros(1_000_000),
//! };
//! let mut verdicts = Verdicts::default();
//! verdicts.push(Verdict::new("per-client", Duration::from_secs(1), decision(7)));
//! verdicts.push(Verdict::new("per-route", Duration::from_secs(1), decision(2)));
//! let binding = verdicts.binding().unwrap();
//! assert_eq!(&*binding.limiter, "per-route"); // the closest to its limit
//! assert_eq!(binding.reset_secs(), 2); // 1.5 s, rounded up
//! assert!(verdicts.only().is_none()); // two limiters enforced
//!
//! let mut single = Verdicts::default();
//! let mut shadow = Verdict::new("dark-launch", Duration::from_secs(1), decision(0));
//! shadow.enforced = false;
//! single.push(shadow);
//! single.push(Verdict::new("per-client", Duration::from_secs(1), decision(7)));
//! assert_eq!(&*single.only().unwrap().limiter, "per-client"); // shadow verdicts do not count
//! ```

use std::time::Duration;

use crate::Name;
use tollgate_core::{Decision, Outcome, Timestamp};

/// What a verdict's quota counts: the quota unit of the IETF RateLimit fields (`qu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum QuotaUnit {
    /// Requests (each of its cost) per window: the rate limiter's quota.
    #[default]
    Requests,
    /// Requests in flight at once: the concurrency limiter's quota. It has no window: the decision's `limit` is the
    /// most requests in flight, `remaining` how many more may start, and `window` is zero.
    ConcurrentRequests,
}

/// One limiter's decision on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The limiter's (policy's) name, shown to clients in headers.
    pub limiter: Name,
    /// The window the decision's limit applies to, as announced to clients: the policy's
    /// [`Quota::window`](tollgate_core::Quota::window) (its period, unless a token bucket's burst differs from its
    /// limit).
    pub window: Duration,
    /// The decision, with every number headers show.
    pub decision: Decision,
    /// False in shadow mode: decided but not enforced, and not shown to clients.
    pub enforced: bool,
    /// What the quota counts: requests per window, or requests in flight.
    pub unit: QuotaUnit,
}

impl Verdict {
    /// An enforced verdict on a quota of requests per `window`.
    pub fn new(limiter: impl Into<Name>, window: Duration, decision: Decision) -> Self {
        Self {
            limiter: limiter.into(),
            window,
            decision,
            enforced: true,
            unit: QuotaUnit::Requests,
        }
    }

    /// An enforced verdict of a concurrency limiter ([`QuotaUnit::ConcurrentRequests`]) decided at `now`: at most
    /// `limit` requests in flight, and `remaining` more may start (after this one, if it was admitted).
    /// `retry_after` is `None` for an admission, and a refusal's announced retry delay otherwise.
    ///
    /// Nothing in flight resets at an instant: the decision's `reset` is `now`.
    pub fn in_flight(
        limiter: impl Into<Name>,
        limit: u64,
        remaining: u64,
        retry_after: Option<Duration>,
        now: Timestamp,
    ) -> Self {
        let outcome = match retry_after {
            None => Outcome::Allowed,
            Some(_) => Outcome::Limited,
        };
        Self {
            limiter: limiter.into(),
            window: Duration::ZERO,
            decision: Decision {
                outcome,
                limit,
                remaining: remaining.min(limit),
                reset: now,
                retry_after,
                now,
            },
            enforced: true,
            unit: QuotaUnit::ConcurrentRequests,
        }
    }

    /// Whole seconds until quota is available again, rounded up (never earlier than it happens): on a denial, until
    /// the denied request would be admitted (`retry_after`); otherwise until the full quota is back (`reset`).
    ///
    /// A token bucket's `reset` is when the bucket is full again: announcing that on a denial would make a client
    /// of "3 per hour" wait an hour for a token that returns in 20 minutes.
    #[must_use]
    pub fn reset_secs(&self) -> u64 {
        match self.decision.retry_after {
            Some(retry) if !self.decision.is_allowed() => ceil_secs(retry),
            _ => ceil_secs(self.decision.reset_after()),
        }
    }

    /// The window in whole seconds, rounded up (at least 1).
    #[must_use]
    pub fn window_secs(&self) -> u64 {
        ceil_secs(self.window).max(1)
    }

    /// The limit over the announced window ([`window_secs`](Self::window_secs)) rather than over the policy's
    /// period, rounded down: the same number when the period is whole seconds, and for "10 per 500 ms" 20 per
    /// second rather than 10, which would tell a client pacing itself to use half its quota. Never more than the
    /// policy admits in the window.
    #[must_use]
    pub fn window_limit(&self) -> u64 {
        let period = self.window.as_nanos();
        let window = u128::from(self.window_secs()) * 1_000_000_000;
        if period == 0 || period == window {
            return self.decision.limit;
        }
        u64::try_from(u128::from(self.decision.limit) * window / period).unwrap_or(u64::MAX)
    }

    /// Requests counted against the limit in the current window (`limit − remaining`, at least 0).
    #[must_use]
    pub fn used(&self) -> u64 {
        self.decision.limit.saturating_sub(self.decision.remaining)
    }
}

/// Whole seconds in `d`, rounded up.
#[must_use]
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The verdicts of every limiter a request went through, innermost first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdicts {
    // Most requests pass one limiter: keep the first verdict inline, without a heap allocation.
    first: Option<Verdict>,
    rest: Vec<Verdict>,
}

impl Verdicts {
    /// Adds a verdict.
    pub fn push(&mut self, verdict: Verdict) {
        if self.first.is_none() {
            self.first = Some(verdict);
        } else {
            self.rest.push(verdict);
        }
    }

    /// All verdicts, innermost limiter first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Verdict> {
        self.first.iter().chain(self.rest.iter())
    }

    /// Enforced verdicts only: the ones clients may see.
    pub fn enforced(&self) -> impl DoubleEndedIterator<Item = &Verdict> {
        self.iter().filter(|v| v.enforced)
    }

    /// Number of verdicts.
    #[must_use]
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The enforced verdict when there is exactly one (the common case of a single limiter), found without
    /// walking the list.
    #[must_use]
    pub fn only(&self) -> Option<&Verdict> {
        if self.rest.is_empty() {
            return self.first.as_ref().filter(|v| v.enforced);
        }
        let mut enforced = self.enforced();
        let only = enforced.next();
        enforced.next().is_none().then_some(only).flatten()
    }

    /// The enforced verdict on requests per window that binds the client most: a denial first, then the fewest
    /// remaining, then the latest reset. Single-policy headers (`X-RateLimit-*`) describe this one; they say
    /// when a window's quota is back (`X-RateLimit-Reset`), which a quota of requests in flight
    /// ([`QuotaUnit::ConcurrentRequests`]) has no instant for, so its verdicts are never the binding one.
    #[must_use]
    pub fn binding(&self) -> Option<&Verdict> {
        let windowed = self.enforced().filter(|v| v.unit == QuotaUnit::Requests);
        windowed.min_by_key(|v| {
            (
                v.decision.is_allowed(),
                v.decision.remaining,
                std::cmp::Reverse(v.decision.reset),
            )
        })
    }
}

impl From<Verdict> for Verdicts {
    fn from(verdict: Verdict) -> Self {
        Self {
            first: Some(verdict),
            rest: Vec::new(),
        }
    }
}

impl IntoIterator for Verdicts {
    type Item = Verdict;
    type IntoIter = std::iter::Chain<std::option::IntoIter<Verdict>, std::vec::IntoIter<Verdict>>;

    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

impl Extend<Verdict> for Verdicts {
    fn extend<I: IntoIterator<Item = Verdict>>(&mut self, verdicts: I) {
        verdicts.into_iter().for_each(|v| self.push(v));
    }
}

/// A request or response that can carry [`Verdicts`].
///
/// Implemented for `http::Request` and `http::Response` (in their extensions) with the `http` feature; implement
/// it for your own response type to use the layer elsewhere.
pub trait VerdictSink {
    /// The verdicts carried so far (created empty on first use).
    fn verdicts_mut(&mut self) -> &mut Verdicts;

    /// The request's real cost this response states at `source`, for a limiter that charges the cost after the
    /// response ([`RateLimitLayer::cost_after`](crate::RateLimitLayer::cost_after)) under the default
    /// responder `()` or in a [`RateLimitSet`](crate::limit::rate::RateLimitSet);
    /// `None` (the default) leaves the cost charged up front. `http::Response` reads the
    /// [`FinalCost`](crate::FinalCost) extension or the header (gRPC: the initial metadata).
    fn final_cost(&self, source: &crate::CostAfter) -> Option<u64> {
        let _ = source;
        None
    }

    /// The ledger of the limiters that charge this response as it streams
    /// ([`CostAfter::Streamed`](crate::CostAfter::Streamed)), created empty on first use; `None` (the default)
    /// for a response that cannot carry one: such a limiter's reservation then stands as the request's cost.
    /// `http::Response` keeps it in its extensions, for the body meter.
    fn stream_charges(&mut self) -> Option<&mut crate::stream_cost::StreamCharges> {
        None
    }
}

#[cfg(feature = "http")]
impl<B> VerdictSink for http::Response<B> {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        self.extensions_mut().get_or_insert_default::<Verdicts>()
    }

    /// The [`FinalCost`](crate::FinalCost) extension, or the header's whole number (a missing or unreadable header
    /// charges nothing more).
    fn final_cost(&self, source: &crate::CostAfter) -> Option<u64> {
        match source {
            crate::CostAfter::Extension => self
                .extensions()
                .get::<crate::FinalCost>()
                .map(|cost| cost.0),
            crate::CostAfter::Header(name) => self
                .headers()
                .get(name.as_ref())?
                .to_str()
                .ok()?
                .trim()
                .parse()
                .ok(),
            crate::CostAfter::Streamed(_) => None,
        }
    }

    fn stream_charges(&mut self) -> Option<&mut crate::stream_cost::StreamCharges> {
        Some(self.extensions_mut().get_or_insert_default())
    }
}

#[cfg(feature = "http")]
impl<B> VerdictSink for http::Request<B> {
    fn verdicts_mut(&mut self) -> &mut Verdicts {
        self.extensions_mut().get_or_insert_default::<Verdicts>()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{Decision, Outcome, Timestamp};

    use super::{Verdict, ceil_secs};

    #[test]
    fn whole_seconds_round_up_and_saturate() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2_001)), 3);
        // An effectively endless wait stays endless rather than wrapping to "retry in 1 s".
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
    }

    fn per(limit: u64, window: Duration) -> Verdict {
        let decision = Decision {
            outcome: Outcome::Allowed,
            limit,
            remaining: limit,
            reset: Timestamp::from_micros(0),
            retry_after: None,
            now: Timestamp::from_micros(0),
        };
        Verdict::new("v", window, decision)
    }

    /// The announced quota is the policy's rate over the announced window, never above it.
    #[test]
    fn window_limit_scales_the_limit_to_whole_seconds() {
        let cases = [
            (100, Duration::from_secs(60), 60, 100),
            (10, Duration::from_millis(500), 1, 20),
            (3, Duration::from_millis(300), 1, 10),
            (1, Duration::from_millis(700), 1, 1),
            (3, Duration::from_millis(1_500), 2, 4),
            (7, Duration::from_micros(1), 1, 7_000_000),
            (u64::MAX, Duration::from_millis(500), 1, u64::MAX),
        ];
        for (limit, period, w, q) in cases {
            let v = per(limit, period);
            assert_eq!(
                (v.window_secs(), v.window_limit()),
                (w, q),
                "{limit} per {period:?}"
            );
        }
    }
}
