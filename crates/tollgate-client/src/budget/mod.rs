//! The budget of one scope (an origin, or what the user's key function groups): what the servers last said, what
//! was sent since, and the requests waiting for room, first come first served.
//!
//! A scope holds one **partition** per policy the responses named (its name and `pk`). A request spends one unit of
//! every partition of its scope, and may be sent when each of them has a unit:
//!
//! - a `requests` partition holds a statement "`r` units within `t`". The units left are `r` less every request
//!   that may not be counted in it: those sent after the one it answered, and those sent before it but still
//!   unanswered when it was sent (over several connections the server may decide them after it). A request
//!   counted twice only ever under-spends. Each answer's statement is such a bound, so a newer answer (by the
//!   order the requests were sent, not the order their answers came back) replaces the standing statement unless
//!   the standing one leaves more and the newer one is consistent with it — says at least what the standing bound
//!   left, less itself: then only this client spent the key between them, both bounds hold, and the larger stands
//!   (a burst of requests sent together would otherwise each count the others as unsure). A refusal's statement
//!   always replaces it. When `t` runs out the statement is over and **one** request probes: its answer is the next
//!   statement. A statement's `r` is cut to the policy's `q`, and its `t` to the longest delay;
//!   A policy's `q` per `w` is also a ceiling the client keeps itself: no more than `q` sent within any `w` (what
//!   a window limiter allows, and a token bucket too), so that a server whose `r` says more than its own policy —
//!   once, or on every answer — is held to the policy it announced;
//! - a `concurrent-requests` partition allows `q` requests of the scope open at once (a request is open until its
//!   response body is done or dropped).
//!
//! A new scope sends one request first and waits for its answer, so that a client never opens with more requests
//! than the server has room for; a response that says nothing about the quota (no field, or only malformed ones)
//! clears the partitions: the scope then sends as if no field had ever been there.
//!
//! A refusal (429, 503, `RESOURCE_EXHAUSTED`, `UNAVAILABLE`) closes the whole scope until its `Retry-After` (or
//! `RetryInfo`, else the refused partition's `t`, else one second), plus jitter, cut to the longest delay.
//!
//! Every instant the scope waits for is a deadline that only moves forward by what a response says, and each is cut
//! to [`Settings::max_delay`] from now: a server that says `t=0` forever, an hour of `Retry-After`, or a date in
//! the past can slow a client down to one request per answer or per longest delay, never spin it or stall it.

mod partition;

use std::collections::{BTreeSet, VecDeque};
use std::hash::{BuildHasher as _, Hasher as _, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use crate::fields::{LimitItem, Observation, PolicyItem, Unit};
use partition::{Ceiling, Partition, Statement};

/// The layer's limits on what servers can make it do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settings {
    /// The longest any statement, refusal or probe holds the scope.
    pub(crate) max_delay: Duration,
    /// The wait after a refusal that names no delay.
    pub(crate) default_retry: Duration,
    /// The largest share of a refusal's delay added as jitter, in per mille.
    pub(crate) jitter_per_mille: u32,
}

/// What a request was granted: its place in the order of sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    /// The number of requests sent in the scope when this one was, itself included.
    pub(crate) seq: u64,
    /// The requests sent before this one and unanswered when it was sent: the server may decide them after it.
    pub(crate) unsure: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    granted: Option<Ticket>,
    waker: Option<Waker>,
}

/// Why a request cannot be sent yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// Until this instant (then the scope must be looked at again).
    Until(Instant),
    /// Until an answer comes back (or a request closes).
    Answer,
}

#[derive(Debug)]
struct State {
    partitions: Vec<Partition>,
    /// No answer yet: one request at a time.
    learning: bool,
    /// Requests sent so far.
    sent: u64,
    /// Requests sent and not yet closed.
    open: u64,
    /// The tickets sent and not yet answered (nor closed).
    unanswered: BTreeSet<u64>,
    /// Closed after a refusal until then.
    closed_until: Option<Instant>,
    queue: VecDeque<Waiter>,
    next_waiter: u64,
}

/// One scope's budget. Shared by every clone of the layer's service.
#[derive(Debug)]
pub(crate) struct Scope {
    state: Mutex<State>,
    settings: Settings,
}

/// Wakers to wake once the scope's lock is released.
type Woken = Vec<Waker>;

