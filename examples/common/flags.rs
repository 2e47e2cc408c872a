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
use tollgate_tower::RateLimitLayer;

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
    /// `--deny-cache on|off`: the rate limiter's deny cache on Redis (`None`: the default, on).
    pub(crate) deny_cache: Option<bool>,
}

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
            deny_cache: None,
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
            "--on-store-error" => {
                self.on_store_error = flags.parsed(|v| v.parse().map_err(|e| format!("{e}")))?;
            }
            "--max-keys" => self.max_keys = flags.parsed(max_keys)?,
            "--deny-cache" => self.deny_cache = Some(flags.parsed(on_off)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The policy `--algorithm`, `--limit`, `--period` and `--burst` describe.
    pub(crate) fn policy(&self) -> Result<Policy, String> {
        policy(self.algorithm, self.limit, self.period, self.burst)
    }

    /// The Redis store `--redis-url` names (keys under `namespace`), or `None` for the in-process store. A Redis
    /// that does not answer yet is a warning, not an error: the store is built without a failure policy of its
    /// own, so its errors reach the layer, whose `--on-store-error` answers them.
    pub(crate) async fn redis_store(
        &self,
        namespace: &str,
        policy: &Policy,
    ) -> Result<Option<RedisStore>, String> {
        let Some(url) = &self.redis_url else {
            return Ok(None);
        };
        let store = RedisStore::builder(url.clone())
            .namespace(namespace)
            .build()
            .await
            .map_err(|e| format!("--redis-url {url:?}: {e}"))?;
        if let Err(e) = store.try_check("startup-probe", policy, 0).await {
            eprintln!(
                "warning: Redis at {url} is not answering ({e}); --on-store-error {} applies",
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
        match self.deny_cache {
            Some(on) if self.redis_url.is_some() => layer.deny_cache(on),
            _ => layer,
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

/// `--max-keys`: a whole number above 0 that fits this machine's `usize`.
fn max_keys(v: &str) -> Result<usize, String> {
    usize::try_from(positive(v)?).map_err(|_| format!("{v:?}: too large for this machine"))
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
