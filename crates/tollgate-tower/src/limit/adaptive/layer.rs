use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::limit::core::enforcement_methods;
use crate::{EnforcementSwitch, Name, Priority};
use tollgate_core::{Clock, SystemClock};
use tower_layer::Layer;

use super::control::Control;
use super::limiter::{DEFAULT_SHARES, Limiter, Settings};
use crate::ConfigError;
use crate::limit::InFlightLimit;
use crate::limit::concurrency::DEFAULT_RETRY_AFTER;

/// The adaptive limiter's default name (in metrics, logs and rejections).
pub const DEFAULT_ADAPTIVE_NAME: &str = "adaptive";

/// Admits requests within a concurrency limit that follows the service's latency: see the [module docs](super).
///
/// Cheap to clone. Its state is built with it, up front, and again by each method that changes a setting; every
/// service it (or a clone) builds (e.g. axum's copy per route) shares that state: one limit and one in-flight
/// count.
#[must_use]
pub struct AdaptiveLimitLayer<P> {
    pub(super) classifier: Arc<P>,
    pub(super) limiter: Arc<Limiter>,
}

impl<P> AdaptiveLimitLayer<P> {
    /// A limit moved by `control` ([`Control::gradient2`] or [`Control::aimd`]), classifying
    /// requests with `classifier` for the guaranteed shares ([`DEFAULT_SHARES`](super::DEFAULT_SHARES): `Critical`
    /// 50 %, `High` 20 %, `Normal` 20 %, `Low` 10 % of the limit). Named [`DEFAULT_ADAPTIVE_NAME`], enforced,
    /// timed by the system clock; rejections announce a retry after 1 s.
    ///
    /// # Errors
    /// If the control's settings are impossible (e.g. a minimum limit above the maximum).
    pub fn new(control: Control, classifier: P) -> Result<Self, ConfigError> {
        control.validate()?;
        let name: Name = DEFAULT_ADAPTIVE_NAME.into();
        let switch = EnforcementSwitch::default();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let settings = Settings {
            name,
            switch,
            retry_after: DEFAULT_RETRY_AFTER,
            control,
            shares: DEFAULT_SHARES,
            clock,
        };
        Ok(Self {
            limiter: Arc::new(Limiter::new(settings)),
            classifier: Arc::new(classifier),
        })
    }

    /// This layer with its settings changed by `change`, and a limit of its own built from them.
    fn configure(self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.limiter.settings.clone();
        change(&mut settings);
        Self {
            limiter: Arc::new(Limiter::new(settings)),
            classifier: self.classifier,
        }
    }

    /// The share of the limit (percent) each class is guaranteed: while the limit is full, a request is still
    /// admitted if fewer requests of its class are in flight than its share (rounded up). Below the limit every
    /// class may use what the others leave (borrowing), so the shares only decide who gets in once it is full.
    ///
    /// # Errors
    /// If the shares add up to more than 100 %.
    pub fn shares(self, low: u8, normal: u8, high: u8, critical: u8) -> Result<Self, ConfigError> {
        let total = u16::from(low) + u16::from(normal) + u16::from(high) + u16::from(critical);
        if total > 100 {
            return Err(ConfigError::new(format!(
                "adaptive limit: guaranteed shares low {low} %, normal {normal} %, high {high} %, critical \
                 {critical} % add up to {total} % (at most 100)"
            )));
        }
        Ok(self.configure(|s| s.shares = [critical, high, normal, low]))
    }

    /// Times requests with `clock` (a [`ManualClock`](tollgate_core::ManualClock) in tests).
    pub fn clock(self, clock: impl Clock) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        self.configure(|s| s.clock = clock)
    }

    /// The retry delay a rejected request announces.
    pub fn retry_after(self, retry_after: Duration) -> Self {
        self.configure(|s| s.retry_after = retry_after)
    }

    /// Renames the limiter (metrics, logs, rejections).
    pub fn name(self, name: impl Into<Name>) -> Self {
        let name = name.into();
        self.configure(|s| s.name = name)
    }

    enforcement_methods!(limiter.settings.switch, |this: Self, switch| this
        .configure(|s| s.switch = switch));

    /// The control and its settings.
    #[must_use]
    pub fn control(&self) -> &Control {
        &self.limiter.settings.control
    }

    /// The current limit, in requests in flight.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.limiter.limit()
    }

    /// Requests in flight through this layer now.
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.limiter.in_flight()
    }

    /// Requests of `priority` in flight now.
    #[must_use]
    pub fn in_flight_of(&self, priority: Priority) -> u64 {
        self.limiter.busy(priority)
    }

    /// The share of the current limit `priority` is guaranteed, in requests.
    #[must_use]
    pub fn guaranteed(&self, priority: Priority) -> u64 {
        self.limiter.guaranteed(priority)
    }

    /// Gradient2's long-term latency, the baseline it compares requests against (zero for AIMD).
    #[must_use]
    pub fn long_latency(&self) -> Duration {
        self.limiter.long_latency()
    }
}

impl<P> Clone for AdaptiveLimitLayer<P> {
    fn clone(&self) -> Self {
        Self {
            classifier: self.classifier.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

impl<P> fmt::Debug for AdaptiveLimitLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimitLayer")
            .field("name", &self.limiter.settings.name)
            .field("control", &self.limiter.settings.control)
            .field("shares", &self.limiter.settings.shares)
            .field("mode", &self.limiter.settings.switch.mode())
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl<S, P> Layer<S> for AdaptiveLimitLayer<P> {
    type Service = InFlightLimit<S, Self>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit::new(inner, self.clone())
    }
}
