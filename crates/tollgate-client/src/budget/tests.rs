use super::*;
use crate::fields::Refusal;

const SETTINGS: Settings = Settings {
    max_delay: Duration::from_secs(60),
    default_retry: Duration::from_secs(1),
    jitter_per_mille: 100,
};

fn said(limits: &[(&str, u64, u64)]) -> Observation {
    Observation {
        limits: limits
            .iter()
            .map(|&(name, r, t)| LimitItem {
                name: name.into(),
                pk: None,
                remaining: r,
                window: (t > 0).then(|| Duration::from_secs(t)),
            })
            .collect(),
        ..Observation::default()
    }
}

#[test]
fn a_new_scope_sends_one_request_first() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let first = scope.try_send(now).unwrap();
    assert!(
        scope.try_send(now).is_none(),
        "one at a time until an answer"
    );
    scope.observe(first, &said(&[("api", 2, 1)]), now);
    assert!(scope.try_send(now).is_some());
    assert!(scope.try_send(now).is_some());
    assert!(scope.try_send(now).is_none(), "r=2 spent");
    // Past t: one probe.
    let later = now + Duration::from_secs(1);
    let probe = scope.try_send(later).unwrap();
    assert!(scope.try_send(later).is_none());
    scope.observe(probe, &said(&[("api", 5, 1)]), later);
    // The two sent before the probe are still unanswered: perhaps decided after it, so counted as spent.
    assert_eq!((0..10).filter_map(|_| scope.try_send(later)).count(), 3);
}

#[test]
fn requests_sent_after_the_answered_one_count_as_spent() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let first = scope.try_send(now).unwrap();
    scope.observe(first, &said(&[]), now); // no fields: free
    let tickets: Vec<_> = (0..4).map(|_| scope.try_send(now).unwrap()).collect();
    // The answer to the first of the four says 3 remaining; 3 more were sent after it.
    scope.observe(tickets[0], &said(&[("api", 3, 1)]), now);
    assert!(scope.try_send(now).is_none());
    // An older answer changes nothing.
    scope.observe(first, &said(&[("api", 9, 1)]), now);
    assert!(scope.try_send(now).is_none());
    // The answers in between: nothing left.
    scope.observe(tickets[1], &said(&[("api", 1, 1)]), now);
    scope.observe(tickets[2], &said(&[("api", 0, 1)]), now);
    assert!(scope.try_send(now).is_none());
    // The newest says 5, but the three before it were unanswered when it was sent: 2.
    scope.observe(tickets[3], &said(&[("api", 5, 1)]), now);
    assert_eq!((0..10).filter_map(|_| scope.try_send(now)).count(), 2);
}

/// Answers may come from decisions in another order than the sends: an answer counts as spent the requests
/// sent before it that were unanswered when it was sent, even if their answers came first.
#[test]
fn unanswered_earlier_requests_count_as_spent() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let first = scope.try_send(now).unwrap();
    scope.observe(first, &said(&[]), now);
    let tickets: Vec<_> = (0..3).map(|_| scope.try_send(now).unwrap()).collect();
    // The middle one is answered first, then the last one, r=3: the two before it may have been decided after
    // it.
    scope.observe(tickets[1], &said(&[("api", 0, 1)]), now);
    scope.observe(tickets[2], &said(&[("api", 3, 1)]), now);
    assert_eq!((0..10).filter_map(|_| scope.try_send(now)).count(), 1);
}

/// Requests sent together each count the others as unsure; while their answers agree with the standing
/// statement (only this client spends), the standing one's larger bound stands.
#[test]
fn a_burst_keeps_the_larger_bound_while_the_answers_agree() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let probe = scope.try_send(now).unwrap();
    scope.observe(probe, &said(&[("api", 19, 1)]), now);
    let burst: Vec<_> = (0..16).map(|_| scope.try_send(now).unwrap()).collect();
    // Decided in order: 18, 17, ..., 3 left; each was sent with the ones before it unanswered.
    for (i, &t) in burst.iter().enumerate() {
        scope.observe(t, &said(&[("api", 18 - i as u64, 1)]), now);
    }
    // The probe's answer left 19: 16 sent since, 3 more.
    assert_eq!((0..10).filter_map(|_| scope.try_send(now)).count(), 3);
}

