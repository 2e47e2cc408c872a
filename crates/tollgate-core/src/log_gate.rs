//! Rate-limited logs: a failing store, a shadow limit, a misconfiguration or a flood of evictions concerns every
//! request, and must not flood the logs.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Lets one log line through per period (a second by default), so that a condition that concerns every request
/// cannot flood the logs.
#[derive(Debug)]
pub struct LogGate {
    /// Milliseconds since [`epoch`] before which the gate stays shut.
    next_ms: AtomicU64,
    /// How long the gate shuts after letting a line through, in milliseconds.
    period_ms: u64,
}

impl Default for LogGate {
    fn default() -> Self {
        Self::new()
    }
}

impl LogGate {
    /// An open gate letting a line through per second; `const`, so it can be a `static`.
    #[must_use]
    pub const fn new() -> Self {
        Self::every_ms(1_000)
    }

    /// An open gate letting a line through every `period_ms` milliseconds.
    #[must_use]
    pub const fn every_ms(period_ms: u64) -> Self {
        Self {
            next_ms: AtomicU64::new(0),
            period_ms,
        }
    }

    /// Whether a line may be logged now; if so, the gate shuts for a period.
    pub fn open(&self) -> bool {
        let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(self.period_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

/// The instant every gate measures from (the first use of any).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

#[cfg(test)]
mod tests {
    use super::LogGate;

    #[test]
    fn a_gate_lets_one_line_through_per_period() {
        let gate = LogGate::every_ms(60_000);
        assert!(gate.open(), "an open gate lets the first line through");
        assert!(!gate.open(), "then stays shut for the period");
        assert!(!gate.open());
        assert!(LogGate::every_ms(0).open(), "another gate is open");
    }
}
