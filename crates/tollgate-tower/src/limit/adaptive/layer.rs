use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::limit::core::{Built, enforcement_methods};
use crate::{EnforcementSwitch, Name, Priority};
use tollgate_core::{Clock, SystemClock};
use tower_layer::Layer;

use super::AdaptiveLimit;
use super::control::{Control, LimitState};
use super::limiter::{DEFAULT_SHARES, Limiter};
use crate::ConfigError;
use crate::limit::concurrency::DEFAULT_RETRY_AFTER;

/// The adaptive limiter's default name (in metrics, logs and rejections).
pub const DEFAULT_ADAPTIVE_NAME: &str = "adaptive";

/// Admits requests within a concurrency limit that follows the service's latency: see the [module docs](super).
///
/// Every service the layer builds (e.g. axum's copy per route) shares one limit and one in-flight count:
/// configure the layer before applying it.
#[must_use]
pub struct AdaptiveLimitLayer<P> {
    name: Name,
    switch: EnforcementSwitch,
    retry_after: Duration,
    control: Control,
    shares: [u8; 4],
    clock: Arc<dyn Clock>,
    classifier: Arc<P>,
    built: Built<Limiter>,
}

impl<P> AdaptiveLimitLayer<P> {
    /// A limit moved by `control` ([`Gradient2`](super::Gradient2) or [`Aimd`](super::Aimd)), classifying
    /// requests with `classifier` for the guaranteed shares ([`DEFAULT_SHARES`](super::DEFAULT_SHARES): `Critical`
    /// 50 %, `High` 20 %, `Normal` 20 %, `Low` 10 % of the limit). Named [`DEFAULT_ADAPTIVE_NAME`], enforced,
    /// timed by the system clock; rejections announce a retry after 1 s.
    ///
    /// # Errors
    /// If the control's settings are impossible (e.g. a minimum limit above the maximum).
    pub fn new(control: impl Into<Control>, classifier: P) -> Result<Self, ConfigError> {
        let control = control.into();
        control.validate()?;
        let name: Name = DEFAULT_ADAPTIVE_NAME.into();
        let switch = EnforcementSwitch::default();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        Ok(Self {
            name,
            switch,
            retry_after: DEFAULT_RETRY_AFTER,
            control,
            shares: DEFAULT_SHARES,
            clock,
            classifier: Arc::new(classifier),
            built: Built::default(),
        })
    }

    /// The limit every service built from now on shares (built by the first call, so metrics register once).
    fn limiter(&self) -> Arc<Limiter> {
        self.built.get_or_init(|| {
            Limiter::new(
                self.name.clone(),
                self.switch.clone(),
                self.retry_after,
                self.clock.clone(),
                LimitState::new(self.control),
                self.shares,
            )
        })
    }

    /// After a setting changed: the services built from now on share a new limit.
    fn rebuilt(mut self) -> Self {
        self.built = Built::default();
        self
    }

    /// The share of the limit (percent) each class is guaranteed: while the limit is full, a request is still
    /// admitted if fewer requests of its class are in flight than its share (rounded up). Below the limit every
    /// class may use what the others leave (borrowing), so the shares only decide who gets in once it is full.
    ///
    /// # Errors
    /// If the shares add up to more than 100 %.
    pub fn shares(
        mut self,
        low: u8,
        normal: u8,
        high: u8,
        critical: u8,
    ) -> Result<Self, ConfigError> {
        let total = u16::from(low) + u16::from(normal) + u16::from(high) + u16::from(critical);
        if total > 100 {
            return Err(ConfigError::new(format!(
                "adaptive limit: guaranteed shares low {low} %, normal {normal} %, high {high} %, critical \
                 {critical} % add up to {total} % (at most 100)"
            )));
        }
        self.shares = [critical, high, normal, low];
        Ok(self.rebuilt())
    }

    /// Times requests with `clock` (a [`ManualClock`](tollgate_core::ManualClock) in tests).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self.rebuilt()
    }

    /// The retry delay a rejected request announces.
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self.rebuilt()
    }

    /// Renames the limiter (metrics, logs, rejections).
    pub fn name(mut self, name: impl Into<Name>) -> Self {
        self.name = name.into();
        self.rebuilt()
    }

    enforcement_methods!();

    /// The control and its settings.
    #[must_use]
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// The current limit, in requests in flight.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.limiter().limit()
    }

    /// Requests in flight through this layer now.
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.limiter().in_flight()
    }

    /// Requests of `priority` in flight now.
    #[must_use]
    pub fn in_flight_of(&self, priority: Priority) -> u64 {
        self.limiter().busy(priority)
    }

    /// The share of the current limit `priority` is guaranteed, in requests.
    #[must_use]
    pub fn guaranteed(&self, priority: Priority) -> u64 {
        self.limiter().guaranteed(priority)
    }

    /// Gradient2's long-term latency, the baseline it compares requests against (zero for AIMD).
    #[must_use]
    pub fn long_latency(&self) -> Duration {
        self.limiter().long_latency()
    }
}

impl<P> Clone for AdaptiveLimitLayer<P> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            switch: self.switch.clone(),
            retry_after: self.retry_after,
            control: self.control,
            shares: self.shares,
            clock: self.clock.clone(),
            classifier: self.classifier.clone(),
            built: self.built.clone(),
        }
    }
}

impl<P> fmt::Debug for AdaptiveLimitLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimitLayer")
            .field("name", &self.name)
            .field("control", &self.control)
            .field("shares", &self.shares)
            .field("mode", &self.switch.mode())
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl<S, P> Layer<S> for AdaptiveLimitLayer<P> {
    type Service = AdaptiveLimit<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveLimit::new(inner, self.limiter(), self.classifier.clone())
    }
}
