//! Policy files: limiters described in TOML, built into the same rate-limit layers as code-built ones, reloaded
//! while the service runs.
//!
//! ```toml
//! trusted-proxies = ["10.0.0.0/8"]  # whose X-Forwarded-For `client-ip` keys believe (default: none)
//! headers = ["ietf", "github"]      # response fields: ietf | github | all | none (default: all)
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
//! on-store-error = "closed"     # open | closed | local (default closed)
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
//! and overrides, inside a [`RateLimitSetLayer`]: decided on the one
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

mod build;
mod error;
mod resolve;
mod schema;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tollgate_core::Store;
use tollgate_grpc::GrpcLimitLayer;
use tollgate_http::HttpLimitLayer;
use tollgate_tower::limit::rate::{RateLimitSetHandle, RateLimitSetLayer};

pub use build::{FileCost, FileEntry, FileKey, Routes};
use build::{Protocol, entry};
pub use error::PolicyFileError;
use resolve::{Limiter, Places, Resolved};

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

/// The set of a policy file's limiters on store `St`.
pub type PolicySetLayer<St> = RateLimitSetLayer<FileKey, St, FileCost, Routes>;

/// A policy file's layer for an axum router: 429 with `Retry-After` and the file's header families, answered in
/// place by the set (as `HttpLimitLayer` answers for one limiter built in code).
pub type AxumLayer<St> = HttpLimitLayer<PolicySetLayer<St>>;

/// A policy file's layer for a tonic server: `RESOURCE_EXHAUSTED` with `RetryInfo`.
pub type TonicLayer<St> = GrpcLimitLayer<PolicySetLayer<St>>;

/// Builds the policy in `source` on `store` into a layer for an axum router (apply it inside the router, with
/// `Router::layer`, so that `route` keys see the matched route), and the [`Reloader`] that replaces it.
///
/// # Errors
/// If the policy cannot be read (with the place and what was expected).
pub fn axum<St: Store>(
    source: Source<'_>,
    store: Arc<St>,
) -> Result<(AxumLayer<St>, Reloader<St>), PolicyFileError> {
    let (set, reloader) = build(source, store, Protocol::Http)?;
    let headers = reloader.state().resolved.headers;
    Ok((HttpLimitLayer::new(set).headers(headers), reloader))
}

/// Builds the policy in `source` on `store` into a layer for a tonic server (`Server::builder().layer(..)`): keys
/// are read from metadata (`header:`), the peer address (`client-ip`) and the method (`route`); limiters naming
/// `methods` apply to those. The file's `headers` does not apply here: gRPC answers carry every field as metadata.
///
/// # Errors
/// If the policy cannot be read (with the place and what was expected).
pub fn tonic<St: Store>(
    source: Source<'_>,
    store: Arc<St>,
) -> Result<(TonicLayer<St>, Reloader<St>), PolicyFileError> {
    let (set, reloader) = build(source, store, Protocol::Grpc)?;
    Ok((GrpcLimitLayer::new(set), reloader))
}

fn build<St: Store>(
    source: Source<'_>,
    store: Arc<St>,
    protocol: Protocol,
) -> Result<(PolicySetLayer<St>, Reloader<St>), PolicyFileError> {
    let file = PolicyFile::read(&source)?;
    let entries = built(&file.resolved, &store, protocol, &[]);
    let set = RateLimitSetLayer::new(entries.iter().filter_map(|(_, e)| e.clone()));
    let reloader = Reloader {
        inner: Arc::new(Inner {
            handle: set.handle(),
            store,
            protocol,
            path: match source {
                Source::File(path) => Some(path.to_owned()),
                Source::Text { .. } => None,
            },
            state: Mutex::new(State {
                resolved: file.resolved,
                entries,
            }),
        }),
    };
    Ok((set, reloader))
}

/// Each limiter with its entry (`None`: not for this protocol), carrying over the entries of `old` limiters that
/// are unchanged.
fn built<St: Store>(
    resolved: &Resolved,
    store: &Arc<St>,
    protocol: Protocol,
    old: &[(Limiter, Option<FileEntry<St>>)],
) -> Vec<(Limiter, Option<FileEntry<St>>)> {
    resolved
        .limiters
        .iter()
        .map(|limiter| {
            let entry = old.iter().find(|(was, _)| was == limiter).map_or_else(
                || entry(limiter, store, protocol, &resolved.trusted_proxies),
                |(_, e)| e.clone(),
            );
            (limiter.clone(), entry)
        })
        .collect()
}

