//! The exact sliding log: every admitted request's time is kept for one period.
//!
//! Memory grows with traffic, so it is no production algorithm (and not in tollgate's API); it is the reference
//! the sliding window counter's accuracy is measured against.

use std::collections::VecDeque;

use tollgate::Timestamp;

/// Admitted requests of one key within the last period.
#[derive(Debug, Clone, Default)]
pub(crate) struct SlidingLog {
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl SlidingLog {
    /// Admits `cost` at `now` if the cost admitted in `(now − period, now]` plus `cost` stays within `limit`.
    pub(crate) fn decide(&mut self, limit: u64, period_us: u64, cost: u64, now: Timestamp) -> bool {
        let now = now.as_micros();
        while let Some(&(at, c)) = self.entries.front() {
            if at + period_us > now {
                break;
            }
            self.entries.pop_front();
            self.total -= c;
        }
        if self.total + cost > limit {
            return false;
        }
        self.entries.push_back((now, cost));
        self.total += cost;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_within_the_limit_of_the_last_period() {
        let mut log = SlidingLog::default();
        let t = Timestamp::from_micros;
        assert!(log.decide(2, 1_000_000, 1, t(0)));
        assert!(log.decide(2, 1_000_000, 1, t(10)));
        assert!(!log.decide(2, 1_000_000, 1, t(20)));
        // The first one left the window.
        assert!(log.decide(2, 1_000_000, 1, t(1_000_000)));
        assert!(!log.decide(2, 1_000_000, 1, t(1_000_005)));
    }
}
