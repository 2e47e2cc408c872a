//! Hand-rolled command-line parsing shared by the example servers and clients (no argument-parsing crate): flags
//! as `--name value` or `--name=value`, durations as `500ms`, `1s`, `10s`, `5m`, `1h`.
//!
//! Included with `#[path = "common/flags.rs"] mod flags;`; an example uses the parts it needs.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tollgate_core::{
    Algorithm, DEFAULT_MAX_KEYS, FailurePolicy, MemoryStore, Policy, Quota, Store,
};
use tollgate_redis::RedisStore;
use tollgate_tower::{LeaseConfig, LeaseHandle, RateLimitLayer};

/// The token leases of every rate limiter [`ServerFlags::rate_limit`] built with `--leases`: [`shutdown`] returns
/// their unspent batches before the process exits.
static LEASES: std::sync::Mutex<Vec<LeaseHandle>> = std::sync::Mutex::new(Vec::new());

/// Resolves on the first SIGTERM or SIGINT (ctrl-c): the signal to stop serving and [`shutdown`].
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            // Without the handlers the default action (exit) stays: nothing to wait for.
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Returns every leased batch to the store (each limiter's [`LeaseHandle::shutdown`]): an instance that exits
/// this way takes no tokens from the fleet with it (one that crashes loses at most its batches, which expire).
pub(crate) async fn shutdown() {
    let leases = std::mem::take(&mut *LEASES.lock().unwrap_or_else(|p| p.into_inner()));
    for lease in leases {
        lease.shutdown().await;
    }
}

/// Walks the arguments: yields each flag, and hands out its value on request.
pub(crate) struct Flags<I> {
    args: I,
    inline: Option<String>,
    flag: String,
}

impl<I: Iterator<Item = String>> Flags<I> {
    /// Flags from `args` (without the program name).
    pub(crate) fn new(args: I) -> Self {
        Self {
            args,
            inline: None,
            flag: String::new(),
        }
    }

    /// The next flag (`--name`, `-h`), with any `=value` split off for [`Flags::value`].
    pub(crate) fn next_flag(&mut self) -> Option<String> {
        let arg = self.args.next()?;
        (self.flag, self.inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        Some(self.flag.clone())
    }

    /// The current flag's value: after `=`, or the next argument.
    pub(crate) fn value(&mut self) -> Result<String, String> {
        self.inline
            .take()
            .or_else(|| self.args.next())
            .ok_or_else(|| format!("{} needs a value", self.flag))
    }

    /// The current flag's value parsed with `parse`, errors prefixed by the flag.
    pub(crate) fn parsed<T>(
        &mut self,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, String> {
        let v = self.value()?;
        parse(&v).map_err(|e| format!("{}: {e}", self.flag))
    }
}

/// The flags both example servers take: where to listen, the per-client policy, and the store.
#[derive(Debug)]
pub(crate) struct ServerFlags {
    pub(crate) addr: SocketAddr,
    pub(crate) limit: u64,
    pub(crate) period: Duration,
    pub(crate) burst: Option<u64>,
    pub(crate) algorithm: Algorithm,
    pub(crate) redis_url: Option<String>,
    pub(crate) on_store_error: FailurePolicy,
    /// `--max-keys`: the in-process store's bound.
    pub(crate) max_keys: usize,
    pub(crate) redis: RedisFlags,
    /// `--deny-cache on|off`: the rate limiter's deny cache on Redis (`None`: the default, on).
    pub(crate) deny_cache: Option<bool>,
    /// `--leases`: token leases for the rate limiter's hot keys.
    pub(crate) leases: bool,
    /// `--lease-share PERCENT`: the largest batch as a share of the burst.
    pub(crate) lease_share: Option<u32>,
}

/// The Redis connection flags: TLS material, the password file, Sentinel (see [`REDIS_USAGE`]).
#[derive(Debug, Default)]
pub(crate) struct RedisFlags {
    pub(crate) ca: Option<String>,
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) password_file: Option<String>,
    pub(crate) sentinels: Vec<String>,
    pub(crate) master: Option<String>,
}

/// The help lines of the Redis connection flags, for the servers' usage texts.
pub(crate) const REDIS_USAGE: &str = "  --redis-ca FILE               trust this CA (PEM) for rediss:// (default: the system's roots)
  --redis-cert FILE             client certificate (PEM) for mutual TLS, with --redis-key
  --redis-key FILE              the client certificate's private key (PEM)
  --redis-password-file FILE    read the Redis password from FILE (the user comes from the URL)
  --redis-sentinel HOST:PORT,.. find the primary through these Sentinels (instead of --redis-url)
  --redis-master NAME           the master name the Sentinels monitor";

impl ServerFlags {
    /// The defaults: 127.0.0.1:`port`, a token bucket of 10 per second, the in-process store, closed on errors.
    pub(crate) fn new(port: u16) -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            limit: 10,
            period: Duration::from_secs(1),
            burst: None,
            algorithm: Algorithm::TokenBucket,
            redis_url: None,
            on_store_error: FailurePolicy::Closed,
            max_keys: DEFAULT_MAX_KEYS,
            redis: RedisFlags::default(),
            deny_cache: None,
            leases: false,
            lease_share: None,
        }
    }

    /// Takes `flag` and its value from `flags` if it is one of these; whether it was.
    pub(crate) fn take<I: Iterator<Item = String>>(
        &mut self,
        flag: &str,
        flags: &mut Flags<I>,
    ) -> Result<bool, String> {
        match flag {
            "--addr" => {
                let port = self.addr.port();
                self.addr = flags.parsed(|v| {
                    v.parse()
                        .map_err(|_| format!("{v:?}: expected HOST:PORT, e.g. 127.0.0.1:{port}"))
                })?;
            }
            "--limit" => self.limit = flags.parsed(positive)?,
            "--period" => self.period = flags.parsed(duration)?,
            "--burst" => self.burst = Some(flags.parsed(positive)?),
            "--algorithm" => self.algorithm = flags.parsed(algorithm)?,
            "--redis-url" => self.redis_url = Some(flags.value()?),
            "--redis-ca" => self.redis.ca = Some(flags.value()?),
            "--redis-cert" => self.redis.cert = Some(flags.value()?),
            "--redis-key" => self.redis.key = Some(flags.value()?),
            "--redis-password-file" => self.redis.password_file = Some(flags.value()?),
            "--redis-sentinel" => {
                self.redis.sentinels = flags.parsed(|v| {
                    let addrs: Vec<String> = v
                        .split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(str::to_owned)
                        .collect();
                    if addrs.is_empty() {
                        Err("expected HOST:PORT,HOST:PORT".to_owned())
                    } else {
                        Ok(addrs)
                    }
                })?;
            }
            "--redis-master" => self.redis.master = Some(flags.value()?),
            "--on-store-error" => {
                self.on_store_error = flags.parsed(|v| v.parse().map_err(|e| format!("{e}")))?;
            }
            "--max-keys" => self.max_keys = flags.parsed(max_keys)?,
            "--deny-cache" => self.deny_cache = Some(flags.parsed(on_off)?),
            "--leases" => self.leases = true,
            "--lease-share" => self.lease_share = Some(flags.parsed(percent)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The policy `--algorithm`, `--limit`, `--period` and `--burst` describe.
    pub(crate) fn policy(&self) -> Result<Policy, String> {
        policy(self.algorithm, self.limit, self.period, self.burst)
    }

    /// Whether a Redis store is configured (`--redis-url` or `--redis-sentinel`).
    pub(crate) fn uses_redis(&self) -> bool {
        self.redis_url.is_some() || !self.redis.sentinels.is_empty()
    }

    /// What the store is, for the start-up line.
    pub(crate) fn store_name(&self) -> String {
        match (&self.redis_url, &self.redis.master) {
            (Some(url), _) => redact(url),
            (None, Some(master)) if !self.redis.sentinels.is_empty() => {
                format!("sentinel {master} via {}", self.redis.sentinels.join(","))
            }
            _ => "in-process".to_owned(),
        }
    }

    /// The Redis store the flags describe (keys under `namespace`), or `None` for the in-process store.
    ///
    /// A configuration error (a wrong password, an untrusted certificate, `NOPERM`, …) is an `Err` with one line
    /// naming the cause, which the servers print before exiting non-zero. A Redis that does not answer yet is a
    /// warning: the store is built and its errors reach the layer, whose `--on-store-error` answers them.
    pub(crate) async fn redis_store(
        &self,
        namespace: &str,
        policy: &Policy,
    ) -> Result<Option<RedisStore>, String> {
        let r = &self.redis;
        let (builder, what) = match (&self.redis_url, r.sentinels.is_empty(), &r.master) {
            (Some(_), false, _) => {
                return Err("give --redis-url or --redis-sentinel, not both".into());
            }
            (Some(url), true, _) => (
                RedisStore::builder(url.clone()),
                format!("--redis-url {}", redact(url)),
            ),
            (None, false, Some(master)) => (
                RedisStore::sentinel_builder(r.sentinels.clone(), master.clone()),
                format!(
                    "--redis-sentinel {} --redis-master {master}",
                    r.sentinels.join(",")
                ),
            ),
            (None, false, None) => return Err("--redis-sentinel needs --redis-master NAME".into()),
            (None, true, _) => {
                if r.ca.is_some()
                    || r.cert.is_some()
                    || r.key.is_some()
                    || r.password_file.is_some()
                {
                    return Err(
                        "--redis-ca, --redis-cert, --redis-key and --redis-password-file need --redis-url or \
                         --redis-sentinel"
                            .into(),
                    );
                }
                return Ok(None);
            }
        };
        let mut builder = builder.namespace(namespace);
        if let Some(ca) = &r.ca {
            builder = builder.tls_ca_file(ca);
        }
        match (&r.cert, &r.key) {
            (Some(cert), Some(key)) => builder = builder.tls_client_cert_files(cert, key),
            (None, None) => {}
            _ => return Err("--redis-cert and --redis-key go together".into()),
        }
        if let Some(file) = &r.password_file {
            builder = builder.password_file(file);
        }
        let store = builder
            .build()
            .await
            .map_err(|e| format!("{what}: {e}").replace(['\n', '\r'], " "))?;
        if let Err(e) = store.check("startup-probe", policy, 0).await {
            eprintln!(
                "warning: Redis ({what}) is not answering ({e}); --on-store-error {} applies until it does",
                self.on_store_error
            );
        }
        Ok(Some(store))
    }
}

// --max-keys: the in-process store's bound (both example servers).

impl ServerFlags {
    /// The in-process store: `--max-keys` keys at most, evicting the least recently used at the bound, its
    /// evictions counted under `name` (the limiter it serves).
    pub(crate) fn memory_store(&self, name: &str) -> MemoryStore {
        MemoryStore::builder()
            .max_keys(self.max_keys)
            .name(name)
            .build()
    }
}

// --deny-cache on|off: the rate limiter's exact deny cache on a shared store (both example servers).

impl ServerFlags {
    /// `layer` with the failure policy `--on-store-error` and, on Redis, the deny cache `--deny-cache` asks for
    /// (the layer's default, on for Redis, when not given).
    pub(crate) fn rate_limit<K, St: Store, C>(
        &self,
        layer: RateLimitLayer<K, St, C>,
    ) -> RateLimitLayer<K, St, C> {
        let layer = layer.on_store_error(self.on_store_error);
        let layer = match self.deny_cache {
            Some(on) if self.redis_url.is_some() => layer.deny_cache(on),
            _ => layer,
        };
        match self.lease_config() {
            Some(config) => {
                let layer = layer.leases(config);
                LEASES
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(layer.lease_handle());
                layer
            }
            None => layer,
        }
    }

    /// The token lease configuration `--leases` and `--lease-share` ask for.
    pub(crate) fn lease_config(&self) -> Option<LeaseConfig> {
        let config = LeaseConfig::new();
        self.leases.then(|| match self.lease_share {
            // Checked when parsed (1 to 100).
            Some(share) => config.clone().share_percent(share).unwrap_or(config),
            None => config,
        })
    }

    /// `--lease-share` is a setting of `--leases`: given alone it is a mistake, said at start-up.
    pub(crate) fn check_leases(&self) -> Result<(), String> {
        if self.lease_share.is_some() && !self.leases {
            return Err(
                "--lease-share sets the token leases' batch size: it needs --leases".to_owned(),
            );
        }
        Ok(())
    }

    /// How token leases are set, for the start-up line.
    pub(crate) fn leases_label(&self) -> String {
        match (self.leases, self.lease_share) {
            (false, _) => "off".to_owned(),
            (true, share) => format!("on (batches up to {} % of the burst)", share.unwrap_or(10)),
        }
    }

    /// How the deny cache is set, for the start-up line.
    pub(crate) fn deny_cache_label(&self) -> &'static str {
        match (&self.redis_url, self.deny_cache) {
            (None, _) => "n/a",
            (Some(_), Some(false)) => "off",
            (Some(_), _) => "on",
        }
    }
}

/// `--deny-cache`: `on` or `off`.
fn on_off(v: &str) -> Result<bool, String> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{v:?}: expected on or off")),
    }
}

