//! The worker shedder's two decisions: the **gate** (at arrival, a class is admitted only while in-flight is below
//! its line, its threshold share of capacity) and the **controller** (per-class shed levels that move in steps,
//! at most once per interval, with hysteresis, so shedding below those lines ramps up and down gradually instead
//! of flapping).

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

/// Which of the worker shedder's two decisions turned a request away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShedBy {
    /// In-flight had reached the class's line (its threshold share of capacity) when it arrived.
    Gate,
    /// The controller's shed level for the class (shedding below the line while utilization stays high).
    Controller,
}

impl ShedBy {
    /// The `reason` label of `tollgate_shed_total`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Gate => "gate",
            Self::Controller => "controller",
        }
    }
}

/// The line of each class (indexed like [`Priority::ALL`]): requests of the class are admitted while fewer than
/// this many are in flight, `capacity × threshold / 100` rounded down, so that a lower class never takes any of
/// the share reserved for the classes above it.
pub(crate) fn lines(tuning: &Tuning) -> [u64; 4] {
    tuning.thresholds.map(|t| {
        let line = u128::from(tuning.capacity) * u128::from(t) / 100;
        u64::try_from(line).unwrap_or(u64::MAX)
    })
}

/// The live controller of one worker (instance): in-flight count, its peak, the shed levels.
pub(crate) struct Controller {
    pub(crate) tuning: Tuning,
    lines: [u64; 4],
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
            lines: lines(&tuning),
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
        // Critical is the class the capacity is kept for: the controller never sheds it (its only line is the gate),
        // or at 100 % it would turn critical traffic away while the lower classes that filled the instance run on.
        next[Priority::Critical.index()] = 0;
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
        next[Priority::Critical.index()] = 0;
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

    /// The line of `priority`: its requests are admitted while fewer than this many are in flight.
    pub(crate) fn line(&self, priority: Priority) -> u64 {
        self.lines[priority.index()]
    }

    /// Decides one request of `priority` at arrival and, when admitted, counts it in flight: first the gate (is
    /// in-flight below the class's line?), then the controller's shed level. The gate's check and the count are
    /// one atomic step, so concurrent arrivals can never push a class past its line.
    pub(crate) fn admit(&self, priority: Priority) -> Result<(), ShedBy> {
        let line = self.line(priority);
        if self.in_flight() >= line {
            return Err(ShedBy::Gate);
        }
        if self.should_shed(priority) {
            return Err(ShedBy::Controller);
        }
        let now = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < line).then_some(n + 1)
            })
            .map_err(|_| ShedBy::Gate)?
            + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the next request of `priority` is shed by the controller.
    pub(crate) fn should_shed(&self, priority: Priority) -> bool {
        let level = self.level(priority);
        if level == 0 {
            return false;
        }
        let n = self.seen[priority.index()].fetch_add(1, Ordering::Relaxed);
        sheds(n, level)
    }

    /// Counts one more request in flight, whatever the lines (shadow mode admits what it would shed).
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
        // Critical is never shed by the controller (its line is the gate's): the others ramp.
        assert_eq!(levels(&c), [0, 25, 25, 25]);
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
        assert_eq!(levels(&c), [0, 100, 100, 100]);

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

    #[test]
    fn lines_round_down_so_lower_classes_never_take_reserved_capacity() {
        let t = tuning();
        // Capacity 10: Critical 10, High 9, Normal 7 (7.5 rounded down), Low 6.
        assert_eq!(lines(&t), [10, 9, 7, 6]);
        let one = Tuning { capacity: 1, ..t };
        assert_eq!(lines(&one), [1, 0, 0, 0], "one slot: only Critical gets it");
        let huge = Tuning {
            capacity: u64::MAX,
            ..t
        };
        assert_eq!(lines(&huge)[0], u64::MAX, "no overflow");
    }

    #[test]
    fn the_gate_caps_a_burst_of_low_and_critical_still_gets_in() {
        // A defect once found, in the model: 20 Low at once, then 4 Critical, capacity 10.
        let c = Controller::new(tuning());
        assert!(c.tick_at(0));
        let low: Vec<_> = (0..20).map(|_| c.admit(Priority::Low)).collect();
        assert_eq!(low.iter().filter(|r| r.is_ok()).count(), 6);
        assert!(low[6..].iter().all(|r| *r == Err(ShedBy::Gate)));
        for _ in 0..4 {
            assert_eq!(c.admit(Priority::Critical), Ok(()));
        }
        assert_eq!(c.admit(Priority::Critical), Err(ShedBy::Gate), "full");
        // At 100 % for a long time: the controller ramps the lower classes, never Critical.
        for t in 1..=20 {
            c.tick_at(t * 100);
        }
        assert_eq!(c.level(Priority::Critical), 0);
        assert_eq!(c.level(Priority::Low), 100);
        c.leave();
        assert_eq!(
            c.admit(Priority::Critical),
            Ok(()),
            "a slot freed: Critical takes it"
        );
        c.leave();
        c.leave();
        assert_eq!(
            c.admit(Priority::High),
            Err(ShedBy::Controller),
            "below High's line, but the controller sheds it"
        );
    }

    mod model {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Arrive(Priority),
            /// The `n`-th (modulo) request in flight finishes.
            Finish(usize),
            /// Milliseconds pass (the controller evaluates at the next arrival).
            Advance(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => prop::sample::select(Priority::ALL.to_vec()).prop_map(Op::Arrive),
                3 => any::<usize>().prop_map(Op::Finish),
                1 => (1_u64..300).prop_map(Op::Advance),
            ]
        }

        proptest! {
            /// Under any arrival order, with any finishes and any passage of time (a manual clock): the requests
            /// of a class and the classes below it never exceed that class's line, and a Critical request is
            /// admitted whenever capacity remains.
            #[test]
            fn lower_classes_never_exceed_their_share(
                capacity in 1_u64..40,
                step in 1_u8..=100,
                ops in prop::collection::vec(op(), 1..400),
            ) {
                let t = Tuning { capacity, step, ..tuning() };
                let c = Controller::new(t);
                let lines = lines(&t);
                let mut now = 0;
                let mut held: Vec<Priority> = Vec::new();
                for op in ops {
                    match op {
                        Op::Arrive(p) => {
                            c.tick_at(now);
                            let room = (held.len() as u64) < capacity;
                            match c.admit(p) {
                                Ok(()) => held.push(p),
                                Err(by) => prop_assert!(
                                    p != Priority::Critical || !room,
                                    "Critical shed by the {} with {} of {capacity} in flight",
                                    by.as_str(), held.len()
                                ),
                            }
                        }
                        Op::Finish(n) if !held.is_empty() => {
                            held.swap_remove(n % held.len());
                            c.leave();
                        }
                        Op::Finish(_) => {}
                        Op::Advance(ms) => now += ms,
                    }
                    prop_assert_eq!(c.in_flight(), held.len() as u64);
                    for class in Priority::ALL {
                        let at_or_below = held.iter().filter(|p| !p.outranks(class)).count() as u64;
                        prop_assert!(
                            at_or_below <= lines[class.index()],
                            "{} {class} and below in flight, line {}", at_or_below, lines[class.index()]
                        );
                    }
                }
            }
        }
    }
}
