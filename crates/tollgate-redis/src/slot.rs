//! Concurrency slots in Redis: [`SlotStore`] for [`RedisStore`], so in-flight limits hold for a whole fleet.
//!
//! Each key's slots are a sorted set `<namespace>:{<key>}:inflight` (member: the slot id, score: its expiry in
//! server milliseconds). One script (`lua/concurrency_acquire.lua`) removes expired slots, counts, admits and
//! sets the key's TTL to its longest slot; `concurrency_renew.lua` extends a slot; `concurrency_release.lua`
//! removes it. The scripts run through the store's own machinery: `EVALSHA` with reload on `NOSCRIPT`, the
//! timeout, the circuit breaker and the latency histogram. Unlike [`Store::check`](tollgate_core::Store::check),
//! slot calls return Redis's failures as errors: the limiter holding the slot applies its own failure policy.

use std::future::Future;
use std::time::Duration;

use tollgate_core::StoreError;
use tollgate_core::slot::{Admission, SlotId, SlotStore};

use crate::script::Scripts;
use crate::{BackendError, RedisStore, keys};

/// The longest slot the scripts are given, in milliseconds (a year): the server's time plus it must stay an exact
/// integer in Lua's doubles, or the expiry instant turns negative and `PEXPIREAT` deletes the slot it just
/// granted.
const MAX_TTL_MS: u64 = 365 * 24 * 60 * 60 * 1_000;

/// How long a release that found no slot keeps that slot's acquire from being granted, should it land late (see
/// `lua/concurrency_release.lua`): the acquire was sent before the release, so it runs within a stall of it.
const TOMBSTONE_MS: u64 = 60_000;

/// Slot lifetimes are whole milliseconds, at least one and at most [`MAX_TTL_MS`].
fn ttl_ms(ttl: Duration) -> String {
    u64::try_from(ttl.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_TTL_MS)
        .to_string()
}

fn ints(reply: &redis::Value) -> Result<Vec<i64>, BackendError> {
    let bad = |why: &str| BackendError::BadReply(format!("{why} in slot script reply {reply:?}"));
    match reply {
        redis::Value::Int(n) => Ok(vec![*n]),
        redis::Value::Array(items) => items
            .iter()
            .map(|item| match item {
                redis::Value::Int(n) => Ok(*n),
                _ => Err(bad("expected integers")),
            })
            .collect(),
        _ => Err(bad("expected integers")),
    }
}

impl RedisStore {
    /// The Redis key holding `key`'s concurrency slots (for inspection).
    #[must_use]
    pub fn slot_key(&self, key: &str) -> String {
        keys::slot_key(self.namespace(), key)
    }
}

impl SlotStore for RedisStore {
    fn slots_expire(&self) -> bool {
        true
    }

    fn acquire(
        &self,
        key: &str,
        slot: SlotId,
        limit: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        let redis_key = self.slot_key(key);
        let args = [slot.to_string(), limit.to_string(), ttl_ms(ttl)];
        async move {
            self.run_script(
                &Scripts::shared().concurrency_acquire,
                &redis_key,
                &args,
                |reply| match ints(reply)?.as_slice() {
                    [granted @ (0 | 1), in_flight] => Ok(Admission {
                        granted: *granted == 1,
                        in_flight: u64::try_from(*in_flight).unwrap_or(0),
                        limit,
                    }),
                    _ => Err(BackendError::BadReply(format!(
                        "expected {{granted, in_flight}}, got {reply:?}"
                    ))),
                },
            )
            .await
        }
    }

    fn renew(
        &self,
        key: &str,
        slot: SlotId,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let redis_key = self.slot_key(key);
        let args = [slot.to_string(), ttl_ms(ttl)];
        async move {
            self.run_script(
                &Scripts::shared().concurrency_renew,
                &redis_key,
                &args,
                |reply| match ints(reply)?.as_slice() {
                    [renewed] => Ok(*renewed == 1),
                    _ => Err(BackendError::BadReply(format!(
                        "expected 0 or 1, got {reply:?}"
                    ))),
                },
            )
            .await
        }
    }

    fn release(
        &self,
        key: &str,
        slot: SlotId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let redis_key = self.slot_key(key);
        let args = [slot.to_string(), TOMBSTONE_MS.to_string()];
        async move {
            self.run_script(
                &Scripts::shared().concurrency_release,
                &redis_key,
                &args,
                |reply| ints(reply).map(drop),
            )
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_scripts_are_embedded_and_distinct() {
        let s = Scripts::shared();
        assert!(s.concurrency_acquire.source.contains("ZREMRANGEBYSCORE"));
        assert!(s.concurrency_acquire.source.contains("PEXPIREAT"));
        assert_ne!(s.concurrency_acquire.sha, s.concurrency_renew.sha);
        assert_ne!(s.concurrency_renew.sha, s.concurrency_release.sha);
        assert_eq!(ttl_ms(Duration::from_micros(10)), "1");
        assert_eq!(ttl_ms(Duration::from_secs(3)), "3000");
    }

    #[test]
    fn slot_keys_are_tagged() {
        assert_eq!(
            keys::slot_key("tollgate", "fleet"),
            "tollgate:{fleet}:inflight"
        );
    }
}
