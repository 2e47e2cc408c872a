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
    /// No primary of a Redis Cluster answers for the key's hash slot (its node is unreachable, or the cluster
    /// answers `CLUSTERDOWN`): a primary failed with no replica left to take its slots. Decisions on the slot's keys
    /// fail until a primary serves it again (its replica promoted, or the node restarted); the store follows the
    /// cluster back by itself.
    ClusterSlotDown {
        /// The hash slot (0–16383) of the key that was being decided.
        hash_slot: u16,
        /// What the cluster or the connection answered.
        error: redis::RedisError,
    },
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

    /// Whether the server does not know the command (e.g. `EVALSHA_RO` before Redis 7).
    pub(crate) fn is_unknown_command(&self) -> bool {
        matches!(self, Self::Redis(e) if e.code() == Some("ERR")
            && e.to_string().to_ascii_lowercase().contains("unknown command"))
    }

    /// The Redis error behind this one, if any.
    pub(crate) fn redis_error(&self) -> Option<&redis::RedisError> {
        match self {
            Self::ReadOnly(e) | Self::Redis(e) | Self::ClusterSlotDown { error: e, .. } => Some(e),
            Self::Pool(_) | Self::BadReply(_) => None,
        }
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
            Self::ClusterSlotDown { hash_slot, error } => write!(
                f,
                "no Redis Cluster primary answers for hash slot {hash_slot} ({error}): its primary is down with \
                 no replica to take over; decisions on its keys fail until a primary serves the slot again"
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
            Self::ReadOnly(e) | Self::Redis(e) | Self::ClusterSlotDown { error: e, .. } => Some(e),
            Self::Pool(_) | Self::BadReply(_) => None,
        }
    }
}

/// Why a [`RedisStore`](crate::RedisStore) could not be built: a configuration error, which retrying will not mend.
///
/// An unreachable Redis is not one of them: the store is built, its calls fail until Redis answers (the limiter's
/// failure policy decides meanwhile), and it connects when Redis comes up.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// The namespace is empty, longer than 64 bytes, or holds characters outside printable ASCII (or `{`, `}`,
    /// `#`, `"`, `\`).
    InvalidNamespace(String),
    /// A zero timeout, pool size or failure threshold, or settings that do not fit together.
    InvalidSetting(&'static str),
    /// The URL (or a Sentinel address) does not parse.
    InvalidUrl(String),
    /// A file named in the configuration (CA, client certificate or key, password file) cannot be read.
    ReadFile {
        /// Which file it is.
        what: &'static str,
        /// Its path.
        path: std::path::PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// The environment variable that should hold the password is not set (or not UTF-8).
    MissingEnv(String),
    /// The server's certificate is not signed by a trusted CA (the system's roots, or the CA given).
    CertificateUntrusted(String),
    /// The server's certificate has expired (or is not valid yet).
    CertificateExpired(String),
    /// The server's certificate does not name the host in the URL.
    CertificateHostMismatch(String),
    /// Another TLS failure: unusable certificate or key files, a client certificate the server refused, a
    /// `rediss://` URL against a plaintext port.
    Tls(String),
    /// A plaintext `redis://` URL against a port that speaks only TLS: use `rediss://`.
    TlsRequired(String),
    /// A wrong password or an unknown user (`WRONGPASS`, `NOAUTH`).
    Auth(String),
    /// The user may not run a command (or touch a key) the store needs (`NOPERM`): see the crate docs for the
    /// least-privilege `ACL SETUSER` line.
    NoPermission(String),
    /// No Sentinel knows the master name, or the Cluster could not be reached to learn its slot map.
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
            Self::InvalidUrl(e) => write!(f, "invalid Redis address: {e}"),
            Self::ReadFile { what, path, source } => {
                write!(f, "cannot read the {what} {}: {source}", path.display())
            }
            Self::MissingEnv(var) => {
                write!(
                    f,
                    "the environment variable {var} (the Redis password) is not set"
                )
            }
            Self::CertificateUntrusted(e) => write!(
                f,
                "Redis's TLS certificate is not trusted ({e}): give the CA that signed it"
            ),
            Self::CertificateExpired(e) => write!(f, "Redis's TLS certificate has expired ({e})"),
            Self::CertificateHostMismatch(e) => write!(
                f,
                "Redis's TLS certificate does not name the host connected to ({e}): use the host name it was \
                 issued for"
            ),
            Self::Tls(e) => write!(f, "TLS to Redis failed: {e}"),
            Self::TlsRequired(e) => write!(
                f,
                "the Redis port speaks TLS only and closed the plaintext connection ({e}): use a rediss:// URL"
            ),
            Self::Auth(e) => write!(
                f,
                "Redis refused the credentials (wrong password or unknown user): {e}"
            ),
            Self::NoPermission(e) => write!(
                f,
                "the Redis user lacks a permission the store needs (see the ACL SETUSER line in the \
                 tollgate-redis docs): {e}"
            ),
            Self::Connect(e) => write!(f, "cannot set up the Redis connection: {e}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect(e) => Some(e),
            Self::ReadFile { source, .. } => Some(source),
            _ => None,
        }
    }
}
