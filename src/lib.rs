//! tollgate: rate limits and load shedding for tower, axum and tonic services, per instance or for a whole
//! fleet.
//!
//! `tollgate` is the one dependency: its features select the parts, and everything is imported from here.
//!
//! | feature | what it adds |
//! |---|---|
//! | (none) | the algorithms, [`Policy`], [`Quota`], the [`Store`] trait and the in-process [`MemoryStore`] |
//! | `redis` | [`redis`]: the Redis store, limits shared by a fleet (`redis-cluster`, `redis-sentinel`, `redis-tls` add Cluster, Sentinel and `rediss://`; `redis-cli` the `RedisArgs` flags of a command-line tool) |
//! | `http` | [`tower`]'s rate limiter and [`http`]: layers for `http` services, 429/503 responses, RateLimit fields |
//! | `axum` | `http`, with axum's extractors for keys |
//! | `grpc` | [`grpc`]: the tonic adapter (RESOURCE_EXHAUSTED / UNAVAILABLE with RetryInfo) |
//! | `config` | [`config`]: limiters from a TOML policy file, reloaded without a restart, built into the layers of the protocols enabled (`axum`: an axum router's; `grpc`: a tonic server's) |
//! | `stack` | [`stack`]: the concurrent-requests limiter and the load shedders |
//! | `leases` | token leases: hot keys admitted from batches leased from the store |
//! | `client` | [`client`]: the outbound layer that paces requests by the servers' RateLimit fields |
//! | `rls` | [`rls`]: the Envoy rate limit service (RLS v3) reading envoyproxy/ratelimit's YAML |
//!
//! The `tollgate-*` crates behind it are its implementation; depend on this one.
//!
//! ```
//! use tollgate::{MemoryStore, Policy, Quota};
//!
//! let store = MemoryStore::new();
//! let policy = Policy::sliding_window(Quota::per_minute(60)?)?;
//! assert!(store.check_now("client", &policy, 1)?.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
// On docs.rs (nightly, `--cfg docsrs`), items behind a feature say which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's examples compile and run with the doctests, so they cannot drift from the API.
#[cfg(all(doctest, feature = "config", feature = "axum"))]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

// So do the examples of the pages the README links to.
#[cfg(all(
    doctest,
    feature = "config",
    feature = "axum",
    feature = "redis-cli",
    feature = "stack",
    feature = "client"
))]
mod page_examples {
    #[doc = include_str!("../docs/client.md")]
    struct Client;
    #[doc = include_str!("../docs/observability.md")]
    struct Observability;
    #[doc = include_str!("../docs/policy-files.md")]
    struct PolicyFiles;
    #[doc = include_str!("../docs/production-redis.md")]
    struct ProductionRedis;
    #[doc = include_str!("../docs/stripe-stack.md")]
    struct StripeStack;
}

pub use tollgate_core::*;

#[cfg(feature = "redis")]
pub use tollgate_redis as redis;

#[cfg(feature = "http")]
pub use tollgate_http as http;

#[cfg(any(
    feature = "http",
    feature = "grpc",
    feature = "stack",
    feature = "leases"
))]
pub use tollgate_tower as tower;

#[cfg(feature = "grpc")]
pub use tollgate_grpc as grpc;

/// Policy files (TOML): limiters, overrides and exemptions built into the axum layer (with feature `axum`) and the
/// tonic layer (with `grpc`), reloaded without a restart (feature `config`).
#[cfg(feature = "config")]
pub use tollgate_config as config;

/// The outbound side: a tower layer that paces a client by the servers' RateLimit fields, `Retry-After` and gRPC
/// `RetryInfo` (feature `client`).
#[cfg(feature = "client")]
pub use tollgate_client as client;

/// The Envoy rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) on tonic, reading
/// envoyproxy/ratelimit's YAML (feature `rls`; the same server as the `tollgate-rls` binary).
#[cfg(feature = "rls")]
pub use tollgate_rls as rls;

/// Stripe's production stack: the concurrent-requests limiter, the fleet-usage and worker-utilization load
/// shedders, the adaptive concurrency limit, and the layer that stacks them with the rate limiter (they live in
/// `tollgate-tower`, on the decision core every tollgate limiter shares; their one service is
/// [`InFlightLimit`](crate::stack::InFlightLimit)).
#[cfg(feature = "stack")]
pub mod stack {
    pub use tollgate_tower::limit::{adaptive, concurrency, fleet, stack, worker};
    pub use tollgate_tower::permit;
    pub use tollgate_tower::{
        AdaptiveLimitLayer, ConcurrencyLimitLayer, ConfigError, FleetShedLayer, HoldPermit,
        InFlightLimit, Permit, PermitBody, StackLayer, WorkerShedLayer,
    };
}
