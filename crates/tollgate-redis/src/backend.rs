//! The connection to Redis: a pool of connections to one primary (given by URL or found through Sentinel), a
//! Cluster client, or a user's deadpool-redis pool.
//!
//! The pool is deadpool's, with a manager of our own: deadpool-redis's manager sends `PING` (with `UNWATCH`) on
//! every checkout, which would double the round trips per decision. Ours recycles a connection unless a call on it
//! failed at the transport level or Sentinel announced a new primary, so a decision is exactly one command:
//! `EVALSHA`. Each new connection loads every script (`SCRIPT LOAD`, one pipelined round trip) before its first
//! decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::{ConnectionLike, MultiplexedConnection};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "cluster")]
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
#[cfg(feature = "sentinel")]
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, ErrorKind, ServerErrorKind, Value};

use crate::BackendError;
use crate::script::Script;

/// A pooled connection, whether a transport error made it unusable, and the primary it was made for.
pub(crate) struct Conn {
    conn: MultiplexedConnection,
    broken: Arc<AtomicBool>,
    generation: u64,
}

/// How a new connection finds its server.
pub(crate) enum Connector {
    /// One URL (a host name a failover may repoint).
    Client(redis::Client),
    /// Ask the Sentinels for the current primary; redis-rs checks its `ROLE` before handing it out.
    #[cfg(feature = "sentinel")]
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl Connector {
    pub(crate) async fn connect(
        &self,
        config: &AsyncConnectionConfig,
    ) -> redis::RedisResult<MultiplexedConnection> {
        match self {
            Self::Client(client) => {
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            #[cfg(feature = "sentinel")]
            Self::Sentinel(sentinel) => {
                let client = sentinel.lock().await.async_get_client().await?;
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
        }
    }
}

/// Creates connections (scripts loaded); recycling is free.
pub(crate) struct Manager {
    connector: Connector,
    config: AsyncConnectionConfig,
    /// Bumped when Sentinel announces a new primary: connections of an older generation are not reused.
    generation: Arc<AtomicU64>,
}

impl Manager {
    pub(crate) fn new(connector: Connector, timeout: Duration) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Self {
            connector,
            config,
            generation: Arc::default(),
        }
    }

    #[cfg(feature = "sentinel")]
    pub(crate) fn generation(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.generation)
    }
}

impl managed::Manager for Manager {
    type Type = Conn;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<Conn, redis::RedisError> {
        // Boxed: connecting (TLS, Sentinel) is a future of kilobytes, and deadpool's `get` holds `create`'s future
        // inline, so unboxed it made every checkout's future (and so every decision's, moved into a box per
        // request by the limiter) that large. A connection is made rarely; the box costs nothing per decision.
        Box::pin(self.connect_new()).await
    }

    async fn recycle(&self, conn: &mut Conn, _: &Metrics) -> RecycleResult<redis::RedisError> {
        if conn.broken.load(Ordering::Relaxed) {
            Err(RecycleError::message("the connection failed"))
        } else if conn.generation != self.generation.load(Ordering::Relaxed) {
            Err(RecycleError::message("Sentinel announced a new primary"))
        } else {
            Ok(())
        }
    }
}

impl Manager {
    /// A new connection to the current server, its scripts loaded.
    async fn connect_new(&self) -> Result<Conn, redis::RedisError> {
        let generation = self.generation.load(Ordering::Relaxed);
        let mut conn = self.connector.connect(&self.config).await?;
        load_scripts(&mut conn).await?;
        Ok(Conn {
            conn,
            broken: Arc::new(AtomicBool::new(false)),
            generation,
        })
    }
}

/// `SCRIPT LOAD` of every script the store runs, in one pipelined round trip.
pub(crate) async fn load_scripts(conn: &mut impl ConnectionLike) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for script in crate::script::pinned() {
        pipe.cmd("SCRIPT").arg("LOAD").arg(script.source).ignore();
    }
    pipe.query_async::<()>(conn).await
}

pub(crate) type Pool = managed::Pool<Manager>;

