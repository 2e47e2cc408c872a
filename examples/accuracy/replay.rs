//! Replays a trace through the sliding window counter, the token bucket and the exact sliding log.
//!
//! Each client has its own state in each. Two comparisons run in the same pass:
//!
//! - **shadow** (same history): a second exact log is fed the requests the *counter* admitted, so before every
//!   request the counter's estimate and the exact count describe the same admitted set. A difference in
//!   decision is then the estimate's fault alone, and the states never drift apart. Same for the token bucket.
//! - **independent**: the counter and the exact log (`SlidingLog`) each run on their own admissions, as either
//!   would in production; once one admits what the other denies, their later decisions may differ for that
//!   reason too.

use std::collections::VecDeque;
use std::time::Duration;

use crate::sliding_log::SlidingLog;
use tollgate::algorithm::sliding_window::{self, SlidingWindowState};
use tollgate::algorithm::token_bucket::{self, TokenBucketState};
use tollgate::{Policy, PolicyError, Quota, Timestamp};

use crate::tally::{Estimate, Tally};
use crate::trace::{Class, Trace};

/// The counter's estimate before deciding at `now`: `current + previous × (1 − elapsed / period)`, aligned and in
/// ticks as in `sliding_window::decide`.
pub(crate) fn estimate(state: Option<SlidingWindowState>, policy: &Policy, now: u64) -> Estimate {
    let period = policy.quota().period_micros();
    let tick = policy.tick_micros();
    let start = now - now % period;
    let (previous, current) = match state {
        Some(s) if s.window_start == start => (s.previous, s.current),
        Some(s) if s.window_start + period == start => (s.current, 0),
        _ => (0, 0),
    };
    let ticks = period / tick;
    let elapsed = (now - start) / tick;
    Estimate {
        scaled: current * ticks + previous * (ticks - elapsed),
        ticks,
    }
}

/// Drops entries that left the rolling period `(now − period, now]` and returns how many remain.
fn exact_count(log: &mut VecDeque<u64>, period: u64, now: u64) -> u64 {
    while log.front().is_some_and(|&at| at + period <= now) {
        log.pop_front();
    }
    log.len() as u64
}

#[derive(Debug, Default)]
struct Client {
    /// Counts every request (Cloudflare's method) and its exact log of every request.
    offered: Option<SlidingWindowState>,
    offered_log: VecDeque<u64>,
    /// Most requests in one rolling period, this one included.
    offered_peak: u64,
    flagged: bool,
    /// The enforcing counter and the exact log of what it admitted.
    window: Option<SlidingWindowState>,
    window_shadow: VecDeque<u64>,
    /// The reference: the exact log deciding on its own.
    log: SlidingLog,
    bucket: Option<TokenBucketState>,
    bucket_shadow: VecDeque<u64>,
}

/// The limiters under study, all over the same limit and period.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limiters {
    /// The sliding window counter as tollgate enforces it.
    pub(crate) window: Policy,
    /// The same counter with its limit out of reach, so that it counts every request, as Cloudflare's does.
    pub(crate) counting: Policy,
    /// A token bucket with burst = limit.
    pub(crate) bucket: Policy,
}

impl Limiters {
    /// `limit` per `period`, for traces of at most `requests` requests.
    pub(crate) fn new(limit: u64, period: Duration, requests: u64) -> Result<Self, PolicyError> {
        let quota = Quota::new(limit, period)?;
        let counting = Policy::sliding_window(Quota::new(requests.max(limit), period)?)?;
        Ok(Self {
            window: Policy::sliding_window(quota)?,
            counting,
            bucket: Policy::token_bucket(quota),
        })
    }
}

