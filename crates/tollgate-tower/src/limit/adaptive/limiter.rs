//! The state every service of one adaptive layer shares: the limit, what is in flight (in total and per class),
//! and the permits that give a slot back and report its latency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::limit::core::Judge;
use crate::observe::{NearLimitShare, Signals};
use crate::{EnforcementSwitch, Name, Priority};
use metrics::{Counter, Gauge, Histogram};
use tollgate_core::{Clock, Timestamp};

use super::control::{Control, LimitState, Sample};

/// The current limit, in requests: `tollgate_adaptive_limit{limiter}`.
pub const ADAPTIVE_LIMIT: &str = "tollgate_adaptive_limit";
/// The latency of each finished request (seconds), as the limiter measured it:
/// `tollgate_adaptive_latency_seconds{limiter}`.
pub const ADAPTIVE_LATENCY: &str = "tollgate_adaptive_latency_seconds";

/// The guaranteed share of the limit (percent) of each class by default, indexed like [`Priority::ALL`]:
/// `Critical` 50 %, `High` 20 %, `Normal` 20 %, `Low` 10 %.
pub const DEFAULT_SHARES: [u8; 4] = [50, 20, 20, 10];

/// What an adaptive limiter is configured with.
#[derive(Clone)]
pub(super) struct Settings {
    pub(super) name: Name,
    pub(super) switch: EnforcementSwitch,
    pub(super) retry_after: Duration,
    pub(super) control: Control,
    pub(super) shares: [u8; 4],
    pub(super) clock: Arc<dyn Clock>,
}

pub(crate) struct Limiter {
    /// What the limiter was built from, for a layer built from this one with a setting changed.
    pub(super) settings: Settings,
    /// Mode, decision metrics and logs: the core every limiter decides through.
    pub(crate) judge: Judge,
    started: Timestamp,
    state: Mutex<LimitState>,
    limit: AtomicU64,
    in_flight: AtomicU64,
    busy: [AtomicU64; 4],
    pub(crate) shed: Counter,
    limit_gauge: Gauge,
    latency: Histogram,
}

impl Limiter {
    /// The limit every service of a layer with `settings` shares.
    pub(super) fn new(settings: Settings) -> Self {
        let Settings {
            name,
            switch,
            control,
            clock,
            ..
        } = &settings;
        let state = LimitState::new(*control);
        let limit = state.limit();
        let limit_gauge = metrics::gauge!(ADAPTIVE_LIMIT, "limiter" => name.to_string());
        limit_gauge.set(limit as f64);
        Self {
            shed: metrics::counter!(crate::limit::worker::SHED_TOTAL, "limiter" => name.to_string(), "reason" => "limit"),
            latency: metrics::histogram!(ADAPTIVE_LATENCY, "limiter" => name.to_string()),
            limit_gauge,
            started: clock.now(),
            judge: Judge::new(
                name.clone(),
                switch.clone(),
                None,
                "shed",
                Signals::new(
                    name,
                    "shed",
                    "adaptive",
                    "in_process",
                    NearLimitShare::DEFAULT,
                ),
            ),
            settings,
            state: Mutex::new(state),
            limit: AtomicU64::new(limit),
            in_flight: AtomicU64::new(0),
            busy: Default::default(),
        }
    }

    /// The retry delay a shed request announces.
    pub(crate) fn retry_after(&self) -> Duration {
        self.settings.retry_after
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn busy(&self, priority: Priority) -> u64 {
        self.busy[priority.index()].load(Ordering::Relaxed)
    }

    pub(crate) fn long_latency(&self) -> Duration {
        self.lock().long_latency()
    }

    /// The share of the limit `priority` is guaranteed: `limit × share`, rounded up (at least 1 for a share above
    /// zero, so that a small limit still guarantees every class something).
    pub(crate) fn guaranteed(&self, priority: Priority) -> u64 {
        guaranteed(self.limit(), self.settings.shares[priority.index()])
    }

    /// Admits one request of `priority` if the limit has room (any class may borrow the unused share of others),
    /// or if its class is below its guaranteed share of the limit; counts it in flight.
    pub(crate) fn try_acquire(self: &Arc<Self>, priority: Priority) -> Option<AdaptivePermit> {
        let limit = self.limit();
        let borrowed = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            });
        let in_flight = match borrowed {
            Ok(n) => {
                self.busy[priority.index()].fetch_add(1, Ordering::AcqRel);
                n + 1
            }
            Err(_) => {
                // Over the limit: only within the class's guaranteed share.
                let line = guaranteed(limit, self.settings.shares[priority.index()]);
                self.busy[priority.index()]
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < line).then_some(n + 1)
                    })
                    .ok()?;
                self.in_flight.fetch_add(1, Ordering::AcqRel) + 1
            }
        };
        Some(self.permit(priority, in_flight))
    }

    /// Counts one request in flight whatever the limit (shadow mode admits what it would reject).
    pub(crate) fn force_acquire(self: &Arc<Self>, priority: Priority) -> AdaptivePermit {
        self.busy[priority.index()].fetch_add(1, Ordering::AcqRel);
        let in_flight = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        self.permit(priority, in_flight)
    }

    fn permit(self: &Arc<Self>, priority: Priority, in_flight: u64) -> AdaptivePermit {
        AdaptivePermit {
            limiter: self.clone(),
            priority,
            started: self.settings.clock.now(),
            in_flight,
            outcome: Outcome::Ignored,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LimitState> {
        // The state is a few numbers updated in one step: a panic elsewhere cannot leave it half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn release(&self, permit: &AdaptivePermit) {
        self.busy[permit.priority.index()].fetch_sub(1, Ordering::AcqRel);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        if permit.outcome == Outcome::Ignored {
            return;
        }
        let now = self.settings.clock.now();
        let latency = now.saturating_duration_since(permit.started);
        self.latency.record(latency.as_secs_f64());
        let sample = Sample {
            latency,
            in_flight: permit.in_flight,
            dropped: permit.outcome == Outcome::Dropped,
        };
        let since_start = now.saturating_duration_since(self.started);
        let (old, new) = {
            let mut state = self.lock();
            let old = state.limit();
            (old, state.update(sample, since_start))
        };
        if new != old {
            self.limit.store(new, Ordering::Relaxed);
            self.limit_gauge.set(new as f64);
            tracing::trace!(
                limiter = &*self.judge.name,
                limit = new,
                "adaptive limit changed"
            );
        }
    }
}

fn guaranteed(limit: u64, share: u8) -> u64 {
    if share == 0 {
        return 0;
    }
    let line = (u128::from(limit) * u128::from(share)).div_ceil(100);
    u64::try_from(line).unwrap_or(u64::MAX).max(1)
}

/// How a request ended, as the limit algorithm learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It was cancelled (or its handler panicked) before a response: the slot goes back, no latency sample.
    Ignored,
    /// A response: its latency (to the end of the body) is a sample.
    Responded,
    /// The inner service failed: an overload signal (AIMD backs off).
    Dropped,
}

