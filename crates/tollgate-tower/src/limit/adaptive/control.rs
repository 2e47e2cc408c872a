//! The controls that move the limit: Gradient2 and AIMD, after Netflix's concurrency-limits (`Gradient2Limit`,
//! `AIMDLimit`), each a pure function of its state and one latency sample, so tests drive them with a manual
//! clock and a synthetic latency curve.
//!
//! The limit is a float internally (the controls move it by fractions per sample) and whole requests outside.

use std::time::Duration;

use crate::ConfigError;

/// The control that moves the limit, with its settings: [`gradient2`](Self::gradient2) or [`aimd`](Self::aimd),
/// each with its defaults, changed by the setters below (checked when the layer is built,
/// [`AdaptiveLimitLayer::new`](super::AdaptiveLimitLayer::new)).
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::limit::adaptive::Control;
///
/// let gradient2 = Control::gradient2().initial_limit(2).min_limit(1).tolerance(2.0);
/// let aimd = Control::aimd().timeout(Duration::from_millis(200));
/// assert_eq!((gradient2.as_str(), aimd.as_str()), ("gradient2", "aimd"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Control {
    /// The limit before any sample.
    initial_limit: u64,
    /// The limit never falls below this.
    min_limit: u64,
    /// The limit never rises above this.
    max_limit: u64,
    kind: Kind,
    /// A setting of the other control, given to this one: refused by [`validate`](Self::validate).
    misplaced: Option<&'static str>,
}

/// Which control, with the settings only it has.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Gradient2(Gradient2),
    Aimd(Aimd),
}

/// Gradient2's own settings (see [`Control::gradient2`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Gradient2 {
    smoothing: f64,
    queue_size: u64,
    tolerance: f64,
    long_window: u32,
    window: Duration,
    window_samples: u32,
}

/// AIMD's own settings (see [`Control::aimd`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Aimd {
    backoff_ratio: f64,
    timeout: Duration,
}

impl Control {
    /// Gradient2: the limit grows while the current latency stays within `tolerance` × the long-term latency, and
    /// shrinks in proportion when it rises above it (by at most half per update).
    ///
    /// Per sample: `long` is an exponential average of the latency over about `long_window` samples (a plain
    /// average over the first 10); `gradient = clamp(tolerance × long / latency, 0.5, 1)`; the new limit is
    /// `limit × gradient + queue_size`, smoothed (`limit × (1 − smoothing) + new × smoothing`) and kept within
    /// `[min_limit, max_limit]`. When fewer than half the limit are in flight the limit holds (no growth without
    /// demand). When `long` exceeds twice the current latency it decays by 5 % per sample, so the baseline comes
    /// back after a long overload instead of waiting for the average.
    ///
    /// A "sample" here is a **window** of requests (as Netflix's `WindowedLimit` around `Gradient2Limit`): at
    /// least `window` long and `window_samples` requests, its latency their average, its in-flight their largest.
    /// Updating on every request instead lets the long-term average follow the latency that queueing itself adds
    /// within a few hundred requests, and the limit then climbs to its maximum under steady overload; averaged
    /// over `long_window` windows (a minute by default), the baseline stays the service's own latency.
    ///
    /// One departure from Netflix's formula: a window in which the limit was full and requests were slower than
    /// the baseline raises the baseline ten times slower (as if `long_window` were ten times longer). Such a
    /// window measures mostly the queue the limit itself lets form; learnt at full speed, it drifts the baseline
    /// (and the limit with it) up through a long overload. A service that really became slower is still learnt,
    /// in minutes, and at once whenever the limit is not full.
    ///
    /// Defaults: limits 20 (initial), 20 (min: Netflix's, so that a slow spell cannot starve the service) and
    /// 200 (max); [`smoothing`](Self::smoothing) 0.2, [`queue_size`](Self::queue_size) 4,
    /// [`tolerance`](Self::tolerance) 1.5, [`long_window`](Self::long_window) 600 (a minute of 100 ms windows),
    /// [`window`](Self::window) 100 ms, [`window_samples`](Self::window_samples) 10.
    #[must_use]
    pub const fn gradient2() -> Self {
        Self::with(Kind::Gradient2(Gradient2 {
            smoothing: 0.2,
            queue_size: 4,
            tolerance: 1.5,
            long_window: 600,
            window: Duration::from_millis(100),
            window_samples: 10,
        }))
    }

