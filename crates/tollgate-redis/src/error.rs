//! Errors: building a store, and what Redis did wrong.

use std::fmt;

/// Why Redis could not decide. Wrapped in [`StoreError::Backend`](tollgate_core::StoreError::Backend); callers
/// can downcast the source to this type.
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The server is a replica (`READONLY`): limiter state is only ever read and written on a primary, because
    /// a lagging replica would answer from stale state. Point the store at the primary.
    ReadOnly(redis::RedisError),
    /// Any other Redis or connection error.
    Redis(redis::RedisError),
    /// No pooled connection could be had.
    Pool(String),
    /// The script answered something other than five integers (a script from another version?).
    BadReply(String),
}

impl BackendError {
    /// Whether the connection's own response or connect timeout fired.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, Self::Redis(e) if e.is_timeout())
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ReadOnly(e) => write!(
                f,
                "Redis refused the write because the server is a read-only replica ({e}); \
                 tollgate keeps limiter state on primaries only: point the store at the primary"
            ),
            Self::Redis(e) => write!(f, "Redis error: {e}"),
            Self::Pool(e) => write!(f, "no Redis connection: {e}"),
            Self::BadReply(e) => write!(f, "unexpected reply from the limiter script: {e}"),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::ReadOnly(e) | Self::Redis(e) => Some(e),
            Self::Pool(_) | Self::BadReply(_) => None,
        }
    }
}

/// Why a [`RedisStore`](crate::RedisStore) could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// The namespace is empty, longer than 64 bytes, or holds characters outside printable ASCII (or `{`, `}`,
    /// `#`, `"`, `\`).
    InvalidNamespace(String),
    /// A zero timeout, pool size or failure threshold.
    InvalidSetting(&'static str),
    /// The URL could not be parsed, or the Cluster could not be reached.
    Connect(BackendError),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidNamespace(ns) => write!(
                f,
                "invalid key namespace {ns:?}: use 1 to 64 printable ASCII characters without braces, `#`, \
                 quotes or backslashes"
            ),
            Self::InvalidSetting(what) => write!(f, "invalid setting: {what}"),
            Self::Connect(e) => write!(f, "cannot set up the Redis connection: {e}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect(e) => Some(e),
            _ => None,
        }
    }
}
