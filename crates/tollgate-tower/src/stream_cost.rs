//! Costs known only as the response streams (LLM tokens): reserve, debit, settle, refund — on the one rate limiter.
//!
//! A limiter charged with [`CostAfter::Streamed`](crate::CostAfter::Streamed) reserves the request's cost up front
//! (its [`cost`](crate::RateLimitLayer::cost): an estimate, say the body's `max_tokens`), and hands the response a
//! [`StreamCharges`] ledger. A body meter further out (`tollgate_http::stream`) reports what the body has streamed
//! so far; the ledger debits what goes beyond the reservation, in batches (every [`Streamed::batch`] tokens or
//! interval, whichever comes first), and settles to the real total at the end — refunding what was reserved and
//! not spent, charging the excess. A stream that fails or whose client goes away is settled at what it streamed.
//!
//! When a debit finds the key's budget spent, the limiter's [`Exhausted`] setting decides: `Finish` lets the stream
//! finish, and the overdraft is a debt the key's next requests pay first (they are refused until it is repaid);
//! `Cut` tells the body to end the stream cleanly at its next chunk.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_tower::CostAfter;
//! use tollgate_tower::stream_cost::{Exhausted, Streamed, Tokens};
//!
//! // Output tokens, cut at the budget, debited every 50 tokens or 200 ms.
//! let streamed = Streamed::new(Tokens::Output)
//!     .on_exhausted(Exhausted::Cut)
//!     .batch(50, Duration::from_millis(200));
//! let source = CostAfter::Streamed(streamed);
//! # let _ = source;
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tollgate_core::{Decision, Name, Timestamp};

use crate::limit::charger::{Charger, KeyPool};

/// Which of a stream's counts a limiter spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tokens {
    /// The request's (prompt) tokens.
    Input,
    /// The response's (completion) tokens.
    Output,
    /// Both.
    Total,
}

impl Tokens {
    /// This count of `usage`.
    #[must_use]
    pub const fn of(self, usage: Usage) -> u64 {
        match self {
            Self::Input => usage.input,
            Self::Output => usage.output,
            Self::Total => usage.input.saturating_add(usage.output),
        }
    }
}

/// What a limiter does when a debit finds its key's budget spent while the response still streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Exhausted {
    /// The stream finishes; the overdraft is a debt the key's next requests pay first (refused until repaid;
    /// the debt's floor is the store's, see [`Store::charge`](tollgate_core::Store::charge)).
    #[default]
    Finish,
    /// The stream ends cleanly at its next chunk (the body meter writes how: an SSE `event: error`, a gRPC
    /// `RESOURCE_EXHAUSTED` status in the trailers).
    Cut,
}

/// A stream's counts so far, or in all: tokens in and out, as a body meter reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
}

/// How a limiter charges a response that streams: which count it spends, what it does at its budget, and how its
/// debits are batched (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Streamed {
    tokens: Tokens,
    on_exhausted: Exhausted,
    batch: u64,
    every: Duration,
}

impl Streamed {
    /// Spends `tokens`; finishes a stream at the budget ([`Exhausted::Finish`]); debits every 100 tokens beyond
    /// the reservation or every 250 ms, whichever comes first.
    #[must_use]
    pub const fn new(tokens: Tokens) -> Self {
        Self {
            tokens,
            on_exhausted: Exhausted::Finish,
            batch: 100,
            every: Duration::from_millis(250),
        }
    }

    /// What to do when the budget runs out mid-stream.
    #[must_use]
    pub const fn on_exhausted(mut self, exhausted: Exhausted) -> Self {
        self.on_exhausted = exhausted;
        self
    }

    /// Debits once `tokens` (at least 1) have streamed beyond what was charged, or `every` after the last debit
    /// with any streamed, whichever comes first: one store call per batch, not per chunk.
    #[must_use]
    pub const fn batch(mut self, tokens: u64, every: Duration) -> Self {
        self.batch = if tokens == 0 { 1 } else { tokens };
        self.every = every;
        self
    }

