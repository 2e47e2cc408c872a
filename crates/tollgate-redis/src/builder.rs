//! Configuring a [`RedisStore`].

use std::time::Duration;

use crate::backend::{self, Backend};
use crate::{BuildError, RedisStore};

/// Default timeout of every Redis call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// Default number of consecutive failures that open the circuit.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 5;
/// Default time the circuit stays open before a probe.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(1);
/// Default key namespace.
pub const DEFAULT_NAMESPACE: &str = "tollgate";
/// Default maximum number of pooled connections (standalone).
pub const DEFAULT_POOL_SIZE: usize = 8;

/// The start-up check gets longer than a decision: it runs once and may have to connect first.
const MIN_STARTUP_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
enum Target {
    Standalone(String),
    Cluster(Vec<String>),
}

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`] or [`RedisStore::cluster_builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    target: Target,
    namespace: String,
    timeout: Duration,
    pool_size: usize,
    failure_threshold: u32,
    cool_down: Duration,
}

impl RedisStoreBuilder {
    pub(crate) fn standalone(url: String) -> Self {
        Self::new(Target::Standalone(url))
    }

    pub(crate) fn cluster(nodes: Vec<String>) -> Self {
        Self::new(Target::Cluster(nodes))
    }

    fn new(target: Target) -> Self {
        Self {
            target,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            pool_size: DEFAULT_POOL_SIZE,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            cool_down: DEFAULT_COOL_DOWN,
        }
    }

    /// Prefix of every key (default `tollgate`): keys are `<namespace>:{<client key>}:tb` or `:sw`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Longest wait for any Redis call, connecting included (default 50 ms). Past it the call fails (with
    /// [`StoreError::Timeout`](tollgate_core::StoreError::Timeout)) and the limiter's failure policy decides.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Maximum pooled connections to a standalone server (default 8). Each is multiplexed: a decision borrows
    /// one only to send its command, so concurrent decisions share connections and are pipelined. Ignored for a
    /// Cluster, whose client multiplexes one connection per node.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Opens the circuit after `failures` consecutive failures (default 5) and keeps it open for `cool_down`
    /// (default 1 s) before one probe may close it.
    pub fn circuit_breaker(mut self, failures: u32, cool_down: Duration) -> Self {
        self.failure_threshold = failures;
        self.cool_down = cool_down;
        self
    }

    /// Builds the store and checks `maxmemory-policy` (see [`RedisStore::eviction_check`]).
    ///
    /// A standalone store connects lazily: an unreachable server is not an error here (decisions follow the
    /// failure policy until it is reachable). A Cluster store must reach a node to learn the slot map.
    pub async fn build(self) -> Result<RedisStore, BuildError> {
        if !crate::keys::valid_namespace(&self.namespace) {
            return Err(BuildError::InvalidNamespace(self.namespace));
        }
        if self.timeout.is_zero() {
            return Err(BuildError::InvalidSetting(
                "the timeout must be longer than zero",
            ));
        }
        if self.pool_size == 0 {
            return Err(BuildError::InvalidSetting(
                "the pool size must be at least 1",
            ));
        }
        if self.failure_threshold == 0 {
            return Err(BuildError::InvalidSetting(
                "the circuit breaker's failure threshold must be at least 1",
            ));
        }
        let backend = match &self.target {
            Target::Standalone(url) => Backend::Standalone(
                backend::pool(url, self.pool_size, self.timeout).map_err(BuildError::Connect)?,
            ),
            Target::Cluster(nodes) => {
                let startup = self.timeout.max(MIN_STARTUP_TIMEOUT);
                let conn = tokio::time::timeout(startup, backend::cluster(nodes, self.timeout))
                    .await
                    .map_err(|_| {
                        BuildError::Connect(crate::BackendError::Pool(format!(
                            "no Cluster node answered within {startup:?}"
                        )))
                    })?
                    .map_err(BuildError::Connect)?;
                Backend::Cluster(conn)
            }
        };
        let store = RedisStore::assemble(
            backend,
            self.namespace,
            self.timeout,
            self.failure_threshold,
            self.cool_down,
        );
        let startup = self.timeout.max(MIN_STARTUP_TIMEOUT);
        let check = store.check_eviction_policy_within(startup).await;
        Ok(store.with_eviction_check(check))
    }
}
