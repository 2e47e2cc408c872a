//! The connection to Redis: a pool of connections to one primary, or a Cluster client.
//!
//! The pool is deadpool's, with a manager of our own: deadpool-redis's manager sends `UNWATCH` + `PING` on every
//! checkout, which would double the round trips per decision. Ours recycles a connection unless a call on it
//! failed at the transport level, so a decision is exactly one command: `EVALSHA`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{AsyncConnectionConfig, ErrorKind, ServerErrorKind, Value};

use crate::BackendError;
use crate::script::Script;

/// A pooled connection and whether a transport error made it unusable.
pub(crate) struct Conn {
    conn: MultiplexedConnection,
    broken: Arc<AtomicBool>,
}

/// Creates connections to one server; recycling is free.
pub(crate) struct Manager {
    client: redis::Client,
    config: AsyncConnectionConfig,
}

impl managed::Manager for Manager {
    type Type = Conn;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<Conn, redis::RedisError> {
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok(Conn {
            conn,
            broken: Arc::new(AtomicBool::new(false)),
        })
    }

    async fn recycle(&self, conn: &mut Conn, _: &Metrics) -> RecycleResult<redis::RedisError> {
        if conn.broken.load(Ordering::Relaxed) {
            Err(RecycleError::message("the connection failed"))
        } else {
            Ok(())
        }
    }
}

pub(crate) type Pool = managed::Pool<Manager>;

/// Where the scripts run.
pub(crate) enum Backend {
    Standalone(Pool),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Standalone(pool) => f.debug_tuple("Standalone").field(&pool.status()).finish(),
            Self::Cluster(_) => f.write_str("Cluster"),
        }
    }
}

pub(crate) fn pool(url: &str, size: usize, timeout: Duration) -> Result<Pool, BackendError> {
    let client = redis::Client::open(url).map_err(BackendError::Redis)?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    managed::Pool::builder(Manager { client, config })
        .max_size(size.max(1))
        .build()
        .map_err(|e| BackendError::Pool(e.to_string()))
}

pub(crate) async fn cluster(
    nodes: &[String],
    timeout: Duration,
) -> Result<ClusterConnection, BackendError> {
    let client = redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .build()
        .map_err(BackendError::Redis)?;
    client
        .get_async_connection()
        .await
        .map_err(BackendError::Redis)
}

/// Runs `EVALSHA`; on `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover) runs `EVAL` once, which also
/// loads the script for the next call. In a Cluster the `EVAL` goes to the key's node, where the script is
/// missing, which a separate `SCRIPT LOAD` (routed to every primary) would not guarantee after a reshard.
async fn eval(
    conn: &mut impl ConnectionLike,
    script: &Script,
    key: &str,
    args: &[String],
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&script.sha).arg(1).arg(key).arg(args);
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            tracing::debug!(sha = %script.sha, "script missing on the server; sending it with EVAL");
            let mut cmd = redis::cmd("EVAL");
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
) -> Result<redis::RedisResult<Value>, BackendError> {
    // The pooled connection is multiplexed: take a handle and return it to the pool at once, so concurrent
    // decisions share sockets and their commands are pipelined by redis-rs.
    let (mut multiplexed, broken) = {
        let conn = pool.get().await.map_err(|e| match e {
            managed::PoolError::Backend(e) => classify(e),
            other => BackendError::Pool(other.to_string()),
        })?;
        (conn.conn.clone(), Arc::clone(&conn.broken))
    };
    // Cancellation (the store's timeout) leaves the guard armed: a connection that stopped answering is replaced
    // rather than handed to the next caller. So is one to a server that became a replica (`READONLY`: a failover
    // demoted it): the new connection resolves the host name again and may reach the new primary.
    let guard = BreakOnDrop(&broken);
    let result = eval(&mut multiplexed, script, key, args).await;
    let replace = matches!(&result, Err(e) if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly));
    guard.disarm(replace);
    Ok(result)
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
        match self {
            Self::Standalone(pool) => {
                let result = match run_pooled(pool, script, key, args).await? {
                    // The server (or a proxy, a load balancer) closed a connection that sat idle: the command
                    // failed on the way out. One retry on a fresh connection, within the caller's timeout, as
                    // Redis clients do; without it every quiet spell cost a decision to the failure policy.
                    // (A connection reset after the command was sent may have run it: then one request counts
                    // twice, which beats failing it.)
                    Err(e) if e.is_connection_dropped() => {
                        tracing::debug!(error = %e, "Redis connection dropped; retrying on a new one");
                        run_pooled(pool, script, key, args).await?
                    }
                    other => other,
                };
                result.map_err(classify)
            }
            Self::Cluster(conn) => eval(&mut conn.clone(), script, key, args)
                .await
                .map_err(classify),
        }
    }

    /// Runs `CONFIG GET <name>`: one reply, or one per primary of a Cluster.
    pub(crate) async fn config_get(&self, name: &str) -> Result<Vec<Value>, BackendError> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        match self {
            Self::Standalone(pool) => {
                let conn = pool.get().await.map_err(|e| match e {
                    managed::PoolError::Backend(e) => classify(e),
                    other => BackendError::Pool(other.to_string()),
                })?;
                let reply = cmd
                    .query_async(&mut conn.conn.clone())
                    .await
                    .map_err(classify)?;
                Ok(vec![reply])
            }
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
