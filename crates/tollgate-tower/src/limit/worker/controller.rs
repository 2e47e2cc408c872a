//! The shedding controller: per-class shed levels that move in steps, at most once per interval, with
//! hysteresis, so shedding ramps up and down gradually instead of flapping.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::Priority;

/// Default utilization (percent of capacity) at which each class starts being shed, indexed like
/// [`Priority::ALL`]: `Critical` 100 %, `High` 90 %, `Normal` 75 %, `Low` 60 %.
pub const DEFAULT_THRESHOLDS: [u8; 4] = [100, 90, 75, 60];
/// Default change of a class's shed level per evaluation, in percentage points.
pub const DEFAULT_STEP_PERCENT: u8 = 25;
/// Default hysteresis: a class's shedding recedes only once utilization is this many points below its threshold.
pub const DEFAULT_HYSTERESIS_PERCENT: u8 = 10;
/// Default minimum time between two evaluations of the controller.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

/// The controller's settings (validated by the layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub(crate) capacity: u64,
    pub(crate) thresholds: [u8; 4],
    pub(crate) step: u8,
    pub(crate) hysteresis: u8,
    pub(crate) interval: Duration,
}

/// The next shed levels (percent of requests shed per class) for utilization `utilization` (percent).
///
/// A class at or above its threshold sheds `step` points more (up to 100); one more than `hysteresis` points
/// below it sheds `step` points less (down to 0); in between its level holds.
pub(crate) fn next_levels(levels: [u8; 4], utilization: u64, tuning: &Tuning) -> [u8; 4] {
    let mut next = levels;
    for (level, threshold) in next.iter_mut().zip(tuning.thresholds) {
        let threshold = u64::from(threshold);
        if utilization >= threshold {
            *level = level.saturating_add(tuning.step).min(100);
        } else if utilization + u64::from(tuning.hysteresis) < threshold {
            *level = level.saturating_sub(tuning.step);
        }
    }
    next
}

/// Whether the `n`-th request (from 0) of a class shed at `level` percent is shed: exactly `level` of every 100
/// consecutive requests, spread evenly, with no randomness (reproducible in tests).
pub(crate) fn sheds(n: u64, level: u8) -> bool {
    let level = u64::from(level);
    (n + 1) * level / 100 > n * level / 100
}

/// The live controller of one worker (instance): in-flight count, its peak, the shed levels.
pub(crate) struct Controller {
    pub(crate) tuning: Tuning,
    start: Instant,
    in_flight: AtomicU64,
    peak: AtomicU64,
    next_eval_ms: AtomicU64,
    levels: [AtomicU8; 4],
    seen: [AtomicU64; 4],
}

