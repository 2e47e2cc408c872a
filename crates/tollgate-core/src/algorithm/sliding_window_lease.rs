//! Token leases on a sliding window counter: an instance takes k slots of the current window in one store call
//! and spends them locally before the window ends. Mirrored line for line by `lua/sliding_window_lease.lua`.
//!
//! # The rules
//!
//! - **A lease** of k slots adds k to the current window's count, as k admitted requests would, and only if
//!   the estimate plus k stays within the limit (the store grants the most that fits, up to `want`).
//! - **A batch is spent in the window it is counted in**: its deadline is the end of that window (the instance
//!   measures it from its send instant, so it ends earlier than the store's window, less a clock-drift margin).
//! - **Each instance has a record** in the key ([`WindowBook`]): the slots the current window counts for it
//!   (granted, less given back) and those the window before counts for it. Every grant says the first
//!   ([`TokenLeaseGrant::held`]), and the instance keeps no more than that of its batch.
//! - **A return** takes unspent slots off the count of the window they were granted in, if that is still the
//!   current or the previous window (older counts no longer matter), never more than the caller's record
//!   counts there.
//! - **A lockout** ([`lockout::lease`](super::lockout::lease)): a lease call on a locked key grants nothing
//!   (returns still apply) and answers with the lockout's end; batches counted before it are spent in their
//!   window.
//!
//! # Why it is exact
//!
//! The sliding window counter's state is per window: a request counted at t0 and one counted at t' in the same
//! window weigh the same in every later estimate. A leased slot spent at t' (same window) is therefore, for
//! every later decision, the plain request it stands for, counted at the lease's instant; and the plain path
//! would have admitted it at t' too, because the estimate of a window with a given count only falls as time
//! passes (the previous window's weight decays), and the lease was granted only where it fit. Decisions made
//! while unspent slots were still counted were stricter than needed; a return makes the counts what plain
//! requests alone would have left. So the fleet admits no request the plain path could not, and what leases
//! cost is bounded under-admission: slots counted but not spent (an instance that dies holding a batch, or
//! whose return is lost) until their window leaves the estimate.
//!
//! # When the store forgets
//!
//! The argument assumes the store keeps its counts. After a Redis restart without persistence, a `FLUSHALL` or
//! a failover to a replica that missed the last writes, instances hold slots the window no longer counts. The
//! records make that visible: a grant's `held` counts only what the store still counts for the caller (the
//! grant alone, when its record is gone), the instance drops the rest, and a return never takes off more than
//! the caller's record counts (it would otherwise lower counts that never held those slots). So the fleet
//! admits at most what the plain path admits through the same loss (which itself starts again from an empty
//! window) **plus what the instances held when it happened**, spent until each one's next call.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::algorithm::sliding_window_lease::{self, WindowBook};
//! use tollgate_core::token_lease::TokenLeaseRequest;
//! use tollgate_core::{Policy, Quota, Timestamp};
//!
//! let policy = Policy::sliding_window(Quota::per_second(10)?)?;
//! let now = Timestamp::from_micros(1_000_250_000);
//! let mut book = WindowBook::default();
//! let ask = TokenLeaseRequest::take(1, 1, 6, Duration::from_secs(1));
//! let (grant, state) = sliding_window_lease::lease(None, &mut book, &policy, &ask, now);
//! assert_eq!((grant.granted, grant.remaining, grant.held), (6, 4, 6));
//! assert_eq!(grant.expires, Timestamp::from_micros(1_001_000_000)); // the window's end
//! // Two slots were not spent: returned, the window counts 4.
//! let back = ask.next(2).ending(2).holding(2, grant.window_start);
//! let (done, state) = sliding_window_lease::lease(state, &mut book, &policy, &back, now);
//! assert_eq!((state.map(|s| s.current), done.held), (Some(4), 4));
//! // Had the store forgotten the key (a restart), the next grant would hold only itself: an instance still
//! // holding 6 keeps min(6 + 6, 6).
//! let (fresh, _) = sliding_window_lease::lease(None, &mut WindowBook::default(), &policy, &ask.next(3), now);
//! assert_eq!((fresh.granted, fresh.held), (6, 6));
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

use std::time::Duration;

use super::sliding_window::SlidingWindowState;
use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Policy, Timestamp};

/// One instance's slots in a key, as the store counts them (`l:<id>` in the key's hash:
/// `window_start:amount:previous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowRecord {
    /// The instance's id.
    pub instance: u64,
    /// The start of the window the record was written in (µs).
    pub window_start: u64,
    /// Slots that window counts for the instance: granted, less given back.
    pub amount: u64,
    /// Slots the window before it counts for the instance, less given back.
    pub previous: u64,
}

impl WindowRecord {
    /// The slots (this window's, the previous window's) the record counts as of the window starting at
    /// `start`: a record one window old counts only in the previous one, an older record nowhere.
    #[must_use]
    pub const fn at(&self, start: u64, period: u64) -> (u64, u64) {
        if self.window_start == start {
            (self.amount, self.previous)
        } else if self.window_start + period == start {
            (0, self.amount)
        } else {
            (0, 0)
        }
    }
}