/// `--lease-share`: a percentage from 1 to 100.
fn percent(v: &str) -> Result<u32, String> {
    match v.trim_end_matches('%').parse::<u32>() {
        Ok(p) if (1..=100).contains(&p) => Ok(p),
        _ => Err(format!("{v:?}: expected a percentage from 1 to 100")),
    }
}

/// `--max-keys`: a whole number above 0 that fits this machine's `usize`.
fn max_keys(v: &str) -> Result<usize, String> {
    usize::try_from(positive(v)?).map_err(|_| format!("{v:?}: too large for this machine"))
}

/// A URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// A whole number above 0.
pub(crate) fn positive(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{v:?}: expected a whole number above 0")),
    }
}

/// `token-bucket` or `sliding-window`.
pub(crate) fn algorithm(v: &str) -> Result<Algorithm, String> {
    match v {
        "token-bucket" => Ok(Algorithm::TokenBucket),
        "sliding-window" => Ok(Algorithm::SlidingWindowCounter),
        other => Err(format!(
            "{other:?}: expected token-bucket or sliding-window"
        )),
    }
}

/// `500ms`, `1s`, `0.5s`, `10s`, `5m`, `1h` (also `us`; a number needs its unit; zero is refused).
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    let d = duration_or_zero(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: must be longer than zero"));
    }
    Ok(d)
}

