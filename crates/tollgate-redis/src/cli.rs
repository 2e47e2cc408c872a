//! The Redis flags of a command-line tool (feature `cli`): one [`clap::Args`] struct that a server flattens into
//! its own flags and turns into a [`RedisStoreBuilder`].
//!
//! ```
//! use clap::Parser;
//! use tollgate_redis::cli::RedisArgs;
//!
//! /// A server whose limits are shared through Redis when `--redis-url` (or `REDIS_URL`) names one.
//! #[derive(Parser)]
//! struct Flags {
//!     #[command(flatten)]
//!     redis: RedisArgs,
//! }
//!
//! let flags = Flags::try_parse_from(["server", "--redis-url", "redis://127.0.0.1:6379", "--redis-namespace", "app"])?;
//! assert_eq!(flags.redis.target().as_deref(), Some("redis://127.0.0.1:6379"));
//! let builder = flags.redis.builder()?.expect("a Redis is named"); // then `.build().await?`
//! # drop(builder);
//! let none = Flags::try_parse_from(["server"])?;
//! # if std::env::var_os("REDIS_URL").is_none() {
//! assert!(none.redis.builder()?.is_none()); // no Redis named: the caller keeps its in-process store
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The flags: `--redis-url URL` (else the environment's `REDIS_URL`), `--redis-namespace NAME` (default
//! [`DEFAULT_NAMESPACE`]: the documented least-privilege ACL line names `~tollgate:*`, so a user with exactly that
//! line runs a tool with the defaults), `--redis-password-file FILE`; with feature `tls`: `--redis-ca FILE`,
//! `--redis-cert FILE`, `--redis-key FILE`; with feature `sentinel`: `--redis-sentinel HOST:PORT,...` and
//! `--redis-master NAME`; with feature `cluster`: `--redis-cluster URL,...`.

use std::fmt;
#[cfg(any(feature = "tls", feature = "sentinel", feature = "cluster"))]
use std::path::PathBuf;
use std::time::Duration;

use crate::{DEFAULT_NAMESPACE, DEFAULT_TIMEOUT, RedisStore, RedisStoreBuilder};

/// The Redis flags: where the store is, how to reach it securely, and its key namespace.
///
/// Flatten it into a tool's flags (`#[command(flatten)]`); [`builder`](Self::builder) turns it into the store's
/// builder, after which the tool adds its own settings (a timeout) and builds.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Redis")]
pub struct RedisArgs {
    /// Share the limits through Redis: redis:// or rediss:// (TLS); user:password@ allowed [default: in-process]
    #[arg(long, value_name = "URL", env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// The prefix of every Redis key: grant the ACL user ~NAME:* (see the least-privilege line)
    #[arg(long, value_name = "NAME", default_value = DEFAULT_NAMESPACE, value_parser = namespace)]
    pub redis_namespace: String,

    /// The budget of each Redis call: past it the limiter's failure policy decides (a Redis in another
    /// region is 20–100 ms away; a busy machine adds its own delay)
    #[arg(long, value_name = "DUR", default_value = "250ms", value_parser = budget)]
    pub redis_timeout: Duration,

    /// Read the Redis password from FILE (the user comes from the URL)
    #[arg(long, value_name = "FILE")]
    pub redis_password_file: Option<std::path::PathBuf>,

    /// Trust this CA (PEM) for rediss:// [default: the system's roots]
    #[cfg(feature = "tls")]
    #[arg(long, value_name = "FILE")]
    pub redis_ca: Option<PathBuf>,

    /// A client certificate (PEM) for mutual TLS, with --redis-key
    #[cfg(feature = "tls")]
    #[arg(long, value_name = "FILE")]
    pub redis_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM)
    #[cfg(feature = "tls")]
    #[arg(long, value_name = "FILE")]
    pub redis_key: Option<PathBuf>,

    /// Find the primary through these Sentinels (instead of --redis-url)
    #[cfg(feature = "sentinel")]
    #[arg(long, value_name = "HOST:PORT,..", value_delimiter = ',', num_args = 1)]
    pub redis_sentinel: Vec<String>,

    /// The master name the Sentinels monitor
    #[cfg(feature = "sentinel")]
    #[arg(long, value_name = "NAME")]
    pub redis_master: Option<String>,

    /// A Redis Cluster, given some of its nodes (instead of --redis-url)
    #[cfg(feature = "cluster")]
    #[arg(long, value_name = "URL,..", value_delimiter = ',', num_args = 1)]
    pub redis_cluster: Vec<String>,
}

