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

use std::fmt;
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

/// Wall-clock time that does not jump.
///
/// Anchored to [`SystemTime`] once, then advanced by a monotonic counter, so an NTP step cannot hand out tokens
/// twice or freeze a bucket. The counter is the CPU's time-stamp counter where it is invariant (through
/// `quanta`, as governor does), which reads in a few nanoseconds where a system call can take tens: on the hot
/// path of every check, that is most of the difference.
///
/// A counter's rate is only as good as its calibration (tens of parts per million off: on the machine this was
/// written on, 17 ppm, 1.5 s a day), so about once a second the clock is set back on the system's monotonic clock,
/// which keeps the rate of real time: a correction of some microseconds, either way (the algorithms take a clock
/// that steps back). Without it, a process up for weeks would announce resets (`X-RateLimit-Reset`, epoch
/// seconds) tens of seconds off. Clones share the correction.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor: Timestamp,
    counter: quanta::Clock,
    started: u64,
    correction: Arc<Correction>,
}

/// How often the counter is set back on the reference clock: every 2^30 ns of counter (1.07 s).
const RESYNC_SHIFT: u32 = 30;

/// The counter's correction, and when it is next due.
struct Correction {
    /// Time elapsed since the clock was made, by the reference clock (the system's monotonic clock).
    reference: Box<dyn Fn() -> Duration + Send + Sync>,
    /// One word, so that a reading loads it once: the microseconds added to the counter's reading (an `i32`,
    /// ±35 minutes, in the high half) and the resync period (counter nanoseconds >> [`RESYNC_SHIFT`]) from which
    /// it is next updated (the low half).
    packed: AtomicU64,
}

/// `correction` and `due` as one word.
fn pack(correction_micros: i32, due: u32) -> u64 {
    u64::from(correction_micros.cast_unsigned()) << 32 | u64::from(due)
}

impl fmt::Debug for Correction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Correction")
            .field(
                "correction_micros",
                &((self.packed.load(Ordering::Relaxed) >> 32) as u32).cast_signed(),
            )
            .finish_non_exhaustive()
    }
}

impl Correction {
    /// Updates the correction in resync period `period`, unless another thread already has (`packed`, as it was
    /// loaded, is then gone); the word to read with. `counter` reads the counter's nanoseconds.
    #[cold]
    #[inline(never)]
    fn resync(&self, packed: u64, period: u64, counter: impl Fn() -> u64) -> u64 {
        // The reference is read between two readings of the counter, and paired with their midpoint: a thread
        // descheduled between a reading and the reference would otherwise put its pause into every clone's clock
        // until the next resync. A pair too far apart (over 20 µs) is read again, three times at most.
        let mut pair = (0, Duration::ZERO);
        for _ in 0..3 {
            let before = counter();
            let reference = (self.reference)();
            let after = counter();
            pair = (before / 2 + after / 2, reference);
            if after.saturating_sub(before) <= 20_000 {
                break;
            }
        }
        let (nanos, reference) = pair;
        let reference = i64::try_from(reference.as_micros()).unwrap_or(i64::MAX);
        let counted = i64::try_from(nanos / 1_000).unwrap_or(i64::MAX);
        let correction = reference.saturating_sub(counted);
        let correction =
            i32::try_from(correction).unwrap_or(if correction < 0 { i32::MIN } else { i32::MAX });
        let due = u32::try_from(period + 1).unwrap_or(u32::MAX);
        let next = pack(correction, due);
        match self
            .packed
            .compare_exchange(packed, next, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => next,
            Err(newer) => newer,
        }
    }
}

impl SystemClock {
    /// A clock anchored at the current wall-clock time.
    #[must_use]
    pub fn new() -> Self {
        // Calibrated first: the reference starts with the reading and the anchor, not before the calibration.
        let counter = quanta::Clock::new();
        let start = Instant::now();
        Self::with_counter(counter, move || start.elapsed())
    }

