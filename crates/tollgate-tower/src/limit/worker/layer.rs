use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::controller::{
    Controller, DEFAULT_HYSTERESIS_PERCENT, DEFAULT_INTERVAL, DEFAULT_STEP_PERCENT,
    DEFAULT_THRESHOLDS, ShedBy, Tuning,
};
use crate::limit::InFlightLimit;
use crate::limit::concurrency::DEFAULT_RETRY_AFTER;
use crate::limit::core::{Judge, enforcement_methods};
use crate::observe::{NearLimitShare, Signals};
use crate::{ConfigError, EnforcementSwitch, Name, Priority};
use metrics::Counter;

/// The worker shedder's default name (in metrics, logs and rejections).
pub const DEFAULT_WORKER_NAME: &str = "worker";

/// State shared by every service the layer builds: one instance, one in-flight count.
pub(crate) struct WorkerState {
    /// What the state was built from, for a layer built from this one with a setting changed.
    pub(crate) settings: Settings,
    pub(crate) judge: Judge,
    pub(crate) controller: Controller,
    /// `tollgate_shed_total{limiter, reason}`, indexed by [`ShedBy`]: which decision shed (`gate`, `controller`).
    pub(crate) shed_by: [Counter; 2],
}

/// The counter of shed requests by the decision that shed them: `tollgate_shed_total{limiter, reason}`.
pub const SHED_TOTAL: &str = "tollgate_shed_total";

/// Sheds the lowest priorities first when this instance is busy: see the [module docs](super).
///
/// Cheap to clone. Its state is built with it, up front, and again by each method that changes a setting; every
/// service it (or a clone) builds (e.g. axum's copy per route) shares that state: one in-flight count and one
/// controller.
#[must_use]
pub struct WorkerShedLayer<P> {
    pub(super) classifier: Arc<P>,
    pub(super) state: Arc<WorkerState>,
}

/// What a worker shedder is configured with.
#[derive(Clone)]
pub(crate) struct Settings {
    name: Name,
    switch: EnforcementSwitch,
    /// The retry delay a shed request announces.
    pub(crate) retry_after: Duration,
    tuning: Tuning,
}

impl Settings {
    /// The state every service of a layer with these settings shares.
    fn build(self) -> WorkerState {
        WorkerState {
            judge: Judge::new(
                self.name.clone(),
                self.switch.clone(),
                None,
                "shed",
                // No quota to be near: the shedder's level is its signal (`tollgate_worker_shed_percent`).
                Signals::new(
                    &self.name,
                    "shed",
                    "worker_shed",
                    "in_process",
                    NearLimitShare::OFF,
                ),
            ),
            controller: Controller::new(self.tuning),
            shed_by: [ShedBy::Gate, ShedBy::Controller].map(|by| {
                metrics::counter!(SHED_TOTAL, "limiter" => self.name.to_string(), "reason" => by.as_str())
            }),
            settings: self,
        }
    }
}

