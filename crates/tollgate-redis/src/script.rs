//! The Lua scripts (from the workspace's `lua/`), their arguments and their replies.

use std::time::Duration;

use tollgate_core::{Algorithm, Check, Decision, Outcome, Policy, Timestamp};

use crate::BackendError;

/// `lua/token_bucket.lua` after `lua/prelude.lua` (the shared integer arithmetic and time prologue) and
/// `lua/token_leases.lua` (the token lease book the bucket honours), embedded at compile time.
pub const TOKEN_BUCKET_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/token_leases.lua"),
    include_str!("../lua/token_bucket.lua")
);
/// `lua/token_bucket_lease.lua` after `lua/prelude.lua` and `lua/token_leases.lua`, embedded at compile time.
pub const TOKEN_BUCKET_LEASE_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/token_leases.lua"),
    include_str!("../lua/token_bucket_lease.lua")
);
/// `lua/sliding_window_lease.lua` after `lua/prelude.lua`, embedded at compile time.
pub const SLIDING_WINDOW_LEASE_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/sliding_window_lease.lua")
);
/// `lua/sliding_window.lua` after `lua/prelude.lua`, embedded at compile time.
pub const SLIDING_WINDOW_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/sliding_window.lua")
);

/// `lua/token_bucket.lua` wrapped in the store operations (`lua/ops_open.lua`, `lua/ops_close.lua`: peek and
/// lockouts), after `lua/prelude.lua`. The lease book's functions (`lua/token_leases.lua`) open the wrapped body,
/// so that their writes go through the wrapper too: a peek or a locked key's refusal sweeps no lease.
pub const TOKEN_BUCKET_OPS_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/ops_open.lua"),
    include_str!("../lua/token_leases.lua"),
    include_str!("../lua/token_bucket.lua"),
    include_str!("../lua/ops_close.lua")
);
/// `lua/fixed_window.lua` after `lua/prelude.lua`, embedded at compile time.
pub const FIXED_WINDOW_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/fixed_window.lua")
);
/// `lua/fixed_window.lua` wrapped in the store operations (peek, lockouts), after `lua/prelude.lua`.
pub const FIXED_WINDOW_OPS_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/ops_open.lua"),
    include_str!("../lua/fixed_window.lua"),
    include_str!("../lua/ops_close.lua")
);
/// `lua/startup_probe.lua`: every command the scripts run, once, on a key of its own, at start-up.
pub(crate) const STARTUP_PROBE_LUA: &str = include_str!("../lua/startup_probe.lua");
/// `lua/sliding_window.lua` wrapped in the store operations, after `lua/prelude.lua`.
pub const SLIDING_WINDOW_OPS_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/ops_open.lua"),
    include_str!("../lua/sliding_window.lua"),
    include_str!("../lua/ops_close.lua")
);

/// `lua/token_bucket_charge.lua` (cost after the response) after `lua/prelude.lua`.
pub const TOKEN_BUCKET_CHARGE_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/token_bucket_charge.lua")
);
/// `lua/sliding_window_charge.lua` (cost after the response) after `lua/prelude.lua`.
pub const SLIDING_WINDOW_CHARGE_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/sliding_window_charge.lua")
);

/// `lua/concurrency_acquire.lua` after `lua/prelude.lua`, embedded at compile time.
pub const CONCURRENCY_ACQUIRE_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/concurrency_acquire.lua")
);
/// `lua/concurrency_renew.lua` after `lua/prelude.lua`, embedded at compile time.
pub const CONCURRENCY_RENEW_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/concurrency_renew.lua")
);
/// `lua/concurrency_release.lua` after `lua/prelude.lua`, embedded at compile time.
pub const CONCURRENCY_RELEASE_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/concurrency_release.lua")
);

/// Several limits decided as one (`lua/set_open.lua`, `lua/set_close.lua`): every algorithm's script wrapped as a
/// function of its `KEYS` and `ARGV`, after `lua/prelude.lua` and `lua/token_leases.lua`. The wrapping lines are
/// here rather than in files of their own: they are only the functions' opening and closing.
pub const SET_LUA: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/set_open.lua"),
    include_str!("../lua/token_leases.lua"),
    "local function token_bucket(KEYS, ARGV)\n",
    include_str!("../lua/token_bucket.lua"),
    "end\nlocal function sliding_window(KEYS, ARGV)\n",
    include_str!("../lua/sliding_window.lua"),
    "end\nlocal function fixed_window(KEYS, ARGV)\n",
    include_str!("../lua/fixed_window.lua"),
    "end\n",
    include_str!("../lua/set_close.lua")
);

