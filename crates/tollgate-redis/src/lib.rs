//! The Redis store: one limit for a whole fleet.
//!
//! [`RedisStore`] implements [`tollgate_core::Store`] with the same algorithms as the in-process
//! [`MemoryStore`](tollgate_core::MemoryStore), ported line for line to Lua (`lua/token_bucket.lua`,
//! `lua/sliding_window.lua`), and returns bit-identical decisions for the same inputs and times. What it adds is
//! that every instance shares the state, so "100 per second" holds for the fleet, not per instance.
//!
//! - **One round trip per decision**: `EVALSHA` of a script that reads, decides, writes and sets the TTL
//!   atomically; `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover) is answered by one `EVAL`.
//! - **Server time**: the script reads Redis's `TIME`, so instances with skewed clocks cannot mint tokens.
//! - **TTL from the policy**: a key lives exactly until its state is indistinguishable from a fresh one.
//! - **Keys**: `<namespace>:{<client key>}:tb` (token bucket) or `:sw` (sliding window); the braces are a hash
//!   tag, so Redis Cluster works. Client keys over 64 bytes or with bytes outside printable ASCII (or with `{`,
//!   `}`, `#`, `"`, `\`) are stored as `#` + their SHA-1, never raw.
//! - **Concurrency leases**: [`RedisStore`] is also a [`SlotStore`](tollgate_core::slot::SlotStore): each key's
//!   in-flight requests are a sorted set `<namespace>:{<key>}:inflight` of lease ids scored by expiry (server
//!   time); `lua/concurrency_acquire.lua` removes expired leases, counts, admits and sets the key's TTL to its
//!   longest lease in one script, so a crashed instance's leases expire and idle keys vanish. A release that finds
//!   no lease leaves a short-lived tombstone, so an acquire that lands after it (its caller timed out during a
//!   stall and released at once) is refused instead of holding a slot nobody will give back.
//! - **Primaries only**: pointed at a replica, Redis answers `READONLY`, reported as
//!   [`BackendError::ReadOnly`] and left to the limiter's failure policy; the connection is then made again (after a
//!   failover the host name may point at the new primary). A connection the server or a proxy closed while idle
//!   is retried once on a new one.
//! - **A Cluster slot no primary serves** (its primary down with no replica left): decisions on its keys fail with
//!   [`BackendError::ClusterSlotDown`], naming the key's hash slot, within the decision's budget; once a primary
//!   serves the slot again, the same store decides on them again.
//! - **Redis 5 or later**: the scripts write after reading `TIME`, which needs effects replication (the default
//!   from Redis 5).
//! - **Start-up check**: `maxmemory-policy` other than `noeviction` (or unreadable) is logged loudly, and the result
//!   is kept in [`RedisStore::eviction_check`].
//! - **Failures are the caller's to answer**: every call is bounded by a timeout (default 250 ms, [`DEFAULT_TIMEOUT`] says why); 5 consecutive
//!   failures open a circuit that skips Redis for 1 s, then one probe may close it. The error (`timeout`,
//!   `circuit_open`, `backend`) goes back to the limiter that asked: a tollgate layer applies its `on_store_error`
//!   policy (open, closed, or a local in-process limit), counts it in `tollgate_decisions_total` and logs it. Round
//!   trips are recorded in the histogram `tollgate_store_latency_seconds{outcome}`, the circuit in the gauge
//!   `tollgate_store_circuit_open`.
//!
//! - **Production Redis**: `rediss://` URLs use TLS through rustls with the system's roots, or a private CA
//!   ([`tls_ca_file`](RedisStoreBuilder::tls_ca_file)) and a client certificate for mutual TLS
//!   ([`tls_client_cert_files`](RedisStoreBuilder::tls_client_cert_files)), for a server, a Cluster and Sentinel
//!   alike. The ACL user and password come from the URL (`rediss://user:pass@host:6380`) or the builder, the
//!   password also from an environment variable or a file ([`password_file`](RedisStoreBuilder::password_file)),
//!   so it need not sit in argv. [`RedisStore::sentinel_builder`] finds the primary through Sentinel;
//!   `RedisStore::from_deadpool` (feature `deadpool-redis`) builds the store on an application's existing
//!   deadpool-redis pool, at the cost of its checkout `PING` (figures in `docs/BENCHMARKS.md`).
//! - **Fail fast on configuration, ride out outages**: [`build`](RedisStoreBuilder::build) connects, loads the
//!   scripts and runs one decision on a probe key of its own. A wrong password or unknown user, an untrusted, expired
//!   or wrong-host certificate, a plaintext URL against a TLS port or a `NOPERM` reply is a typed [`BuildError`];
//!   an unreachable Redis is an outage: the store is built, its calls fail (the limiter's failure policy decides),
//!   and it connects when Redis comes up.
//! - **Sentinel**: [`RedisStore::sentinel_builder`] asks the Sentinels for the master name's primary for every new
//!   connection (redis-rs checks its `ROLE`, so a replica is never used). A failover is followed three ways: a
//!   demoted primary's `READONLY`, a dead primary's failed socket, and Sentinel's `+switch-master` announcement
//!   (watched on one Sentinel at a time), each of which retires the old connections. In the private setups of the
//!   tests (`down-after-milliseconds 1000`) decisions resume about 1.1 s after `SENTINEL FAILOVER` and 2.5 s after
//!   a SIGKILL of the primary. The Sentinels themselves are reached without credentials.
//! - **Pinned scripts**: every new connection (at start, after a reconnect, after a failover) loads the scripts
//!   with `SCRIPT LOAD` before its first decision, so a decision stays one `EVALSHA` even on Redis 7.4+, which may
//!   evict scripts that `EVAL` loaded.
//! - **What the scripts rely on**: each touches only the one key it is given in `KEYS` (hash-tagged, so Cluster
//!   and servers that enforce declared keys, such as Dragonfly, accept it; `tests/script_keys.rs` runs every
//!   script as a user allowed exactly those keys), reads the time with `TIME` (effects replication: Redis 5 and
//!   later), and uses no deprecated Lua. Tested on Redis 7.0; peeks use `EVALSHA_RO` (7.0) and fall back to
//!   `EVALSHA` before it. Valkey and other forks are not tested here.
//!
//! ## Features
//!
//! `cluster` (Redis Cluster), `sentinel` (Sentinel discovery and failover) and `tls` (`rediss://` through rustls)
//! are on by default; without them the crate builds only the standalone store (the `tollgate` facade turns them on
//! with `redis-cluster`, `redis-sentinel`, `redis-tls`). `cli`: [`cli::RedisArgs`], the Redis flags of a
//! command-line tool (clap). `deadpool-redis`: `RedisStore::from_deadpool`.
//!
//! ## Least privilege
//!
//! The store needs exactly these permissions (keys under its namespace, here `tollgate`; the commands it sends and
//! those its scripts call; `role` for Sentinel's check of the primary, `cluster|slots` for a Cluster's slot map):
//!
//! ```text
//! ACL SETUSER tollgate on >PASSWORD resetkeys ~tollgate:* resetchannels -@all +evalsha +eval +evalsha_ro +eval_ro +script|load +time +hmget +hset +hgetall +hdel +pexpire +pexpireat +pttl +zadd +zcount +zrange +zrem +zremrangebyscore +zscore +role +cluster|slots
//! ```
//!
//! (also [`LEAST_PRIVILEGE_ACL`]). Without `+config|get` (which that line leaves out, since `CONFIG GET` can
//! read secrets) the start-up eviction check cannot read `maxmemory-policy`: it logs a warning saying so and
//! reports [`EvictionCheck::Unknown`]; it never fails and never passes silently.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Outcome, Policy, Quota, Store};
//! use tollgate_redis::RedisStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
//! # let namespace = format!("doctest-{}-{}", std::process::id(), std::time::SystemTime::now()
//! #     .duration_since(std::time::UNIX_EPOCH)?.as_nanos());
//! tokio::runtime::Runtime::new()?.block_on(async {
//!     let store = RedisStore::builder(url) // e.g. "redis://127.0.0.1:6379"
//!         .namespace(namespace) // e.g. "myapp"
//!         .timeout(Duration::from_secs(2)) // the default is 250 ms
//!         .build()
//!         .await?;
//!     let policy = Policy::token_bucket(Quota::per_minute(100)?.with_burst(2)?);
//!     assert!(store.check("client-42", &policy, 1).await?.is_allowed());
//!     assert!(store.check("client-42", &policy, 1).await?.is_allowed());
//!     let denied = store.check("client-42", &policy, 1).await?;
//!     assert_eq!(denied.outcome, Outcome::Limited);
//!     // One token comes back every 600 ms (a little less is left by the time the third request arrives).
//!     assert!(denied.retry_after.unwrap() <= Duration::from_millis(600));
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })
//! # }
//! ```
//!
//! A Redis Cluster is given by some of its nodes:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_core::{Policy, Quota, Store};
//! use tollgate_redis::RedisStore;
//!
//! let cluster = RedisStore::cluster_builder(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
//!     .build()
//!     .await?;
//! let policy = Policy::sliding_window(Quota::per_second(100)?)?;
//! cluster.check("client-42", &policy, 1).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod backend;
mod builder;
mod circuit;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cluster")]
mod cluster;
mod connect;
mod deadline;
mod error;
mod eviction;
mod keys;
mod observe;
mod script;
#[cfg(feature = "sentinel")]
mod sentinel;
mod slot;
mod store;
mod token_lease;

