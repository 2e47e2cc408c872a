//! The deny table: a request answered from its key's cached denial, or its key's one store call.

use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};

use ahash::RandomState;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tollgate_core::KeyHasher;

use event_listener::EventListener;
use tollgate_core::store::BoundedTable;
use tollgate_core::{Algorithm, Clock, Decision, Outcome, Policy, StoreError};

use super::clock::Offset;
use super::denial::{Denial, Flight, answer, covers, held, next_denial};
use super::{AHEAD_MICROS, FLIGHT_WINDOW_MICROS, MAX_WAITS, PPM_DIVISOR, SWEEP_EVERY_MICROS};

/// What a request for a key whose cached denial it may wait on does.
enum Enter {
    /// Refused with the cached decision.
    Hit(Decision),
    /// Asks the store, as the key's single flight.
    Probe(Arc<Flight>),
    /// Asks the store ahead of the entry's expiry, as the key's single flight, ready to be held for up to this
    /// long; the key's other requests are still refused by the entry meanwhile.
    Ahead(Arc<Flight>, Duration),
    /// Waits for the flight under way.
    Wait(Arc<Flight>, EventListener),
    /// Asks the store on its own (no entry covers it, or it waited long enough).
    Alone,
}

/// A key's two digests in a [`DenyTable`]: the entry's and the check against collisions of the first.
#[derive(Clone, Copy)]
pub(crate) struct KeyDigests {
    digest: u64,
    check: u64,
}

/// What [`DenyTable::decide`] got for a request.
pub(crate) enum Asked {
    /// Refused from a cached denial, with the numbers the store gave.
    Cached(Decision),
    /// The store's own answer.
    Store(Result<Decision, StoreError>),
}

/// A request's turn at a key the deny cache may hold.
enum Turn<'a> {
    /// Refuse it with this cached decision.
    Refuse(Decision),
    /// Ask the store (ready to hold the request for the duration, if not zero); with the key's single flight,
    /// hold the flight until the reply is recorded.
    Ask(Option<FlightGuard<'a>>, Duration),
}

/// Held by the request that asks the store for an expired entry's key; dropping it lets the waiters go.
pub(crate) struct FlightGuard<'a> {
    table: &'a DenyTable,
    digest: u64,
    check: u64,
    flight: Arc<Flight>,
}

impl FlightGuard<'_> {
    /// The store decided, and the decision is recorded: the waiters look at the entry again.
    pub(crate) fn decided(&self) {
        self.flight.decided.store(true, Ordering::Release);
    }
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        // A new entry (a denial recorded) replaced the flight already; otherwise the key has none under way now.
        self.table.table.get(self.digest, |d| {
            if d.check == self.check
                && d.flight
                    .as_ref()
                    .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
            {
                d.flight = None;
            }
        });
        self.flight.landed.notify(usize::MAX);
    }
}

/// A layer's table of denied keys.
pub(crate) struct DenyTable {
    pub(super) table: BoundedTable<Denial>,
    /// The key of every digest the table takes.
    pub(super) seed: RandomState,
    pub(super) clock: Arc<dyn Clock>,
    /// The fixed part of the margin an entry expires early by (µs).
    pub(super) fixed: u64,
    pub(super) hits: metrics::Counter,
    pub(super) next_sweep: AtomicU64,
}

/// What a key's state is carried on by for its second digest.
const CHECK_BLOCK: u64 = u64::from_le_bytes(*b"checkkey");

impl DenyTable {
    /// The local instant, in µs: take it before the store is asked.
    pub(crate) fn now(&self) -> u64 {
        self.clock.now().as_micros()
    }

    /// A hasher keyed by this table's seed: write a key's parts into it, then [`finish`](Self::finish) it.
    pub(crate) fn hasher(&self) -> KeyHasher {
        self.seed.build_hasher()
    }

    /// The digests of the key written into `state`: the entry's, and the check against its collisions — the same
    /// state carried one block further, so that the key is read once and two keys whose entry digests collide
    /// still differ in their checks.
    #[inline]
    pub(crate) fn finish(state: KeyHasher) -> KeyDigests {
        let digest = state.finish();
        let mut further = state;
        further.write_u64(CHECK_BLOCK);
        KeyDigests {
            digest,
            check: further.finish(),
        }
    }