impl Scope {
    pub(crate) fn new(settings: Settings) -> Self {
        Self {
            state: Mutex::new(State {
                partitions: Vec::new(),
                learning: true,
                sent: 0,
                open: 0,
                unanswered: BTreeSet::new(),
                closed_until: None,
                queue: VecDeque::new(),
                next_waiter: 0,
            }),
            settings,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between statements: a panic elsewhere leaves nothing half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends at once if nobody waits and the budget allows; otherwise `None`.
    pub(crate) fn try_send(&self, now: Instant) -> Option<Ticket> {
        let mut state = self.lock();
        if !state.queue.is_empty() {
            return None;
        }
        state
            .blocked(now, &self.settings)
            .is_none()
            .then(|| state.take(now))
    }

    /// Sends whatever the budget says (the user's choice after the longest wait).
    pub(crate) fn send_anyway(&self, now: Instant) -> Ticket {
        self.lock().take(now)
    }

    /// Queues a waiter; its id for [`poll_waiter`](Self::poll_waiter).
    pub(crate) fn enqueue(&self) -> u64 {
        let mut state = self.lock();
        let id = state.next_waiter;
        state.next_waiter += 1;
        state.queue.push_back(Waiter {
            id,
            granted: None,
            waker: None,
        });
        id
    }

    /// A waiter's turn: `Ok(ticket)` once granted, else when to look again (`Some` only for the head of the
    /// queue: the others are woken when they become it).
    pub(crate) fn poll_waiter(
        &self,
        id: u64,
        now: Instant,
        waker: &Waker,
    ) -> Result<Ticket, Option<Instant>> {
        let mut woken = Woken::new();
        let result = {
            let mut state = self.lock();
            state.pump(now, &self.settings, &mut woken);
            let position = state.queue.iter().position(|w| w.id == id);
            match position.map(|i| (i, state.queue[i].granted)) {
                Some((i, Some(ticket))) => {
                    state.queue.remove(i);
                    Ok(ticket)
                }
                Some((i, None)) => {
                    let waiter = &mut state.queue[i];
                    if !waiter.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                        waiter.waker = Some(waker.clone());
                    }
                    // The head is the first waiter not yet granted (granted ones stay queued until collected).
                    let head = state.queue.iter().take(i).all(|w| w.granted.is_some());
                    let next = head
                        .then(|| state.blocked(now, &self.settings))
                        .flatten()
                        .and_then(|blocked| match blocked {
                            Blocked::Until(at) => Some(at),
                            Blocked::Answer => None,
                        });
                    Err(next)
                }
                // Not queued (cannot happen: only its own future removes it): send rather than wait forever.
                None => Ok(state.take(now)),
            }
        };
        woken.into_iter().for_each(Waker::wake);
        result
    }

    /// Removes a waiter that gave up (its longest wait passed, or its future was dropped); a grant it had not
    /// collected is handed back.
    pub(crate) fn leave(&self, id: u64, now: Instant) {
        let mut woken = Woken::new();
        {
            let mut state = self.lock();
            if let Some(i) = state.queue.iter().position(|w| w.id == id) {
                if let Some(ticket) = state.queue.remove(i).and_then(|w| w.granted) {
                    // Sent nothing after all.
                    state.open -= 1;
                    state.unanswered.remove(&ticket.seq);
                }
                state.pump_news(now, &self.settings, &mut woken);
            }
        }
        woken.into_iter().for_each(Waker::wake);
    }

    /// A granted request is closed: its response body is done or dropped, or it failed.
    pub(crate) fn close(&self, ticket: Ticket, now: Instant) {
        let mut woken = Woken::new();
        {
            let mut state = self.lock();
            state.open = state.open.saturating_sub(1);
            state.unanswered.remove(&ticket.seq);
            state.pump_news(now, &self.settings, &mut woken);
        }
        woken.into_iter().for_each(Waker::wake);
    }

    /// What the answer to `ticket` said, received at `now`; `jitter` in `[0, 1)` spreads a refusal's wait.
    pub(crate) fn observe(&self, ticket: Ticket, observation: &Observation, now: Instant) {
        let mut woken = Woken::new();
        {
            let mut state = self.lock();
            state.observe(ticket, observation, now, &self.settings);
            state.pump_news(now, &self.settings, &mut woken);
        }
        woken.into_iter().for_each(Waker::wake);
    }

    /// A problem details body named these policies: each is spent until the scope opens again.
    pub(crate) fn violated(&self, ticket: Ticket, names: &[String], now: Instant) {
        let mut state = self.lock();
        let until = state
            .closed_until
            .unwrap_or(now + self.settings.default_retry);
        for p in &mut state.partitions {
            if names.contains(&p.name) {
                p.statement = Some(Statement {
                    remaining: 0,
                    seq: ticket.seq,
                    until,
                    probe: false,
                });
            }
        }
    }
}

impl State {
    /// Spends a unit of every partition: the next request is sent.
    fn take(&mut self, now: Instant) -> Ticket {
        self.sent += 1;
        self.open += 1;
        let unsure = self.unanswered.len() as u64;
        self.unanswered.insert(self.sent);
        for p in &mut self.partitions {
            if let Some(ceiling) = &mut p.ceiling {
                ceiling.spend(now);
            }
        }
        Ticket {
            seq: self.sent,
            unsure,
        }
    }