pub use builder::{
    DEFAULT_COOL_DOWN, DEFAULT_FAILURE_THRESHOLD, DEFAULT_NAMESPACE, DEFAULT_POOL_SIZE,
    DEFAULT_TIMEOUT, RedisStoreBuilder,
};
pub use circuit::CircuitState;
pub use error::{BackendError, BuildError};
pub use eviction::EvictionCheck;
pub use observe::{CIRCUIT_OPEN, LATENCY_SECONDS};
pub use script::{
    CONCURRENCY_ACQUIRE_LUA, CONCURRENCY_RELEASE_LUA, CONCURRENCY_RENEW_LUA, FIXED_WINDOW_LUA,
    FIXED_WINDOW_OPS_LUA, SET_LUA, SLIDING_WINDOW_CHARGE_LUA, SLIDING_WINDOW_LEASE_LUA,
    SLIDING_WINDOW_LUA, SLIDING_WINDOW_OPS_LUA, TOKEN_BUCKET_CHARGE_LUA, TOKEN_BUCKET_LEASE_LUA,
    TOKEN_BUCKET_LUA, TOKEN_BUCKET_OPS_LUA,
};
pub use store::RedisStore;

/// The least-privilege ACL rule the store works under, for the namespace `tollgate` (replace `PASSWORD`, and
/// `tollgate:*` with `<your namespace>:*`).
pub const LEAST_PRIVILEGE_ACL: &str = "ACL SETUSER tollgate on >PASSWORD resetkeys ~tollgate:* resetchannels -@all \
    +evalsha +eval +evalsha_ro +eval_ro +script|load +time +hmget +hset +hgetall +hdel +pexpire +pexpireat +pttl +zadd +zcount +zrange +zrem \
    +zremrangebyscore +zscore +role +cluster|slots";
