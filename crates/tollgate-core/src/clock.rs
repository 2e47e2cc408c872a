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
use std::time::{Duration, SystemTime};

use crate::Timestamp;

/// A source of the current instant.
///
/// Decisions depend on time only through this trait, so tests can drive time by hand and the Redis store can
/// use the server's clock instead.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// Wall-clock time that does not jump.
///
/// Anchored to [`SystemTime`] once, then advanced by a monotonic counter, so an NTP step cannot hand out tokens
/// twice or freeze a bucket. The counter is the CPU's time-stamp counter where it is invariant (through
/// `quanta`, as governor does), which reads in a few nanoseconds where a system call can take tens: on the hot
/// path of every check, that is most of the difference.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor: Timestamp,
    counter: quanta::Clock,
    started: u64,
}

impl SystemClock {
    /// A clock anchored at the current wall-clock time.
    #[must_use]
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        let started = counter.raw();
        Self {
            anchor: Timestamp::from(SystemTime::now()),
            counter,
            started,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Timestamp {
        let nanos = self
            .counter
            .delta_as_nanos(self.started, self.counter.raw());
        Timestamp::from_micros(self.anchor.as_micros() + nanos / 1_000)
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