/// A combination of Redis flags that names no usable store, or a store that did not build: one line naming the
/// flags and the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgsError(String);

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArgsError {}

fn error(text: impl Into<String>) -> ArgsError {
    ArgsError(text.into())
}

/// `--redis-namespace`: what [`RedisStoreBuilder::namespace`] accepts, checked when the flags are parsed.
fn namespace(v: &str) -> Result<String, String> {
    if crate::keys::valid_namespace(v) {
        Ok(v.to_owned())
    } else {
        Err(
            "expected 1 to 64 printable ASCII characters without spaces, braces, `#`, `\"` or `\\`"
                .to_owned(),
        )
    }
}

/// `--redis-timeout`: whole milliseconds or seconds (`250ms`, `1s`), from 1 ms to 60 s.
fn budget(v: &str) -> Result<Duration, String> {
    let expected =
        || "expected whole milliseconds or seconds from 1ms to 60s, e.g. 250ms or 1s".to_owned();
    let (number, unit) = v
        .find(|c: char| !c.is_ascii_digit())
        .map_or((v, ""), |at| v.split_at(at));
    let n: u64 = number.parse().map_err(|_| expected())?;
    let budget = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return Err(expected()),
    };
    if budget.is_zero() || budget > Duration::from_secs(60) {
        return Err(expected());
    }
    Ok(budget)
}