    /// AIMD: additive increase while at least half of the limit is in use, multiplicative decrease (by
    /// `backoff_ratio`) on a request slower than `timeout` or failed; kept within `[min_limit, max_limit]`.
    ///
    /// Two departures from Netflix's `AIMDLimit`, both TCP's congestion avoidance: the limit grows by `1 / limit`
    /// per request — one per round trip of a full limit — rather than one per request (which overshoots by a
    /// whole round trip's worth of requests before the first slow one is back), and it backs off at most once per
    /// round trip: a slow request admitted before the last decrease is the same queue that decrease answered, not
    /// a new signal (otherwise one queue cuts the limit once per queued request, down to the minimum).
    ///
    /// Defaults: limits 20 (initial), 20 (min) and 200 (max); [`backoff_ratio`](Self::backoff_ratio) 0.9,
    /// [`timeout`](Self::timeout) 5 s.
    #[must_use]
    pub const fn aimd() -> Self {
        Self::with(Kind::Aimd(Aimd {
            backoff_ratio: 0.9,
            timeout: Duration::from_secs(5),
        }))
    }

    const fn with(kind: Kind) -> Self {
        Self {
            initial_limit: 20,
            min_limit: 20,
            max_limit: 200,
            kind,
            misplaced: None,
        }
    }

    /// `gradient2` or `aimd`.
    #[must_use]
    pub const fn as_str(&self) -> &'static str {
        match self.kind {
            Kind::Gradient2(_) => "gradient2",
            Kind::Aimd(_) => "aimd",
        }
    }

    /// The limit before any sample.
    #[must_use]
    pub const fn initial_limit(mut self, limit: u64) -> Self {
        self.initial_limit = limit;
        self
    }

    /// The limit never falls below this.
    #[must_use]
    pub const fn min_limit(mut self, limit: u64) -> Self {
        self.min_limit = limit;
        self
    }

    /// The limit never rises above this.
    #[must_use]
    pub const fn max_limit(mut self, limit: u64) -> Self {
        self.max_limit = limit;
        self
    }

    /// Gradient2: the share of each update that is taken, above 0 and at most 1.
    #[must_use]
    pub const fn smoothing(mut self, smoothing: f64) -> Self {
        match &mut self.kind {
            Kind::Gradient2(g) => g.smoothing = smoothing,
            Kind::Aimd(_) => self.misplaced = Some("smoothing"),
        }
        self
    }

    /// Gradient2: requests allowed to queue beyond the ideal limit, the growth per update.
    #[must_use]
    pub const fn queue_size(mut self, requests: u64) -> Self {
        match &mut self.kind {
            Kind::Gradient2(g) => g.queue_size = requests,
            Kind::Aimd(_) => self.misplaced = Some("queue_size"),
        }
        self
    }

    /// Gradient2: how much slower than the long-term latency requests may be before the limit shrinks (at
    /// least 1).
    #[must_use]
    pub const fn tolerance(mut self, tolerance: f64) -> Self {
        match &mut self.kind {
            Kind::Gradient2(g) => g.tolerance = tolerance,
            Kind::Aimd(_) => self.misplaced = Some("tolerance"),
        }
        self
    }

    /// Gradient2: windows the long-term latency averages over (at least 2).
    #[must_use]
    pub const fn long_window(mut self, windows: u32) -> Self {
        match &mut self.kind {
            Kind::Gradient2(g) => g.long_window = windows,
            Kind::Aimd(_) => self.misplaced = Some("long_window"),
        }
        self
    }

    /// Gradient2: the shortest window of requests taken as one sample.
    #[must_use]
    pub const fn window(mut self, window: Duration) -> Self {
        match &mut self.kind {
            Kind::Gradient2(g) => g.window = window,
            Kind::Aimd(_) => self.misplaced = Some("window"),
        }
        self
    }

    /// Gradient2: the fewest requests a window holds (at least 1).
    #[must_use]
    pub const fn window_samples(mut self, requests: u32) -> Self {
        match &mut self.kind {
            Kind::Gradient2(g) => g.window_samples = requests,
            Kind::Aimd(_) => self.misplaced = Some("window_samples"),
        }
        self
    }

    /// AIMD: the factor applied on a slow or failed request, from 0.5 up to (not including) 1.
    #[must_use]
    pub const fn backoff_ratio(mut self, ratio: f64) -> Self {
        match &mut self.kind {
            Kind::Aimd(a) => a.backoff_ratio = ratio,
            Kind::Gradient2(_) => self.misplaced = Some("backoff_ratio"),
        }
        self
    }

    /// AIMD: a request slower than this counts as an overload signal (above zero).
    #[must_use]
    pub const fn timeout(mut self, timeout: Duration) -> Self {
        match &mut self.kind {
            Kind::Aimd(a) => a.timeout = timeout,
            Kind::Gradient2(_) => self.misplaced = Some("timeout"),
        }
        self
    }
}

