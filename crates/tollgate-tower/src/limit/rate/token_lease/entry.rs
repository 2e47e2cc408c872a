//! One key's lease state in the table: its demand, its batch, and the fetch its requests wait for.

use std::sync::{Arc, OnceLock};

use event_listener::Event;
use tollgate_core::store::Expiry;
use tollgate_core::{StoreError, Timestamp};

/// One key's lease state (or, for a cold key, only its demand).
pub(super) struct Entry {
    pub(super) check: u64,
    /// The key's text, once it leases (fetches and returns need it).
    pub(super) key: Option<Box<str>>,
    /// Local demand: tokens asked in the epoch starting at `epoch`, and in the one before.
    pub(super) epoch: u64,
    pub(super) demand: u64,
    pub(super) last_demand: u64,
    pub(super) last_use: u64,
    /// The batch: unspent tokens, spendable until `deadline` (local µs).
    pub(super) tokens: u64,
    pub(super) deadline: u64,
    /// Sliding window: the window the batch is counted in, and an earlier batch's leftovers to give back.
    pub(super) window_start: u64,
    pub(super) leftover: u64,
    pub(super) leftover_window: u64,
    /// The last fetch: the store's figures, and the local instant it was sent at.
    pub(super) global: u64,
    pub(super) reset: Timestamp,
    pub(super) store_now: Timestamp,
    pub(super) sent: u64,
    pub(super) fetching: bool,
    /// No fetch before this local instant; refuse locally until `denied_until` when the batch cannot pay.
    pub(super) next_fetch: u64,
    pub(super) denied_until: u64,
    /// What requests that wait for the fetch under way listen on (made by the first of them).
    pub(super) landing: Option<Arc<Landing>>,
    /// The remaining this instance last showed for the key (fixed point: `Inner::token` units per token), when,
    /// and whether the store's last answer left less than a batch unheld (no credit for refill then): see
    /// "Headers under leases".
    pub(super) shown: Option<u64>,
    pub(super) shown_at: u64,
    pub(super) exhausted: bool,
}

/// A fetch that requests wait for: woken when it lands, with its error if it failed.
#[derive(Default)]
pub(super) struct Landing {
    pub(super) landed: Event,
    pub(super) failure: OnceLock<StoreError>,
}

impl Landing {
    /// The fetch is over (`failure` if it failed): the waiters look at the entry again.
    pub(super) fn land(&self, failure: Option<StoreError>) {
        if let Some(err) = failure {
            let _ = self.failure.set(err);
        }
        self.landed.notify(usize::MAX);
    }
}

/// A copy of a fetch's error for each request that waited on it (the error itself is not `Clone`).
pub(super) fn copy_error(err: &StoreError) -> StoreError {
    match err {
        StoreError::KeyCapacity { max_keys } => StoreError::KeyCapacity {
            max_keys: *max_keys,
        },
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::CircuitOpen => StoreError::CircuitOpen,
        StoreError::Unsupported(what) => StoreError::Unsupported(what),
        StoreError::Backend(e) => StoreError::Backend(format!("token lease fetch: {e}").into()),
        other => StoreError::Backend(format!("token lease fetch: {other}").into()),
    }
}

impl Expiry for Entry {
    fn expires_at(&self) -> u64 {
        if self.fetching {
            return u64::MAX;
        }
        self.last_use
            .saturating_add(1)
            .max(if self.tokens > 0 { self.deadline } else { 0 })
    }
}

impl Entry {
    pub(super) fn cold(check: u64, cost: u64, now: u64) -> Self {
        Self {
            check,
            key: None,
            epoch: now,
            demand: cost,
            last_demand: 0,
            last_use: now,
            tokens: 0,
            deadline: 0,
            window_start: 0,
            leftover: 0,
            leftover_window: 0,
            global: 0,
            reset: Timestamp::from_micros(0),
            store_now: Timestamp::from_micros(0),
            sent: 0,
            fetching: false,
            next_fetch: 0,
            denied_until: 0,
            landing: None,
            shown: None,
            shown_at: 0,
            exhausted: false,
        }
    }

    /// The store's instant now, as of the last fetch plus the local time since.
    pub(super) fn store_now(&self, now: u64) -> Timestamp {
        Timestamp::from_micros(self.store_now.as_micros() + now.saturating_sub(self.sent))
    }
}
