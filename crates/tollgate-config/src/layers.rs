//! The layers a policy file is built into (an axum router's, a tonic server's) and the [`Reloader`] that swaps in
//! a new file.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use tollgate_core::Store;
#[cfg(feature = "tonic")]
use tollgate_grpc::GrpcLimitLayer;
#[cfg(feature = "axum")]
use tollgate_http::HttpLimitLayer;
use tollgate_tower::limit::rate::RateLimitSetLayer;

use crate::build::{FileCost, FileEntry, FileKey, Protocol, Routes, entry};
use crate::resolve::{Limiter, Resolved};
use crate::{PolicyFile, PolicyFileError, Source};

/// The set of a policy file's limiters on store `St`.
pub type PolicySetLayer<St> = RateLimitSetLayer<FileKey, St, FileCost, Routes>;

#[cfg(feature = "axum")]
/// A policy file's layer for an axum router: 429 with `Retry-After` and the file's header families, answered in
/// place by the set (as `HttpLimitLayer` answers for one limiter built in code).
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub type AxumLayer<St> = HttpLimitLayer<PolicySetLayer<St>>;

#[cfg(feature = "tonic")]
/// A policy file's layer for a tonic server: `RESOURCE_EXHAUSTED` with `RetryInfo`.
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub type TonicLayer<St> = GrpcLimitLayer<PolicySetLayer<St>>;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
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

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
/// Builds the policy in `source` on `store` into a layer for a tonic server (`Server::builder().layer(..)`): keys
/// are read from metadata (`header:`), the peer address (`client-ip`) and the method (`route`); limiters naming
/// `methods` apply to those. The file's `headers` does not apply here: an admitted call carries `ratelimit` as metadata, a refused one every field (as
/// [`GrpcLimitLayer::new`] answers).
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
            set: set.clone(),
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
    set: PolicySetLayer<St>,
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
                && inner.protocol.writes_headers(),
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
            .set
            .replace(entries.iter().filter_map(|(_, e)| e.clone()));
        if report.headers_changed {
            // The set's responders write these from the next request on (gRPC answers write none).
            inner.set.set_headers(file.resolved.headers);
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