/// A key's lease records, as `lua/sliding_window_lease.lua` keeps them in the key's hash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct WindowBook {
    /// The start of the window the records were last swept in (`lease_w`): records that count nothing any more
    /// are dropped once per window.
    pub swept: u64,
    /// The records.
    pub records: Vec<WindowRecord>,
}

impl WindowBook {
    /// Whether no instance has a record.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Whether no record counts anything as of the window starting at `start`.
    #[must_use]
    pub fn is_spent(&self, start: u64, period: u64) -> bool {
        self.records.iter().all(|r| r.at(start, period) == (0, 0))
    }
}

/// Answers one lease call at `now`: the grant, and the new state when it changed. `book` holds the key's
/// records (a key without state has none: a book left from a state the store dropped is cleared).
#[must_use]
pub fn lease(
    state: Option<SlidingWindowState>,
    book: &mut WindowBook,
    policy: &Policy,
    request: &TokenLeaseRequest,
    now: Timestamp,
) -> (TokenLeaseGrant, Option<SlidingWindowState>) {
    if state.is_none() {
        // The records live in the key's state: with it gone, so are they.
        *book = WindowBook::default();
    }
    let quota = policy.quota();
    let limit = quota.limit();
    let period = quota.period_micros();
    let tick = policy.tick_micros();
    let ticks = period / tick;
    let want = request.want.min(limit);
    // As sliding_window::decide: after a clock step back the window decides as of its stored start.
    let clock = now.min(Timestamp::LATEST).as_micros();
    let mut now = clock;
    let mut start = now - now % period;
    let (mut previous, mut current) = (0, 0);
    if let Some(s) = state {
        if s.window_start > start {
            now = s.window_start;
            start = s.window_start;
        }
        if s.window_start == start {
            (previous, current) = (s.previous, s.current);
        } else if s.window_start + period == start {
            previous = s.current;
        }
    }
    let index = book
        .records
        .iter()
        .position(|r| r.instance == request.instance);
    let (mut mine, mut mine_previous) = index.map_or((0, 0), |i| book.records[i].at(start, period));
    let mut changed = false;
    if request.unspent > 0 {
        // Only what the caller's record counts there comes off: after the store lost state, nothing.
        if request.window_start == start {
            let back = request.unspent.min(mine).min(current);
            current -= back;
            mine -= back;
            changed = true;
        } else if request.window_start + period == start {
            let back = request.unspent.min(mine_previous).min(previous);
            previous -= back;
            mine_previous -= back;
            changed = true;
        }
    }
    let elapsed = (now - start) / tick;
    let weighted_previous = previous * (ticks - elapsed);
    // The most slots k with current + k + previous × (ticks − elapsed) / ticks ≤ limit.
    let granted = (limit * ticks)
        .checked_sub(current * ticks + weighted_previous)
        .map_or(0, |room| want.min(room / ticks));
    if granted > 0 {
        current += granted;
        mine += granted;
        changed = true;
    }
    if changed {
        book.write(request.instance, index, start, period, mine, mine_previous);
    }
    let retry_after = (granted < want).then(|| {
        let admit_at = if current + want <= limit {
            start + (ticks - (limit - current - want) * ticks / previous) * tick
        } else {
            start + period + (ticks - (limit - want) * ticks / current) * tick
        };
        Duration::from_micros(admit_at - clock)
    });
    let used = current * ticks + previous * (ticks - elapsed);
    let new_state = SlidingWindowState {
        window_start: start,
        previous,
        current,
    };
    let grant = TokenLeaseGrant {
        granted,
        remaining: (limit * ticks).saturating_sub(used) / ticks,
        reset: Timestamp::from_micros(new_state.reset(period, clock)),
        retry_after,
        now: Timestamp::from_micros(clock),
        expires: Timestamp::from_micros(start + period),
        window_start: start,
        stale: false,
        held: mine,
    };
    (grant, changed.then_some(new_state))
}

impl WindowBook {
    /// Sets the caller's record (record `index`, if it has one) as of the window starting at `start`, dropped
    /// when it counts nothing; once per window, drops the records that count nothing any more.
    fn write(
        &mut self,
        instance: u64,
        index: Option<usize>,
        start: u64,
        period: u64,
        amount: u64,
        previous: u64,
    ) {
        let record = WindowRecord {
            instance,
            window_start: start,
            amount,
            previous,
        };
        match (index, amount + previous > 0) {
            (Some(i), true) => self.records[i] = record,
            (Some(i), false) => {
                self.records.swap_remove(i);
            }
            (None, true) => self.records.push(record),
            (None, false) => {}
        }
        if self.swept < start {
            self.swept = start;
            self.records.retain(|r| r.window_start + period >= start);
        }
    }
}
