//! Where "now" comes from: a monotonic system clock in production, a manual clock in tests.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Clock, ManualClock, Timestamp};
//!
//! let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
//! clock.advance(Duration::from_millis(250));
//! assert_eq!(clock.now(), Timestamp::from_micros(1_250_000));
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::Timestamp;

/// A source of the current instant.
///
/// Decisions depend on time only through this trait, so tests can drive time by hand and the Redis store can
/// use the server's clock instead.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// Wall-clock time that never goes backwards.
///
/// Anchored to [`SystemTime`] once, then advanced by [`Instant`], so an NTP step cannot hand out tokens twice
/// or freeze a bucket.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    anchor: Timestamp,
    started: Instant,
}

impl SystemClock {
    /// A clock anchored at the current wall-clock time.
    #[must_use]
    pub fn new() -> Self {
        Self {
            anchor: Timestamp::from(SystemTime::now()),
            started: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        self.anchor.saturating_add(self.started.elapsed())
    }
}

/// A clock that moves only when told to; clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    #[must_use]
    pub fn new(start: Timestamp) -> Self {
        Self {
            micros: Arc::new(AtomicU64::new(start.as_micros())),
        }
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let micros = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.micros.fetch_add(micros, Ordering::SeqCst);
    }

    /// Sets the time to `to` (which may be earlier, to test clocks that step back).
    pub fn set(&self, to: Timestamp) {
        self.micros.store(to.as_micros(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(self.micros.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}
