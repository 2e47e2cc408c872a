//! A circuit breaker: after repeated failures, stop asking Redis for a while, then let one probe through.
//!
//! Without it every request during an outage would wait out the full timeout; with it, requests get the failure
//! policy's answer at once while one probe per cool-down finds out whether Redis is back.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the circuit currently lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Every call goes to Redis.
    Closed,
    /// Calls are answered by the failure policy without asking Redis, until the cool-down ends.
    Open,
    /// The cool-down is over and one probe is (or may now be) in flight: its result closes or reopens the circuit.
    HalfOpen,
}

#[derive(Debug)]
struct Inner {
    consecutive_failures: u32,
    opened_at: Option<Instant>,
    probing: bool,
}

/// Consecutive-failure circuit breaker. The lock is held for a few instructions per call, never across I/O.
#[derive(Debug)]
pub(crate) struct Circuit {
    threshold: u32,
    cool_down: Duration,
    inner: Mutex<Inner>,
}

/// Permission to call Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The circuit is closed.
    Call,
    /// The circuit is half-open and this call is its probe.
    Probe,
    /// The circuit is open: do not call.
    Skip,
}

impl Circuit {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down,
            inner: Mutex::new(Inner {
                consecutive_failures: 0,
                opened_at: None,
                probing: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a call may go to Redis at `now` (the time is passed in, so tests can move it by hand).
    pub(crate) fn admit(&self, now: Instant) -> Admission {
        let mut inner = self.lock();
        match inner.opened_at {
            None => Admission::Call,
            Some(at) if now.saturating_duration_since(at) < self.cool_down || inner.probing => {
                Admission::Skip
            }
            Some(_) => {
                inner.probing = true;
                Admission::Probe
            }
        }
    }

    /// Records a success; returns whether this closed an open circuit.
    pub(crate) fn succeeded(&self) -> bool {
        let mut inner = self.lock();
        inner.consecutive_failures = 0;
        inner.probing = false;
        inner.opened_at.take().is_some()
    }

    /// Records a failure at `now`; returns whether this opened (or reopened) the circuit.
    pub(crate) fn failed(&self, admission: Admission, now: Instant) -> bool {
        let mut inner = self.lock();
        inner.consecutive_failures = inner.consecutive_failures.saturating_add(1);
        if admission == Admission::Probe {
            inner.probing = false;
            inner.opened_at = Some(now);
            return true;
        }
        if inner.opened_at.is_none() && inner.consecutive_failures >= self.threshold {
            inner.opened_at = Some(now);
            return true;
        }
        false
    }

    /// A probe that was abandoned (its caller was cancelled) must not keep the circuit shut forever.
    pub(crate) fn abandoned(&self) {
        self.lock().probing = false;
    }

    pub(crate) fn state(&self, now: Instant) -> CircuitState {
        let inner = self.lock();
        match inner.opened_at {
            None => CircuitState::Closed,
            Some(at) if now.saturating_duration_since(at) < self.cool_down => CircuitState::Open,
            Some(_) => CircuitState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The circuit is driven by hand-made instants: no sleep, no race with a loaded machine.
    #[test]
    fn opens_after_threshold_and_probes_after_cool_down() {
        let cool_down = Duration::from_secs(1);
        let c = Circuit::new(3, cool_down);
        let t0 = Instant::now();
        for _ in 0..2 {
            assert_eq!(c.admit(t0), Admission::Call);
            assert!(!c.failed(Admission::Call, t0));
        }
        assert_eq!(c.admit(t0), Admission::Call);
        assert!(c.failed(Admission::Call, t0));
        assert_eq!(c.state(t0), CircuitState::Open);
        assert_eq!(c.admit(t0), Admission::Skip);
        let almost = t0 + cool_down - Duration::from_nanos(1);
        assert_eq!(c.state(almost), CircuitState::Open);
        assert_eq!(c.admit(almost), Admission::Skip, "still cooling down");
        let t1 = t0 + cool_down;
        assert_eq!(c.state(t1), CircuitState::HalfOpen);
        assert_eq!(c.admit(t1), Admission::Probe);
        assert_eq!(c.admit(t1), Admission::Skip, "only one probe at a time");
        assert!(c.failed(Admission::Probe, t1));
        assert_eq!(
            c.admit(t1),
            Admission::Skip,
            "a failed probe reopens the circuit"
        );
        assert_eq!(c.admit(t1 + cool_down / 2), Admission::Skip);
        let t2 = t1 + cool_down;
        assert_eq!(c.admit(t2), Admission::Probe);
        assert!(c.succeeded());
        assert_eq!(c.state(t2), CircuitState::Closed);
        assert_eq!(c.admit(t2), Admission::Call);
    }

    #[test]
    fn an_abandoned_probe_frees_the_slot() {
        let c = Circuit::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        assert!(c.failed(Admission::Call, t0));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(c.admit(t1), Admission::Probe);
        c.abandoned();
        assert_eq!(c.admit(t1), Admission::Probe);
    }

    #[test]
    fn a_success_resets_the_count() {
        let c = Circuit::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(!c.failed(Admission::Call, t0));
        assert!(!c.succeeded());
        assert!(!c.failed(Admission::Call, t0));
        assert_eq!(c.state(t0), CircuitState::Closed);
    }
}