    /// Why the next request cannot be sent now, if it cannot.
    fn blocked(&mut self, now: Instant, settings: &Settings) -> Option<Blocked> {
        if let Some(until) = self.closed_until {
            if now < until {
                return Some(Blocked::Until(until));
            }
            self.closed_until = None;
        }
        if self.learning && self.open > 0 {
            return Some(Blocked::Answer);
        }
        let (sent, open) = (self.sent, self.open);
        let mut blocked = None;
        for p in &mut self.partitions {
            let this = match p.unit {
                Unit::Requests => {
                    let ceiling = p.ceiling.as_mut().and_then(|c| c.blocked(now));
                    match (requests_blocked(p, sent, now, settings), ceiling) {
                        (Some(Blocked::Until(a)), Some(b)) => Some(Blocked::Until(a.max(b))),
                        (_, Some(b)) => Some(Blocked::Until(b)),
                        (b, None) => b,
                    }
                }
                Unit::ConcurrentRequests => p.quota.filter(|&q| open >= q).map(|_| Blocked::Answer),
                Unit::Other => None,
            };
            // The latest instant any partition waits for; an answer may come sooner and is waited for too.
            blocked = match (blocked, this) {
                (None, b) | (b, None) => b,
                (Some(Blocked::Until(a)), Some(Blocked::Until(b))) => {
                    Some(Blocked::Until(a.max(b)))
                }
                (Some(Blocked::Until(a)), Some(Blocked::Answer))
                | (Some(Blocked::Answer), Some(Blocked::Until(a))) => Some(Blocked::Until(a)),
                (Some(Blocked::Answer), Some(Blocked::Answer)) => Some(Blocked::Answer),
            };
        }
        blocked
    }

    /// Grants waiters from the front of the queue while the budget allows, collecting their wakers, and wakes the
    /// new head so that it waits for the next instant.
    fn pump(&mut self, now: Instant, settings: &Settings, woken: &mut Woken) {
        let mut granted_any = false;
        let mut i = 0;
        while i < self.queue.len() {
            if self.queue[i].granted.is_some() {
                i += 1;
                continue;
            }
            if self.blocked(now, settings).is_some() {
                break;
            }
            let ticket = self.take(now);
            let waiter = &mut self.queue[i];
            waiter.granted = Some(ticket);
            woken.extend(waiter.waker.take());
            granted_any = true;
            i += 1;
        }
        if granted_any && let Some(head) = self.queue.get_mut(i) {
            woken.extend(head.waker.clone());
        }
    }

    /// [`pump`](Self::pump) after news (an answer, a close, a waiter leaving), and the head woken even when nothing
    /// was granted: it may have been waiting for an answer, and must now wait for the instant the answer names
    /// (its own wake-up is only its longest wait).
    fn pump_news(&mut self, now: Instant, settings: &Settings, woken: &mut Woken) {
        self.pump(now, settings, woken);
        if let Some(head) = self.queue.iter().find(|w| w.granted.is_none()) {
            woken.extend(head.waker.clone());
        }
    }

    fn observe(
        &mut self,
        ticket: Ticket,
        observation: &Observation,
        now: Instant,
        settings: &Settings,
    ) {
        self.learning = false;
        self.unanswered.remove(&ticket.seq);
        let horizon = now + settings.max_delay;
        let refused = observation.refusal.is_some();
        if observation.policies.is_empty() && observation.limits.is_empty() {
            if observation.refusal.is_none() {
                // Says nothing (or nothing readable): as if no field had ever been there.
                self.partitions.clear();
            }
        } else {
            for policy in &observation.policies {
                self.learn_policy(policy);
            }
            for limit in &observation.limits {
                self.learn_limit(limit, ticket, now, horizon, refused);
            }
        }
        if let Some(refusal) = observation.refusal {
            let delay = observation
                .retry_after
                .or_else(|| {
                    observation
                        .limits
                        .iter()
                        .filter(|l| l.remaining == 0)
                        .filter_map(|l| l.window)
                        .max()
                })
                .unwrap_or(settings.default_retry)
                .min(settings.max_delay);
            let until = (now + delay + jitter(delay, settings)).min(horizon);
            self.closed_until = Some(self.closed_until.map_or(until, |u| u.max(until)));
            metrics::counter!("tollgate_client_refused_total", "reason" => refusal.as_str())
                .increment(1);
        }
    }