impl Controller {
    pub(crate) fn new(tuning: Tuning) -> Self {
        Self {
            tuning,
            start: Instant::now(),
            in_flight: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            next_eval_ms: AtomicU64::new(0),
            levels: Default::default(),
            seen: Default::default(),
        }
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn level(&self, priority: Priority) -> u8 {
        self.levels[priority.index()].load(Ordering::Relaxed)
    }

    /// Re-evaluates the levels if the interval has passed since the last evaluation (one caller wins).
    pub(crate) fn tick(&self) {
        let now_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.tick_at(now_ms);
    }

    /// [`tick`](Self::tick) at `now_ms` milliseconds after the controller started (tests drive time).
    pub(crate) fn tick_at(&self, now_ms: u64) -> bool {
        let due = self.next_eval_ms.load(Ordering::Relaxed);
        let interval = u64::try_from(self.tuning.interval.as_millis()).unwrap_or(u64::MAX);
        if now_ms < due
            || self
                .next_eval_ms
                .compare_exchange(
                    due,
                    now_ms.saturating_add(interval),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return false;
        }
        // The busiest moment since the last evaluation: a burst between two ticks still counts.
        let in_flight = self.in_flight();
        let peak = self.peak.swap(in_flight, Ordering::Relaxed);
        let utilization = peak.saturating_mul(100) / self.tuning.capacity;
        let current = std::array::from_fn(|i| self.levels[i].load(Ordering::Relaxed));
        let mut next = next_levels(current, utilization, &self.tuning);
        // Evaluations run on the request path, so none ran in the intervals after `due` in which no request came:
        // they are caught up now, or a quiet spell after a burst would keep its shedding until traffic returned
        // (and a stale peak would raise it further). The first of them saw the peak; in the rest nothing new was
        // admitted (a request would have evaluated), so what is in flight now is what they saw last. Past enough
        // steps to cross the whole range, more change nothing.
        let missed = (now_ms - due).checked_div(interval).unwrap_or(0);
        let now_utilization = in_flight.saturating_mul(100) / self.tuning.capacity;
        let enough = 100 / u64::from(self.tuning.step.max(1)) + 1;
        for _ in 0..missed.min(enough) {
            next = next_levels(next, now_utilization, &self.tuning);
        }
        let utilization = if missed > 0 {
            now_utilization
        } else {
            utilization
        };
        for (i, level) in next.into_iter().enumerate() {
            self.levels[i].store(level, Ordering::Relaxed);
        }
        if next != current {
            tracing::info!(
                utilization_percent = utilization,
                critical = next[0],
                high = next[1],
                normal = next[2],
                low = next[3],
                "worker shed levels changed (percent of requests shed per class)"
            );
        }
        metrics::gauge!("tollgate_worker_utilization_percent").set(utilization as f64);
        for (p, level) in Priority::ALL.into_iter().zip(next) {
            metrics::gauge!("tollgate_worker_shed_percent", "priority" => p.as_str())
                .set(f64::from(level));
        }
        true
    }

    /// Whether the next request of `priority` is shed.
    pub(crate) fn should_shed(&self, priority: Priority) -> bool {
        let level = self.level(priority);
        if level == 0 {
            return false;
        }
        let n = self.seen[priority.index()].fetch_add(1, Ordering::Relaxed);
        sheds(n, level)
    }

    /// Counts one more request in flight.
    pub(crate) fn enter(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// Counts one request less in flight.
    pub(crate) fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuning() -> Tuning {
        Tuning {
            capacity: 10,
            thresholds: DEFAULT_THRESHOLDS,
            step: DEFAULT_STEP_PERCENT,
            hysteresis: DEFAULT_HYSTERESIS_PERCENT,
            interval: Duration::from_millis(100),
        }
    }

    #[test]
    fn shed_fractions_are_exact_and_even() {
        for level in [0_u8, 1, 25, 50, 99, 100] {
            let shed = (0..100).filter(|&n| sheds(n, level)).count();
            assert_eq!(shed, usize::from(level));
        }
        let half: Vec<bool> = (0..4).map(|n| sheds(n, 50)).collect();
        assert_eq!(half, [false, true, false, true]);
    }

    #[test]
    fn lowest_class_first_and_gradual_ramp_with_hysteresis() {
        let t = tuning();
        let mut levels = [0; 4];
        // 70 %: only Low is over its threshold, and it ramps 25 points per evaluation.
        for expected in [25, 50, 75, 100, 100] {
            levels = next_levels(levels, 70, &t);
            assert_eq!(levels, [0, 0, 0, expected]);
        }
        // 80 %: Normal joins, High and Critical pass.
        levels = next_levels(levels, 80, &t);
        assert_eq!(levels, [0, 0, 25, 100]);
        // 95 %: High joins.
        levels = next_levels(levels, 95, &t);
        assert_eq!(levels, [0, 25, 50, 100]);
        // 55 %: within Low's hysteresis band (60 − 10 < 55): Low holds; the others recede one step.
        levels = next_levels(levels, 55, &t);
        assert_eq!(levels, [0, 0, 25, 100]);
        // 40 %: everything recedes step by step, not at once.
        levels = next_levels(levels, 40, &t);
        assert_eq!(levels, [0, 0, 0, 75]);
        for expected in [50, 25, 0, 0] {
            levels = next_levels(levels, 40, &t);
            assert_eq!(levels, [0, 0, 0, expected]);
        }
    }

    #[test]
    fn evaluates_at_most_once_per_interval_on_the_peak() {
        let c = Controller::new(tuning());
        for _ in 0..9 {
            c.enter();
        }
        for _ in 0..9 {
            c.leave();
        }
        // The burst of 9 (90 %) is over, but the peak since the last evaluation counts.
        assert!(c.tick_at(0));
        assert_eq!(c.level(Priority::Low), 25);
        assert_eq!(c.level(Priority::High), 25);
        assert!(!c.tick_at(50), "within the interval nothing changes");
        assert_eq!(c.level(Priority::Low), 25);
        assert!(c.tick_at(100));
        // Now idle: High (90 − 10 > 0) and Low recede.
        assert_eq!(c.level(Priority::Low), 0);
        assert_eq!(c.level(Priority::High), 0);
        assert!(!c.should_shed(Priority::Low));
    }

    #[test]
    fn intervals_without_requests_are_caught_up() {
        let levels = |c: &Controller| Priority::ALL.map(|p| c.level(p));
        // A burst of 12 (120 %) that is over by the next request, two seconds later: that evaluation sees its peak,
        // then the 19 idle intervals after it, in which shedding recedes to nothing.
        let c = Controller::new(tuning());
        for _ in 0..12 {
            c.enter();
        }
        assert!(c.tick_at(0));
        assert_eq!(levels(&c), [25; 4]);
        for _ in 0..12 {
            c.leave();
        }
        assert!(c.tick_at(2_000));
        assert_eq!(levels(&c), [0; 4]);
        assert!(!c.should_shed(Priority::Critical));

        // The same burst still in flight two seconds later: a controller on a timer would have kept raising the
        // levels all along, and this one ends where it would have.
        let c = Controller::new(tuning());
        for _ in 0..12 {
            c.enter();
        }
        assert!(c.tick_at(0));
        assert!(c.tick_at(2_000));
        assert_eq!(levels(&c), [100; 4]);

        // Requests that keep coming evaluate on time (or less than an interval late): nothing to catch up.
        let c = Controller::new(tuning());
        for _ in 0..8 {
            c.enter();
        }
        assert!(c.tick_at(0));
        assert_eq!(levels(&c), [0, 0, 25, 25]);
        assert!(c.tick_at(150));
        assert_eq!(levels(&c), [0, 0, 50, 50]);
        assert!(c.tick_at(250));
        assert_eq!(levels(&c), [0, 0, 75, 75]);
    }
}
