//! The figures the study collects, and their arithmetic.

/// The sliding window counter's estimate before a request: `scaled / ticks` requests, where
/// `scaled = current × ticks + previous × (ticks − elapsed)` in the policy's ticks, as in `sliding_window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Estimate {
    pub(crate) scaled: u64,
    pub(crate) ticks: u64,
}

impl Estimate {
    pub(crate) fn value(self) -> f64 {
        self.scaled as f64 / self.ticks as f64
    }

    /// Whether one more request keeps the estimate within `limit` (exact integer comparison).
    pub(crate) const fn admits_one(self, limit: u64) -> bool {
        self.scaled + self.ticks <= limit * self.ticks
    }
}

/// The largest undercount seen: the exact count minus the counter's estimate, before one request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Undercount {
    pub(crate) amount: f64,
    pub(crate) exact: u64,
    pub(crate) estimate: f64,
    /// How far into its (aligned) window the request came, µs.
    pub(crate) elapsed_us: u64,
}

/// The counter's estimates and decisions against the exact count on the same history.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Estimates {
    /// The estimate admits one more request, the exact count does not.
    pub(crate) wrongly_allowed: u64,
    /// The exact count admits one more request, the estimate does not: a false positive.
    pub(crate) wrongly_denied: u64,
    /// Wrongly denied while the exact count was `limit − 1`: the counter kept the client one request short.
    pub(crate) denied_one_short: u64,
    /// Σ |estimate − exact| and Σ exact over all requests.
    abs_error: f64,
    exact_sum: u64,
    /// Σ |estimate − exact| / exact and Σ (estimate − exact) / exact over requests with exact > 0.
    abs_rel_error: f64,
    signed_rel_error: f64,
    rel_error_n: u64,
    /// Σ |estimate − exact| / exact over requests with exact ≥ limit / 2.
    busy_abs_rel_error: f64,
    busy_n: u64,
    pub(crate) worst_undercount: Undercount,
}

impl Estimates {
    /// Records one request that came `elapsed_us` into its window, when `exact` requests were in the
    /// rolling period.
    pub(crate) fn record(&mut self, estimate: Estimate, exact: u64, limit: u64, elapsed_us: u64) {
        let (allows, exact_allows) = (estimate.admits_one(limit), exact < limit);
        self.wrongly_allowed += u64::from(allows && !exact_allows);
        self.wrongly_denied += u64::from(!allows && exact_allows);
        self.denied_one_short += u64::from(!allows && exact + 1 == limit);
        let estimate = estimate.value();
        self.abs_error += (estimate - exact as f64).abs();
        self.exact_sum += exact;
        if exact > 0 {
            let rel = (estimate - exact as f64) / exact as f64;
            self.abs_rel_error += rel.abs();
            self.signed_rel_error += rel;
            self.rel_error_n += 1;
            if 2 * exact >= limit {
                self.busy_abs_rel_error += rel.abs();
                self.busy_n += 1;
            }
        }
        let under = exact as f64 - estimate;
        if under > self.worst_undercount.amount {
            self.worst_undercount = Undercount {
                amount: under,
                exact,
                estimate,
                elapsed_us,
            };
        }
    }

    pub(crate) const fn wrong(&self) -> u64 {
        self.wrongly_allowed + self.wrongly_denied
    }

    /// Mean |estimate − exact| / exact over requests with exact > 0.
    pub(crate) fn mean_abs_rel_error(&self) -> f64 {
        ratio(self.abs_rel_error, self.rel_error_n)
    }

    /// Σ |estimate − exact| / Σ exact: the error relative to the traffic, which small counts cannot inflate.
    pub(crate) fn weighted_rel_error(&self) -> f64 {
        ratio(self.abs_error, self.exact_sum)
    }

    /// Mean (estimate − exact) / exact: negative when the counter undercounts on average.
    pub(crate) fn mean_signed_rel_error(&self) -> f64 {
        ratio(self.signed_rel_error, self.rel_error_n)
    }

    /// Mean |estimate − exact| / exact over requests with exact ≥ limit / 2.
    pub(crate) fn mean_busy_abs_rel_error(&self) -> f64 {
        ratio(self.busy_abs_rel_error, self.busy_n)
    }

    fn absorb(&mut self, o: &Self) {
        self.wrongly_allowed += o.wrongly_allowed;
        self.wrongly_denied += o.wrongly_denied;
        self.denied_one_short += o.denied_one_short;
        self.abs_error += o.abs_error;
        self.exact_sum += o.exact_sum;
        self.abs_rel_error += o.abs_rel_error;
        self.signed_rel_error += o.signed_rel_error;
        self.rel_error_n += o.rel_error_n;
        self.busy_abs_rel_error += o.busy_abs_rel_error;
        self.busy_n += o.busy_n;
        if o.worst_undercount.amount > self.worst_undercount.amount {
            self.worst_undercount = o.worst_undercount;
        }
    }
}

