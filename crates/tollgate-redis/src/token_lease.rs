//! Token leases in Redis ([`tollgate_core::token_lease`]): a hot key's batch of tokens or window slots taken in
//! one `EVALSHA` of `lua/token_bucket_lease.lua` or `lua/sliding_window_lease.lua`, on the key's own hash (the
//! lease book lives beside the bucket, under the same hash tag and TTL), through the store's timeout and
//! circuit like any decision.

use std::time::Duration;

use tollgate_core::token_lease::{TokenLeaseGrant, TokenLeaseRequest};
use tollgate_core::{Algorithm, Policy, StoreError, Timestamp};

use crate::{BackendError, RedisStore, keys};

/// The longest lease the scripts are given (an hour): the server's time plus it stays an exact integer in Lua.
const MAX_TTL_US: u64 = 3_600_000_000;

fn args(policy: &Policy, request: &TokenLeaseRequest, now: Option<Timestamp>) -> Vec<String> {
    let quota = policy.quota();
    let now = now.map_or_else(String::new, |t| {
        t.min(Timestamp::LATEST).as_micros().to_string()
    });
    match policy.algorithm() {
        Algorithm::TokenBucket => vec![
            quota.token_bucket_token().to_string(),
            quota.token_bucket_rate().to_string(),
            quota.burst().to_string(),
            request.instance.to_string(),
            request.seq.min(1 << 52).to_string(),
            request.want.min(quota.burst()).to_string(),
            request.unspent.min(1 << 52).to_string(),
            u64::try_from(request.ttl.as_micros())
                .unwrap_or(u64::MAX)
                .clamp(1, MAX_TTL_US)
                .to_string(),
            u8::from(request.end).to_string(),
            now,
            policy.lockout_micros().to_string(),
        ],
        Algorithm::SlidingWindowCounter => vec![
            quota.limit().to_string(),
            quota.period_micros().to_string(),
            policy.tick_micros().to_string(),
            request.want.min(quota.limit()).to_string(),
            request.unspent.min(1 << 52).to_string(),
            request.window_start.min(1 << 53).to_string(),
            now,
            policy.lockout_micros().to_string(),
            request.instance.to_string(),
        ],
        // Never run: the fixed window has no lease script.
        Algorithm::FixedWindow => Vec::new(),
    }
}

fn parse(policy: &Policy, reply: &redis::Value) -> Result<TokenLeaseGrant, BackendError> {
    let bad = |why: &str| BackendError::BadReply(format!("{why} in lease script reply {reply:?}"));
    let redis::Value::Array(items) = reply else {
        return Err(bad("expected an array"));
    };
    let ints = items
        .iter()
        .map(|item| match item {
            redis::Value::Int(n) => Ok(*n),
            _ => Err(bad("expected integers")),
        })
        .collect::<Result<Vec<i64>, _>>()?;
    let unsigned = |n: i64| u64::try_from(n).map_err(|_| bad("negative value"));
    let retry = |n: i64| {
        if n < 0 {
            Ok(None)
        } else {
            unsigned(n).map(|us| Some(Duration::from_micros(us)))
        }
    };
    match (policy.algorithm(), ints.as_slice()) {
        (
            Algorithm::TokenBucket,
            &[
                granted,
                remaining,
                reset,
                retry_after,
                now,
                deadline,
                stale,
                held,
            ],
        ) => Ok(TokenLeaseGrant {
            granted: unsigned(granted)?,
            remaining: unsigned(remaining)?,
            reset: Timestamp::from_micros(unsigned(reset)?),
            retry_after: retry(retry_after)?,
            now: Timestamp::from_micros(unsigned(now)?),
            expires: Timestamp::from_micros(unsigned(deadline)?),
            window_start: 0,
            stale: stale == 1,
            held: unsigned(held)?,
        }),
        (
            Algorithm::SlidingWindowCounter,
            &[granted, remaining, reset, retry_after, now, end, held],
        ) => {
            let end = unsigned(end)?;
            Ok(TokenLeaseGrant {
                granted: unsigned(granted)?,
                remaining: unsigned(remaining)?,
                reset: Timestamp::from_micros(unsigned(reset)?),
                retry_after: retry(retry_after)?,
                now: Timestamp::from_micros(unsigned(now)?),
                expires: Timestamp::from_micros(end),
                window_start: end.saturating_sub(policy.quota().period_micros()),
                stale: false,
                held: unsigned(held)?,
            })
        }
        _ => Err(bad("unexpected length")),
    }
}

impl RedisStore {
    /// Answers a token lease call at `now` instead of the server's time (the shared lease vectors, tests). Like
    /// [`Store::lease_tokens`](tollgate_core::Store::lease_tokens) it is bounded by the timeout, skipped while the
    /// circuit is open, and returns Redis's failures as errors.
    pub async fn lease_tokens_at(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
        now: Timestamp,
    ) -> Result<TokenLeaseGrant, StoreError> {
        self.lease(key, policy, request, Some(now)).await
    }

    pub(crate) async fn lease(
        &self,
        key: &str,
        policy: &Policy,
        request: &TokenLeaseRequest,
        now: Option<Timestamp>,
    ) -> Result<TokenLeaseGrant, StoreError> {
        let Some(script) = crate::script::Scripts::shared().lease_for(policy.algorithm()) else {
            return Err(StoreError::Unsupported("token leases on a fixed window"));
        };
        let redis_key = keys::redis_key(self.namespace(), key, policy.algorithm());
        let args = args(policy, request, now);
        self.run_script(script, &redis_key, &args, |reply| parse(policy, reply))
            .await
    }
}
