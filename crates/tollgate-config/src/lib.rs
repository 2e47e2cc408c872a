//! Policy files: limiters described in TOML, built into the same rate-limit layers as code-built ones, reloaded
//! while the service runs.
//!
//! ```toml
//! trusted-proxies = ["10.0.0.0/8"]  # whose X-Forwarded-For `client-ip` keys believe (default: none)
//! headers = ["ietf", "github"]      # response fields: ietf | ratelimit | github | all | none (default: all)
//!
//! [[limiter]]
//! name = "per-key"
//! key = "header:x-api-key"      # client-ip | header:<name> | route | global, or an array of them (a tuple)
//! algorithm = "token-bucket"    # token-bucket | sliding-window (default token-bucket)
//! limit = 3
//! period = "10s"                # 500ms, 10s, 15m, 1h, 1d
//! burst = 3                     # token bucket only (default: the limit)
//! lockout = "15m"               # after a denial, refuse the key this long (default: none)
//! cost = 1                      # tokens per request (default 1), charged up front
//! cost-after = "header:x-cost"  # the real cost, read from the response: header:<name> (gRPC: metadata) or
//!                               # extension (a `FinalCost` the handler sets); the difference is charged or
//!                               # refunded then (default: none, the cost is final)
//! mode = "enforce"              # enforce | shadow | off (default enforce)
//! on-store-error = "local"      # open | closed | local (default local)
//! routes = ["/api/*"]           # HTTP paths, `*` at the end for a prefix (default: every route)
//! methods = ["/pkg.Svc/*"]      # gRPC methods, likewise (a limiter naming only the other kind is not built)
//! exempt = ["internal"]         # keys never limited (addresses or CIDRs for client-ip keys)
//!
//! [[limiter.override]]
//! key = "gold"                  # a key value (or an address or CIDR for client-ip keys)
//! limit = 6                     # algorithm, period, burst and lockout: the limiter's unless given
//! period = "10s"
//! burst = 6
//! ```
//!
//! Every table is closed: an unknown field is an error, as is a value of the wrong kind, each reported as
//! `file:line:column: what was expected` ([`PolicyFileError`]). [`axum`] and [`tonic`] build a file into one layer for
//! the router or the server and a [`Reloader`] that swaps in a new file without a restart, every field of it (the
//! header families too): requests in flight finish under the old set, the next ones see the new one, and a limiter
//! the new file leaves as it was keeps everything (its deny cache, its counters); a limiter whose policy is
//! unchanged keeps its keys' state wherever it lives (the buckets are named `<limiter>#<policy>:<key>`), a changed
//! policy starts its keys afresh. One exception: on the in-process store, turning `cost-after` on or off also starts
//! the limiter's keys afresh (a limiter charging after the response keys its buckets by their text, the others by
//! digest). An invalid new file changes nothing and says why.
//!
//! Each limiter is a [`RateLimitLayer`](tollgate_tower::RateLimitLayer) with its key, cost, mode, failure policy
//! and overrides, inside a [`RateLimitSetLayer`](tollgate_tower::limit::rate::RateLimitSetLayer): decided on the one
//! decision core, exactly as in code.
//!
//! ```
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use tollgate_config::Source;
//! use tollgate_core::MemoryStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = r#"
//! [[limiter]]
//! name = "per-key"
//! key = "header:x-api-key"
//! limit = 3
//! period = "10s"
//! exempt = ["internal"]
//! "#;
//! let (limits, reloader) = tollgate_config::axum(Source::text(file, "limits.toml"), Arc::new(MemoryStore::new()))?;
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(limits);
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//!
//! // Later (on SIGHUP, say): the new limits apply to the next request.
//! let report = reloader.reload_from(Source::text(&file.replace("limit = 3", "limit = 5"), "limits.toml"))?;
//! assert_eq!(report.changed, ["per-key"]);
//!
//! // An invalid file leaves them as they are.
//! let err = reloader.reload_from(Source::text("[[limiter]]\nname = \"x\"\nlimt = 3\n", "limits.toml")).unwrap_err();
//! assert!(err.to_string().starts_with("limits.toml:3:1: unknown field `limt`"));
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
// On docs.rs (nightly, `--cfg docsrs`), items behind a feature say which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The layers a file is built into, one per protocol: feature `axum`, feature `tonic`.
#[cfg(any(feature = "axum", feature = "tonic"))]
mod build;
mod error;
#[cfg(any(feature = "axum", feature = "tonic"))]
mod layers;
mod resolve;
mod schema;

use std::path::Path;

#[cfg(any(feature = "axum", feature = "tonic"))]
pub use build::{FileCost, FileEntry, FileKey, Routes};
pub use error::PolicyFileError;
#[cfg(feature = "axum")]
pub use layers::{AxumLayer, axum};
#[cfg(any(feature = "axum", feature = "tonic"))]
pub use layers::{PolicySetLayer, Reloaded, Reloader};
#[cfg(feature = "tonic")]
pub use layers::{TonicLayer, tonic};
use resolve::{Places, Resolved};

/// A policy file, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFile {
    origin: String,
    resolved: Resolved,
}

impl PolicyFile {
    /// Reads the policy in `text`; errors name `origin` as the file.
    ///
    /// # Errors
    /// Where the text is not a policy file, and what was expected there.
    pub fn parse(text: &str, origin: &str) -> Result<Self, PolicyFileError> {
        let spec: schema::FileSpec = toml::from_str(text)
            .map_err(|e| PolicyFileError::at(origin, text, e.span(), e.message().trim_end()))?;
        let resolved = resolve::resolve(spec, &Places { origin, text })?;
        Ok(Self {
            origin: origin.to_owned(),
            resolved,
        })
    }

    /// Reads the policy file at `path`.
    ///
    /// # Errors
    /// If it cannot be read, or where it is not a policy file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PolicyFileError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            PolicyFileError::whole(&origin, format!("cannot read the policy file: {e}"))
        })?;
        Self::parse(&text, &origin)
    }

    /// Reads `source`.
    ///
    /// # Errors
    /// As [`load`](Self::load) or [`parse`](Self::parse).
    pub fn read(source: &Source<'_>) -> Result<Self, PolicyFileError> {
        match source {
            Source::File(path) => Self::load(path),
            Source::Text { text, origin } => Self::parse(text, origin),
        }
    }

    /// Where it was read from.
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Its limiters' names, in order.
    pub fn limiters(&self) -> impl Iterator<Item = &str> {
        self.resolved.limiters.iter().map(|l| l.name.as_str())
    }
}

/// Where a policy comes from: a file (which [`Reloader::reload`] reads again), or a string.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// The file at this path.
    File(&'a Path),
    /// This text, called `origin` in errors.
    Text {
        /// The policy.
        text: &'a str,
        /// Its name in errors (a file name, `<inline>`).
        origin: &'a str,
    },
}

impl<'a> Source<'a> {
    /// The file at `path`.
    #[must_use]
    pub fn file(path: &'a (impl AsRef<Path> + ?Sized)) -> Self {
        Self::File(path.as_ref())
    }

    /// The policy in `text`, called `origin` in errors.
    #[must_use]
    pub const fn text(text: &'a str, origin: &'a str) -> Self {
        Self::Text { text, origin }
    }
}
