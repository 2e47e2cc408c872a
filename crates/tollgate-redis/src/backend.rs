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

/// A pooled connection, its health, and the primary it was made for.
pub(crate) struct Conn {
    conn: MultiplexedConnection,
    health: Arc<Health>,
    generation: u64,
}

/// How long a connection may go on answering nothing (every call on it cut off by its caller's timeout) before it
/// is replaced. A call cut off by the decision's budget says nothing about the connection: a multiplexed connection
/// drops that reply and serves the next call, so a slow but healthy Redis keeps its connections (replacing them
/// would put a connect and a `SCRIPT LOAD` into the next decisions' budgets, which a slow Redis cannot meet either).
/// Only a connection silent for this long (a half-open socket, a server that vanished) is made again.
const SILENT_FOR: Duration = Duration::from_secs(2);

/// How long a connection may sit unused before it is checked with a `PING` on its next use. Below one decision
/// every 2 s per connection, each decision costs a second round trip; a connection in use is never checked.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(2);

/// Whether a connection is still usable: a transport error breaks it; calls cut off without any answer for
/// [`SILENT_FOR`] break it too.
#[derive(Default)]
struct Health {
    broken: AtomicBool,
    /// A call was cut off since the last answer (read by every answer, so kept apart from the instant).
    silent: AtomicBool,
    /// When the first call cut off since the last answer was.
    silent_since: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Health {
    /// An answer came (an error reply is an answer too).
    fn answered(&self) {
        if self.silent.load(Ordering::Relaxed) {
            *lock(&self.silent_since) = None;
            self.silent.store(false, Ordering::Relaxed);
        }
    }

    /// A call was cut off before its answer came.
    fn cut_off(&self) {
        let now = std::time::Instant::now();
        let mut since = lock(&self.silent_since);
        let first = *since.get_or_insert(now);
        self.silent.store(true, Ordering::Relaxed);
        if now.saturating_duration_since(first) > SILENT_FOR {
            self.broken.store(true, Ordering::Relaxed);
        }
    }
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
///
/// A connection is made by a task of its own, bounded by the connection's own timeout (the start-up budget, at
/// least 2 s), not by the decision that asked for it: a decision cut off by its budget leaves the connect running,
/// and the connection it makes waits as a spare for the next decision. So a Redis slower than a decision's budget
/// to connect to (a TCP and TLS handshake, `HELLO`, `SCRIPT LOAD`: several round trips) is still connected to, and
/// the store recovers as soon as Redis answers a decision within its budget.
pub(crate) struct Manager {
    shared: Arc<Connecting>,
}

/// What the connect tasks share with the pool.
struct Connecting {
    connector: Connector,
    config: AsyncConnectionConfig,
    /// The longest a connect (and its `SCRIPT LOAD`) may take.
    limit: Duration,
    /// Bumped when Sentinel announces a new primary: connections of an older generation are not reused.
    generation: Arc<AtomicU64>,
    /// A connection made after the decision that asked for it had given up.
    spare: std::sync::Mutex<Option<Conn>>,
    /// The last connect's failure, for the decisions that waited on it.
    failed: std::sync::Mutex<Option<redis::RedisError>>,
    /// A connect task is running.
    busy: AtomicBool,
    /// Wakes the decisions waiting for a connect task.
    done: tokio::sync::Notify,
}

impl Manager {
    pub(crate) fn new(connector: Connector, timeout: Duration) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Self {
            shared: Arc::new(Connecting {
                connector,
                config,
                limit: timeout,
                generation: Arc::default(),
                spare: std::sync::Mutex::new(None),
                failed: std::sync::Mutex::new(None),
                busy: AtomicBool::new(false),
                done: tokio::sync::Notify::new(),
            }),
        }
    }

    #[cfg(feature = "sentinel")]
    pub(crate) fn generation(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.shared.generation)
    }