impl<P> WorkerShedLayer<P> {
    /// Sheds when this instance has close to `capacity` requests in flight, classifying requests with
    /// `classifier`. Defaults: thresholds `Low` 60 %, `Normal` 75 %, `High` 90 %, `Critical` 100 % of capacity;
    /// shed levels move 25 points per evaluation, at most every 100 ms, and recede only 10 points below the
    /// threshold; shed requests are told to retry after 1 s.
    ///
    /// A class is admitted while in-flight is below its line, `capacity × threshold` rounded down (see
    /// [`line`](Self::line)): with the default thresholds a capacity of 1 admits only `Critical` requests (the
    /// 40 % kept from the lower classes is the whole slot).
    ///
    /// # Errors
    /// If `capacity` is 0.
    pub fn new(capacity: u64, classifier: P) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new(
                "worker shedder: the capacity must be at least 1 request in flight",
            ));
        }
        let tuning = Tuning {
            capacity,
            thresholds: DEFAULT_THRESHOLDS,
            step: DEFAULT_STEP_PERCENT,
            hysteresis: DEFAULT_HYSTERESIS_PERCENT,
            interval: DEFAULT_INTERVAL,
        };
        let settings = Settings {
            name: DEFAULT_WORKER_NAME.into(),
            switch: EnforcementSwitch::default(),
            retry_after: DEFAULT_RETRY_AFTER,
            tuning,
        };
        Ok(Self {
            state: Arc::new(settings.build()),
            classifier: Arc::new(classifier),
        })
    }

    /// This layer with its settings changed by `change`, and a state of its own built from them.
    fn configure(self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.state.settings.clone();
        change(&mut settings);
        Self {
            state: Arc::new(settings.build()),
            classifier: self.classifier,
        }
    }

    /// The utilization (percent of capacity) at which each class starts being shed.
    ///
    /// # Errors
    /// Unless `low ≤ normal ≤ high ≤ critical` (a class is never shed before a lower one), from 1 up to
    /// 255.
    pub fn thresholds(
        self,
        low: u16,
        normal: u16,
        high: u16,
        critical: u16,
    ) -> Result<Self, ConfigError> {
        let ordered = low <= normal && normal <= high && high <= critical;
        if !ordered || low == 0 || critical > 255 {
            return Err(ConfigError::new(format!(
                "worker shedder: thresholds low {low} %, normal {normal} %, high {high} %, critical {critical} % \
                 must satisfy 1 ≤ low ≤ normal ≤ high ≤ critical ≤ 255"
            )));
        }
        let pct = |v: u16| u8::try_from(v).unwrap_or(u8::MAX);
        let thresholds = [pct(critical), pct(high), pct(normal), pct(low)];
        Ok(self.configure(|s| s.tuning.thresholds = thresholds))
    }

    /// How many percentage points a class's shed level moves per evaluation (1 to 100; 100 switches at once).
    ///
    /// # Errors
    /// If `step` is 0 or over 100.
    pub fn step_percent(self, step: u8) -> Result<Self, ConfigError> {
        if step == 0 || step > 100 {
            return Err(ConfigError::new(format!(
                "worker shedder: a step of {step} points is impossible (1 to 100)"
            )));
        }
        Ok(self.configure(|s| s.tuning.step = step))
    }

    /// How far (percentage points) below its threshold utilization must fall before a class's shedding recedes.
    pub fn hysteresis_percent(self, points: u8) -> Self {
        self.configure(|s| s.tuning.hysteresis = points)
    }

    /// The minimum time between two evaluations of the shed levels.
    pub fn interval(self, interval: Duration) -> Self {
        self.configure(|s| s.tuning.interval = interval)
    }

    /// The retry delay a shed request announces.
    pub fn retry_after(self, retry_after: Duration) -> Self {
        self.configure(|s| s.retry_after = retry_after)
    }

    /// Renames the shedder (metrics, logs, rejections).
    pub fn name(self, name: impl Into<Name>) -> Self {
        let name = name.into();
        self.configure(|s| s.name = name)
    }

    enforcement_methods!(state.settings.switch, |this: Self, switch| this
        .configure(|s| s.switch = switch));

    /// Requests in flight through this layer now.
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.state.controller.in_flight()
    }

    /// The line of `priority`: its requests are admitted only while fewer than this many are in flight
    /// (`capacity × threshold / 100`, rounded down).
    #[must_use]
    pub fn line(&self, priority: Priority) -> u64 {
        self.state.controller.line(priority)
    }

    /// The share of `priority` requests the controller currently sheds below the class's line, in percent
    /// (always 0 for `Critical`).
    #[must_use]
    pub fn shed_percent(&self, priority: Priority) -> u8 {
        self.state.controller.level(priority)
    }
}

impl<P> Clone for WorkerShedLayer<P> {
    fn clone(&self) -> Self {
        Self {
            classifier: self.classifier.clone(),
            state: self.state.clone(),
        }
    }
}

impl<P> fmt::Debug for WorkerShedLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerShedLayer")
            .field("name", &self.state.settings.name)
            .field("tuning", &self.state.settings.tuning)
            .field("mode", &self.state.settings.switch.mode())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl<S, P> Layer<S> for WorkerShedLayer<P> {
    type Service = InFlightLimit<S, Self>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit::new(inner, self.clone())
    }
}