    /// The digests of a key's text.
    pub(crate) fn key(&self, key: &str) -> KeyDigests {
        let mut state = self.hasher();
        state.write(key.as_bytes());
        Self::finish(state)
    }

    /// The digests of `key` decided under `policy`, for a table shared by keys whose policy may change (a
    /// store wrapped by [`DenyCacheConfig::around`]): an entry answers only requests under the policy it was made
    /// under.
    pub(crate) fn key_under(&self, key: &str, policy: &Policy) -> KeyDigests {
        let mut state = self.hasher();
        state.write(key.as_bytes());
        policy.hash(&mut state);
        Self::finish(state)
    }

    /// The cached denial of the key `key` digests for a request of `cost`, as the store would give it now; `None`
    /// when the store must be asked.
    pub(crate) fn lookup(&self, key: KeyDigests, cost: u64) -> Option<Decision> {
        let KeyDigests { digest, check } = key;
        let now = self.now();
        let decision = self
            .table
            .get(digest, |d| {
                (d.check == check
                    && covers(d, cost)
                    && now < d.expires
                    && (now < d.ahead_at || d.flight.is_some()))
                .then(|| answer(d, now))
            })
            .flatten()?;
        self.hits.increment(1);
        Some(decision)
    }

    /// Whether a request of `cost` on the key `key` digests would be decided through the key's entry (a live one,
    /// or one whose denial has just expired, whose single flight the key's requests share): `false` when the
    /// store is asked as if the cache were not there.
    pub(crate) fn holds_entry(&self, key: KeyDigests, cost: u64) -> bool {
        let KeyDigests { digest, check } = key;
        let now = self.now();
        self.table
            .get(digest, |d| {
                d.check == check && covers(d, cost) && now < d.coalesce_until
            })
            .unwrap_or(false)
    }

    /// Decides a request on the key `key` digests (`text` its text) with this cache: refused from an entry (one a
    /// flight it waited for brought), or asked of the store by `ask` — as the key's single flight when its entry
    /// has just expired, while the others wait for that reply (at most [`MAX_WAITS`] flights, each one store
    /// call) — whose answer is recorded; or, just before a token bucket's entry expires, asked ahead by `ask` with
    /// a hold ([`Store::check_held`](tollgate_core::Store::check_held)), the admission it brings held here until
    /// the store's clock reaches its instant. Measured from before the request is sent: the store decides no
    /// earlier.
    pub(crate) async fn decide<F>(
        &self,
        key: KeyDigests,
        text: &str,
        policy: &Policy,
        cost: u64,
        ask: impl FnOnce(Duration) -> F,
    ) -> Asked
    where
        F: Future<Output = Result<Decision, StoreError>>,
    {
        let (flight, hold) = match self.turn(key, cost).await {
            Turn::Refuse(decision) => return Asked::Cached(decision),
            Turn::Ask(flight, hold) => (flight, hold),
        };
        let sent = self.now();
        let mut result = ask(hold).await;
        match &result {
            Ok(decision) => {
                self.record(key, text, policy, cost, sent, hold, decision);
                if let Some(flight) = &flight {
                    flight.decided();
                }
            }
            // Asked ahead, and the store failed: the entry, still live, refuses the request as it would have
            // without asking, and the key waits for the entry's expiry (its failure policy then answers).
            Err(_) if !hold.is_zero() => {
                if let Some(decision) = self.ahead_failed(key, cost) {
                    return Asked::Cached(decision);
                }
            }
            Err(_) => {}
        }
        drop(flight);
        if let Ok(decision) = &mut result
            && let Some(wait) = held(decision)
        {
            // The store's clock read the decision's `now` before the reply arrived: it reaches the admission's
            // instant no later than `wait` from here, and the drift allowance, on this clock.
            let allowance = wait / PPM_DIVISOR + Duration::from_micros(self.fixed);
            tokio::time::sleep(wait + allowance).await;
            decision.now = decision.now.saturating_add(wait);
            decision.retry_after = None;
        }
        Asked::Store(result)
    }