    fn partition(&mut self, name: &str, pk: Option<&[u8]>) -> &mut Partition {
        let i = match self.partitions.iter().position(|p| p.is(name, pk)) {
            Some(i) => i,
            None => {
                self.partitions.push(Partition {
                    name: name.to_owned(),
                    pk: pk.map(<[u8]>::to_vec),
                    unit: Unit::Requests,
                    quota: None,
                    statement: None,
                    ceiling: None,
                });
                self.partitions.len() - 1
            }
        };
        &mut self.partitions[i]
    }

    fn learn_policy(&mut self, policy: &PolicyItem) {
        let p = self.partition(&policy.name, policy.pk.as_deref());
        let same = p.quota == Some(policy.quota) && p.unit == policy.unit;
        p.unit = policy.unit;
        p.quota = Some(policy.quota);
        if !same || p.ceiling.is_none() {
            // A new policy starts full; the sends so far are the server's `r` to account for.
            p.ceiling = match (policy.unit, policy.window) {
                (Unit::Requests, Some(w)) => Ceiling::new(policy.quota, w),
                _ => None,
            };
        }
    }

    /// Learns a statement from an answer; a refusal's is always the one to follow.
    fn learn_limit(
        &mut self,
        limit: &LimitItem,
        ticket: Ticket,
        now: Instant,
        horizon: Instant,
        refused: bool,
    ) {
        let sent = self.sent;
        let p = self.partition(&limit.name, limit.pk.as_deref());
        if p.unit != Unit::Requests {
            return;
        }
        let Some(window) = limit.window else {
            // No horizon (`t` absent or 0): nothing to pace by; the probe or the last statement stands.
            return;
        };
        let said = p.quota.map_or(limit.remaining, |q| limit.remaining.min(q));
        let new = Statement {
            remaining: said.saturating_sub(ticket.unsure),
            seq: ticket.seq,
            until: (now + window).min(horizon),
            probe: false,
        };
        let Some(s) = p.statement.as_mut() else {
            p.statement = Some(new);
            return;
        };
        if s.probe || now >= s.until || refused {
            *s = new;
        } else if s.seq > ticket.seq {
            // An answer to a request sent before the one the statement answered is older news.
        } else {
            // Both bounds hold if only this client spends the key: the larger one stands. The newer answer shows
            // somebody else spending when it says less than the standing bound left for the requests decided
            // between the two (each sent by now) and itself; then it is the one to follow.
            let standing = s.left(sent);
            if standing > new.left(sent) && said.saturating_add(1) >= standing {
                // The count stands; the horizon is the newer one's if later: the state it was computed from
                // holds more of this client's requests, and the probe once the count is spent must not come
                // sooner than the newest answer says a unit is back.
                s.until = s.until.max(new.until);
            } else {
                *s = new;
            }
        }
    }
}

fn requests_blocked(
    p: &mut Partition,
    sent: u64,
    now: Instant,
    settings: &Settings,
) -> Option<Blocked> {
    let s = p.statement.as_mut()?;
    if now >= s.until {
        // Over: one request probes for the next statement (itself bounded, should no answer come).
        *s = Statement {
            remaining: 1,
            seq: sent,
            until: now + settings.max_delay,
            probe: true,
        };
    }
    let spent = sent.saturating_sub(s.seq);
    if spent < s.remaining {
        return None;
    }
    Some(if s.probe {
        Blocked::Answer
    } else {
        Blocked::Until(s.until)
    })
}

/// Up to `jitter_per_mille` of `delay`, at least up to 10 ms, drawn per refusal.
fn jitter(delay: Duration, settings: &Settings) -> Duration {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let span = (delay * settings.jitter_per_mille / 1000).max(Duration::from_millis(10));
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    let fraction = (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64;
    span.mul_f64(fraction)
}

#[cfg(test)]
mod tests;
