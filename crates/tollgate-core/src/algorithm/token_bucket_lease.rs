//! Token leases on a token bucket: an instance takes a batch of tokens in one store call and spends it locally,
//! and the fleet still never admits more than `burst + rate × T` in any interval of length T.
//!
//! Beside the bucket (its content C, as [`token_bucket`] keeps it), the key holds a
//! [`LeaseBook`]: one record per instance holding a lease (the tokens it may still hold, its deadline, the number
//! of its last call) and their sum O, the **leased** tokens. Mirrored line for line by `lua/token_leases.lua`,
//! `lua/token_bucket_lease.lua` and the lease branch of `lua/token_bucket.lua`.
//!
//! # The rules
//!
//! - **C + O ≤ burst**: the refill goes into C only up to `burst − O` (the deficit is floored at O), so tokens
//!   that are out on lease are never refilled behind the instance's back.
//! - **A lease call** (one script call, the store's clock) first drops the records whose deadline has passed:
//!   O falls, C does not (the deficit is floored with the book as it was): their tokens are lost. Then it sets the
//!   caller's record to the unspent amount the caller reports — never more than the record — and grants
//!   `g = min(want, ⌊C⌋)`: C −= g, record += g, deadline = now + ttl.
//! - **A return** gives back `u = min(reported unspent, record)`: C += u, O −= record, the record is dropped.
//! - **A plain request** ([`decide`]) is the token bucket's own decision on the floored content; it sweeps
//!   expired records too, so a crashed instance's lease ends even if only plain requests follow.
//! - **A lockout** ([`lockout::lease`](super::lockout::lease)): a lease call on a locked key is made with
//!   `want` 0 (nothing granted; a report or a return still applies) and answers with the lockout's end; a refusal
//!   of a locked key writes nothing, the book's sweep included. Lease calls never start a lockout (plain denials
//!   do), and the batches granted before it are spent: their tokens left the bucket before the lockout began.
//! - **The instance** stops spending a batch at its own send instant + ttl (minus a clock-drift margin): that is
//!   before the store's deadline (the store received the call later), so a record never expires while its
//!   holder may still spend from it. Calls carry increasing numbers, and a call not above its record's is
//!   ignored: a call that timed out and landed after a later one cannot raise a record.
//! - **Every grant says what the record holds** ([`TokenLeaseGrant::held`]: the reported unspent, at most the
//!   record, plus the grant), and the instance keeps no more than that of its batch. Normally it holds less
//!   (it spent since it sent the call); more means the store lost the record — see "When the store forgets".
//!
//! # Why the fleet stays within `burst + rate × T`
//!
//! Let `u_i` be what instance i can still spend of its batch (0 after its deadline). Every rule keeps
//! `u_i ≤ record_i`: a grant adds the same to both, a report sets the record to what the instance held when it
//! sent the call (it only spent since), a return or expiry drops both. So the tokens anyone can spend,
//! P = C + Σ u_i, are at most C + O ≤ burst. Every admission — plain or from a batch — takes its cost from P. P
//! rises only by refill (at most `rate` per µs, and only while C < burst − O): grants move tokens from C to some
//! u_i, reports and expiries lower O without touching C, a return moves `u ≤ record` back into C while O falls by
//! the whole record. Over any interval [a, b] the fleet therefore admits at most P(a) + rate × (b − a) ≤
//! `burst + rate × (b − a)`: the plain path's own bound, exactly.
//!
//! # When the store forgets
//!
//! The proof assumes the store keeps what it wrote. A Redis restarted without persistence, a `FLUSHALL`, a
//! failover to a replica that had not received the last writes, or a record that expired early (the server's
//! clock stepped forward past its deadline) leaves instances holding tokens no record counts, while the bucket
//! is full again (or older): P exceeds C + O by what they hold. Each instance's next call restores the
//! invariant — its grant's `held` is what its record now holds (the grant alone, for a record that is gone),
//! and it drops the rest — so the fleet admits at most the plain path's bound through the same loss (which
//! itself starts again from a full bucket) **plus what the instances held when it happened** (each at most its
//! batch, spent until its next call). Without that drop every batch held would stay spendable beside the fresh
//! bucket until spent (each grant renews the whole batch's deadline).
//!
//! What leases cost is under-admission, bounded: a record that counts tokens its holder already spent (until
//! its next report) holds the refill cap that much lower; an instance that dies holding a batch loses it
//! (its record expires at its deadline, and the key refills from there). A lease report or return can also make
//! tokens available earlier than a denial's `retry_after` said: a deny cache entry for that key then refuses,
//! until its instant, what the returned tokens would have admitted (the same bound).
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::algorithm::token_bucket_lease::{self, LeaseBook};
//! use tollgate_core::token_lease::TokenLeaseRequest;
//! use tollgate_core::{Quota, Timestamp};
//!
//! let quota = Quota::per_second(10)?;
//! let now = Timestamp::from_micros(1_000_000_000);
//! let mut book = LeaseBook::default();
//! let ask = TokenLeaseRequest::take(1, 1, 8, Duration::from_secs(1));
//! let (grant, bucket) = token_bucket_lease::lease(None, &mut book, &quota, &ask, now);
//! assert_eq!((grant.granted, grant.remaining, book.leased), (8, 2, 8));
//! // A second later the bucket has refilled only to burst − leased: 2 tokens.
//! let later = Timestamp::from_micros(2_000_000_000 - 1);
//! let step = token_bucket_lease::decide(Some(bucket), &mut book, &quota, 1, later);
//! assert_eq!(step.decision.remaining, 1);
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