/// A script's source and SHA-1, as `EVALSHA` wants it.
pub(crate) struct Script {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl std::fmt::Debug for Script {
    // The SHA names the script; its source would fill a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script").field("sha", &self.sha).finish()
    }
}

impl Script {
    pub(crate) fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

/// Every script the store runs (decisions, token leases, concurrency slots), hashed once per process.
#[derive(Debug)]
pub(crate) struct Scripts {
    token_bucket: Script,
    sliding_window: Script,
    token_bucket_lease: Script,
    sliding_window_lease: Script,
    token_bucket_ops: Script,
    sliding_window_ops: Script,
    token_bucket_charge: Script,
    sliding_window_charge: Script,
    fixed_window: Script,
    fixed_window_ops: Script,
    set: Script,
    startup_probe: Script,
    pub(crate) concurrency_acquire: Script,
    pub(crate) concurrency_renew: Script,
    pub(crate) concurrency_release: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            token_bucket: Script::new(TOKEN_BUCKET_LUA),
            sliding_window: Script::new(SLIDING_WINDOW_LUA),
            token_bucket_lease: Script::new(TOKEN_BUCKET_LEASE_LUA),
            sliding_window_lease: Script::new(SLIDING_WINDOW_LEASE_LUA),
            token_bucket_ops: Script::new(TOKEN_BUCKET_OPS_LUA),
            sliding_window_ops: Script::new(SLIDING_WINDOW_OPS_LUA),
            token_bucket_charge: Script::new(TOKEN_BUCKET_CHARGE_LUA),
            sliding_window_charge: Script::new(SLIDING_WINDOW_CHARGE_LUA),
            fixed_window: Script::new(FIXED_WINDOW_LUA),
            fixed_window_ops: Script::new(FIXED_WINDOW_OPS_LUA),
            set: Script::new(SET_LUA),
            startup_probe: Script::new(STARTUP_PROBE_LUA),
            concurrency_acquire: Script::new(CONCURRENCY_ACQUIRE_LUA),
            concurrency_renew: Script::new(CONCURRENCY_RENEW_LUA),
            concurrency_release: Script::new(CONCURRENCY_RELEASE_LUA),
        }
    }

    /// The token lease script of `algorithm` (the fixed window has none).
    pub(crate) fn lease_for(&self, algorithm: Algorithm) -> Option<&Script> {
        match algorithm {
            Algorithm::TokenBucket => Some(&self.token_bucket_lease),
            Algorithm::SlidingWindowCounter => Some(&self.sliding_window_lease),
            Algorithm::FixedWindow => None,
        }
    }

    /// The charge script (cost after the response) of `algorithm` (the fixed window has none).
    pub(crate) fn charge_for_algorithm(&self, algorithm: Algorithm) -> Option<&Script> {
        match algorithm {
            Algorithm::TokenBucket => Some(&self.token_bucket_charge),
            Algorithm::SlidingWindowCounter => Some(&self.sliding_window_charge),
            Algorithm::FixedWindow => None,
        }
    }

    /// The wrapped script (peek, lockouts) of `algorithm`.
    pub(crate) fn ops_for_algorithm(&self, algorithm: Algorithm) -> &Script {
        match algorithm {
            Algorithm::TokenBucket => &self.token_bucket_ops,
            Algorithm::SlidingWindowCounter => &self.sliding_window_ops,
            Algorithm::FixedWindow => &self.fixed_window_ops,
        }
    }

    /// Several limits decided as one (`SET_LUA`).
    pub(crate) fn set(&self) -> &Script {
        &self.set
    }

    /// The start-up check of the store's permissions (`lua/startup_probe.lua`).
    pub(crate) fn startup_probe(&self) -> &Script {
        &self.startup_probe
    }

    /// The scripts of every store, hashed once per process.
    pub(crate) fn shared() -> &'static Self {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(Self::new)
    }

    pub(crate) fn for_algorithm(&self, algorithm: Algorithm) -> &Script {
        match algorithm {
            Algorithm::TokenBucket => &self.token_bucket,
            Algorithm::SlidingWindowCounter => &self.sliding_window,
            Algorithm::FixedWindow => &self.fixed_window,
        }
    }
}