    /// The count this limiter spends.
    #[must_use]
    pub const fn tokens(&self) -> Tokens {
        self.tokens
    }

    /// What it does when the budget runs out mid-stream.
    #[must_use]
    pub const fn exhausted(&self) -> Exhausted {
        self.on_exhausted
    }

    /// Its batch: tokens, and the longest time between debits.
    #[must_use]
    pub const fn batch_size(&self) -> (u64, Duration) {
        (self.batch, self.every)
    }
}

/// The response extension a streamed limiter leaves for the body meter: every streamed limiter's charge on one
/// request. The meter reports the running counts ([`count`](Self::count)), asks whether a limiter that cuts has
/// found its budget spent ([`cut_by`](Self::cut_by)), and settles at the end ([`settle`](Self::settle)). Dropped
/// unsettled (the client went away, the body was dropped), it settles what was counted; never counted (no meter
/// around the limiter), the reservation stands.
#[derive(Default)]
pub struct StreamCharges {
    charges: Vec<StreamCharge>,
    counted: Option<Usage>,
}

impl fmt::Debug for StreamCharges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamCharges")
            .field("limiters", &self.charges.len())
            .field("counted", &self.counted)
            .finish()
    }
}

impl Clone for StreamCharges {
    /// A clone holds no charge: a ledger is settled once, by the response that carries it.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl StreamCharges {
    pub(crate) fn push(&mut self, charge: StreamCharge) {
        self.charges.push(charge);
    }

    /// Whether no limiter charges this response as it streams.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.charges.is_empty()
    }

    /// The stream's counts so far (running totals, not increments): debits each limiter whose batch is due.
    pub fn count(&mut self, usage: Usage) {
        self.counted = Some(usage);
        let now = Instant::now();
        for charge in &mut self.charges {
            charge.count(usage, now);
        }
    }

    /// The first limiter that cuts streams ([`Exhausted::Cut`], enforcing) and whose budget a debit found spent:
    /// the body should end the stream at its next chunk.
    #[must_use]
    pub fn cut_by(&self) -> Option<&Name> {
        self.charges
            .iter()
            .find(|c| c.cuts() && c.pool.exhausted.load(Ordering::Acquire))
            .map(|c| c.charger.limiter())
    }

    /// Settles every limiter to the stream's real totals: refunds what was reserved and not spent, charges the
    /// excess. `cut`: the stream was cut at a budget (counted in the metrics). Later calls do nothing.
    pub fn settle(&mut self, real: Usage, cut: bool) {
        self.counted = None;
        let cut_by = if cut { self.cut_by().cloned() } else { None };
        for charge in self.charges.drain(..) {
            let was_cut = cut_by.as_ref() == Some(charge.charger.limiter());
            charge.finish(Some(real), was_cut);
        }
    }
}

impl Drop for StreamCharges {
    /// Settles what was counted; a ledger never counted leaves its key's pool with the reservation standing.
    fn drop(&mut self) {
        let counted = self.counted.take();
        for charge in self.charges.drain(..) {
            charge.finish(counted, false);
        }
    }
}

/// One limiter's charge on a streaming response: what it has accounted for (its reservation, then what it handed
/// its key's pool to debit), in the pool of the key's streams on this instance.
pub(crate) struct StreamCharge {
    charger: Arc<dyn Charger>,
    key: String,
    streamed: Streamed,
    accounted: u64,
    decided_at: Timestamp,
    pool: Arc<KeyPool>,
}

impl StreamCharge {
    /// A charge for a request `charged` up front (0 for one admitted over the limit in shadow mode), admitted
    /// with `left` remaining after it (when known).
    pub(crate) fn new(
        charger: Arc<dyn Charger>,
        key: String,
        streamed: Streamed,
        charged: u64,
        decided_at: Timestamp,
        left: Option<u64>,
    ) -> Self {
        let pool = charger.pools().join(&key, left);
        Self {
            charger,
            key,
            streamed,
            accounted: charged,
            decided_at,
            pool,
        }
    }