    /// A clock on `counter`, corrected by `reference` (the time elapsed since it was made).
    fn with_counter(
        counter: quanta::Clock,
        reference: impl Fn() -> Duration + Send + Sync + 'static,
    ) -> Self {
        let started = counter.raw();
        Self {
            anchor: Timestamp::from(SystemTime::now()),
            counter,
            started,
            correction: Arc::new(Correction {
                reference: Box::new(reference),
                packed: AtomicU64::new(pack(0, 1)),
            }),
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
        let mut packed = self.correction.packed.load(Ordering::Relaxed);
        let period = nanos >> RESYNC_SHIFT;
        if period >= packed & u64::from(u32::MAX) {
            packed = self.correction.resync(packed, period, || {
                self.counter
                    .delta_as_nanos(self.started, self.counter.raw())
            });
        }
        // Added in two's complement: the anchor is decades of microseconds, the correction a few of them.
        let correction = i64::from(((packed >> 32) as u32).cast_signed());
        Timestamp::from_micros(
            (self.anchor.as_micros() + nanos / 1_000).wrapping_add(correction.cast_unsigned()),
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock on a mocked counter, corrected by a reference moved by hand; returns both handles.
    fn clock() -> (SystemClock, Arc<quanta::Mock>, Arc<AtomicU64>) {
        let (counter, mock) = quanta::Clock::mock();
        let reference = Arc::new(AtomicU64::new(0));
        let read = reference.clone();
        let clock = SystemClock::with_counter(counter, move || {
            Duration::from_micros(read.load(Ordering::SeqCst))
        });
        (clock, mock, reference)
    }

    #[test]
    fn a_counter_off_rate_is_set_back_on_the_reference_about_once_a_second() {
        let (clock, counter, reference) = clock();
        let start = clock.now().as_micros();
        let at = |clock: &SystemClock| clock.now().as_micros() - start;
        let advance = |counter_us: u64, reference_us: u64| {
            counter.increment(Duration::from_micros(counter_us));
            reference.fetch_add(reference_us, Ordering::SeqCst);
        };

        // Resyncs are due at whole periods of the counter, 2^30 ns (1.074 s): none in the first.
        advance(1_000_000, 1_000_000);
        assert_eq!(at(&clock), 1_000_000);
        // The counter runs fast (10 µs in 0.1 s): the first reading of the next period is set back on the
        // reference...
        advance(100_000, 99_990);
        assert_eq!(at(&clock), 1_099_990);
        // ...and the correction holds through that period; the reference is not looked at before the next one
        // (here it jumps, and nothing follows it).
        reference.fetch_add(5_000_000, Ordering::SeqCst);
        advance(1_000_000, 1_000_000);
        assert_eq!(at(&clock), 2_099_990);
        reference.fetch_sub(5_000_000, Ordering::SeqCst);
        // A counter running slow is corrected forward the same way, at the start of the third period.
        advance(100_000, 100_050);
        assert_eq!(at(&clock), 2_200_040);
    }

    #[test]
    fn a_pause_between_the_counter_and_the_reference_is_not_taken_for_drift() {
        // The first time the reference is read, the thread "was descheduled" for 10 ms just before: counter and
        // reference both moved on. The correction must not take those 10 ms for the counter running slow.
        let (counter, mock) = quanta::Clock::mock();
        let elapsed = Arc::new(AtomicU64::new(0));
        let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (read, moved, pausing) = (elapsed.clone(), mock.clone(), first.clone());
        let clock = SystemClock::with_counter(counter, move || {
            if pausing.swap(false, Ordering::SeqCst) {
                moved.increment(Duration::from_millis(10));
                read.fetch_add(10_000, Ordering::SeqCst);
            }
            Duration::from_micros(read.load(Ordering::SeqCst))
        });
        let start = clock.now().as_micros();
        mock.increment(Duration::from_millis(1_100));
        elapsed.fetch_add(1_100_000, Ordering::SeqCst);
        let at = clock.now().as_micros() - start;
        assert!(!first.load(Ordering::SeqCst), "the resync ran");
        // The reading was taken before the pause (1.1 s); what follows it must be right to the microsecond.
        assert_eq!(at, 1_100_000);
        assert_eq!(clock.now().as_micros() - start, 1_110_000);
    }

    #[test]
    fn clones_share_the_correction() {
        let (clock, counter, reference) = clock();
        let copy = clock.clone();
        counter.increment(Duration::from_secs(2));
        reference.fetch_add(2_000_100, Ordering::SeqCst);
        assert_eq!(copy.now(), clock.now());
        assert_eq!(copy.now().as_micros() - clock.anchor.as_micros(), 2_000_100);
    }

    #[test]
    fn the_system_clock_follows_the_wall_clock() {
        let clock = SystemClock::new();
        let wall = || Timestamp::from(SystemTime::now()).as_micros();
        let (before, now, after) = (wall(), clock.now().as_micros(), wall());
        // Anchored at the wall clock when made, a moment ago: within 50 ms of it (a busy machine).
        assert!(
            now + 50_000 >= before && now <= after + 50_000,
            "{before} {now} {after}"
        );
    }
}