/// Where the flags point.
enum Target<'a> {
    Url(&'a str),
    #[cfg(feature = "sentinel")]
    Sentinel(&'a [String], &'a str),
    #[cfg(feature = "cluster")]
    Cluster(&'a [String]),
}

impl RedisArgs {
    /// No Redis named, the default namespace: what an empty command line (and no `REDIS_URL`) gives.
    #[must_use]
    pub fn new() -> Self {
        Self {
            redis_url: None,
            redis_namespace: DEFAULT_NAMESPACE.to_owned(),
            redis_timeout: DEFAULT_TIMEOUT,
            redis_password_file: None,
            #[cfg(feature = "tls")]
            redis_ca: None,
            #[cfg(feature = "tls")]
            redis_cert: None,
            #[cfg(feature = "tls")]
            redis_key: None,
            #[cfg(feature = "sentinel")]
            redis_sentinel: Vec::new(),
            #[cfg(feature = "sentinel")]
            redis_master: None,
            #[cfg(feature = "cluster")]
            redis_cluster: Vec::new(),
        }
    }

    /// Whether the flags name a Redis (`--redis-url`, `REDIS_URL`, `--redis-sentinel` or `--redis-cluster`).
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.redis_url.as_deref().is_some_and(|u| !u.is_empty()) || self.others().next().is_some()
    }

    /// The store the flags name, without a password, for a start-up line: `redis://app:***@host:6379`,
    /// `sentinel mymaster via a:26379,b:26379`, `cluster redis://a:7000,...`; `None` when none is named.
    #[must_use]
    pub fn target(&self) -> Option<String> {
        Some(match self.targets().ok()?? {
            Target::Url(url) => redact(url),
            #[cfg(feature = "sentinel")]
            Target::Sentinel(sentinels, master) => {
                format!("sentinel {master} via {}", sentinels.join(","))
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(nodes) => {
                let nodes: Vec<String> = nodes.iter().map(|n| redact(n)).collect();
                format!("cluster {}", nodes.join(","))
            }
        })
    }

    /// The flags that name the store, as given (passwords hidden): what an error message starts with.
    fn flags(&self) -> String {
        match self.targets() {
            Ok(Some(Target::Url(url))) => format!("--redis-url {}", redact(url)),
            #[cfg(feature = "sentinel")]
            Ok(Some(Target::Sentinel(sentinels, master))) => {
                format!(
                    "--redis-sentinel {} --redis-master {master}",
                    sentinels.join(",")
                )
            }
            #[cfg(feature = "cluster")]
            Ok(Some(Target::Cluster(nodes))) => {
                let nodes: Vec<String> = nodes.iter().map(|n| redact(n)).collect();
                format!("--redis-cluster {}", nodes.join(","))
            }
            _ => "Redis".to_owned(),
        }
    }

    /// The flags other than `--redis-url` that name a store.
    fn others(&self) -> impl Iterator<Item = &'static str> {
        #[cfg_attr(not(any(feature = "sentinel", feature = "cluster")), allow(unused_mut))]
        let mut named = Vec::new();
        #[cfg(feature = "sentinel")]
        if !self.redis_sentinel.is_empty() {
            named.push("--redis-sentinel");
        }
        #[cfg(feature = "cluster")]
        if !self.redis_cluster.is_empty() {
            named.push("--redis-cluster");
        }
        named.into_iter()
    }

    /// The one store the flags name, if any.
    fn targets(&self) -> Result<Option<Target<'_>>, ArgsError> {
        let url = self.redis_url.as_deref().filter(|u| !u.is_empty());
        let others: Vec<&str> = self.others().collect();
        match (url, others.as_slice()) {
            (Some(_), [other, ..]) => Err(error(format!(
                "give --redis-url (or REDIS_URL) or {other}, not both"
            ))),
            (_, [a, b, ..]) => Err(error(format!("give {a} or {b}, not both"))),
            (Some(url), []) => Ok(Some(Target::Url(url))),
            (None, []) => Ok(None),
            #[cfg(feature = "sentinel")]
            (None, ["--redis-sentinel"]) => match self.redis_master.as_deref() {
                Some(master) => Ok(Some(Target::Sentinel(&self.redis_sentinel, master))),
                None => Err(error("--redis-sentinel needs --redis-master NAME")),
            },
            #[cfg(feature = "cluster")]
            (None, ["--redis-cluster"]) => Ok(Some(Target::Cluster(&self.redis_cluster))),
            (None, [_]) => unreachable!("every flag of `others` has its arm"),
        }
    }

    /// The store's builder with every flag applied (namespace, TLS material, password file), or `None` when the
    /// flags name no Redis.
    ///
    /// # Errors
    /// A combination that names no usable store: `--redis-url` with `--redis-sentinel`, `--redis-sentinel`
    /// without `--redis-master`, `--redis-cert` without `--redis-key`, TLS or password flags without a store.
    pub fn builder(&self) -> Result<Option<RedisStoreBuilder>, ArgsError> {
        let Some(target) = self.targets()? else {
            let mut given = Vec::new();
            #[cfg(feature = "tls")]
            for (flag, set) in [
                ("--redis-ca", self.redis_ca.is_some()),
                ("--redis-cert", self.redis_cert.is_some()),
                ("--redis-key", self.redis_key.is_some()),
            ] {
                if set {
                    given.push(flag);
                }
            }
            if self.redis_password_file.is_some() {
                given.push("--redis-password-file");
            }
            #[cfg(feature = "sentinel")]
            if self.redis_master.is_some() {
                given.push("--redis-master");
            }
            return match given.as_slice() {
                [] => Ok(None),
                flags => Err(error(format!(
                    "{} need --redis-url or --redis-sentinel",
                    flags.join(", ")
                ))),
            };
        };
        let builder = match target {
            Target::Url(url) => RedisStore::builder(url),
            #[cfg(feature = "sentinel")]
            Target::Sentinel(sentinels, master) => {
                RedisStore::sentinel_builder(sentinels.iter().cloned(), master)
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(nodes) => RedisStore::cluster_builder(nodes.iter().cloned()),
        };
        #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
        let mut builder = builder.namespace(&self.redis_namespace);
        #[cfg(feature = "tls")]
        {
            if let Some(ca) = &self.redis_ca {
                builder = builder.tls_ca_file(ca);
            }
            match (&self.redis_cert, &self.redis_key) {
                (Some(cert), Some(key)) => builder = builder.tls_client_cert_files(cert, key),
                (None, None) => {}
                _ => return Err(error("--redis-cert and --redis-key go together")),
            }
        }
        let builder = builder.timeout(self.redis_timeout);
        Ok(Some(match &self.redis_password_file {
            Some(file) => builder.password_file(file),
            None => builder,
        }))
    }

    /// Builds the store the flags name (`None`: none is named), with `configure` applied to its builder first
    /// (a timeout, a pool size).
    ///
    /// # Errors
    /// What [`builder`](Self::builder) refuses, and every [`BuildError`](crate::BuildError) (a wrong password, an
    /// untrusted certificate, `NOPERM`, …), as one line that starts with the flags naming the store.
    pub async fn build(
        &self,
        configure: impl FnOnce(RedisStoreBuilder) -> RedisStoreBuilder,
    ) -> Result<Option<RedisStore>, ArgsError> {
        let Some(builder) = self.builder()? else {
            return Ok(None);
        };
        configure(builder)
            .build()
            .await
            .map(Some)
            .map_err(|e| error(format!("{}: {e}", self.flags()).replace(['\n', '\r'], " ")))
    }
}