use std::time::Duration;

use super::token_bucket::{self, TokenBucketState};
use super::{Step, div_ceil};
use crate::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use crate::{Quota, Timestamp};

/// One instance's lease on a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseRecord {
    /// The instance's id.
    pub instance: u64,
    /// Tokens the instance may still hold (granted, not reported spent).
    pub amount: u64,
    /// When the record expires, µs on the store's clock.
    pub deadline: u64,
    /// The number of the instance's last call.
    pub seq: u64,
}

/// A key's leases: the records and their summary, as `lua/token_leases.lua` stores them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LeaseBook {
    /// The sum of the records' amounts (O).
    pub leased: u64,
    /// No record expires before this instant (µs): the next sweep.
    pub due: u64,
    /// The latest record deadline (µs).
    pub end: u64,
    /// The records.
    pub records: Vec<LeaseRecord>,
}

impl LeaseBook {
    /// Whether no instance holds a lease.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The instant until which the key's state matters: a full bucket (`full_at`), and every lease's tokens
    /// refilled after its deadline.
    #[must_use]
    pub fn keep_until(&self, full_at: u64, quota: &Quota) -> u64 {
        if self.records.is_empty() {
            return full_at;
        }
        let refill = div_ceil(
            self.leased * quota.token_bucket_token(),
            quota.token_bucket_rate(),
        );
        full_at.max(self.end + refill)
    }

    /// Floors `deficit` at the leased tokens and drops expired records (see `settle_leases` in
    /// `lua/token_leases.lua`); returns the floored deficit and whether the book was swept.
    fn settle(&mut self, now: u64, deficit: u64, token: u64) -> (u64, bool) {
        if self.records.is_empty() {
            return (deficit, false);
        }
        let deficit = deficit.max(self.leased * token);
        if now < self.due {
            return (deficit, false);
        }
        self.records.retain(|r| r.deadline > now);
        self.leased = self.records.iter().map(|r| r.amount).sum();
        self.due = self.records.iter().map(|r| r.deadline).min().unwrap_or(0);
        self.end = self.records.iter().map(|r| r.deadline).max().unwrap_or(0);
        (deficit, true)
    }
}

/// The bucket's deficit at `now` in fixed-point units, rebased to an empty bucket when more than that is owed
/// (as [`token_bucket::decide`] does); and whether it was rebased.
fn deficit(bucket: Option<TokenBucketState>, quota: &Quota, now: u64) -> (u64, bool) {
    let capacity = quota.burst() * quota.token_bucket_token();
    let Some(s) = bucket.filter(|s| s.full_at > now) else {
        return (0, false);
    };
    match (s.full_at - now)
        .checked_mul(quota.token_bucket_rate())
        .map(|owed| owed.saturating_sub(s.remainder))
    {
        Some(owed) if owed <= capacity => (owed, false),
        _ => (capacity, true),
    }
}

