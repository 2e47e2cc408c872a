//! What a limiter tells about each decision besides the decision counters: the near-limit counter (an alerting
//! signal before clients see 429s) and one `tracing` span (with an event in it) per decision.
//!
//! Both are called at the decision points of every limiter (the rate limiter's and the stack's decision cores) and
//! cost a few instructions there when nobody listens: the near-limit check is two multiplications and a compare,
//! and the event is behind `tracing`'s global level filter, so with no subscriber (or one at `INFO`) no field is
//! evaluated and nothing is formatted.

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use metrics::Counter;
use tracing::Level;
use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};

use crate::{Mode, Name};

/// The counter of admissions close to the limit: `tollgate_near_limit_total{limiter}`.
pub const NEAR_LIMIT_TOTAL: &str = "tollgate_near_limit_total";

/// The `tracing` target of the per-decision events (at `DEBUG`): filter on it to see them, e.g.
/// `tollgate::decision=debug`.
pub const DECISION_TARGET: &str = "tollgate::decision";

/// The share of the limit below which an admission counts as near the limit: validated, in parts per million.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NearLimitShare {
    ppm: u32,
}

impl NearLimitShare {
    /// 20 %: an admission with less than a fifth of the limit remaining is near it.
    pub(crate) const DEFAULT: Self = Self { ppm: 200_000 };

    /// Never near: counts nothing (the worker shedder's, whose decisions have no limit to be near).
    #[cfg(any(feature = "stack", test))]
    pub(crate) const OFF: Self = Self { ppm: 0 };

    /// The share `share` of the limit (0.0 to 1.0; 0.0 never counts, 1.0 counts every admission that leaves the
    /// limit less than whole).
    ///
    /// # Errors
    /// If `share` is not a number from 0.0 to 1.0.
    pub(crate) fn new(share: f64) -> Result<Self, ShareError> {
        if !(0.0..=1.0).contains(&share) {
            return Err(ShareError(share));
        }
        // In range, so the cast neither saturates nor wraps.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ppm = (share * 1_000_000.0).round() as u32;
        Ok(Self { ppm })
    }

    /// The share, from 0.0 to 1.0.
    #[must_use]
    pub(crate) fn get(self) -> f64 {
        f64::from(self.ppm) / 1_000_000.0
    }
}

impl Default for NearLimitShare {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A near-limit share that is not a number from 0.0 to 1.0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ShareError(f64);

impl fmt::Display for ShareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a near-limit share of {} is impossible: expected a share of the limit from 0.0 to 1.0 (e.g. 0.2 for 20 %)",
            self.0
        )
    }
}

impl std::error::Error for ShareError {}

/// One limiter's per-decision signals: the near-limit counter (registered once, so counting does no label work)
/// and the fields of its decision events. Owned by the limiter's judge (`limit::core`): with the default share, an
/// admission leaving 1 of 10 counts in `tollgate_near_limit_total`, one leaving 2 of 10 (not less than 20 %) does
/// not.
#[derive(Debug)]
pub(crate) struct Signals {
    near_limit: Counter,
    ppm: u64,
    limiter: Name,
    rejected: &'static str,
    algorithm: &'static str,
    store: &'static str,
}

impl Signals {
    /// The signals of the limiter `name`, whose rejections count as `rejected` (`limited` or `shed`, as for
    /// [`Counters`](super::Counters)), deciding with `algorithm` (`token_bucket`, `concurrency` …) on `store` (a
    /// short type name, see [`store_name`]), counting admissions with less than `near` of the limit left.
    #[must_use]
    pub(crate) fn new(
        name: &Name,
        rejected: &'static str,
        algorithm: &'static str,
        store: &'static str,
        near: NearLimitShare,
    ) -> Self {
        Self {
            near_limit: metrics::counter!(NEAR_LIMIT_TOTAL, "limiter" => name.to_string()),
            ppm: u64::from(near.ppm),
            limiter: name.clone(),
            rejected,
            algorithm,
            store,
        }
    }

    /// An admission (`outcome` as in `tollgate_decisions_total`) that left `remaining` of `limit`: counted as near
    /// the limit if `remaining < share × limit`, and traced.
    #[inline]
    pub(crate) fn admitted(&self, outcome: &'static str, remaining: u64, limit: u64) {
        // remaining < ppm / 10^6 × limit, exactly, in integers (no division, no float on the hot path).
        if u128::from(remaining) * 1_000_000 < u128::from(limit) * u128::from(self.ppm) {
            self.near_limit.increment(1);
        }
        self.decided(outcome, Some(remaining));
    }

    /// A request over the limit in `mode`: rejected (`limited`, `shed`), or admitted in shadow mode
    /// (`shadow_limited`, `shadow_shed`), with `remaining` left: traced.
    #[inline]
    pub(crate) fn over_limit(&self, mode: Mode, remaining: u64) {
        if events_enabled() {
            let outcome = match (mode, self.rejected) {
                (Mode::Shadow, "shed") => "shadow_shed",
                (Mode::Shadow, _) => "shadow_limited",
                (_, rejected) => rejected,
            };
            self.emit(outcome, Some(remaining));
        }
    }