/// Replays `trace` (times offset by `origin_us`, a multiple of the period) with one request of cost 1 each.
pub(crate) fn replay(trace: &Trace, limiters: &Limiters, origin_us: u64) -> Vec<(Class, Tally)> {
    let Limiters {
        window,
        counting,
        bucket,
    } = limiters;
    let quota = window.quota();
    let (limit, period) = (quota.limit(), quota.period_micros());
    let mut clients: Vec<Client> = (0..trace.classes.len())
        .map(|_| Client::default())
        .collect();
    let mut tallies: Vec<(Class, Tally)> =
        Class::ALL.iter().map(|&c| (c, Tally::default())).collect();
    let slot = |class: Class| Class::ALL.iter().position(|&c| c == class).unwrap_or(0);
    for r in &trace.requests {
        let now = origin_us + r.at;
        let at = Timestamp::from_micros(now);
        let c = &mut clients[r.client as usize];
        let t = &mut tallies[slot(trace.classes[r.client as usize])].1;
        t.requests += 1;

        let guess = estimate(c.offered, counting, now);
        let exact = exact_count(&mut c.offered_log, period, now);
        t.offered.record(guess, exact, limit, now % period);
        c.offered_peak = c.offered_peak.max(exact + 1);
        c.flagged |= !guess.admits_one(limit);
        let step = sliding_window::decide(c.offered, counting, 1, at);
        // Checked in release builds too: the study's figures rest on both (a report built on a broken mirror would
        // be wrong without a sign).
        assert!(
            step.decision.is_allowed(),
            "the counting limit is out of reach"
        );
        c.offered = step.state;
        c.offered_log.push_back(now);

        let guess = estimate(c.window, window, now);
        let step = sliding_window::decide(c.window, window, 1, at);
        let counter = step.decision.is_allowed();
        assert_eq!(
            counter,
            guess.admits_one(limit),
            "the estimate mirrors sliding_window::decide"
        );
        c.window = step.state.or(c.window);
        let exact = exact_count(&mut c.window_shadow, period, now);
        t.enforced.record(guess, exact, limit, now % period);
        if counter {
            c.window_shadow.push_back(now);
            t.counter_allowed += 1;
            t.counter_peak = t.counter_peak.max(exact + 1);
        }

        let log = c.log.decide(limit, period, 1, at);
        t.log_allowed += u64::from(log);
        t.counter_only += u64::from(counter && !log);
        t.log_only_vs_counter += u64::from(log && !counter);

        let step = token_bucket::decide(c.bucket, &bucket.quota(), 1, at);
        let admitted = step.decision.is_allowed();
        c.bucket = step.state.or(c.bucket);
        t.bucket_allowed += u64::from(admitted);
        t.bucket_only += u64::from(admitted && !log);
        t.log_only_vs_bucket += u64::from(log && !admitted);
        let exact = exact_count(&mut c.bucket_shadow, period, now);
        t.bucket_over_window += u64::from(admitted && exact >= limit);
        t.bucket_under_window += u64::from(!admitted && exact < limit);
        if admitted {
            c.bucket_shadow.push_back(now);
            t.bucket_peak = t.bucket_peak.max(exact + 1);
        }
    }
    for (client, class) in clients.iter().zip(&trace.classes) {
        let t = &mut tallies[slot(*class)].1;
        let over = client.offered_peak > limit;
        t.sources_over += u64::from(over);
        if over && !client.flagged {
            t.sources_missed += 1;
            t.missed_peak = t.missed_peak.max(client.offered_peak);
        }
        t.sources_wrongly_flagged += u64::from(client.flagged && !over);
    }
    tallies
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tally::Undercount;
    use crate::trace::Request;

    const S: u64 = 1_000_000;

    fn limiters(limit: u64, period_s: u64) -> Limiters {
        Limiters::new(limit, Duration::from_secs(period_s), 100).unwrap()
    }

    fn one_client(times: &[u64], class: Class) -> Trace {
        let requests = times.iter().map(|&at| Request { at, client: 0 }).collect();
        Trace {
            requests,
            classes: vec![class],
            edge_us: S,
        }
    }

    #[test]
    fn estimate_matches_the_worked_example() {
        // 42 in the previous minute, 18 in this one, 15 s in: 42 × 0.75 + 18 = 49.5.
        let window = limiters(100, 60).window;
        let state = SlidingWindowState {
            window_start: 60 * S,
            previous: 42,
            current: 18,
        };
        assert_eq!(estimate(Some(state), &window, 75 * S).value(), 49.5);
        // A window later, this window's 18 are the previous ones: 18 × (1 − 30/60) = 9.
        assert_eq!(estimate(Some(state), &window, 150 * S).value(), 9.0);
        assert_eq!(estimate(Some(state), &window, 180 * S).value(), 0.0);
        assert_eq!(estimate(None, &window, 75 * S).value(), 0.0);
    }

    #[test]
    fn a_burst_at_the_window_edge_is_undercounted_and_wrongly_allowed() {
        // Limit 2 per 10 s. Two requests at 9 s and 9.5 s, then one at 16 s: the counter estimates
        // 2 × (1 − 6/10) = 0.8 and admits, while both earlier requests are still in (6 s, 16 s].
        let limiters = limiters(2, 10);
        let tallies = replay(
            &one_client(&[9 * S, 9 * S + S / 2, 16 * S], Class::EdgeBurst),
            &limiters,
            0,
        );
        let t = &tallies[0].1;
        assert_eq!(t.requests, 3);
        assert_eq!((t.counter_allowed, t.log_allowed), (3, 2));
        let e = &t.enforced;
        assert_eq!((e.wrongly_allowed, e.wrongly_denied), (1, 0));
        assert_eq!((t.counter_only, t.log_only_vs_counter), (1, 0));
        assert_eq!(t.counter_peak, 3);
        assert_eq!(e.worst_undercount.exact, 2);
        assert_eq!(e.worst_undercount.elapsed_us, 6 * S);
        assert!((e.worst_undercount.amount - 1.2).abs() < 1e-9);
        // Errors before each request: none (exact 0), 0 % (1 vs 1), −60 % (0.8 vs 2).
        assert!((e.mean_abs_rel_error() - 0.3).abs() < 1e-9);
        // Counting every request gives the same history here: all three were admitted.
        assert_eq!(t.offered, t.enforced);
        assert_eq!(
            (t.sources_over, t.sources_missed, t.sources_wrongly_flagged),
            (1, 1, 0)
        );
        assert_eq!(
            t.missed_peak, 3,
            "three requests within 10 s against a limit of 2"
        );
        // The bucket (2 tokens, one per 5 s) has 1.4 tokens at 16 s: it admits all three, one beyond the window.
        assert_eq!(
            (
                t.bucket_allowed,
                t.bucket_only,
                t.bucket_over_window,
                t.bucket_peak
            ),
            (3, 1, 1, 3)
        );
        assert_eq!(t.bucket_under_window, 0);
        assert!(tallies[1].1 == Tally::default() && tallies[2].1 == Tally::default());
    }

    #[test]
    fn early_traffic_is_overcounted_and_wrongly_denied() {
        // Limit 2 per 10 s. Two requests at 0.5 s and 1 s; at 12 s they left (2 s, 12 s], yet the counter
        // still weighs them: 2 × (1 − 2/10) = 1.6 and 1.6 + 1 > 2, so it denies what the exact log admits.
        let limiters = limiters(2, 10);
        let trace = one_client(&[S / 2, S, 12 * S], Class::NearLimit);
        let t = replay(&trace, &limiters, 10 * S).remove(1).1;
        assert_eq!(
            (t.enforced.wrongly_allowed, t.enforced.wrongly_denied),
            (0, 1)
        );
        assert_eq!(
            (t.counter_allowed, t.log_allowed, t.bucket_allowed),
            (2, 3, 3)
        );
        assert_eq!(t.log_only_vs_counter, 1);
        assert_eq!(
            t.enforced.worst_undercount,
            Undercount::default(),
            "never undercounted"
        );
        assert_eq!((t.sources_over, t.sources_wrongly_flagged), (0, 1));
    }

    #[test]
    fn counting_every_request_differs_from_counting_admissions() {
        // Limit 1 per 10 s, requests at 1, 2 and 3 s: the enforcing counter admits the first only; counting
        // every request, the exact count before the third is 2 and the estimate is 2 as well.
        let limiters = limiters(1, 10);
        let t = replay(
            &one_client(&[S, 2 * S, 3 * S], Class::HeavyTailed),
            &limiters,
            0,
        )
        .remove(2)
        .1;
        assert_eq!(
            (t.counter_allowed, t.log_allowed, t.bucket_allowed),
            (1, 1, 1)
        );
        assert_eq!((t.offered.wrong(), t.enforced.wrong()), (0, 0));
        assert_eq!((t.sources_over, t.sources_missed), (1, 0));
        assert_eq!(t.offered.mean_abs_rel_error(), 0.0);
    }
}
