//! What a limiter that charges after the response offers the response: charges to its keys.

/// Charges a limiter's key once a response states the request's real cost.
pub(crate) trait Charger: Send + Sync {
    /// Charges `delta` (a refund if negative) to `key`, for a request decided at `decided_at`, without waiting.
    fn charge(&self, key: String, delta: i64, decided_at: tollgate_core::Timestamp);

    /// Whether a charge moves the key's reset (the instant it holds nothing of the key) by the time the charge
    /// takes to accrue: a token bucket's, which is full that much later. A sliding window counter's reset is the
    /// end of the window after the one the charge is counted in, whatever the count.
    fn charge_moves_reset(&self) -> bool;

    /// The limiter's name.
    fn limiter(&self) -> &crate::Name;

    /// Whether the limiter enforces (it may cut a stream); in shadow mode it only reports.
    fn enforcing(&self) -> bool;

    /// Charges `delta` (a refund if negative) to `key` as [`charge`](Self::charge) does, and hands the key's
    /// decision right after to `done` (`None` when the charge failed: counted as lost), at once when the store
    /// answers at once, else from a task.
    fn debit(
        &self,
        key: String,
        delta: i64,
        decided_at: tollgate_core::Timestamp,
        done: Box<dyn FnOnce(Option<tollgate_core::Decision>) + Send>,
    );

    /// The limiter's streams in progress, by key.
    fn pools(&self) -> &StreamPools;
}

/// A limiter's streams in progress, per key: the streams of one key on this instance debit together, so that
/// however many stream at once, the key's budget is met within one batch on this instance.
#[derive(Debug, Default)]
pub(crate) struct StreamPools {
    keys: std::sync::Mutex<std::collections::HashMap<String, Pooled>>,
}

#[derive(Debug)]
struct Pooled {
    streams: usize,
    pool: std::sync::Arc<KeyPool>,
}

/// One key's streams in progress on this instance.
#[derive(Debug)]
pub(crate) struct KeyPool {
    pub(crate) state: std::sync::Mutex<PoolState>,
    /// Set by a debit that found the key's budget spent; cleared by a stream admitted since.
    pub(crate) exhausted: std::sync::atomic::AtomicBool,
}

/// What a key's streams have counted and not yet debited, and what the last debit said.
#[derive(Debug)]
pub(crate) struct PoolState {
    /// Streamed beyond the streams' charges, and settled streams' differences (a refund if negative), not yet
    /// debited.
    pub(crate) pending: i64,
    /// A debit is on its way (one at a time: what streams meanwhile waits for the next).
    pub(crate) in_flight: bool,
    /// What the key has left as this instance knows it: the store's last answer (a debit's, or an admission's)
    /// less what streamed since (`u64::MAX` while unknown).
    pub(crate) left: u64,
    /// When the last debit was made (or the pool opened).
    pub(crate) last: std::time::Instant,
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere never leaves these counters half-written: every update is one assignment.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl StreamPools {
    /// A stream of `key` begins, admitted with `left` remaining after its reservation (when known): its pool
    /// (the key's budget is not spent: the stream was just admitted).
    pub(crate) fn join(&self, key: &str, left: Option<u64>) -> std::sync::Arc<KeyPool> {
        let mut keys = lock(&self.keys);
        let pooled = keys.entry(key.to_owned()).or_insert_with(|| Pooled {
            streams: 0,
            pool: std::sync::Arc::new(KeyPool {
                state: std::sync::Mutex::new(PoolState {
                    pending: 0,
                    in_flight: false,
                    left: u64::MAX,
                    last: std::time::Instant::now(),
                }),
                exhausted: std::sync::atomic::AtomicBool::new(false),
            }),
        });
        pooled.streams += 1;
        if let Some(left) = left {
            let mut state = lock(&pooled.pool.state);
            let pending = u64::try_from(state.pending).unwrap_or(0);
            state.left = state.left.min(left.saturating_sub(pending));
        }
        pooled
            .pool
            .exhausted
            .store(false, std::sync::atomic::Ordering::Release);
        pooled.pool.clone()
    }

    /// A stream of `key` ended: what the key's pool still owes the store when it was the last one (to be debited
    /// now), else 0 (the others debit it).
    pub(crate) fn leave(&self, key: &str) -> i64 {
        let mut keys = lock(&self.keys);
        let Some(pooled) = keys.get_mut(key) else {
            return 0;
        };
        pooled.streams -= 1;
        if pooled.streams > 0 {
            return 0;
        }
        let pooled = keys.remove(key).expect("the entry was just found");
        drop(keys);
        std::mem::take(&mut lock(&pooled.pool.state).pending)
    }
}

#[cfg(test)]
impl StreamPools {
    /// Keys with streams in progress.
    pub(crate) fn len(&self) -> usize {
        lock(&self.keys).len()
    }
}

impl KeyPool {
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        lock(&self.state)
    }
}