/// Replaces the limiters of the layer it was built with (every clone, every service built from it) by a new
/// policy's: see the [crate docs](crate). Cheap to clone.
pub struct Reloader<St> {
    inner: Arc<Inner<St>>,
}

struct Inner<St> {
    handle: RateLimitSetHandle<FileKey, St, FileCost, Routes>,
    store: Arc<St>,
    protocol: Protocol,
    path: Option<PathBuf>,
    state: Mutex<State<St>>,
}

struct State<St> {
    resolved: Resolved,
    entries: Vec<(Limiter, Option<FileEntry<St>>)>,
}

impl<St> Clone for Reloader<St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<St> fmt::Debug for Reloader<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

/// What a reload changed, by limiter name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reloaded {
    /// Limiters exactly as they were: carried over whole.
    pub kept: Vec<String>,
    /// Limiters rebuilt with new settings (a key whose policy is unchanged keeps its state).
    pub changed: Vec<String>,
    /// New limiters.
    pub added: Vec<String>,
    /// Limiters the new policy no longer has.
    pub removed: Vec<String>,
    /// The response header families (`headers = ...`) are other than the old file's: the next responses write
    /// the new ones.
    pub headers_changed: bool,
}

impl fmt::Display for Reloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |names: &[String]| {
            if names.is_empty() {
                "-".to_owned()
            } else {
                names.join(", ")
            }
        };
        write!(
            f,
            "kept {}; changed {}; added {}; removed {}",
            list(&self.kept),
            list(&self.changed),
            list(&self.added),
            list(&self.removed)
        )?;
        if self.headers_changed {
            f.write_str("; new header families")?;
        }
        Ok(())
    }
}

impl<St: Store> Reloader<St> {
    /// Reads the policy file the layer was built from again and applies it.
    ///
    /// # Errors
    /// If it cannot be read (the old policy stays, and the error is logged), or the layer was built from a string.
    pub fn reload(&self) -> Result<Reloaded, PolicyFileError> {
        match &self.inner.path {
            Some(path) => self.reload_from(Source::File(path)),
            None => Err(PolicyFileError::whole(
                "<inline>",
                "built from a string: nothing to read again (use reload_from)",
            )),
        }
    }

    /// Reads `source` and applies it.
    ///
    /// # Errors
    /// If it cannot be read: the old policy stays, and the error is logged (`file:line:column`).
    pub fn reload_from(&self, source: Source<'_>) -> Result<Reloaded, PolicyFileError> {
        match PolicyFile::read(&source) {
            Ok(file) => Ok(self.apply(file)),
            Err(err) => {
                tracing::error!(error = %err, "policy file rejected; the policies in force stay");
                Err(err)
            }
        }
    }

    /// Swaps in `file`'s limiters.
    pub fn apply(&self, file: PolicyFile) -> Reloaded {
        let inner = &*self.inner;
        let mut state = self.state();
        // Every limiter keyed by the client address reads the trusted proxies: changed, they are all rebuilt.
        let old: &[_] = if state.resolved.trusted_proxies == file.resolved.trusted_proxies {
            &state.entries
        } else {
            &[]
        };
        let entries = built(&file.resolved, &inner.store, inner.protocol, old);
        let mut report = Reloaded {
            headers_changed: state.resolved.headers != file.resolved.headers
                && inner.protocol == Protocol::Http,
            ..Reloaded::default()
        };
        for (limiter, _) in &entries {
            let name = limiter.name.clone();
            match state
                .entries
                .iter()
                .find(|(was, _)| was.name == limiter.name)
            {
                Some((was, _)) if was == limiter && !old.is_empty() => report.kept.push(name),
                Some(_) => report.changed.push(name),
                None => report.added.push(name),
            }
        }
        report.removed = state
            .entries
            .iter()
            .filter(|(was, _)| !entries.iter().any(|(l, _)| l.name == was.name))
            .map(|(was, _)| was.name.clone())
            .collect();
        inner
            .handle
            .replace(entries.iter().filter_map(|(_, e)| e.clone()));
        if report.headers_changed {
            // The set's responders write these from the next request on (gRPC answers write none).
            inner.handle.set_headers(file.resolved.headers);
        }
        *state = State {
            resolved: file.resolved,
            entries,
        };
        tracing::info!(origin = %file.origin, changes = %report, "policy file applied");
        report
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<St>> {
        // A panic elsewhere while holding the lock left a consistent state (it is replaced whole).
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