fn ratio(sum: f64, n: u64) -> f64 {
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// What one class of clients (or all of them) saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Tally {
    pub(crate) requests: u64,
    pub(crate) counter_allowed: u64,
    pub(crate) log_allowed: u64,
    pub(crate) bucket_allowed: u64,
    /// Cloudflare's method: the counter counts every request and flags the source when the estimate exceeds
    /// the limit; the exact count is of every request too.
    pub(crate) offered: Estimates,
    /// Sources that went over the limit at some request, and those of them the counter never flagged.
    pub(crate) sources_over: u64,
    pub(crate) sources_missed: u64,
    /// The most requests a missed source had in one rolling period (with the one that went over).
    pub(crate) missed_peak: u64,
    /// Sources the counter flagged although they never went over the limit.
    pub(crate) sources_wrongly_flagged: u64,
    /// Enforcing (shadow): the counter counts what it admits; the exact count is of what it admitted.
    pub(crate) enforced: Estimates,
    /// Most counter-admitted requests within any rolling period.
    pub(crate) counter_peak: u64,
    /// Independent: admitted by the counter only, and by the exact log only.
    pub(crate) counter_only: u64,
    pub(crate) log_only_vs_counter: u64,
    /// Independent: admitted by the token bucket only, and by the exact log only.
    pub(crate) bucket_only: u64,
    pub(crate) log_only_vs_bucket: u64,
    /// Shadow: bucket admissions that put more than `limit` in the rolling period, and bucket denials the
    /// rolling window would have admitted.
    pub(crate) bucket_over_window: u64,
    pub(crate) bucket_under_window: u64,
    /// Most bucket-admitted requests within any rolling period.
    pub(crate) bucket_peak: u64,
}

impl Tally {
    pub(crate) fn absorb(&mut self, o: &Self) {
        self.requests += o.requests;
        self.counter_allowed += o.counter_allowed;
        self.log_allowed += o.log_allowed;
        self.bucket_allowed += o.bucket_allowed;
        self.offered.absorb(&o.offered);
        self.sources_over += o.sources_over;
        self.sources_missed += o.sources_missed;
        self.missed_peak = self.missed_peak.max(o.missed_peak);
        self.sources_wrongly_flagged += o.sources_wrongly_flagged;
        self.enforced.absorb(&o.enforced);
        self.counter_peak = self.counter_peak.max(o.counter_peak);
        self.counter_only += o.counter_only;
        self.log_only_vs_counter += o.log_only_vs_counter;
        self.bucket_only += o.bucket_only;
        self.log_only_vs_bucket += o.log_only_vs_bucket;
        self.bucket_over_window += o.bucket_over_window;
        self.bucket_under_window += o.bucket_under_window;
        self.bucket_peak = self.bucket_peak.max(o.bucket_peak);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An estimate of `n / 10` requests.
    const fn tenths(n: u64) -> Estimate {
        Estimate {
            scaled: n,
            ticks: 10,
        }
    }

    #[test]
    fn the_estimate_admits_while_one_more_fits() {
        assert_eq!(tenths(495).value(), 49.5);
        assert!(tenths(990).admits_one(100)); // 99 + 1 <= 100
        assert!(!tenths(991).admits_one(100)); // 99.1 + 1 > 100
    }

    #[test]
    fn relative_errors_and_decisions() {
        let mut e = Estimates::default();
        e.record(tenths(30), 4, 10, 7); // −25 %, 4 < 10 / 2: not busy; both admit
        e.record(tenths(60), 5, 10, 8); // +20 %, busy; both admit
        e.record(tenths(5), 0, 10, 9); // exact 0: no relative error, an overcount
        e.record(tenths(85), 10, 10, 1); // −15 %, busy; the estimate admits, the exact count does not
        e.record(tenths(95), 9, 10, 2); // +5.6 %, busy; the exact count admits, the estimate does not
        assert_eq!((e.wrongly_allowed, e.wrongly_denied, e.wrong()), (1, 1, 2));
        assert_eq!(e.denied_one_short, 1);
        // Σ |estimate − exact| = 1 + 1 + 0.5 + 1.5 + 0.5 over Σ exact = 4 + 5 + 0 + 10 + 9.
        assert!((e.weighted_rel_error() - 4.5 / 28.0).abs() < 1e-12);
        assert_eq!(e.rel_error_n, 4);
        let abs = (0.25 + 0.2 + 0.15 + 0.5 / 9.0) / 4.0;
        assert!((e.mean_abs_rel_error() - abs).abs() < 1e-12);
        let signed = (-0.25 + 0.2 - 0.15 + 0.5 / 9.0) / 4.0;
        assert!((e.mean_signed_rel_error() - signed).abs() < 1e-12);
        assert_eq!(e.busy_n, 3);
        assert!((e.mean_busy_abs_rel_error() - (0.2 + 0.15 + 0.5 / 9.0) / 3.0).abs() < 1e-12);
        assert_eq!(
            e.worst_undercount,
            Undercount {
                amount: 1.5,
                exact: 10,
                estimate: 8.5,
                elapsed_us: 1
            }
        );
    }

    #[test]
    fn no_requests_means_no_error() {
        let e = Estimates::default();
        assert_eq!(
            (e.mean_abs_rel_error(), e.mean_busy_abs_rel_error()),
            (0.0, 0.0)
        );
    }

    #[test]
    fn tallies_add_up() {
        let mut a = Tally {
            requests: 2,
            counter_peak: 3,
            sources_over: 1,
            ..Tally::default()
        };
        a.enforced.record(tenths(10), 2, 10, 5);
        let mut b = Tally {
            requests: 5,
            counter_peak: 1,
            ..Tally::default()
        };
        b.enforced.record(tenths(30), 2, 10, 6);
        b.absorb(&a);
        assert_eq!((b.requests, b.counter_peak, b.sources_over), (7, 3, 1));
        assert_eq!(b.enforced.rel_error_n, 2);
        assert!((b.enforced.mean_abs_rel_error() - 0.5).abs() < 1e-12);
        assert_eq!(b.enforced.worst_undercount.amount, 1.0);
    }
}