/// Every script a store runs: loaded with `SCRIPT LOAD` on each new connection (and at start-up), so that a
/// decision is one `EVALSHA` even where the server evicts scripts that `EVAL` loaded (Redis 7.4 and later).
pub(crate) fn pinned() -> [&'static Script; 15] {
    let s = Scripts::shared();
    [
        &s.token_bucket,
        &s.sliding_window,
        &s.token_bucket_lease,
        &s.sliding_window_lease,
        &s.token_bucket_ops,
        &s.sliding_window_ops,
        &s.token_bucket_charge,
        &s.sliding_window_charge,
        &s.fixed_window,
        &s.fixed_window_ops,
        &s.set,
        &s.startup_probe,
        &s.concurrency_acquire,
        &s.concurrency_renew,
        &s.concurrency_release,
    ]
}

/// The script's ARGV: the policy's derived integers (so the script needs no gcd), the cost and the injected time
/// (empty: the server's `TIME`).
pub(crate) fn args(policy: &Policy, cost: u64, now: Option<Timestamp>) -> [String; 5] {
    let quota = policy.quota();
    let now = now_arg(now);
    match policy.algorithm() {
        Algorithm::TokenBucket => token_bucket_args(&quota, cost.to_string(), now),
        Algorithm::SlidingWindowCounter => [
            quota.limit().to_string(),
            quota.period_micros().to_string(),
            policy.tick_micros().to_string(),
            cost.to_string(),
            now,
        ],
        // The time stays fifth, where the store operations read it.
        Algorithm::FixedWindow => [
            quota.limit().to_string(),
            quota.period_micros().to_string(),
            cost.to_string(),
            String::new(),
            now,
        ],
    }
}

/// The injected time argument (empty: the server's `TIME`).
fn now_arg(now: Option<Timestamp>) -> String {
    now.map_or_else(String::new, |t| t.as_micros().to_string())
}

/// The token bucket's ARGV, a decision's and a charge's alike: the quota's derived integers, then `amount` (the
/// cost, or the charge's delta) and the time.
fn token_bucket_args(quota: &tollgate_core::Quota, amount: String, now: String) -> [String; 5] {
    [
        quota.token_bucket_token().to_string(),
        quota.token_bucket_rate().to_string(),
        quota.burst().to_string(),
        amount,
        now,
    ]
}

/// The wrapped script's ARGV: the algorithm's, then the lockout (µs, 0: none) and whether to peek.
pub(crate) fn ops_args(
    policy: &Policy,
    cost: u64,
    now: Option<Timestamp>,
    peek: bool,
) -> Vec<String> {
    let mut args = Vec::from(self::args(policy, cost, now));
    args.push(policy.lockout_micros().to_string());
    args.push(if peek { "1" } else { "0" }.to_owned());
    args
}

/// A token bucket's decision ARGV with a hold (µs, capped so that `now + hold` stays an exact integer in Lua's
/// doubles) sixth, as `token_bucket.lua` reads it.
pub(crate) fn held_args(
    policy: &Policy,
    cost: u64,
    now: Option<Timestamp>,
    hold: Duration,
) -> Vec<String> {
    let mut args = Vec::from(self::args(policy, cost, now));
    args.push(
        hold.as_micros()
            .min(u128::from(Timestamp::LATEST.as_micros()))
            .to_string(),
    );
    args
}

/// The charge script's ARGV.
pub(crate) fn charge_args(
    policy: &Policy,
    delta: i64,
    decided_at: Timestamp,
    now: Option<Timestamp>,
) -> [String; 5] {
    let quota = policy.quota();
    let now = now_arg(now);
    match policy.algorithm() {
        // The same script arguments as a decision's, the delta in the cost's place.
        Algorithm::TokenBucket => token_bucket_args(&quota, delta.to_string(), now),
        Algorithm::SlidingWindowCounter => [
            quota.limit().to_string(),
            quota.period_micros().to_string(),
            delta.to_string(),
            decided_at.min(Timestamp::LATEST).as_micros().to_string(),
            now,
        ],
        // Never run: the fixed window has no charge script.
        Algorithm::FixedWindow => Default::default(),
    }
}

