//! `BoundedTable` against a model (`support/clock_model.rs`: CLOCK over the slots, a decayed entry at the hand
//! first, else the first unvisited one unless one of the 3 after it is decayed; the new key takes the victim's
//! slot, a removal gives a slot to the last entry): inserts, reads, removals (one key, or every value a predicate
//! picks) and sweeps, evicting and refusing tables alike, on one shard. Values own something (a `String`), as a
//! lease owns its batch: an eviction must hand back the evicted value itself.

#[path = "support/clock_model.rs"]
mod clock_model;

use std::collections::HashMap;

use proptest::prelude::*;
use tollgate_core::StoreError;
use tollgate_core::store::{BoundedTable, Evicted, Expiry, OnFull};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Lease {
    batch: String,
    until: u64,
}

impl Expiry for Lease {
    fn expires_at(&self) -> u64 {
        self.until
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert {
        key: u8,
        ttl: u64,
    },
    Get(u8),
    Remove(u8),
    Sweep,
    /// Removes the values whose `until` has this parity.
    RemoveWhere(u64),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..24, 0u64..50).prop_map(|(key, ttl)| Op::Insert { key, ttl }),
        3 => (0u8..24).prop_map(Op::Get),
        1 => (0u8..24).prop_map(Op::Remove),
        1 => Just(Op::Sweep),
        1 => (0u64..2).prop_map(Op::RemoveWhere),
        2 => (1u64..30).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn bounded_table_follows_the_model(
        max_keys in 1usize..=16,
        refuse in any::<bool>(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let on_full = if refuse { OnFull::Refuse } else { OnFull::Evict };
        let table = BoundedTable::builder().max_keys(max_keys).on_full(on_full).build::<Lease>();
        let digest = |k: u8| table.digest(&[k]);
        let mut entries: HashMap<u8, Lease> = HashMap::new();
        let mut clock = clock_model::Clock::new();
        let mut now = 1_000;
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Insert { key, ttl } => {
                    let value = Lease { batch: format!("batch {i}"), until: now + ttl };
                    let got = table.insert(digest(key), value.clone(), now);
                    let want = if entries.contains_key(&key) {
                        clock.touch(key);
                        entries.insert(key, value);
                        Ok(None)
                    } else if entries.len() < max_keys {
                        clock.push(0, key);
                        entries.insert(key, value);
                        Ok(None)
                    } else {
                        let (victim, decayed) =
                            clock.victim(|k| entries[&k].until <= now).expect("a full table");
                        if refuse && !decayed {
                            Err(max_keys)
                        } else {
                            clock.replace(victim, key);
                            let old = entries.remove(&victim).expect("held");
                            entries.insert(key, value);
                            Ok(Some((digest(victim), old, !decayed)))
                        }
                    };
                    let got = match got {
                        Ok(e) => Ok(e.map(|Evicted { key, value, live, .. }| (key, value, live))),
                        Err(StoreError::KeyCapacity { max_keys }) => Err(max_keys),
                        Err(e) => panic!("op {i}: {e}"),
                    };
                    prop_assert_eq!(got, want, "op {} {:?}", i, op);
                }
                Op::Get(key) => {
                    let got = table.get(digest(key), |v| v.clone());
                    if entries.contains_key(&key) {
                        clock.touch(key);
                    }
                    prop_assert_eq!(got, entries.get(&key).cloned(), "op {} {:?}", i, op);
                }
                Op::Remove(key) => {
                    clock.remove(key);
                    prop_assert_eq!(table.remove(digest(key)), entries.remove(&key), "op {} {:?}", i, op);
                }
                Op::Sweep => {
                    table.sweep(now);
                    clock.sweep(|k| entries[&k].until <= now);
                    entries.retain(|_, v| v.until > now);
                }
                Op::RemoveWhere(parity) => {
                    let removed = table.remove_where(|v| v.until % 2 == parity);
                    let before = entries.len();
                    clock.sweep(|k| entries[&k].until % 2 == parity);
                    entries.retain(|_, v| v.until % 2 != parity);
                    prop_assert_eq!(removed, before - entries.len(), "op {} {:?}", i, op);
                }
                Op::Advance(us) => now += us,
            }
            prop_assert_eq!(table.len(), entries.len(), "op {} {:?}", i, op);
            prop_assert_eq!(clock.len(), entries.len());
        }
    }
}