    /// A connection from the connect task: the spare if there is one, else the one the running (or a new) task
    /// makes, or that task's error.
    async fn take_connection(&self) -> Result<Conn, redis::RedisError> {
        let shared = &self.shared;
        loop {
            let done = shared.done.notified();
            tokio::pin!(done);
            // Registered before the checks: a task that ends after them wakes this waiter.
            done.as_mut().enable();
            if let Some(conn) = lock(&shared.spare).take() {
                return Ok(conn);
            }
            if !shared.busy.swap(true, Ordering::AcqRel) {
                *lock(&shared.failed) = None;
                let task = Arc::clone(shared);
                tokio::spawn(async move {
                    let made = task.connect_new().await;
                    match made {
                        Ok(conn) => *lock(&task.spare) = Some(conn),
                        Err(e) => {
                            tracing::debug!(error = %e, "connecting to Redis failed");
                            *lock(&task.failed) = Some(e);
                        }
                    }
                    task.busy.store(false, Ordering::Release);
                    task.done.notify_waiters();
                });
            }
            done.await;
            if let Some(conn) = lock(&shared.spare).take() {
                return Ok(conn);
            }
            if let Some(e) = lock(&shared.failed).clone() {
                return Err(e);
            }
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl managed::Manager for Manager {
    type Type = Conn;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<Conn, redis::RedisError> {
        // Boxed: deadpool's `get` holds `create`'s future inline, and every decision's future (moved into a box per
        // request by the limiter) would carry it. A connection is made rarely; the box costs nothing per decision.
        Box::pin(self.take_connection()).await
    }

    async fn recycle(
        &self,
        conn: &mut Conn,
        metrics: &Metrics,
    ) -> RecycleResult<redis::RedisError> {
        if conn.health.broken.load(Ordering::Relaxed) {
            Err(RecycleError::message("the connection failed"))
        } else if conn.generation != self.shared.generation.load(Ordering::Relaxed) {
            Err(RecycleError::message("Sentinel announced a new primary"))
        } else if metrics.last_used() > PING_IF_IDLE_FOR {
            // The server (`timeout`), a proxy or a load balancer may have closed it meanwhile. A decision sent on
            // it would fail, or worse, run as the server closed the connection and count twice when retried; a
            // PING lost that way costs nothing.
            redis::cmd("PING")
                .query_async::<()>(&mut conn.conn.clone())
                .await
                .map_err(RecycleError::Backend)
        } else {
            Ok(())
        }
    }
}

impl Connecting {
    /// A new connection to the current server, its scripts loaded, within the connection's own timeout.
    async fn connect_new(&self) -> Result<Conn, redis::RedisError> {
        let generation = self.generation.load(Ordering::Relaxed);
        let limit = self.limit;
        let connect = async {
            let mut conn = self.connector.connect(&self.config).await?;
            load_scripts(&mut conn).await?;
            Ok::<_, redis::RedisError>(conn)
        };
        let conn = match tokio::time::timeout(limit, connect).await {
            Ok(made) => made?,
            Err(_) => {
                return Err(redis::RedisError::from((
                    ErrorKind::Io,
                    "connecting to Redis timed out",
                    format!("no connection within {limit:?}"),
                )));
            }
        };
        Ok(Conn {
            conn,
            health: Arc::default(),
            generation,
        })
    }
}

/// `SCRIPT LOAD` of every script the store runs: the shortest alone, then the others in one pipelined round trip. A
/// server that wants a password closes the connection of an unauthenticated client that sends a long argument (a
/// script of 16 KiB or more) before its `NOAUTH` can be read; the short script's load reads that answer first.
pub(crate) async fn load_scripts(conn: &mut impl ConnectionLike) -> redis::RedisResult<()> {
    let mut scripts = crate::script::pinned();
    scripts.sort_by_key(|s| s.source.len());
    let (first, rest) = scripts.split_first().expect("scripts to load");
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(first.source)
        .query_async::<()>(conn)
        .await?;
    let mut pipe = redis::pipe();
    for script in rest {
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

/// The shortest and the longest wait before a Cluster command is retried (after a connection error, `MOVED`,
/// `TRYAGAIN`, `CLUSTERDOWN`, …).
#[cfg(feature = "cluster")]
const CLUSTER_RETRY_MIN: Duration = Duration::from_millis(10);
#[cfg(feature = "cluster")]
const CLUSTER_RETRY_MAX: Duration = Duration::from_millis(100);

/// How many times a Cluster command is retried: as many as the waits between them (10 ms, doubling, at most
/// [`CLUSTER_RETRY_MAX`]) fill half of `budget`, at least 2 (a `MOVED` and an `ASK` while a slot migrates), so that a
/// slot nobody serves is reported as such within a decision's budget instead of being cut off by it.
#[cfg(feature = "cluster")]
fn cluster_retries(budget: Duration) -> u32 {
    let (mut retries, mut waited, mut wait) = (0, Duration::ZERO, CLUSTER_RETRY_MIN);
    while waited + wait <= budget / 2 && retries < 16 {
        waited += wait;
        wait = (wait * 2).min(CLUSTER_RETRY_MAX);
        retries += 1;
    }
    retries.max(2)
}

#[cfg(feature = "cluster")]
pub(crate) async fn cluster(
    builder: redis::cluster::ClusterClientBuilder,
    timeout: Duration,
    budget: Duration,
) -> Result<ClusterConnection, redis::RedisError> {
    // The connections' own limits are the start-up budget (as the pool's): each decision is bounded by the store's
    // budget above them, and a node reconnected to after a cut-off call must not have to fit into that budget.
    //
    // Retries come soon: redis-rs waits at least 1.28 s before retrying a command by default, longer than a
    // decision's whole budget, so a slot whose primary failed over would stay unanswered for a second after its
    // replica took over. Retrying within tens of milliseconds, each retry after a fresh slot map, follows a
    // failover or a resharding as soon as the cluster has done it; the budget still bounds every decision.
    let client = builder
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .min_retry_wait(CLUSTER_RETRY_MIN.as_millis() as u64)
        .max_retry_wait(CLUSTER_RETRY_MAX.as_millis() as u64)
        .retry_wait_formula(10, 2)
        .retries(cluster_retries(budget))
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
    keys: &[&str],
    args: &[String],
    read_only: bool,
) -> redis::RedisResult<Value> {
    let (evalsha, eval) = if read_only {
        ("EVALSHA_RO", "EVAL_RO")
    } else {
        ("EVALSHA", "EVAL")
    };
    let mut cmd = redis::cmd(evalsha);
    cmd.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            tracing::debug!(sha = %script.sha, "script missing on the server; sending it with EVAL");
            let mut cmd = redis::cmd(eval);
            cmd.arg(script.source).arg(keys.len()).arg(keys).arg(args);
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// Runs one script on a pooled connection; the outer error is the pool's (no connection to be had).
async fn run_pooled(
    pool: &Pool,
    script: &Script,
    keys: &[&str],
    args: &[String],
    read_only: bool,
) -> Result<redis::RedisResult<Value>, BackendError> {
    // The pooled connection is multiplexed: take a handle and return it to the pool at once, so concurrent
    // decisions share sockets and their commands are pipelined by redis-rs.
    let (mut multiplexed, health) = {
        let conn = pool.get().await.map_err(pool_error)?;
        (conn.conn.clone(), Arc::clone(&conn.health))
    };
    // Cancellation (the store's timeout) leaves the guard armed: a connection that has answered nothing for a while
    // is replaced rather than handed to the next caller. So is one that failed, or one to a server that became a
    // replica (`READONLY`: a failover demoted it): the new connection resolves the host name again and may reach
    // the new primary.
    let guard = CutOffOnDrop(&health);
    let result = eval(&mut multiplexed, script, keys, args, read_only).await;
    let replace = matches!(&result, Err(e) if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly));
    guard.answered(replace, matches!(&result, Err(e) if e.is_timeout()));
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

/// [`classify`] for a Cluster: a key whose hash slot no primary answers for after every retry (`CLUSTERDOWN`, its
/// node unreachable, or a redirection to that node left as the last answer) is reported with the slot.
#[cfg(feature = "cluster")]
fn classify_cluster(e: redis::RedisError, key: &str) -> BackendError {
    let unserved = [
        ServerErrorKind::ClusterDown,
        ServerErrorKind::Moved,
        ServerErrorKind::Ask,
    ];
    if unserved
        .iter()
        .any(|&kind| e.kind() == ErrorKind::Server(kind))
        || (e.is_io_error() && !e.is_timeout())
        || e.is_connection_refusal()
    {
        BackendError::ClusterSlotDown {
            hash_slot: hash_slot(key),
            error: e,
        }
    } else {
        classify(e)
    }
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the first non-empty `{…}`), or of the
/// whole key without one, modulo 16384.
#[cfg(feature = "cluster")]
pub(crate) fn hash_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % 16_384
}

impl Backend {
    /// Runs one script on `key`. The caller bounds it with the store's timeout.
    pub(crate) async fn run(
        &self,
        script: &Script,
        key: &str,
        args: &[String],
    ) -> Result<Value, BackendError> {
        self.run_mode(script, &[key], args, false).await
    }

    /// Runs one script on `keys` (on a Cluster, keys of one hash slot), read-only (`EVALSHA_RO`) if `read_only`.
    /// The caller bounds it with the store's timeout.
    pub(crate) async fn run_mode(
        &self,
        script: &Script,
        keys: &[&str],
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
                    eval(&mut conn, script, keys, args, read_only)
                        .await
                        .map_err(classify)
                })
                .await
            }
            Self::Pooled(pool) => {
                let result = match run_pooled(pool, script, keys, args, read_only).await? {
                    // The server (or a proxy, a load balancer) closed a connection that sat idle: the command
                    // failed on the way out. One retry on a fresh connection, within the caller's timeout, as
                    // Redis clients do; without it every quiet spell cost a decision to the failure policy.
                    // (A connection reset after the command was sent may have run it: then one request counts
                    // twice, which beats failing it.)
                    Err(e) if e.is_connection_dropped() => {
                        tracing::debug!(error = %e, "Redis connection dropped; retrying on a new one");
                        run_pooled(pool, script, keys, args, read_only).await?
                    }
                    other => other,
                };
                result.map_err(classify)
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => eval(&mut conn.clone(), script, keys, args, read_only)
                .await
                .map_err(|e| classify_cluster(e, keys.first().copied().unwrap_or_default())),
        }
    }

    /// Whether one script call can take every key of `keys`: on a Cluster only keys of one hash slot (a script's
    /// keys must all be on the node it runs on).
    pub(crate) fn one_call(&self, keys: &[String]) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => keys
                .windows(2)
                .all(|w| hash_slot(&w[0]) == hash_slot(&w[1])),
            _ => {
                let _ = keys;
                true
            }
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

/// Reports a call cut off (dropped before its answer) to its connection's health, unless told how it ended.
struct CutOffOnDrop<'a>(&'a Health);

impl CutOffOnDrop<'_> {
    /// The call ended: `broken`, the connection failed; `timed_out`, its own response timeout ran out (no answer).
    fn answered(self, broken: bool, timed_out: bool) {
        if broken {
            self.0.broken.store(true, Ordering::Relaxed);
        } else if timed_out {
            self.0.cut_off();
        } else {
            self.0.answered();
        }
        std::mem::forget(self);
    }
}

impl Drop for CutOffOnDrop<'_> {
    fn drop(&mut self) {
        self.0.cut_off();
    }
}