    fn cuts(&self) -> bool {
        self.streamed.on_exhausted == Exhausted::Cut && self.charger.enforcing()
    }

    /// Hands what streamed beyond this charge to the key's pool, and debits the pool when its batch is due.
    fn count(&mut self, usage: Usage, now: Instant) {
        let seen = self.streamed.tokens.of(usage);
        let more = seen.saturating_sub(self.accounted);
        if more == 0 {
            return;
        }
        self.accounted = seen;
        self.add(i64::try_from(more).unwrap_or(i64::MAX), now);
    }

    /// Adds `delta` to the key's pool and debits the pool when due: a batch's worth, the key's budget met as this
    /// instance knows it (for a limiter that cuts, the key's streams are then cut at once, without waiting for the
    /// store's answer), or the interval since the last debit.
    fn add(&self, delta: i64, now: Instant) {
        let mut state = self.pool.state();
        state.pending = state.pending.saturating_add(delta);
        if state.left != u64::MAX {
            state.left = if delta >= 0 {
                state.left.saturating_sub(delta.unsigned_abs())
            } else {
                state.left.saturating_add(delta.unsigned_abs())
            };
        }
        // Only a limiter that cuts acts on it: one that lets streams finish keeps its batches.
        let met = delta > 0 && state.left == 0 && self.cuts();
        if met {
            self.pool.exhausted.store(true, Ordering::Release);
        }
        let due = !state.in_flight
            && state.pending != 0
            && (met
                || state.pending.unsigned_abs() >= self.streamed.batch
                || now.duration_since(state.last) >= self.streamed.every);
        if !due {
            return;
        }
        let amount = std::mem::take(&mut state.pending);
        state.in_flight = true;
        state.last = now;
        drop(state);
        let pool = self.pool.clone();
        self.charger.debit(
            self.key.clone(),
            amount,
            self.decided_at,
            Box::new(move |after: Option<Decision>| {
                let mut state = pool.state();
                state.in_flight = false;
                if let Some(after) = after {
                    // What streamed while the debit was on its way is not in the answer.
                    let since = u64::try_from(state.pending).unwrap_or(0);
                    state.left = after.remaining.saturating_sub(since);
                    let spent = !after.is_allowed() || state.left == 0;
                    pool.exhausted.store(spent, Ordering::Release);
                }
            }),
        );
    }