/// Turns the charge script's reply (the charged state, its lockout and the server's time) into the decision
/// after it, derived as `MemoryStore` derives it ([`charge::decision`](tollgate_core::algorithm::charge::decision)).
pub(crate) fn parse_charge_reply(
    policy: &Policy,
    reply: &redis::Value,
) -> Result<Decision, BackendError> {
    use tollgate_core::algorithm::charge;
    use tollgate_core::algorithm::lockout::Locked;
    use tollgate_core::algorithm::sliding_window::{self, SlidingWindowState};
    use tollgate_core::algorithm::token_bucket::{self, TokenBucketState};

    let bad = |why: &str| BackendError::BadReply(format!("{why} in charge reply {reply:?}"));
    let redis::Value::Array(items) = reply else {
        return Err(bad("expected an array"));
    };
    let ints = items
        .iter()
        .map(|item| match item {
            redis::Value::Int(n) => u64::try_from(*n).map_err(|_| bad("negative value")),
            _ => Err(bad("expected integers")),
        })
        .collect::<Result<Vec<u64>, _>>()?;
    let lockout = policy.lockout_micros();
    match (policy.algorithm(), ints.as_slice()) {
        (Algorithm::TokenBucket, &[full_at, remainder, locked_until, now]) => {
            let state = Locked {
                state: TokenBucketState { full_at, remainder },
                locked_until,
            };
            let now = Timestamp::from_micros(now);
            Ok(charge::decision(state, lockout, |s| {
                token_bucket::decide(s, &policy.quota(), 0, now)
            }))
        }
        (
            Algorithm::SlidingWindowCounter,
            &[window_start, previous, current, locked_until, now],
        ) => {
            let state = Locked {
                state: SlidingWindowState {
                    window_start,
                    previous,
                    current,
                },
                locked_until,
            };
            let now = Timestamp::from_micros(now);
            Ok(charge::decision(state, lockout, |s| {
                sliding_window::decide(s, policy, 0, now)
            }))
        }
        _ => Err(bad("unexpected length")),
    }
}

