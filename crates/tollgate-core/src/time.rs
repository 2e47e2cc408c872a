//! Absolute instants in integer microseconds since the UNIX epoch.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An absolute instant: microseconds since the UNIX epoch.
///
/// Microseconds, not nanoseconds, because the same numbers travel through Redis Lua scripts, whose numbers are
/// doubles: every integer below 2^53 is exact, and 2^53 µs reaches the year 2255.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The latest instant the algorithms compute with: 2^53 µs, in the year 2255. Every sum they form stays exact
    /// (and below `u64::MAX`) from there, in Rust and in Lua's doubles; a later instant is decided as this one.
    pub const LATEST: Timestamp = Timestamp(1 << 53);

    /// The instant `micros` microseconds after the UNIX epoch.
    #[must_use]
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros)
    }

    /// Microseconds since the UNIX epoch.
    #[must_use]
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// Whole seconds since the UNIX epoch, rounded up (a reset is never announced earlier than it happens).
    #[must_use]
    pub const fn as_secs_ceil(self) -> u64 {
        self.0.div_ceil(1_000_000)
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is later.
    #[must_use]
    pub const fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }

    /// This instant plus `d`, saturating at the largest representable instant.
    #[must_use]
    pub fn saturating_add(self, d: Duration) -> Self {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(micros))
    }

    /// The same instant as a [`SystemTime`].
    #[must_use]
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.0)
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        let micros = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
        Self(u64::try_from(micros).unwrap_or(u64::MAX))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}s", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}