/// One admitted request's slot: dropping it gives the slot back and, unless the request was cancelled, reports
/// its latency to the limit algorithm.
pub(crate) struct AdaptivePermit {
    limiter: Arc<Limiter>,
    priority: Priority,
    started: Timestamp,
    in_flight: u64,
    pub(crate) outcome: Outcome,
}

impl Drop for AdaptivePermit {
    fn drop(&mut self) {
        self.limiter.release(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::adaptive::Control;
    use proptest::prelude::*;
    use tollgate_core::ManualClock;

    fn limiter(limit: u64, shares: [u8; 4]) -> Arc<Limiter> {
        let pinned = Control::gradient2()
            .min_limit(limit)
            .initial_limit(limit)
            .max_limit(limit);
        Arc::new(Limiter::new(Settings {
            name: "test".into(),
            switch: EnforcementSwitch::default(),
            retry_after: Duration::from_secs(1),
            control: pinned,
            shares,
            clock: Arc::new(ManualClock::default()),
        }))
    }

    #[test]
    fn shares_round_up_and_a_share_of_zero_only_borrows() {
        assert_eq!(guaranteed(10, 50), 5);
        assert_eq!(guaranteed(10, 15), 2, "1.5 rounds up");
        assert_eq!(guaranteed(3, 10), 1, "at least one for a share above zero");
        assert_eq!(guaranteed(10, 0), 0);
        assert_eq!(guaranteed(u64::MAX, 100), u64::MAX, "no overflow");
    }

    proptest! {
        /// Under any arrival order and finishes: a request is turned away only when the limit is full and its
        /// class holds its whole guaranteed share; nobody exceeds the limit except within a guaranteed share.
        #[test]
        fn rejected_only_when_full_and_over_its_share(
            limit in 1_u64..30,
            shares in prop::array::uniform4(0_u8..=25),
            ops in prop::collection::vec((any::<bool>(), 0_usize..4, any::<usize>()), 1..300),
        ) {
            let l = limiter(limit, shares);
            let mut held: Vec<AdaptivePermit> = Vec::new();
            for (arrive, class, n) in ops {
                let priority = Priority::ALL[class];
                if arrive {
                    let (full, busy) = (l.in_flight() >= limit, l.busy(priority));
                    let line = guaranteed(limit, shares[class]);
                    match l.try_acquire(priority) {
                        Some(p) => {
                            prop_assert!(!full || busy < line, "admitted {priority} over its share");
                            held.push(p);
                        }
                        None => prop_assert!(full && busy >= line, "{priority} rejected with room"),
                    }
                } else if !held.is_empty() {
                    // Finished, or cancelled: either way the slot comes back.
                    let mut p = held.swap_remove(n % held.len());
                    if n % 2 == 0 {
                        p.outcome = Outcome::Responded;
                    }
                }
                prop_assert_eq!(l.in_flight(), held.len() as u64);
                let beyond: u64 = Priority::ALL
                    .iter()
                    .map(|&p| guaranteed(limit, shares[p.index()]))
                    .sum();
                prop_assert!(l.in_flight() <= limit + beyond);
                for p in Priority::ALL {
                    let n = held.iter().filter(|h| h.priority == p).count() as u64;
                    prop_assert_eq!(l.busy(p), n);
                }
            }
        }
    }
}