/// Where the scripts run.
pub(crate) enum Backend {
    /// Our pool, to one server or the primary Sentinel names.
    Pooled(Pool),
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
    /// A user's deadpool-redis pool: its manager pings on every checkout.
    #[cfg(feature = "deadpool-redis")]
    Deadpool(deadpool_redis::Pool),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pooled(pool) => f.debug_tuple("Pooled").field(&pool.status()).finish(),
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => f.write_str("Cluster"),
            #[cfg(feature = "deadpool-redis")]
            Self::Deadpool(pool) => f.debug_tuple("Deadpool").field(&pool.status()).finish(),
        }
    }
}

pub(crate) fn pool(
    connector: Connector,
    size: usize,
    timeout: Duration,
) -> Result<Pool, BackendError> {
    managed::Pool::builder(Manager::new(connector, timeout))
        .max_size(size.max(1))
        .build()
        .map_err(|e| BackendError::Pool(e.to_string()))
}

/// A background task of the store (the Sentinel watcher), stopped when the store goes.
#[derive(Debug)]
pub(crate) struct Watcher(pub(crate) Option<tokio::task::JoinHandle<()>>);

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

#[cfg(feature = "cluster")]
pub(crate) async fn cluster(
    builder: redis::cluster::ClusterClientBuilder,
    timeout: Duration,
) -> Result<ClusterConnection, redis::RedisError> {
    let client = builder
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .build()?;
    let mut conn = client.get_async_connection().await?;
    // Pinned on every primary at start; a node that loses them later (a restart, a reshard onto a new node) is
    // answered by EVAL after NOSCRIPT.
    for script in crate::script::pinned() {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(script.source);
        conn.route_command(
            cmd,
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await?;
    }
    Ok(conn)
}

/// Runs `EVALSHA`; on `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover) runs `EVAL` once, which also
/// loads the script for the next call. In a Cluster the `EVAL` goes to the key's node, where the script is
/// missing, which a separate `SCRIPT LOAD` (routed to every primary) would not guarantee after a reshard.
///
/// `read_only`: `EVALSHA_RO` / `EVAL_RO` (Redis 7), which the server refuses to let write anything. (Both go to
/// the primary: the Cluster client reads from replicas only when told to, which tollgate never does.)
async fn eval(
    conn: &mut impl ConnectionLike,
    script: &Script,
    key: &str,
    args: &[String],
    read_only: bool,
) -> redis::RedisResult<Value> {
    let (evalsha, eval) = if read_only {
        ("EVALSHA_RO", "EVAL_RO")
    } else {
        ("EVALSHA", "EVAL")
    };
    let mut cmd = redis::cmd(evalsha);
    cmd.arg(&script.sha).arg(1).arg(key).arg(args);
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            tracing::debug!(sha = %script.sha, "script missing on the server; sending it with EVAL");
            let mut cmd = redis::cmd(eval);
            cmd.arg(script.source).arg(1).arg(key).arg(args);
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// Runs one script on a pooled connection; the outer error is the pool's (no connection to be had).
async fn run_pooled(
    pool: &Pool,
    script: &Script,
    key: &str,
    args: &[String],
    read_only: bool,
) -> Result<redis::RedisResult<Value>, BackendError> {
    // The pooled connection is multiplexed: take a handle and return it to the pool at once, so concurrent
    // decisions share sockets and their commands are pipelined by redis-rs.
    let (mut multiplexed, broken) = {
        let conn = pool.get().await.map_err(pool_error)?;
        (conn.conn.clone(), Arc::clone(&conn.broken))
    };
    // Cancellation (the store's timeout) leaves the guard armed: a connection that stopped answering is replaced
    // rather than handed to the next caller. So is one to a server that became a replica (`READONLY`: a failover
    // demoted it): the new connection resolves the host name again and may reach the new primary.
    let guard = BreakOnDrop(&broken);
    let result = eval(&mut multiplexed, script, key, args, read_only).await;
    let replace = matches!(&result, Err(e) if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly));
    guard.disarm(replace);
    Ok(result)
}

/// Why no pooled connection could be had: the connection's own error where there is one.
pub(crate) fn pool_error(e: managed::PoolError<redis::RedisError>) -> BackendError {
    match e {
        managed::PoolError::Backend(e) => classify(e),
        other => BackendError::Pool(other.to_string()),
    }
}

#[cfg(feature = "deadpool-redis")]
fn deadpool_error(e: deadpool_redis::PoolError) -> BackendError {
    match e {
        deadpool_redis::PoolError::Backend(e) => classify(e),
        other => BackendError::Pool(other.to_string()),
    }
}

/// Classifies a Redis error: `READONLY` gets its own variant so that callers (and logs) see at once that the
/// store was pointed at a replica.
fn classify(e: redis::RedisError) -> BackendError {
    if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
        BackendError::ReadOnly(e)
    } else {
        BackendError::Redis(e)
    }
}