/// The standing statement's count stands beside an agreeing newer answer, but its horizon becomes the newer
/// one's: the probe comes no sooner than the newest answer says.
#[test]
fn a_kept_statement_takes_the_newer_horizon() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let probe = scope.try_send(now).unwrap();
    scope.observe(probe, &said(&[("api", 10, 1)]), now);
    let _a = scope.try_send(now).unwrap();
    let b = scope.try_send(now).unwrap();
    let later = now + Duration::from_millis(500);
    scope.observe(b, &said(&[("api", 8, 1)]), later);
    // The probe's count: 8 more.
    assert_eq!((0..20).filter_map(|_| scope.try_send(later)).count(), 8);
    // Spent until the newer answer's horizon (1.5 s), not the probe's (1 s).
    assert!(scope.try_send(now + Duration::from_millis(1200)).is_none());
    assert!(scope.try_send(now + Duration::from_millis(1500)).is_some());
}

/// A newer answer that says less than the standing statement leaves (less itself) shows somebody else
/// spending the key: it replaces the larger bound.
#[test]
fn a_newer_answer_below_the_standing_bound_replaces_it() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let probe = scope.try_send(now).unwrap();
    scope.observe(probe, &said(&[("api", 10, 1)]), now);
    let a = scope.try_send(now).unwrap();
    let b = scope.try_send(now).unwrap();
    // `b` was sent with `a` unanswered; the standing bound leaves 8, and `b` says 2 (at least 7 if only this
    // client spent): somebody else spent 5. 2 less `a`, possibly decided after it: 1.
    scope.observe(b, &said(&[("api", 2, 1)]), now);
    assert_eq!((0..10).filter_map(|_| scope.try_send(now)).count(), 1);
    let _ = a;
}

/// A refusal's statement replaces the standing one whatever it leaves.
#[test]
fn a_refusal_replaces_the_standing_statement() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let probe = scope.try_send(now).unwrap();
    scope.observe(probe, &said(&[("api", 10, 1)]), now);
    let a = scope.try_send(now).unwrap();
    let refused = Observation {
        refusal: Some(Refusal::TooManyRequests),
        retry_after: Some(Duration::from_secs(1)),
        ..said(&[("api", 0, 1)])
    };
    scope.observe(a, &refused, now);
    let later = now + Duration::from_millis(1500);
    // Open again after the retry (and jitter), but the refusal's statement is over too: one probe.
    assert!(scope.try_send(later).is_some());
    assert!(scope.try_send(later).is_none());
}

#[test]
fn a_refusal_closes_the_scope_for_its_delay_and_jitter() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let t = scope.try_send(now).unwrap();
    let refused = Observation {
        refusal: Some(Refusal::TooManyRequests),
        retry_after: Some(Duration::from_secs(2)),
        ..said(&[("api", 0, 2)])
    };
    scope.observe(t, &refused, now);
    assert!(scope.try_send(now + Duration::from_secs(2)).is_none());
    // Jitter is at most a tenth of the delay.
    assert!(scope.try_send(now + Duration::from_millis(2_201)).is_some());
}

#[test]
fn waiters_are_granted_in_order() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let first = scope.try_send(now).unwrap();
    let waker = Waker::noop();
    let ids: Vec<_> = (0..3).map(|_| scope.enqueue()).collect();
    // The head waits for the answer; the others wait to become the head.
    assert_eq!(scope.poll_waiter(ids[0], now, waker), Err(None));
    assert_eq!(scope.poll_waiter(ids[2], now, waker), Err(None));
    scope.observe(first, &said(&[("api", 2, 1)]), now);
    let until = now + Duration::from_secs(1);
    // The first two are granted (not yet collected): the third is the head, waiting for the statement's end.
    assert_eq!(scope.poll_waiter(ids[2], now, waker), Err(Some(until)));
    assert!(scope.poll_waiter(ids[0], now, waker).is_ok());
    assert!(scope.poll_waiter(ids[1], now, waker).is_ok());
    assert_eq!(scope.poll_waiter(ids[2], now, waker), Err(Some(until)));
    assert!(scope.try_send(now).is_none(), "nobody jumps the queue");
    assert!(scope.poll_waiter(ids[2], until, waker).is_ok(), "the probe");
}

