use std::collections::{HashMap, HashSet};
use std::future::{Future, ready};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{Admission, LeaseId, LeaseStore};
use crate::StoreError;

/// In-process leases: a per-instance concurrency limit.
///
/// Leases do not expire: they live in this process, so a crash frees them with everything else, and the holder's
/// guard gives them back on drop. A key without leases is removed, so memory follows the keys in flight.
#[derive(Debug, Default)]
pub struct MemoryLeaseStore {
    keys: Mutex<HashMap<String, HashSet<LeaseId>>>,
}

impl MemoryLeaseStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Leases held on `key` now.
    #[must_use]
    pub fn in_flight(&self, key: &str) -> u64 {
        self.lock().get(key).map_or(0, |set| set.len() as u64)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashSet<LeaseId>>> {
        // A panic elsewhere while holding the lock leaves consistent data (every update is one insert or remove).
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire_now(&self, key: &str, lease: LeaseId, limit: u64) -> Admission {
        let mut keys = self.lock();
        let held = keys.get(key).map_or(0, |set| set.len() as u64);
        if held >= limit {
            return Admission {
                granted: false,
                in_flight: held,
                limit,
            };
        }
        // Allocate the key only for a key with no lease yet.
        match keys.get_mut(key) {
            Some(set) => {
                set.insert(lease);
            }
            None => {
                keys.insert(key.to_owned(), HashSet::from([lease]));
            }
        }
        Admission {
            granted: true,
            in_flight: held + 1,
            limit,
        }
    }

    fn release_now(&self, key: &str, lease: LeaseId) {
        let mut keys = self.lock();
        if let Some(set) = keys.get_mut(key) {
            set.remove(&lease);
            if set.is_empty() {
                keys.remove(key);
            }
        }
    }
}

impl LeaseStore for MemoryLeaseStore {
    fn leases_expire(&self) -> bool {
        false
    }

    fn acquire(
        &self,
        key: &str,
        lease: LeaseId,
        limit: u64,
        _ttl: Duration,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        ready(Ok(self.acquire_now(key, lease, limit)))
    }

    fn renew(
        &self,
        key: &str,
        lease: LeaseId,
        _ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let held = self.lock().get(key).is_some_and(|set| set.contains(&lease));
        ready(Ok(held))
    }

    fn release(
        &self,
        key: &str,
        lease: LeaseId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.release_now(key, lease);
        ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::block_on_ready as now;

    const TTL: Duration = Duration::from_secs(1);

    #[test]
    fn admits_up_to_the_limit_and_frees_on_release() {
        let store = MemoryLeaseStore::new();
        let leases: Vec<LeaseId> = (0..4).map(|_| LeaseId::new()).collect();
        for (i, lease) in leases.iter().take(3).enumerate() {
            let a = now(store.acquire("k", *lease, 3, TTL)).unwrap();
            assert!(a.granted);
            assert_eq!(a.in_flight, i as u64 + 1);
        }
        let denied = now(store.acquire("k", leases[3], 3, TTL)).unwrap();
        assert_eq!(
            denied,
            Admission {
                granted: false,
                in_flight: 3,
                limit: 3
            }
        );
        assert!(
            now(store.acquire("other", leases[3], 3, TTL))
                .unwrap()
                .granted
        );
        now(store.release("k", leases[0])).unwrap();
        now(store.release("k", leases[0])).unwrap(); // twice: no effect
        assert_eq!(store.in_flight("k"), 2);
        assert!(now(store.renew("k", leases[1], TTL)).unwrap());
        assert!(!now(store.renew("k", leases[0], TTL)).unwrap());
        for lease in &leases[1..3] {
            now(store.release("k", *lease)).unwrap();
        }
        assert!(store.lock().get("k").is_none(), "empty keys are removed");
    }

    #[test]
    fn a_lower_ceiling_is_checked_against_all_leases() {
        let store = MemoryLeaseStore::new();
        for _ in 0..2 {
            assert!(
                now(store.acquire("fleet", LeaseId::new(), 5, TTL))
                    .unwrap()
                    .granted
            );
        }
        assert!(
            !now(store.acquire("fleet", LeaseId::new(), 2, TTL))
                .unwrap()
                .granted
        );
        assert!(
            now(store.acquire("fleet", LeaseId::new(), 5, TTL))
                .unwrap()
                .granted
        );
    }

    #[test]
    fn lease_ids_are_unique() {
        let ids: HashSet<LeaseId> = (0..1000).map(|_| LeaseId::new()).collect();
        assert_eq!(ids.len(), 1000);
        assert_eq!(LeaseId::new().to_string().len(), 32);
    }
}