    /// A decision with `outcome` (as in `tollgate_decisions_total`), and what it left when the limiter knows:
    /// traced, at `DEBUG` on [`DECISION_TARGET`].
    #[inline]
    pub(crate) fn decided(&self, outcome: &'static str, remaining: Option<u64>) {
        if events_enabled() {
            self.emit(outcome, remaining);
        }
    }

    fn emit(&self, outcome: &'static str, remaining: Option<u64>) {
        let store_latency_us = STORE_WAIT
            .take()
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        // A span per decision (what tracing backends such as OpenTelemetry show beside the request's own span),
        // carrying the decision's fields, and the event inside it for log subscribers.
        let span = tracing::span!(
            target: DECISION_TARGET,
            Level::DEBUG,
            "tollgate.decision",
            limiter = &*self.limiter,
            algorithm = self.algorithm,
            store = self.store,
            outcome,
            remaining,
            store_latency_us,
        );
        span.in_scope(|| {
            tracing::event!(
                target: DECISION_TARGET,
                Level::DEBUG,
                limiter = &*self.limiter,
                algorithm = self.algorithm,
                store = self.store,
                outcome,
                remaining,
                store_latency_us,
                "tollgate decision"
            );
        });
    }
}

/// Whether decision events could be seen: the global level filter lets `DEBUG` through. One atomic load; a
/// subscriber's own filter (targets) is asked only when this passes.
#[inline]
fn events_enabled() -> bool {
    Level::DEBUG <= STATIC_MAX_LEVEL && Level::DEBUG <= LevelFilter::current()
}

thread_local! {
    /// The last store call's duration on this thread, timed only while events are enabled, for the decision event
    /// that follows it at once on the same thread (an event takes it, so it never describes another decision).
    static STORE_WAIT: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Runs a store call that answers at once, timing it for the next decision event when events are enabled.
#[inline]
pub(crate) fn timed<T>(call: impl FnOnce() -> T) -> T {
    let started = start();
    let out = call();
    if let Some(started) = started {
        stop(started);
    }
    out
}

/// Awaits a store call, timing it for the next decision event when events are enabled.
pub(crate) async fn timed_async<F: Future>(call: F) -> F::Output {
    let started = start();
    let out = call.await;
    if let Some(started) = started {
        stop(started);
    }
    out
}

/// Now, if decision events are enabled.
#[inline]
fn start() -> Option<Instant> {
    if events_enabled() {
        return Some(now());
    }
    None
}

fn now() -> Instant {
    Instant::now()
}

fn stop(started: Instant) {
    STORE_WAIT.set(Some(started.elapsed()));
}

/// The short name of the store type `St` for decision events: `MemoryStore`, `RedisStore` (its path and generic
/// arguments left out).
#[must_use]
pub(crate) fn store_name<St: ?Sized>() -> &'static str {
    let full = std::any::type_name::<St>();
    let bare = full.split('<').next().unwrap_or(full);
    bare.rsplit("::").next().unwrap_or(bare)
}

#[cfg(test)]
mod tests {
    use super::NearLimitShare;

    #[test]
    fn near_limit_shares_are_validated() {
        assert_eq!(NearLimitShare::DEFAULT.get(), 0.2);
        assert_eq!(NearLimitShare::new(0.05).unwrap().get(), 0.05);
        assert!(NearLimitShare::new(1.5).is_err());
        assert!(NearLimitShare::new(f64::NAN).is_err());
        let err = NearLimitShare::new(-0.1).unwrap_err().to_string();
        assert!(err.contains("-0.1") && err.contains("0.0 to 1.0"), "{err}");
    }

    use super::*;

    #[test]
    fn the_near_limit_boundary_is_strict_and_exact() {
        let near = |share, remaining, limit| {
            let s = Signals::new(
                &Name::from("t"),
                "limited",
                "token_bucket",
                "MemoryStore",
                NearLimitShare::new(share).unwrap(),
            );
            u128::from(remaining) * 1_000_000 < u128::from(limit) * u128::from(s.ppm)
        };
        assert!(near(0.2, 1, 10));
        assert!(!near(0.2, 2, 10), "exactly 20 % left is not less than 20 %");
        assert!(near(0.2, 19, 100));
        assert!(!near(0.2, 20, 100));
        assert!(!near(0.0, 0, 10), "share 0 never counts");
        assert!(near(1.0, 9, 10));
        assert!(!near(1.0, 10, 10));
        assert!(near(0.2, u64::MAX / 5 - 1, u64::MAX), "no overflow");
    }

    #[test]
    fn store_names_are_short() {
        assert_eq!(store_name::<tollgate_core::MemoryStore>(), "MemoryStore");
        assert_eq!(store_name::<Vec<String>>(), "Vec");
        assert_eq!(store_name::<u64>(), "u64");
    }

    #[test]
    fn bad_shares_are_errors_with_a_message() {
        for bad in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
            let err = NearLimitShare::new(bad).unwrap_err();
            assert!(err.to_string().contains("0.0 to 1.0"), "{err}");
        }
        assert_eq!(NearLimitShare::new(0.0).unwrap(), NearLimitShare::OFF);
    }
}