/// Like [`duration`], but `0s` (or `0`) is allowed: e.g. "no pause".
pub(crate) fn duration_or_zero(s: &str) -> Result<Duration, String> {
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let expected = || format!("{s:?}: expected a number and a unit, e.g. 500ms, 1s, 0.5s, 1h");
    // A decimal fraction is kept exact in nanoseconds (digits past a nanosecond are dropped).
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || fraction.contains('.') || (number.contains('.') && fraction.is_empty()) {
        return Err(expected());
    }
    let whole: u128 = whole.parse().map_err(|_| expected())?;
    let scale: u128 = match unit {
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" if whole == 0 && fraction.bytes().all(|b| b == b'0') => return Ok(Duration::ZERO),
        "" => return Err(format!("{s:?}: add a unit (us, ms, s, m or h)")),
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (use us, ms, s, m or h)"
            ));
        }
    };
    let mut nanos = whole.saturating_mul(scale);
    let mut place = scale;
    for digit in fraction.bytes().take(13) {
        place /= 10;
        nanos = nanos.saturating_add(u128::from(digit - b'0') * place);
    }
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// The policy the example servers' `--algorithm`, `--limit`, `--period` and `--burst` describe.
pub(crate) fn policy(
    algorithm: Algorithm,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
) -> Result<Policy, String> {
    let quota = Quota::new(limit, period).map_err(|e| format!("--limit/--period: {e}"))?;
    let quota = match burst {
        Some(burst) if algorithm == Algorithm::SlidingWindowCounter && burst != limit => {
            return Err("--burst applies to --algorithm token-bucket only".to_owned());
        }
        Some(burst) => quota
            .with_burst(burst)
            .map_err(|e| format!("--burst: {e}"))?,
        None => quota,
    };
    Policy::new(algorithm, quota).map_err(|e| e.to_string())
}

