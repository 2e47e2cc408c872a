//! Rate-limited logs: a failing store, a shadow limit or a misconfiguration concerns every request, and must not
//! flood the logs.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Lets one log line through per second, so that a failing store, a shadow limit or a misconfiguration — each of
/// which concerns every request — cannot flood the logs.
#[derive(Debug)]
pub struct LogGate {
    /// Milliseconds since [`epoch`] before which the gate stays shut.
    next_ms: AtomicU64,
}

impl Default for LogGate {
    fn default() -> Self {
        Self::new()
    }
}

impl LogGate {
    /// An open gate; `const`, so it can be a `static`.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            next_ms: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now; if so, the gate shuts for a second.
    pub fn open(&self) -> bool {
        let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_ms
                .compare_exchange(next, now + 1_000, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// The instant every gate measures from (the first use of any).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}
