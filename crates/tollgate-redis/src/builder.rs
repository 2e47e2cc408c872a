//! Configuring a [`RedisStore`].

use std::path::PathBuf;
use std::time::Duration;

use tollgate_core::{Policy, Quota};

use crate::backend::{self, Backend, Connector};
#[cfg(feature = "tls")]
use crate::connect::Pem;
use crate::connect::{self, Secret, Security};
use crate::{BackendError, BuildError, RedisStore};

/// Default budget of every Redis call: 250 ms.
///
/// It fits a Redis in another zone (≈ 1 ms away) or another region (≈ 20–100 ms away) with room for a machine
/// whose cores are saturated (each wake-up of the request's task, of the connection's task and of Redis may wait
/// a scheduler slice, ≈ 10 ms on a busy 2-core machine), so that a healthy Redis never fails a decision; a Redis
/// that stops answering is still cut off within it, and the circuit then skips it. A Redis on the same host or
/// in the same zone may take a tighter budget with [`RedisStoreBuilder::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// Default number of consecutive failures that open the circuit.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 5;
/// Default time the circuit stays open before a probe.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(1);
/// Default key namespace.
pub const DEFAULT_NAMESPACE: &str = "tollgate";
/// Default maximum number of pooled connections (standalone).
pub const DEFAULT_POOL_SIZE: usize = 8;

/// The start-up checks get longer than a decision: they run once and may have to connect first. It is also the
/// connection's own limit for connecting (a TLS handshake and `AUTH` on a loaded machine may take longer than a
/// decision's budget, and a start-up check cut short would report a wrong password as an outage); every call is
/// still bounded by the store's timeout.
const MIN_STARTUP_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
enum Target {
    Standalone(String),
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
    #[cfg(feature = "deadpool-redis")]
    Deadpool(deadpool_redis::Pool),
}

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`], [`RedisStore::cluster_builder`],
/// [`RedisStore::sentinel_builder`] or `RedisStore::from_deadpool`.
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    target: Target,
    namespace: String,
    timeout: Duration,
    pool_size: usize,
    failure_threshold: u32,
    cool_down: Duration,
    security: Security,
}

impl RedisStoreBuilder {
    pub(crate) fn standalone(url: String) -> Self {
        Self::new(Target::Standalone(url))
    }

    #[cfg(feature = "cluster")]
    pub(crate) fn cluster(nodes: Vec<String>) -> Self {
        Self::new(Target::Cluster(nodes))
    }

    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(sentinels: Vec<String>, master: String) -> Self {
        Self::new(Target::Sentinel { sentinels, master })
    }

    #[cfg(feature = "deadpool-redis")]
    pub(crate) fn deadpool(pool: deadpool_redis::Pool) -> Self {
        Self::new(Target::Deadpool(pool))
    }

    fn new(target: Target) -> Self {
        Self {
            target,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            pool_size: DEFAULT_POOL_SIZE,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            cool_down: DEFAULT_COOL_DOWN,
            security: Security::default(),
        }
    }

    /// Prefix of every key (default `tollgate`): keys are `<namespace>:{<client key>}:tb` or `:sw`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Longest wait for any Redis call, a decision waiting for a connection included (default [`DEFAULT_TIMEOUT`], 250 ms). Past it the call fails (with
    /// [`StoreError::Timeout`](tollgate_core::StoreError::Timeout)) and the limiter's failure policy decides.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Maximum pooled connections to a standalone server or Sentinel's primary (default 8). Each is multiplexed:
    /// a decision borrows one only to send its command, so concurrent decisions share connections and are
    /// pipelined. Ignored for a Cluster, whose client multiplexes one connection per node, and for a deadpool-redis
    /// pool, which has its own size.
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

    /// Trusts the CA certificates in this PEM (a private CA) instead of the system's roots. Needs `rediss://`
    /// (feature `tls`, as the other `tls_` settings).
    #[cfg(feature = "tls")]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.security.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// Trusts the CA certificates in this PEM file (read when the store is built) instead of the system's roots.
    #[cfg(feature = "tls")]
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.security.ca = Some(Pem::File(path.into()));
        self
    }

    /// Presents this client certificate (chain) and private key, both PEM, for mutual TLS.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.security.client_cert = Some((Pem::Bytes(cert.into()), Pem::Bytes(key.into())));
        self
    }

    /// Presents the client certificate and key in these PEM files (read when the store is built).
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_files(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.security.client_cert = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// The ACL user (overrides one in the URL).
    pub fn username(mut self, user: impl Into<String>) -> Self {
        self.security.username = Some(user.into());
        self
    }

    /// The password (overrides one in the URL). Prefer [`password_file`](Self::password_file) or
    /// [`password_env`](Self::password_env) over a literal taken from a command line.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.security.password = Some(Secret::Value(password.into()));
        self
    }

    /// Reads the password from the environment variable `var` when the store is built.
    pub fn password_env(mut self, var: impl Into<String>) -> Self {
        self.security.password = Some(Secret::Env(var.into()));
        self
    }

    /// Reads the password from a file when the store is built (a trailing newline is dropped).
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.security.password = Some(Secret::File(path.into()));
        self
    }

    /// Builds the store, connects, loads the scripts, runs one probe decision and a probe of every command the
    /// scripts run (each on a key of its own) and checks `maxmemory-policy` (see [`RedisStore::eviction_check`]).
    ///
    /// Configuration errors are returned, each typed: an unparsable URL, an unreadable file, a wrong password or
    /// unknown user, an untrusted, expired or wrong-host certificate, a plaintext URL against a TLS port, a
    /// `NOPERM` reply. An unreachable Redis is not an error (except for a Cluster, which must answer once to give
    /// its slot map): it is logged, the store is built, its calls fail until Redis answers (the limiter's failure
    /// policy decides meanwhile), and it connects, loading the scripts, when Redis comes up.
    pub async fn build(self) -> Result<RedisStore, BuildError> {
        self.validate()?;
        let security = self.security.resolve()?;
        connect::install_crypto_provider();
        let startup = self.timeout.max(MIN_STARTUP_TIMEOUT);
        let (backend, watcher, probe) = match &self.target {
            Target::Standalone(url) => {
                let client = connect::client(url, &security)?;
                let probe = probe_target(&client);
                let pool = backend::pool(Connector::Client(client), self.pool_size, startup)
                    .map_err(BuildError::Connect)?;
                (Backend::Pooled(pool), None, probe)
            }
            #[cfg(feature = "sentinel")]
            Target::Sentinel { sentinels, master } => {
                let (sentinel, tls) = crate::sentinel::client(sentinels, master, &security)?;
                let connector = Connector::Sentinel(tokio::sync::Mutex::new(sentinel));
                let pool = backend::pool(connector, self.pool_size, startup)
                    .map_err(BuildError::Connect)?;
                let generation = pool.manager().generation();
                let watcher = crate::sentinel::watch(sentinels, tls, &security, &generation)?;
                (Backend::Pooled(pool), Some(watcher), None)
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(nodes) => {
                let builder = crate::cluster::builder(nodes, &security)?;
                let cluster = backend::cluster(builder, startup, self.timeout);
                let conn = match tokio::time::timeout(startup, cluster).await {
                    Err(_) => {
                        return Err(BuildError::Connect(BackendError::Pool(format!(
                            "no Cluster node answered within {startup:?}"
                        ))));
                    }
                    Ok(Err(e)) => {
                        return Err(connect::config_error(&e)
                            .unwrap_or(BuildError::Connect(BackendError::Redis(e))));
                    }
                    Ok(Ok(conn)) => conn,
                };
                (Backend::Cluster(conn), None, None)
            }
            #[cfg(feature = "deadpool-redis")]
            Target::Deadpool(pool) => (Backend::Deadpool(pool.clone()), None, None),
        };
        let store = RedisStore::assemble(
            backend,
            self.namespace,
            self.timeout,
            self.failure_threshold,
            self.cool_down,
            watcher,
        );
        store.verify(startup, probe).await?;
        let check = store.check_eviction_policy_within(startup).await;
        Ok(store.with_eviction_check(check))
    }

    fn validate(&self) -> Result<(), BuildError> {
        if !crate::keys::valid_namespace(&self.namespace) {
            return Err(BuildError::InvalidNamespace(self.namespace.clone()));
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
        #[cfg(feature = "deadpool-redis")]
        if matches!(self.target, Target::Deadpool(_))
            && (self.security.has_tls_material()
                || self.security.username.is_some()
                || self.security.password.is_some())
        {
            return Err(BuildError::InvalidSetting(
                "a deadpool-redis pool brings its own TLS and credentials: configure them on the pool",
            ));
        }
        Ok(())
    }
}

/// Where a standalone store connects and whether with TLS, to tell a port speaking the other protocol from an
/// outage when the first connection fails.
fn probe_target(client: &redis::Client) -> Option<ProbeTarget> {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => Some(ProbeTarget {
            host: host.clone(),
            port: *port,
            tls: false,
        }),
        redis::ConnectionAddr::TcpTls { host, port, .. } => Some(ProbeTarget {
            host: host.clone(),
            port: *port,
            tls: true,
        }),
        _ => None,
    }
}