// ---- Observability flags, taken by both example servers: `--metrics-addr`, `--log` (see `observe.rs`). ----

/// `--metrics-addr HOST:PORT` (serve Prometheus metrics at `/metrics` there) and `--log LEVEL` (a `tracing`
/// subscriber on stderr; `debug` shows one event per decision).
#[derive(Debug, Default)]
pub(crate) struct ObserveFlags {
    pub(crate) metrics_addr: Option<SocketAddr>,
    pub(crate) log: Option<tracing::Level>,
}

impl ObserveFlags {
    /// Their usage lines.
    pub(crate) const USAGE: &str = "  --metrics-addr HOST:PORT      serve Prometheus metrics at http://HOST:PORT/metrics
  --log LEVEL                   log to stderr: error | warn | info | debug (one line per decision) | trace";

    /// Takes `flag` and its value from `flags` if it is one of these; whether it was.
    pub(crate) fn take<I: Iterator<Item = String>>(
        &mut self,
        flag: &str,
        flags: &mut Flags<I>,
    ) -> Result<bool, String> {
        match flag {
            "--metrics-addr" => {
                self.metrics_addr = Some(flags.parsed(|v| {
                    v.parse()
                        .map_err(|_| format!("{v:?}: expected HOST:PORT, e.g. 127.0.0.1:9090"))
                })?);
            }
            "--log" => {
                self.log = Some(flags.parsed(|v| {
                    v.parse()
                        .map_err(|_| format!("{v:?}: expected error, warn, info, debug or trace"))
                })?);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

// --- Adaptive concurrency (issue 17): `--adaptive gradient2|aimd`. ---

/// `gradient2` or `aimd`: the adaptive limiter's algorithm, with its default settings (limit 20 to 200).
pub(crate) fn adaptive(v: &str) -> Result<tollgate_tower::limit::adaptive::Algorithm, String> {
    use tollgate_tower::limit::adaptive::{Aimd, Gradient2};
    match v {
        "gradient2" => Ok(Gradient2::default().into()),
        "aimd" => Ok(Aimd::default().into()),
        other => Err(format!("{other:?}: expected gradient2 or aimd")),
    }
}