    /// Hands the key's pool the difference between the real total and what this charge accounted for (a refund
    /// if negative); the pool's last stream debits what the pool still owes, without waiting. Counts a cut
    /// stream, and a stream that ends while its key's budget is spent (a debt, when streams finish).
    /// `real: None` (never counted): nothing more is charged, the reservation stands.
    fn finish(self, real: Option<Usage>, cut: bool) {
        if let Some(real) = real {
            let real = self.streamed.tokens.of(real);
            let delta = i64::try_from(real)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(self.accounted).unwrap_or(i64::MAX));
            self.add(delta, Instant::now());
        }
        let limiter = self.charger.limiter();
        if cut {
            metrics::counter!(crate::observe::STREAMS_CUT_TOTAL, "limiter" => limiter.to_string())
                .increment(1);
        } else if self.pool.exhausted.load(Ordering::Acquire) {
            metrics::counter!(crate::observe::STREAMS_IN_DEBT_TOTAL, "limiter" => limiter.to_string())
                .increment(1);
        }
        let owed = self.charger.pools().leave(&self.key);
        if owed != 0 {
            self.charger
                .debit(self.key, owed, self.decided_at, Box::new(|_| {}));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tollgate_core::Outcome;

    use super::*;
    use crate::limit::charger::StreamPools;

    /// A limiter of 100 tokens that answers every debit at once and records it.
    #[derive(Default)]
    struct Ledger {
        pools: StreamPools,
        debits: Mutex<Vec<i64>>,
        left: Mutex<i64>,
    }

    impl Charger for Ledger {
        fn charge(&self, _: String, _: i64, _: Timestamp) {}
        fn charge_moves_reset(&self) -> bool {
            true
        }
        fn limiter(&self) -> &Name {
            static NAME: std::sync::OnceLock<Name> = std::sync::OnceLock::new();
            NAME.get_or_init(|| Name::from("tokens"))
        }
        fn enforcing(&self) -> bool {
            true
        }
        fn debit(
            &self,
            _: String,
            delta: i64,
            decided_at: Timestamp,
            done: Box<dyn FnOnce(Option<Decision>) + Send>,
        ) {
            self.debits.lock().unwrap().push(delta);
            let mut left = self.left.lock().unwrap();
            *left -= delta;
            done(Some(Decision {
                outcome: if *left >= 0 {
                    Outcome::Allowed
                } else {
                    Outcome::Limited
                },
                limit: 100,
                remaining: u64::try_from(*left).unwrap_or(0),
                reset: decided_at,
                retry_after: None,
                now: decided_at,
            }));
        }
        fn pools(&self) -> &StreamPools {
            &self.pools
        }
    }

    fn ledger(charger: &Arc<Ledger>, streams: usize, cut: bool) -> StreamCharges {
        let streamed = Streamed::new(Tokens::Output)
            .on_exhausted(if cut {
                Exhausted::Cut
            } else {
                Exhausted::Finish
            })
            .batch(10, Duration::from_secs(60));
        let mut charges = StreamCharges::default();
        for _ in 0..streams {
            let charger: Arc<dyn Charger> = charger.clone();
            charges.push(StreamCharge::new(
                charger,
                "k".to_owned(),
                streamed,
                16,
                Timestamp::from_micros(1),
                Some(100 - 16),
            ));
        }
        charges
    }

    fn output(n: u64) -> Usage {
        Usage {
            input: 0,
            output: n,
        }
    }

    #[test]
    fn a_ledger_never_counted_leaves_its_pool_and_charges_nothing() {
        let charger = Arc::new(Ledger::default());
        *charger.left.lock().unwrap() = 84;
        drop(ledger(&charger, 2, false));
        assert_eq!(charger.pools.len(), 0, "the key's pool is gone");
        assert!(charger.debits.lock().unwrap().is_empty());
    }

    #[test]
    fn debits_are_batched_and_the_end_settles_the_rest() {
        let charger = Arc::new(Ledger::default());
        *charger.left.lock().unwrap() = 84;
        let mut charges = ledger(&charger, 1, false);
        for n in 1..=45 {
            charges.count(output(n));
        }
        // 16 reserved: 29 more streamed, debited 10 at a time.
        assert_eq!(*charger.debits.lock().unwrap(), [10, 10]);
        charges.settle(output(45), false);
        assert_eq!(*charger.debits.lock().unwrap(), [10, 10, 9]);
        assert_eq!(charger.pools.len(), 0);
        drop(charges);
        assert_eq!(charger.debits.lock().unwrap().len(), 3, "settled once");
    }

    #[test]
    fn an_unspent_reservation_is_refunded() {
        let charger = Arc::new(Ledger::default());
        let mut charges = ledger(&charger, 1, false);
        charges.count(output(4));
        drop(charges);
        assert_eq!(*charger.debits.lock().unwrap(), [-12]);
    }

    #[test]
    fn a_cutting_limiter_cuts_at_the_budget_it_knows() {
        let charger = Arc::new(Ledger::default());
        *charger.left.lock().unwrap() = 84;
        let mut charges = ledger(&charger, 1, true);
        let mut streamed = 0;
        while charges.cut_by().is_none() {
            streamed += 1;
            charges.count(output(streamed));
            assert!(streamed <= 200, "never cut");
        }
        assert_eq!(streamed, 100, "cut at exactly the budget");
        charges.settle(output(streamed), true);
        assert_eq!(charger.debits.lock().unwrap().iter().sum::<i64>(), 84);
    }
}
