//! A shard: a step applied to a key's entry, and the eviction and sweeping that keep the shard bounded.

use super::decide::Decide;
use super::entry::{Entry, Slabs, WINDOW};
use crate::store::evictions::{EvictionCounts, EvictionLog, OnFull};
use crate::store::table::{Arena, Hand};
use crate::{Decision, StoreError, Timestamp};

/// A shard is not swept below this many keys.
const MIN_SWEEP: usize = 64;

/// The bound, as each shard applies it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bound {
    pub(super) shard_capacity: usize,
    pub(super) max_keys: usize,
    pub(super) on_full: OnFull,
}

#[derive(Default)]
pub(super) struct Shard {
    pub(super) slabs: Slabs,
    hand: Hand,
    pub(super) evictions: EvictionCounts,
    /// Sweep when the shard grows to this many keys…
    sweep_at: usize,
    /// …but only once some key may have expired.
    next_expiry: u64,
}

impl Shard {
    pub(super) fn len(&self) -> usize {
        self.slabs.buckets.len() + self.slabs.windows.len()
    }

    #[inline(always)]
    pub(super) fn apply<E: Entry, D: Decide<E::State>>(
        &mut self,
        hash: u64,
        now: Timestamp,
        bound: &Bound,
        log: &EvictionLog,
        ctx: E::Ctx,
        decide: D,
    ) -> Result<Decision, StoreError> {
        let slab = E::slab(&mut self.slabs);
        let slot = slab.find(hash);
        let state = slot.map(|slot| slab.node_mut(slot).value.state(ctx));
        // Only a step with a lockout reads the key's end (only a held key has one).
        let held = if D::LOCKOUT && slot.is_some() {
            self.slabs.lockouts.get(E::TAG, hash)
        } else {
            0
        };
        let (step, locked_until) = decide.decide::<E>(state, held);
        if let Some(slot) = slot {
            // The state and the visited bit are one node: a hit writes that alone.
            let node = E::slab(&mut self.slabs).node_mut(slot);
            node.visit();
            if let Some(state) = step.state {
                node.value = E::new(state, ctx);
                if D::LOCKOUT && locked_until != held {
                    self.slabs.lockouts.set(E::TAG, hash, locked_until);
                }
            }
            return Ok(step.decision);
        }
        let Some(state) = step.state else {
            return Ok(step.decision);
        };
        let entry = E::new(state, ctx);
        let now = now.as_micros();
        let expires_at = entry.expires_at().max(locked_until);
        if expires_at <= now {
            return Ok(step.decision); // already indistinguishable from fresh
        }
        let cap = bound.shard_capacity;
        let len = self.len();
        match bound.on_full {
            OnFull::Evict => {
                // Sweeps only while growing (each one at twice the keys of the last: O(1) amortised); at the bound,
                // eviction makes room one key at a time, decayed keys first, so no request waits on a scan.
                if len < cap && len >= self.sweep_at.max(MIN_SWEEP) && now >= self.next_expiry {
                    self.sweep(now, bound);
                }
                if self.len() >= cap && self.evict_for(hash, entry, expires_at, now, bound, log) {
                    if D::LOCKOUT && locked_until != 0 {
                        self.slabs.lockouts.set(E::TAG, hash, locked_until);
                    }
                    return Ok(step.decision);
                }
            }
            OnFull::Refuse => {
                if (len >= self.sweep_at.max(MIN_SWEEP) || len >= cap) && now >= self.next_expiry {
                    self.sweep(now, bound);
                }
                if self.len() >= cap {
                    return Err(StoreError::KeyCapacity {
                        max_keys: bound.max_keys,
                    });
                }
            }
        }
        self.next_expiry = self.next_expiry.min(expires_at);
        E::slab(&mut self.slabs).push(hash, entry);
        if D::LOCKOUT && locked_until != 0 {
            self.slabs.lockouts.set(E::TAG, hash, locked_until);
        }
        Ok(step.decision)
    }

    /// Evicts the hand's victim for the new key `hash`, which takes the victim's slot when both are of one
    /// algorithm (no allocation, nothing moved); `false` if it still has to be added (the victim was of the other
    /// algorithm, or there was none).
    fn evict_for<E: Entry>(
        &mut self,
        hash: u64,
        entry: E,
        expires_at: u64,
        now: u64,
        bound: &Bound,
        log: &EvictionLog,
    ) -> bool {
        let Some((victim, decayed)) = self.hand.victim(&mut self.slabs, now) else {
            return false; // an empty shard is never full (its capacity is at least 1)
        };
        self.next_expiry = self.next_expiry.min(expires_at);
        let replaced = victim & WINDOW == E::TAG;
        if replaced {
            let (old, _) = E::slab(&mut self.slabs).replace(victim & !WINDOW, hash, entry);
            self.slabs.lockouts.remove(E::TAG, old);
        } else {
            self.remove(victim);
        }
        self.evictions.add(!decayed);
        log.record(!decayed, &self.evictions, bound.max_keys);
        replaced
    }

    /// Removes the entry at `link` from its slab (whose last entry moves into its slot) and its lockout end.
    fn remove(&mut self, link: u32) {
        let (tag, slot) = (link & WINDOW, link & !WINDOW);
        let key = if tag == 0 {
            self.slabs.buckets.swap_remove(slot).key()
        } else {
            self.slabs.windows.swap_remove(slot).key()
        };
        self.slabs.lockouts.remove(tag, key);
    }

    pub(super) fn sweep(&mut self, now: u64, bound: &Bound) {
        let mut next = u64::MAX;
        for (tag, len) in [
            (0, self.slabs.buckets.len()),
            (WINDOW, self.slabs.windows.len()),
        ] {
            // From the last slot down: the entry a removal moves into a slot was already looked at.
            for slot in (0..len as u32).rev() {
                let link = slot | tag;
                let expires_at = self.slabs.expires_at(link);
                if expires_at <= now {
                    self.remove(link);
                } else {
                    next = next.min(expires_at);
                }
            }
        }
        self.next_expiry = next;
        self.sweep_at = (self.len() * 2).max(MIN_SWEEP);
        // Refusing and still (nearly) full: sweeping again as soon as the next key expires would scan the whole
        // shard, under its lock, for every new key (a client spraying keys at the bound). Wait until an eighth of
        // it can go; new keys are refused meanwhile, as they would be at the bound anyway. (An evicting store does
        // not sweep at the bound.)
        let cap = bound.shard_capacity;
        let batch = (cap / 8).max(1);
        if bound.on_full == OnFull::Refuse && self.len() + batch > cap {
            let links = (0..self.slabs.buckets.len() as u32)
                .chain((0..self.slabs.windows.len() as u32).map(|slot| slot | WINDOW));
            let mut expiries: Vec<u64> = links.map(|link| self.slabs.expires_at(link)).collect();
            if !expiries.is_empty() {
                let index = batch.min(expiries.len()) - 1;
                self.next_expiry = *expiries.select_nth_unstable(index).1;
            }
        }
    }
}