    async fn turn(&self, key: KeyDigests, cost: u64) -> Turn<'_> {
        let KeyDigests { digest, check } = key;
        let guard = |flight| {
            Some(FlightGuard {
                table: self,
                digest,
                check,
                flight,
            })
        };
        let mut waits = 0;
        loop {
            match self.enter(digest, check, cost, waits < MAX_WAITS) {
                Enter::Hit(decision) => {
                    self.hits.increment(1);
                    return Turn::Refuse(decision);
                }
                Enter::Probe(flight) => return Turn::Ask(guard(flight), Duration::ZERO),
                Enter::Ahead(flight, hold) => return Turn::Ask(guard(flight), hold),
                Enter::Alone => return Turn::Ask(None, Duration::ZERO),
                Enter::Wait(flight, landed) => {
                    landed.await;
                    if !flight.decided.load(Ordering::Acquire) {
                        return Turn::Ask(None, Duration::ZERO);
                    }
                    waits += 1;
                }
            }
        }
    }

    /// One look at the key's entry, under its shard's lock: a live entry answers (but for one request, which asks
    /// ahead, just before a token bucket's entry expires); an expired one within its window sends one request to
    /// the store and makes the others wait (a listener registered under the lock the flight is cleared under, so
    /// no wake-up is missed).
    fn enter(&self, digest: u64, check: u64, cost: u64, may_wait: bool) -> Enter {
        let now = self.now();
        self.table
            .get(digest, |d| {
                if d.check != check || !covers(d, cost) || now >= d.coalesce_until {
                    return Enter::Alone;
                }
                if now < d.expires {
                    if now < d.ahead_at || d.flight.is_some() {
                        return Enter::Hit(answer(d, now));
                    }
                    // Held up to the store's instant, as far as this clock can tell, and as long again: a reply
                    // whose request reached the store later than that is a plain answer.
                    let hold = d.due.saturating_sub(now) + AHEAD_MICROS;
                    return Enter::Ahead(d.fly(), Duration::from_micros(hold));
                }
                match &d.flight {
                    Some(flight) if may_wait => Enter::Wait(flight.clone(), flight.landed.listen()),
                    Some(_) => Enter::Alone,
                    None => Enter::Probe(d.fly()),
                }
            })
            .unwrap_or(Enter::Alone)
    }

    /// Remembers the store's `decision` under `policy` on `key` for a request of `cost` sent at local instant
    /// `sent` (ready to be held for `hold`, if not zero), if it is a denial that can be cached, or an admission
    /// that tells the denial the key's next such request would get ([`next_denial`]); any reply also tightens the
    /// bound on the clocks' offset an entry for the key keeps.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        key: KeyDigests,
        text: &str,
        policy: &Policy,
        cost: u64,
        sent: u64,
        hold: Duration,
        decision: &Decision,
    ) {
        // A request asked ahead that the store refused though its instant fell within the hold: the store does
        // not hold (or not for this key: tokens leased on it), and the key's next entries do not ask ahead.
        let unheld = !hold.is_zero()
            && !decision.is_allowed()
            && decision.retry_after.is_some_and(|retry| retry <= hold);
        let from_admission = decision.is_allowed();
        let next;
        let decision = if decision.is_allowed() {
            // A held admission is the store's at the instant the entry announced (or later): the entry stays
            // until the one for the next denial replaces it.
            if held(decision).is_none() {
                self.admitted(key, sent, decision);
            }
            let Some(denial) = next_denial(policy, cost, decision) else {
                return;
            };
            next = denial;
            &next
        } else {
            decision
        };
        let (Outcome::Limited, Some(retry)) = (decision.outcome, decision.retry_after) else {
            return;
        };
        let KeyDigests { digest, check } = key;
        let now = self.now();
        let own = Offset::of(sent, decision);
        // The key's earlier replies (to the same server, which keeps one clock) may bound the offset tighter:
        // one whose request reached the store sooner after its send.
        let previous = self
            .table
            .get(digest, |d| {
                (d.check == check).then(|| {
                    d.offset = d.offset.min(own);
                    d.holds &= !unheld;
                    (d.offset, d.cost, d.expires, d.coalesce_until, d.holds)
                })
            })
            .flatten();
        let offset = previous.map_or(own, |(offset, ..)| offset);
        let holds = previous.map_or(!unheld, |(.., holds)| holds);
        let retry_micros = u64::try_from(retry.as_micros()).unwrap_or(u64::MAX);
        let instant = decision.now.as_micros().saturating_add(retry_micros);
        let latest = own.local(instant).max(offset.local(instant));
        let expires = latest.saturating_sub(self.fixed);
        if expires <= sent || cost == 0 {
            return;
        }
        let due = sent.saturating_add(retry_micros).max(latest);
        // A denial just before the instant (a retry of some µs) does not shorten the key's coalescing window: its
        // entry expires before the waiters look again, and they would all ask at once.
        let coalesce_until = previous
            .map_or(0, |(.., until, _)| until)
            .max(due.saturating_add(retry_micros.min(FLIGHT_WINDOW_MICROS)));
        // Asked ahead: a token bucket's entry (no lockout) that an admission made (a flooded key: the next token
        // is the key's next admission) and that lives longer than the lead, on a store that holds.
        let ahead = holds
            && from_admission
            && policy.algorithm() == Algorithm::TokenBucket
            && policy.lockout_micros() == 0
            && expires.saturating_sub(now) > AHEAD_MICROS;
        let entry = Denial {
            check,
            text: self.key(text).digest,
            cost,
            sent,
            due,
            expires,
            ahead_at: if ahead {
                expires - AHEAD_MICROS
            } else {
                u64::MAX
            },
            holds,
            coalesce_until,
            offset,
            flight: None,
            decision: *decision,
        };
        // Keep a live entry that already covers this one (a reply overtaken by a later one).
        if previous.is_some_and(|(_, covering, until, ..)| {
            now < until && covering <= cost && until >= entry.expires
        }) {
            return;
        }
        // Never refuses (`Evict`); an evicted entry only costs its key a store call.
        let _ = self.table.insert(digest, entry, now);
        self.sweep(now);
    }

    /// A request on `key` asked ahead and the store failed: the key's entry asks ahead no more, and answers the
    /// request if it still covers it.
    fn ahead_failed(&self, key: KeyDigests, cost: u64) -> Option<Decision> {
        let KeyDigests { digest, check } = key;
        self.table.get(digest, |d| {
            if d.check == check {
                d.ahead_at = u64::MAX;
            }
        });
        self.lookup(key, cost)
    }

    /// The store admitted a request for `key`, sent at local instant `sent`.
    fn admitted(&self, key: KeyDigests, sent: u64, decision: &Decision) {
        let KeyDigests { digest, check } = key;
        let now = self.now();
        // A live entry goes: a cheaper request spent from the key, and the entry would still refuse exactly, but
        // with numbers (`remaining`, `reset`) the store no longer gives; the next costly request asks again. An
        // expired one stays while the key has no room for another request of its cost (the token that accrued
        // is spent): the next request then asks alone, the others wait for it, as after the expiry; the reply
        // bounds the clocks' offset for the entry the next denial makes.
        let drop = self.table.get(digest, |d| {
            if d.check != check {
                return false;
            }
            if now < d.expires || decision.remaining >= d.cost {
                return true;
            }
            d.offset = d.offset.min(Offset::of(sent, decision));
            false
        });
        if drop == Some(true) {
            self.table.remove(digest);
        }
    }

    /// Drops expired entries, at most once a second (the first insertion after the second passes does it).
    fn sweep(&self, now: u64) {
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now < due
            || self
                .next_sweep
                .compare_exchange(
                    due,
                    now + SWEEP_EVERY_MICROS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        self.table.sweep(now);
    }

    /// Ends the cached denial of the key `key` digests, if any: the key's state changed under it (a set gave
    /// back what a request it refused had spent), and the next request on the key asks the store.
    pub(crate) fn expire(&self, key: KeyDigests) {
        let now = self.now();
        self.table.get(key.digest, |d| {
            if d.check == key.check {
                d.expires = d.expires.min(now);
            }
        });
    }

    /// Forgets every entry.
    pub(crate) fn clear(&self) {
        self.table.sweep(u64::MAX);
    }

    /// Entries held (expired ones included until replaced or swept).
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Forgets the entry of the key whose text is `key` (entries are found by digests of the key's parts, which
    /// the text does not give: a scan, for an operator's action).
    pub(crate) fn forget(&self, key: &str) {
        let text = self.key(key).digest;
        self.table.remove_where(|d| d.text == text);
    }
}