/// The state whose deficit at `now` is `deficit`.
fn state_at(deficit: u64, quota: &Quota, now: u64) -> TokenBucketState {
    let rate = quota.token_bucket_rate();
    let wait = div_ceil(deficit, rate);
    TokenBucketState {
        full_at: now + wait,
        remainder: wait * rate - deficit,
    }
}

/// Decides one plain request of `cost` tokens at `now` on a bucket whose key has leases in `book` (which this
/// updates: expired records are dropped). Without leases it is [`token_bucket::decide`].
#[must_use]
pub fn decide(
    bucket: Option<TokenBucketState>,
    book: &mut LeaseBook,
    quota: &Quota,
    cost: u64,
    now: Timestamp,
) -> Step<TokenBucketState> {
    if book.is_empty() {
        return token_bucket::decide(bucket, quota, cost, now);
    }
    let now = now.min(Timestamp::LATEST);
    let at = now.as_micros();
    let (raw, rebased) = deficit(bucket, quota, at);
    let (floored, swept) = book.settle(at, raw, quota.token_bucket_token());
    let state = if floored != raw || swept || rebased {
        state_at(floored, quota, at)
    } else {
        bucket.unwrap_or(TokenBucketState {
            full_at: at,
            remainder: 0,
        })
    };
    let step = token_bucket::decide(Some(state), quota, cost, now);
    Step {
        decision: step.decision,
        state: step.state.or((rebased || swept).then_some(state)),
    }
}

/// Answers one lease call at `now` (see the [module docs](self)): the grant, and the bucket's new state.
#[must_use]
pub fn lease(
    bucket: Option<TokenBucketState>,
    book: &mut LeaseBook,
    quota: &Quota,
    request: &TokenLeaseRequest,
    now: Timestamp,
) -> (TokenLeaseGrant, TokenBucketState) {
    let now = now.min(Timestamp::LATEST).as_micros();
    let token = quota.token_bucket_token();
    let rate = quota.token_bucket_rate();
    let capacity = quota.burst() * token;
    let want = request.want.min(quota.burst());
    let (raw, _) = deficit(bucket, quota, now);
    let (mut deficit, _) = book.settle(now, raw, token);
    let index = book
        .records
        .iter()
        .position(|r| r.instance == request.instance);
    let record = index.map(|i| book.records[i]);
    let stale = record.is_some_and(|r| request.seq <= r.seq);
    let mut granted = 0;
    let mut deadline = record.map_or(0, |r| r.deadline);
    let mut held = record.map_or(0, |r| r.amount);
    if !stale {
        let amount = record.map_or(0, |r| r.amount);
        // What the caller reports left is what its record still counts; the rest was spent, and stays spent.
        let left = request.unspent.min(amount);
        book.leased -= amount;
        if let Some(i) = index {
            book.records.remove(i);
        }
        held = 0;
        if request.end {
            deficit -= left * token;
        } else {
            granted = want.min((capacity - deficit) / token);
            deficit += granted * token;
            deadline = now + duration_micros(request.ttl);
            book.leased += left + granted;
            book.due = if book.records.is_empty() {
                deadline
            } else {
                book.due.min(deadline)
            };
            book.end = book.end.max(deadline);
            held = left + granted;
            book.records.push(LeaseRecord {
                instance: request.instance,
                amount: left + granted,
                deadline,
                seq: request.seq,
            });
        }
        if book.records.is_empty() {
            *book = LeaseBook::default();
        }
    }
    let state = state_at(deficit, quota, now);
    let retry_after = (granted < want && !request.end && !stale)
        .then(|| Duration::from_micros(div_ceil(deficit - (capacity - want * token), rate)));
    let grant = TokenLeaseGrant {
        granted,
        remaining: (capacity - deficit) / token,
        reset: Timestamp::from_micros(state.full_at),
        retry_after,
        now: Timestamp::from_micros(now),
        expires: Timestamp::from_micros(deadline),
        window_start: 0,
        stale,
        held,
    };
    (grant, state)
}

/// A lease's lifetime in whole µs, capped so that `now + ttl` stays an exact integer in Lua's doubles.
pub(crate) fn duration_micros(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_micros())
        .unwrap_or(u64::MAX)
        .min(Timestamp::LATEST.as_micros())
}