impl Control {
    fn bounds(&self) -> (u64, u64, u64) {
        (self.min_limit, self.initial_limit, self.max_limit)
    }

    /// Checks the settings.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(setting) = self.misplaced {
            let other = match self.kind {
                Kind::Gradient2(_) => "aimd",
                Kind::Aimd(_) => "gradient2",
            };
            return Err(ConfigError::new(format!(
                "{}: `{setting}` is a setting of {other}, not of this control",
                self.as_str()
            )));
        }
        let (min, initial, max) = self.bounds();
        if min == 0 || min > initial || initial > max {
            return Err(ConfigError::new(format!(
                "adaptive limit ({}): limits min {min}, initial {initial}, max {max} must satisfy \
                 1 ≤ min ≤ initial ≤ max",
                self.as_str()
            )));
        }
        match self.kind {
            Kind::Gradient2(g) => {
                if !(g.smoothing > 0.0 && g.smoothing <= 1.0) {
                    return Err(ConfigError::new(format!(
                        "gradient2: a smoothing of {} is impossible (above 0, at most 1)",
                        g.smoothing
                    )));
                }
                if !(g.tolerance >= 1.0 && g.tolerance.is_finite()) {
                    return Err(ConfigError::new(format!(
                        "gradient2: a latency tolerance of {} is impossible (at least 1)",
                        g.tolerance
                    )));
                }
                if g.long_window < 2 {
                    return Err(ConfigError::new(
                        "gradient2: the long window must span at least 2 windows",
                    ));
                }
                if g.window_samples == 0 {
                    return Err(ConfigError::new(
                        "gradient2: a window must hold at least 1 request",
                    ));
                }
            }
            Kind::Aimd(a) => {
                if !(0.5..1.0).contains(&a.backoff_ratio) {
                    return Err(ConfigError::new(format!(
                        "aimd: a backoff ratio of {} is impossible (0.5 up to, not including, 1)",
                        a.backoff_ratio
                    )));
                }
                if a.timeout.is_zero() {
                    return Err(ConfigError::new(
                        "aimd: the latency timeout must be above zero",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One finished request, as the controls see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// From admission to the end of the response.
    pub(crate) latency: Duration,
    /// Requests in flight when it was admitted (itself included).
    pub(crate) in_flight: u64,
    /// It failed (the inner service returned an error).
    pub(crate) dropped: bool,
}

/// The running state of an control.
#[derive(Debug, Clone)]
pub(crate) struct LimitState {
    control: Control,
    limit: f64,
    /// Gradient2's long-term latency (seconds) and the windows averaged so far (up to the warm-up).
    long: f64,
    seen: u32,
    window: Window,
    /// AIMD: when it last backed off (the requests admitted before then answered to that decrease).
    backed_off: Option<Duration>,
}

/// Gradient2's current window of samples.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    started: Option<Duration>,
    count: u32,
    latency_sum: f64,
    max_in_flight: u64,
    dropped: bool,
}

/// How much slower Gradient2's baseline rises on windows in which the limit was full.
const SATURATED_SLOWDOWN: f64 = 10.0;

/// Windows averaged plainly before the long-term average becomes exponential.
const WARMUP: u32 = 10;

impl LimitState {
    pub(crate) fn new(control: Control) -> Self {
        let (_, initial, _) = control.bounds();
        Self {
            control,
            limit: initial as f64,
            long: 0.0,
            seen: 0,
            window: Window::default(),
            backed_off: None,
        }
    }

    /// The limit in whole requests.
    pub(crate) fn limit(&self) -> u64 {
        self.limit as u64
    }

    /// Gradient2's long-term latency (zero before the first window, and for AIMD).
    pub(crate) fn long_latency(&self) -> Duration {
        Duration::from_secs_f64(self.long)
    }

    /// Takes the sample of a request that finished at `now` (any monotonic origin); returns the limit in whole
    /// requests.
    pub(crate) fn update(&mut self, sample: Sample, now: Duration) -> u64 {
        let (min, _, max) = self.control.bounds();
        let limit = match self.control.kind {
            Kind::Gradient2(g) => match self.windowed(&g, sample, now) {
                Some(window) => self.gradient2(&g, window),
                None => return self.limit(),
            },
            Kind::Aimd(a) => {
                let admitted = now.saturating_sub(sample.latency);
                if sample.dropped || sample.latency > a.timeout {
                    if self.backed_off.is_some_and(|at| admitted <= at) {
                        return self.limit();
                    }
                    self.backed_off = Some(now);
                    self.limit * a.backoff_ratio
                } else if sample.in_flight.saturating_mul(2) as f64 >= self.limit {
                    self.limit + 1.0 / self.limit
                } else {
                    self.limit
                }
            }
        };
        self.limit = limit.clamp(min as f64, max as f64);
        self.limit()
    }

    /// Adds `sample` to the window; the window as one sample once it is complete.
    fn windowed(&mut self, g: &Gradient2, sample: Sample, now: Duration) -> Option<Sample> {
        let w = &mut self.window;
        let started = *w.started.get_or_insert(now);
        w.count += 1;
        w.latency_sum += sample.latency.as_secs_f64();
        w.max_in_flight = w.max_in_flight.max(sample.in_flight);
        w.dropped |= sample.dropped;
        if w.count < g.window_samples || now.saturating_sub(started) < g.window {
            return None;
        }
        let done = std::mem::take(w);
        Some(Sample {
            latency: Duration::from_secs_f64(done.latency_sum / f64::from(done.count)),
            in_flight: done.max_in_flight,
            dropped: done.dropped,
        })
    }

    fn gradient2(&mut self, g: &Gradient2, sample: Sample) -> f64 {
        // A zero latency (a clock that did not move) would divide by zero: a microsecond is the clock's grain.
        let short = sample.latency.as_secs_f64().max(1e-6);
        if self.seen < WARMUP {
            self.seen += 1;
            self.long += (short - self.long) / f64::from(self.seen);
        } else {
            let mut factor = 2.0 / (f64::from(g.long_window) + 1.0);
            if short > self.long && sample.in_flight >= self.limit() {
                // A full window's latency is mostly the queue the limit lets form: learnt at full speed, the
                // baseline would follow it up and the limit with it, to the maximum under a long overload.
                factor /= SATURATED_SLOWDOWN;
            }
            self.long = self.long * (1.0 - factor) + short * factor;
        }
        if self.long / short > 2.0 {
            self.long *= 0.95;
        }
        if (sample.in_flight as f64) < self.limit / 2.0 {
            return self.limit;
        }
        let gradient = (g.tolerance * self.long / short).clamp(0.5, 1.0);
        let target = self.limit * gradient + g.queue_size as f64;
        self.limit * (1.0 - g.smoothing) + target * g.smoothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service of `workers` workers and a service time `service`: latency grows with what is in flight
    /// beyond them (they queue), as the overload example's server does.
    fn curve(workers: u64, service: Duration) -> impl Fn(u64) -> Duration {
        move |in_flight| service.mul_f64((in_flight as f64 / workers as f64).max(1.0))
    }

    /// Saturated demand for `secs` seconds: every request sees the limit in flight, and the requests finish
    /// evenly spread in time (in-flight / latency per second, Little's law). Returns the limit after each second.
    fn run(
        state: &mut LimitState,
        clock: &mut Duration,
        secs: u64,
        latency: &impl Fn(u64) -> Duration,
    ) -> Vec<u64> {
        (0..secs)
            .map(|_| {
                let end = *clock + Duration::from_secs(1);
                while *clock < end {
                    let in_flight = state.limit();
                    let rtt = latency(in_flight);
                    state.update(
                        Sample {
                            latency: rtt,
                            in_flight,
                            dropped: false,
                        },
                        *clock,
                    );
                    *clock += rtt.div_f64(in_flight as f64);
                }
                state.limit()
            })
            .collect()
    }

    const WORKERS: u64 = 32;
    const SERVICE: Duration = Duration::from_millis(20);

    fn gradient2() -> LimitState {
        LimitState::new(
            Control::gradient2()
                .min_limit(1)
                .initial_limit(4)
                .max_limit(1000),
        )
    }

    fn aimd() -> LimitState {
        LimitState::new(
            Control::aimd()
                .min_limit(1)
                .initial_limit(4)
                .max_limit(1000)
                .timeout(SERVICE.mul_f64(1.5)),
        )
    }

    /// Under steady overload each control settles where every worker is busy (above `WORKERS`) and latency is
    /// under twice the service time (below 2 × `WORKERS`), and stays there for a minute: Gradient2's baseline
    /// drifts up with the queue only at a tenth of its speed (10 % of the limit a minute here).
    #[test]
    fn converge_under_a_synthetic_latency_curve() {
        for (name, mut state) in [("gradient2", gradient2()), ("aimd", aimd())] {
            let mut clock = Duration::ZERO;
            let limits = run(&mut state, &mut clock, 60, &curve(WORKERS, SERVICE));
            let settled = &limits[10..];
            assert!(
                settled.iter().all(|&l| l > WORKERS && l < 2 * WORKERS),
                "{name}: {limits:?}"
            );
            let spread = settled.iter().max().unwrap() - settled.iter().min().unwrap();
            assert!(spread <= WORKERS / 4, "{name} wanders: {limits:?}");
        }
    }

    /// When the service becomes three times slower the limit backs off (no more queue than before), and grows
    /// back when it recovers.
    #[test]
    fn back_off_when_latency_rises_and_recover() {
        for (name, mut state) in [("gradient2", gradient2()), ("aimd", aimd())] {
            let mut clock = Duration::ZERO;
            let before = *run(&mut state, &mut clock, 20, &curve(WORKERS, SERVICE))
                .last()
                .unwrap();
            let slow = run(&mut state, &mut clock, 10, &curve(WORKERS, SERVICE * 3));
            assert!(
                slow[5..].iter().all(|&l| l < before / 2),
                "{name}: {before} then {slow:?}"
            );
            let back = run(&mut state, &mut clock, 30, &curve(WORKERS, SERVICE));
            assert!(
                *back.last().unwrap() > WORKERS,
                "{name} did not recover: {back:?}"
            );
        }
    }

    #[test]
    fn no_growth_without_demand() {
        let mut state = LimitState::new(Control::gradient2());
        for i in 0..1_000 {
            // 5 in flight of a limit of 20, at a constant latency: app-limited.
            state.update(
                Sample {
                    latency: SERVICE,
                    in_flight: 5,
                    dropped: false,
                },
                SERVICE * i,
            );
        }
        assert_eq!(state.limit(), 20);
        let mut state = aimd();
        for i in 0..1_000 {
            state.update(
                Sample {
                    latency: SERVICE,
                    in_flight: 1,
                    dropped: false,
                },
                SERVICE * i,
            );
        }
        assert_eq!(
            state.limit(),
            4,
            "AIMD grows only while half the limit is used"
        );
    }

    #[test]
    fn aimd_backs_off_on_drops_within_its_bounds() {
        let mut state = LimitState::new(Control::aimd());
        let drop = Sample {
            latency: SERVICE,
            in_flight: 20,
            dropped: true,
        };
        assert_eq!(
            state.update(drop, Duration::ZERO),
            20,
            "never below the minimum"
        );
        let mut state = LimitState::new(Control::aimd().initial_limit(100));
        assert_eq!(state.update(drop, Duration::ZERO), 90);
        let later = Duration::from_millis(10);
        assert_eq!(
            state.update(drop, later),
            90,
            "admitted before the decrease: the same congestion"
        );
        assert_eq!(state.update(drop, Duration::from_millis(30)), 81);
    }

    #[test]
    fn impossible_settings_are_refused() {
        let bad: [Control; 6] = [
            Control::gradient2().min_limit(0),
            Control::gradient2().initial_limit(500),
            Control::gradient2().smoothing(0.0),
            Control::gradient2().tolerance(f64::NAN),
            Control::aimd().backoff_ratio(1.0),
            Control::aimd().timeout(Duration::ZERO),
        ];
        for control in bad {
            let err = control.validate().unwrap_err();
            assert!(err.to_string().contains(control.as_str()), "{err}");
        }
        assert!(Control::gradient2().validate().is_ok());
        assert!(Control::aimd().validate().is_ok());
        // A setting of the other control is refused, naming both.
        let err = Control::aimd().smoothing(0.5).validate().unwrap_err();
        assert!(
            err.to_string()
                .contains("`smoothing` is a setting of gradient2"),
            "{err}"
        );
        let err = Control::gradient2()
            .timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("`timeout` is a setting of aimd"),
            "{err}"
        );
    }
}