/// The set script's ARGV for `checks` (see `lua/set_open.lua`): the instant (empty: the server's `TIME`), then per
/// check its algorithm, whether it is enforced, and the algorithm's arguments without their own time.
pub(crate) fn set_args(checks: &[Check<'_>], now: Option<Timestamp>) -> Vec<String> {
    let mut args = Vec::with_capacity(1 + 7 * checks.len());
    args.push(now_arg(now));
    for check in checks {
        let algorithm = match check.policy.algorithm() {
            Algorithm::TokenBucket => "tb",
            Algorithm::SlidingWindowCounter => "sw",
            Algorithm::FixedWindow => "fw",
        };
        let [a, b, c, d, _] = self::args(check.policy, check.cost, None);
        let enforced = if check.enforced { "1" } else { "0" };
        args.extend([
            algorithm.to_owned(),
            enforced.to_owned(),
            a,
            b,
            c,
            d,
            String::new(),
        ]);
    }
    args
}

/// Turns the set script's reply, one decision reply per check, into the checks' decisions.
pub(crate) fn parse_set_reply(
    checks: &[Check<'_>],
    reply: &redis::Value,
) -> Result<Vec<Decision>, BackendError> {
    match reply {
        redis::Value::Array(items) if items.len() == checks.len() => checks
            .iter()
            .zip(items)
            .map(|(check, item)| parse_reply(check.policy, item))
            .collect(),
        _ => Err(BackendError::BadReply(format!(
            "expected {} decisions in the set script's reply {reply:?}",
            checks.len()
        ))),
    }
}

/// Turns `{outcome, remaining, reset_us, retry_after_us, now_us}` into a [`Decision`].
pub(crate) fn parse_reply(policy: &Policy, reply: &redis::Value) -> Result<Decision, BackendError> {
    let bad = |why: &str| BackendError::BadReply(format!("{why} in script reply {reply:?}"));
    let redis::Value::Array(items) = reply else {
        return Err(bad("expected an array"));
    };
    let mut ints = [0_i64; 5];
    if items.len() != ints.len() {
        return Err(bad("expected 5 integers"));
    }
    for (slot, item) in ints.iter_mut().zip(items) {
        let redis::Value::Int(n) = item else {
            return Err(bad("expected integers"));
        };
        *slot = *n;
    }
    let [outcome, remaining, reset, retry_after, now] = ints;
    let unsigned = |n: i64| u64::try_from(n).map_err(|_| bad("negative value"));
    let outcome = match outcome {
        0 => Outcome::Allowed,
        1 => Outcome::Limited,
        2 => Outcome::CostExceedsCapacity,
        _ => return Err(bad("unknown outcome")),
    };
    Ok(Decision {
        outcome,
        limit: policy.quota().burst(),
        remaining: unsigned(remaining)?,
        reset: Timestamp::from_micros(unsigned(reset)?),
        retry_after: if retry_after < 0 {
            None
        } else {
            Some(Duration::from_micros(unsigned(retry_after)?))
        },
        now: Timestamp::from_micros(unsigned(now)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Quota;

    /// The commands `source` runs with `redis.call`, in upper case.
    fn commands(source: &str) -> std::collections::BTreeSet<&str> {
        source
            .split("redis.call('")
            .skip(1)
            .filter_map(|rest| rest.split('\'').next())
            .collect()
    }

    /// The start-up probe runs every command any pinned script runs (a new command in a script, missing from
    /// the probe, would pass start-up and fail on first use under an ACL user that lacks it).
    #[test]
    fn the_startup_probe_runs_every_command_of_the_scripts() {
        let probe = commands(STARTUP_PROBE_LUA);
        let mut all = std::collections::BTreeSet::new();
        for script in pinned() {
            all.extend(commands(script.source));
        }
        assert!(all.len() >= 14, "{all:?}");
        let missing: Vec<_> = all.difference(&probe).collect();
        assert!(
            missing.is_empty(),
            "the start-up probe does not run {missing:?}"
        );
    }

    #[test]
    fn scripts_are_embedded_and_hashed() {
        let scripts = Scripts::new();
        let tb = scripts.for_algorithm(Algorithm::TokenBucket);
        assert!(tb.source.contains("token_bucket.rs"));
        assert_eq!(tb.sha.len(), 40);
        assert_ne!(
            tb.sha,
            scripts.for_algorithm(Algorithm::SlidingWindowCounter).sha
        );
    }

    #[test]
    fn every_script_starts_with_the_one_prelude() {
        let prelude = include_str!("../lua/prelude.lua");
        for source in [
            TOKEN_BUCKET_LUA,
            SLIDING_WINDOW_LUA,
            TOKEN_BUCKET_LEASE_LUA,
            SLIDING_WINDOW_LEASE_LUA,
            TOKEN_BUCKET_OPS_LUA,
            SLIDING_WINDOW_OPS_LUA,
            TOKEN_BUCKET_CHARGE_LUA,
            SLIDING_WINDOW_CHARGE_LUA,
            SET_LUA,
            crate::CONCURRENCY_ACQUIRE_LUA,
            crate::CONCURRENCY_RENEW_LUA,
            crate::CONCURRENCY_RELEASE_LUA,
        ] {
            assert!(source.starts_with(prelude));
            // Defined once: a script repeating a helper would shadow the prelude's copy.
            for helper in ["idiv", "div_ceil", "int", "server_time_us", "decision_time"] {
                let definition = format!("local function {helper}(");
                assert_eq!(source.matches(&definition).count(), 1, "{helper}");
            }
            assert_eq!(source.matches("redis.call('TIME')").count(), 1);
        }
    }

    #[test]
    fn replies_parse_and_bad_replies_are_errors() {
        let policy = Policy::token_bucket(Quota::per_second(5).unwrap());
        let ok = redis::Value::Array(vec![
            redis::Value::Int(1),
            redis::Value::Int(0),
            redis::Value::Int(2_000_000),
            redis::Value::Int(200_000),
            redis::Value::Int(1_000_000),
        ]);
        let d = parse_reply(&policy, &ok).unwrap();
        assert_eq!(d.outcome, Outcome::Limited);
        assert_eq!(d.retry_after, Some(Duration::from_millis(200)));
        assert_eq!(d.limit, 5);
        assert!(parse_reply(&policy, &redis::Value::Nil).is_err());
        assert!(parse_reply(&policy, &redis::Value::Array(vec![redis::Value::Int(9); 5])).is_err());
    }
}