/// Sends as fast as the ceiling allows, for three windows: never more than `q` within any `w`, and `q` per `w`
/// over the run, less at most a step per window.
#[test]
fn the_ceiling_holds_any_window_to_the_quota() {
    for (quota, window_ms) in [(2, 1_000), (5, 1_000), (100, 1_000), (1_000, 60_000)] {
        let window = Duration::from_millis(window_ms);
        let mut ceiling = Ceiling::new(quota, window).unwrap();
        let start = Instant::now();
        let mut now = start;
        let mut sends = Vec::new();
        while now < start + window * 3 {
            match ceiling.blocked(now) {
                None => {
                    ceiling.spend(now);
                    sends.push(now);
                }
                Some(at) => {
                    assert!(at > now, "a wait is in the future");
                    now = at;
                }
            }
            // Each send a microsecond apart, as a client's would be.
            now += Duration::from_micros(1);
        }
        for (i, &at) in sends.iter().enumerate() {
            let within = sends[i..].iter().take_while(|&&s| s < at + window).count();
            assert!(
                within as u64 <= quota,
                "{within} within {window:?} of a send, q={quota}"
            );
        }
        let least = quota * 3 - 3 * (quota / u64::from(Ceiling::STEPS) + 1);
        assert!(
            sends.len() as u64 >= least,
            "{} sends, q={quota}",
            sends.len()
        );
    }
}

/// Wakes counted: a waker that only counts.
struct Count(AtomicU64);

impl std::task::Wake for Count {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The head waits for the probe's answer; an answer that says "nothing left until t" grants nothing, and the
/// head is woken all the same, to wait for `t` instead of its longest wait.
#[test]
fn an_answer_that_grants_nothing_wakes_the_head() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let first = scope.try_send(now).unwrap();
    let count = std::sync::Arc::new(Count(AtomicU64::new(0)));
    let waker = Waker::from(count.clone());
    let id = scope.enqueue();
    assert_eq!(
        scope.poll_waiter(id, now, &waker),
        Err(None),
        "waits for the answer"
    );
    scope.observe(first, &said(&[("api", 0, 1)]), now);
    assert_eq!(count.0.load(Ordering::Relaxed), 1, "woken by the answer");
    let until = now + Duration::from_secs(1);
    assert_eq!(scope.poll_waiter(id, now, &waker), Err(Some(until)));
    assert_eq!(count.0.load(Ordering::Relaxed), 1, "a poll wakes nobody");
}

#[test]
fn hostile_numbers_stay_bounded() {
    let scope = Scope::new(SETTINGS);
    let now = Instant::now();
    let t = scope.try_send(now).unwrap();
    // An enormous t and Retry-After: cut to the longest delay.
    let refused = Observation {
        refusal: Some(Refusal::TooManyRequests),
        retry_after: Some(Duration::from_secs(u64::MAX / 4)),
        ..said(&[("api", 0, u64::MAX / 4)])
    };
    scope.observe(t, &refused, now);
    let horizon = now + SETTINGS.max_delay;
    assert!(scope.try_send(horizon - Duration::from_millis(1)).is_none());
    let probe = scope
        .try_send(horizon)
        .expect("open again after the longest delay");
    // r above the policy's q: cut to q.
    let mut o = said(&[("api", 1_000_000, 1)]);
    o.policies.push(PolicyItem {
        name: "api".into(),
        pk: None,
        quota: 3,
        unit: Unit::Requests,
        window: Some(Duration::from_secs(1)),
    });
    scope.observe(probe, &o, horizon);
    assert_eq!((0..10).filter_map(|_| scope.try_send(horizon)).count(), 3);
}
