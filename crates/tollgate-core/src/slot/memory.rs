use std::collections::{HashMap, HashSet};
use std::future::{Future, ready};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{Admission, SlotId, SlotStore};
use crate::StoreError;

/// In-process slots: a per-instance concurrency limit.
///
/// Slots do not expire: they live in this process, so a crash frees them with everything else, and the holder's
/// guard gives them back on drop. A key without slots is removed, so memory follows the keys in flight.
#[derive(Debug, Default)]
pub struct MemorySlotStore {
    keys: Mutex<HashMap<String, HashSet<SlotId>>>,
}

impl MemorySlotStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Slots held on `key` now.
    #[must_use]
    pub fn in_flight(&self, key: &str) -> u64 {
        self.lock().get(key).map_or(0, |set| set.len() as u64)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashSet<SlotId>>> {
        // A panic elsewhere while holding the lock leaves consistent data (every update is one insert or remove).
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire_now(&self, key: &str, slot: SlotId, limit: u64) -> Admission {
        let mut keys = self.lock();
        let held = keys.get(key).map_or(0, |set| set.len() as u64);
        if held >= limit {
            return Admission {
                granted: false,
                in_flight: held,
                limit,
            };
        }
        // Allocate the key only for a key with no slot yet.
        match keys.get_mut(key) {
            Some(set) => {
                set.insert(slot);
            }
            None => {
                keys.insert(key.to_owned(), HashSet::from([slot]));
            }
        }
        Admission {
            granted: true,
            in_flight: held + 1,
            limit,
        }
    }

    fn release_now(&self, key: &str, slot: SlotId) {
        let mut keys = self.lock();
        if let Some(set) = keys.get_mut(key) {
            set.remove(&slot);
            if set.is_empty() {
                keys.remove(key);
            }
        }
    }
}

impl SlotStore for MemorySlotStore {
    fn slots_expire(&self) -> bool {
        false
    }

    fn acquire(
        &self,
        key: &str,
        slot: SlotId,
        limit: u64,
        _ttl: Duration,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        ready(Ok(self.acquire_now(key, slot, limit)))
    }

    fn renew(
        &self,
        key: &str,
        slot: SlotId,
        _ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let held = self.lock().get(key).is_some_and(|set| set.contains(&slot));
        ready(Ok(held))
    }

    fn release(
        &self,
        key: &str,
        slot: SlotId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.release_now(key, slot);
        ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::block_on_ready as now;

    const TTL: Duration = Duration::from_secs(1);

    #[test]
    fn admits_up_to_the_limit_and_frees_on_release() {
        let store = MemorySlotStore::new();
        let slots: Vec<SlotId> = (0..4).map(|_| SlotId::new()).collect();
        for (i, slot) in slots.iter().take(3).enumerate() {
            let a = now(store.acquire("k", *slot, 3, TTL)).unwrap();
            assert!(a.granted);
            assert_eq!(a.in_flight, i as u64 + 1);
        }
        let denied = now(store.acquire("k", slots[3], 3, TTL)).unwrap();
        assert_eq!(
            denied,
            Admission {
                granted: false,
                in_flight: 3,
                limit: 3
            }
        );
        assert!(
            now(store.acquire("other", slots[3], 3, TTL))
                .unwrap()
                .granted
        );
        now(store.release("k", slots[0])).unwrap();
        now(store.release("k", slots[0])).unwrap(); // twice: no effect
        assert_eq!(store.in_flight("k"), 2);
        assert!(now(store.renew("k", slots[1], TTL)).unwrap());
        assert!(!now(store.renew("k", slots[0], TTL)).unwrap());
        for slot in &slots[1..3] {
            now(store.release("k", *slot)).unwrap();
        }
        assert!(store.lock().get("k").is_none(), "empty keys are removed");
    }

    #[test]
    fn a_lower_ceiling_is_checked_against_all_slots() {
        let store = MemorySlotStore::new();
        for _ in 0..2 {
            assert!(
                now(store.acquire("fleet", SlotId::new(), 5, TTL))
                    .unwrap()
                    .granted
            );
        }
        assert!(
            !now(store.acquire("fleet", SlotId::new(), 2, TTL))
                .unwrap()
                .granted
        );
        assert!(
            now(store.acquire("fleet", SlotId::new(), 5, TTL))
                .unwrap()
                .granted
        );
    }

    #[test]
    fn slot_ids_are_unique() {
        let ids: HashSet<SlotId> = (0..1000).map(|_| SlotId::new()).collect();
        assert_eq!(ids.len(), 1000);
        assert_eq!(SlotId::new().to_string().len(), 32);
    }
}