impl Backend {
    /// Runs one script on `key`. The caller bounds it with the store's timeout.
    pub(crate) async fn run(
        &self,
        script: &Script,
        key: &str,
        args: &[String],
    ) -> Result<Value, BackendError> {
        self.run_mode(script, key, args, false).await
    }

    /// Runs one script on `key`, read-only (`EVALSHA_RO`) if `read_only`. The caller bounds it with the store's
    /// timeout.
    pub(crate) async fn run_mode(
        &self,
        script: &Script,
        key: &str,
        args: &[String],
        read_only: bool,
    ) -> Result<Value, BackendError> {
        match self {
            #[cfg(feature = "deadpool-redis")]
            Self::Deadpool(pool) => {
                // Boxed: deadpool-redis's checkout holds its manager's connect inline (kilobytes), and this arm's
                // future would size every backend's. That pool already costs a second round trip per decision.
                Box::pin(async {
                    let mut conn = pool.get().await.map_err(deadpool_error)?;
                    eval(&mut conn, script, key, args, read_only)
                        .await
                        .map_err(classify)
                })
                .await
            }
            Self::Pooled(pool) => {
                let result = match run_pooled(pool, script, key, args, read_only).await? {
                    // The server (or a proxy, a load balancer) closed a connection that sat idle: the command
                    // failed on the way out. One retry on a fresh connection, within the caller's timeout, as
                    // Redis clients do; without it every quiet spell cost a decision to the failure policy.
                    // (A connection reset after the command was sent may have run it: then one request counts
                    // twice, which beats failing it.)
                    Err(e) if e.is_connection_dropped() => {
                        tracing::debug!(error = %e, "Redis connection dropped; retrying on a new one");
                        run_pooled(pool, script, key, args, read_only).await?
                    }
                    other => other,
                };
                result.map_err(classify)
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => eval(&mut conn.clone(), script, key, args, read_only)
                .await
                .map_err(classify),
        }
    }

    /// Loads the scripts at start-up where connections do not load them themselves (a deadpool-redis pool's).
    pub(crate) async fn pin_scripts(&self) -> Result<(), BackendError> {
        match self {
            #[cfg(feature = "deadpool-redis")]
            Self::Deadpool(pool) => {
                let mut conn = pool.get().await.map_err(deadpool_error)?;
                load_scripts(&mut conn).await.map_err(classify)
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => Ok(()),
            Self::Pooled(_) => Ok(()),
        }
    }

    /// Runs `CONFIG GET <name>`: one reply, or one per primary of a Cluster.
    pub(crate) async fn config_get(&self, name: &str) -> Result<Vec<Value>, BackendError> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        match self {
            #[cfg(feature = "deadpool-redis")]
            Self::Deadpool(pool) => {
                let mut conn = pool.get().await.map_err(deadpool_error)?;
                Ok(vec![cmd.query_async(&mut conn).await.map_err(classify)?])
            }
            Self::Pooled(pool) => {
                let conn = pool.get().await.map_err(pool_error)?;
                let reply = cmd
                    .query_async(&mut conn.conn.clone())
                    .await
                    .map_err(classify)?;
                Ok(vec![reply])
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => {
                // Every primary holds limiter keys: each one's policy matters.
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                match conn
                    .clone()
                    .route_command(cmd, routing)
                    .await
                    .map_err(classify)?
                {
                    Value::Map(per_node) => {
                        Ok(per_node.into_iter().map(|(_, reply)| reply).collect())
                    }
                    other => Ok(vec![other]),
                }
            }
        }
    }
}

/// Marks a connection broken unless disarmed with `false`.
struct BreakOnDrop<'a>(&'a AtomicBool);

impl BreakOnDrop<'_> {
    fn disarm(self, broken: bool) {
        if broken {
            self.0.store(true, Ordering::Relaxed);
        }
        std::mem::forget(self);
    }
}

impl Drop for BreakOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