/// A host and port the start-up check may probe with a bare socket.
#[derive(Debug)]
pub(crate) struct ProbeTarget {
    host: String,
    port: u16,
    tls: bool,
}

/// The policy of the start-up probe decision: a million per second, so one token refills in a microsecond and the
/// key the probe writes (so that the script's writes are checked for permission) expires after 1 ms, before
/// anything can list it.
pub(crate) fn probe_policy() -> Policy {
    Policy::token_bucket(
        Quota::per_second(1_000_000).expect("a million per second is a valid quota"),
    )
}

/// Whether a start-up failure is a configuration error; an outage is logged and ridden out. `error` is `None`
/// when the check timed out.
pub(crate) async fn judge_startup_failure(
    error: Option<&BackendError>,
    target: Option<&ProbeTarget>,
) -> Result<(), BuildError> {
    let redis = error.and_then(BackendError::redis_error);
    if let Some(config) = redis.and_then(connect::config_error) {
        return Err(config);
    }
    let Some(target) = target else {
        return Ok(());
    };
    let refused = redis.is_some_and(redis::RedisError::is_connection_refusal);
    if refused || (error.is_some() && redis.is_none()) {
        return Ok(());
    }
    let dropped = redis.is_none_or(|e| connect::dropped_after_accept(e) || e.is_timeout());
    if !dropped {
        return Ok(());
    }
    let text = redis.map_or_else(|| "no answer".to_owned(), ToString::to_string);
    // A plaintext URL on a TLS port: the server drops the connection. A TLS URL on a plaintext port: the server
    // waits for a command line that the handshake never sends. A bare PING tells which protocol the port speaks.
    match (
        target.tls,
        connect::speaks_resp(&target.host, target.port, MIN_STARTUP_TIMEOUT).await,
    ) {
        (false, Some(false)) => Err(BuildError::TlsRequired(text)),
        (true, Some(true)) => Err(BuildError::Tls(format!(
            "the port answers plaintext Redis ({text}): use a redis:// URL or the server's TLS port"
        ))),
        _ => Ok(()),
    }
}
