//! A partition of a scope's budget: what the server last stated of it, and the ceiling its quota sets on sends.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::fields::Unit;

#[derive(Debug)]
pub(super) struct Statement {
    /// Units available when the answered request was decided.
    pub(super) remaining: u64,
    /// The answered request's [`Ticket::seq`].
    pub(super) seq: u64,
    /// Until when `remaining` holds.
    pub(super) until: Instant,
    /// A probe's statement: one request, until its answer.
    pub(super) probe: bool,
}

impl Statement {
    /// What the statement still allows once `sent` requests were sent in the scope.
    pub(super) const fn left(&self, sent: u64) -> u64 {
        self.remaining.saturating_sub(sent.saturating_sub(self.seq))
    }
}

/// The announced policy as a ceiling: no more than `q` requests sent within any `w`, whatever the algorithm behind
/// it (a token bucket would take a burst of `q` then `q` per `w`; a window takes no more than `q` in any `w`, so
/// the window's rule is the one that never gets a client refused). The sends of the last `w` are kept in at most
/// [`Ceiling::STEPS`] + 1 steps: the sends within `w / STEPS` of a step's first share it, and it leaves the window
/// with the latest of them, so a send is only ever forgotten late (by at most `w / STEPS`), never early.
#[derive(Debug)]
pub(super) struct Ceiling {
    pub(super) quota: u64,
    pub(super) window: Duration,
    /// `window / STEPS`: the closest two steps may be.
    step: Duration,
    /// The steps, oldest first.
    steps: VecDeque<Step>,
    /// The sends in `steps`.
    pub(super) sent: u64,
}

impl Ceiling {
    /// The steps a window is kept in.
    pub(super) const STEPS: u32 = 64;

    pub(super) fn new(quota: u64, window: Duration) -> Option<Self> {
        (quota > 0 && !window.is_zero()).then(|| Self {
            quota,
            window,
            step: window / Self::STEPS,
            steps: VecDeque::new(),
            sent: 0,
        })
    }

    /// Forgets the steps that left the window.
    fn expire(&mut self, now: Instant) {
        while let Some(step) = self.steps.front() {
            if step.latest + self.window > now {
                break;
            }
            self.sent -= step.sends;
            self.steps.pop_front();
        }
    }

    /// When a send is allowed again, if not now.
    pub(super) fn blocked(&mut self, now: Instant) -> Option<Instant> {
        self.expire(now);
        let mut left = self.sent;
        for step in &self.steps {
            if left < self.quota {
                break;
            }
            left -= step.sends;
            // Below the quota once this step has left the window.
            if left < self.quota {
                return Some(step.latest + self.window);
            }
        }
        None
    }

    pub(super) fn spend(&mut self, now: Instant) {
        self.expire(now);
        self.sent += 1;
        match self.steps.back_mut() {
            Some(step) if now.saturating_duration_since(step.first) < self.step => {
                step.latest = step.latest.max(now);
                step.sends += 1;
            }
            _ => self.steps.push_back(Step {
                first: now,
                latest: now,
                sends: 1,
            }),
        }
    }
}

/// Sends of a [`Ceiling`] close together.
#[derive(Debug)]
struct Step {
    first: Instant,
    latest: Instant,
    sends: u64,
}

#[derive(Debug)]
pub(super) struct Partition {
    pub(super) name: String,
    pub(super) pk: Option<Vec<u8>>,
    pub(super) unit: Unit,
    pub(super) quota: Option<u64>,
    pub(super) statement: Option<Statement>,
    pub(super) ceiling: Option<Ceiling>,
}

impl Partition {
    pub(super) fn is(&self, name: &str, pk: Option<&[u8]>) -> bool {
        self.name == name && self.pk.as_deref() == pk
    }
}
