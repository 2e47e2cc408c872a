use std::error::Error;
use std::fmt;
use std::time::Duration;

/// Why a store could not decide.
///
/// A store error is not a rejection: the limiter's failure policy decides what happens to the request.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The store holds its maximum number of keys and none of them has expired; only a store configured to refuse
    /// at its bound ([`OnFull::Refuse`](crate::OnFull::Refuse)) returns it, the default evicts.
    KeyCapacity {
        /// The configured maximum.
        max_keys: usize,
    },
    /// The backend did not answer in time.
    Timeout(Duration),
    /// Recent failures opened the circuit; the backend is not being asked for now.
    CircuitOpen,
    /// The backend answered with an error or could not be reached.
    Backend(Box<dyn Error + Send + Sync>),
    /// The store does not offer this operation (e.g. [`Store::peek`](crate::Store::peek), or token leases, on a store that does
    /// not implement them); the message names it.
    Unsupported(&'static str),
}

impl StoreError {
    /// A short stable name for metrics and logs.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::KeyCapacity { .. } => "key_capacity",
            Self::Timeout(_) => "timeout",
            Self::CircuitOpen => "circuit_open",
            Self::Backend(_) => "backend",
            Self::Unsupported(_) => "unsupported",
        }
    }

    /// Wraps a backend's error.
    pub fn backend(err: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self::Backend(err.into())
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KeyCapacity { max_keys } => write!(
                f,
                "the store holds its maximum of {max_keys} keys and none has expired; new keys cannot be tracked"
            ),
            Self::Timeout(d) => write!(f, "the store did not answer within {d:?}"),
            Self::CircuitOpen => f.write_str("the store's circuit is open after repeated failures"),
            Self::Backend(e) => write!(f, "the store failed: {e}"),
            Self::Unsupported(what) => write!(f, "this store does not support {what}"),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Backend(e) => Some(&**e),
            _ => None,
        }
    }
}