impl Default for RedisArgs {
    fn default() -> Self {
        Self::new()
    }
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        redis: RedisArgs,
    }

    fn parse(args: &[&str]) -> Result<RedisArgs, clap::Error> {
        Flags::try_parse_from(std::iter::once("tool").chain(args.iter().copied())).map(|f| f.redis)
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redact("rediss://app:s3cret@10.0.0.1:6380/0"),
            "rediss://app:***@10.0.0.1:6380/0"
        );
        assert_eq!(redact("redis://app@h:1"), "redis://app@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        let flags = parse(&["--redis-url", "redis://u:pw@h:1"]).unwrap();
        assert_eq!(flags.target().unwrap(), "redis://u:***@h:1");
    }

    #[test]
    fn the_timeout_defaults_to_the_librarys_and_is_checked_when_parsed() {
        assert_eq!(parse(&[]).unwrap().redis_timeout, DEFAULT_TIMEOUT);
        assert_eq!(RedisArgs::new().redis_timeout, DEFAULT_TIMEOUT);
        let timeout = |v: &str| parse(&["--redis-timeout", v]).map(|f| f.redis_timeout);
        assert_eq!(timeout("40ms").unwrap(), Duration::from_millis(40));
        assert_eq!(timeout("2s").unwrap(), Duration::from_secs(2));
        for bad in ["", "0ms", "61s", "1.5s", "250", "ms", "1m"] {
            let e = timeout(bad).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad:?}");
        }
    }

    #[test]
    fn the_namespace_defaults_to_the_librarys_and_is_checked_when_parsed() {
        assert_eq!(parse(&[]).unwrap().redis_namespace, DEFAULT_NAMESPACE);
        assert_eq!(
            parse(&["--redis-namespace", "app"])
                .unwrap()
                .redis_namespace,
            "app"
        );
        for bad in ["", "a{b}", "has space", &"x".repeat(65)] {
            let e = parse(&["--redis-namespace", bad]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad:?}");
        }
    }

    #[test]
    fn flags_without_a_store_are_refused() {
        // (An empty URL is none, whatever the environment's REDIS_URL says.)
        let flags = parse(&["--redis-url", "", "--redis-password-file", "/pw"]).unwrap();
        let e = flags.builder().unwrap_err().to_string();
        assert!(e.contains("--redis-password-file need --redis-url"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_client_certificate_needs_its_key() {
        let flags = parse(&["--redis-url", "rediss://h:1", "--redis-cert", "c.pem"]).unwrap();
        assert_eq!(
            flags.builder().unwrap_err().to_string(),
            "--redis-cert and --redis-key go together"
        );
    }

    #[cfg(feature = "sentinel")]
    #[test]
    fn sentinels_need_the_master_name_and_exclude_a_url() {
        let flags = parse(&["--redis-url", "", "--redis-sentinel", "a:1,b:2"]).unwrap();
        assert_eq!(flags.redis_sentinel, ["a:1", "b:2"]);
        assert!(
            flags
                .builder()
                .unwrap_err()
                .to_string()
                .contains("--redis-master")
        );
        let flags = parse(&[
            "--redis-url=",
            "--redis-sentinel",
            "a:1",
            "--redis-master",
            "m",
        ])
        .unwrap();
        assert_eq!(flags.target().unwrap(), "sentinel m via a:1");
        let both = parse(&["--redis-sentinel", "a:1", "--redis-url", "redis://h:1"]).unwrap();
        assert!(both.builder().unwrap_err().to_string().contains("not both"));
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn a_cluster_is_given_by_some_of_its_nodes() {
        let flags = parse(&["--redis-url=", "--redis-cluster", "redis://a:1,redis://b:2"]).unwrap();
        assert_eq!(flags.target().unwrap(), "cluster redis://a:1,redis://b:2");
        assert!(flags.builder().unwrap().is_some());
    }
}
