//! envoyproxy/ratelimit's configuration: YAML files of domains and nested descriptors, read unchanged, merged and
//! checked as upstream does, and the lookup that finds which limit applies to a request's descriptor.
//!
//! ```
//! use tollgate_rls::config::{Entry, Loader};
//!
//! let yaml = "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//! ";
//! let config = Loader::new().load([("edge.yaml", yaml)])?;
//! let found = config.find("edge", &[Entry::new("remote_address", "10.0.0.1")]).unwrap();
//! assert_eq!(found.limit().requests_per_unit(), 10);
//! assert!(config.find("edge", &[Entry::new("path", "/")]).is_none());
//! # Ok::<(), tollgate_rls::config::LoadError>(())
//! ```

pub(crate) mod dir;
mod load;
mod lookup;
mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::Policy;

pub use dir::{ConfigDir, DirError};
pub use load::Loader;
pub use lookup::{DescriptorEntry, Entry, Found};

/// The unit of a limit, as envoyproxy/ratelimit spells and measures it (a month is 30 days, a year 365).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3 600 seconds.
    Hour,
    /// 86 400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit's length.
    #[must_use]
    pub const fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        })
    }

    /// The unit named `name`, case-insensitive (`second`, `minute`, `hour`, `day`, `week`, `month`, `year`).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Self::Second,
            "MINUTE" => Self::Minute,
            "HOUR" => Self::Hour,
            "DAY" => Self::Day,
            "WEEK" => Self::Week,
            "MONTH" => Self::Month,
            "YEAR" => Self::Year,
            _ => return None,
        })
    }
}

/// Which algorithm decides a limit: tollgate's own ([`Algorithm`]), chosen per file or per limit, or for every
/// limit by the service.
pub use tollgate_core::Algorithm;

/// The algorithm of a limit that names none: tollgate's sliding window counter (no burst of twice the limit
/// across a window's boundary, as the fixed windows envoyproxy/ratelimit counts allow).
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingWindowCounter;

/// The algorithm named `name` in a file or a flag: `sliding_window`, `token_bucket` or `fixed_window` (`-` and
/// `_` alike).
pub(crate) fn parse_algorithm(name: &str) -> Option<Algorithm> {
    Some(match name.replace('-', "_").as_str() {
        "sliding_window" => Algorithm::SlidingWindowCounter,
        "token_bucket" => Algorithm::TokenBucket,
        "fixed_window" => Algorithm::FixedWindow,
        _ => return None,
    })
}

/// One configured limit (a descriptor's `rate_limit`), or a limit Envoy sent in the descriptor.
#[derive(Debug, Clone)]
pub struct Limit {
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: Option<Unit>,
    pub(crate) name: String,
    pub(crate) replaces: Vec<String>,
    pub(crate) unlimited: bool,
    pub(crate) shadow_mode: bool,
    pub(crate) quota_mode: bool,
    pub(crate) detailed_metric: bool,
    pub(crate) algorithm: Algorithm,
    /// The descriptor's path in the configuration (`domain.key_value.key`), upstream's stats key.
    pub(crate) full_key: Arc<str>,
    /// `None`: unlimited, or `requests_per_unit: 0` (nothing is admitted).
    pub(crate) policy: Option<Policy>,
    /// Its metrics, registered at its first decision (after the recorder is installed).
    pub(crate) counters: std::sync::OnceLock<crate::counters::LimitCounters>,
}

impl Limit {
    /// Requests per unit.
    #[must_use]
    pub const fn requests_per_unit(&self) -> u32 {
        self.requests_per_unit
    }
    /// The unit (`None` for an unlimited limit, which has none).
    #[must_use]
    pub const fn unit(&self) -> Option<Unit> {
        self.unit
    }
    /// The limit's `name` (empty if none).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The names of the limits this one replaces.
    #[must_use]
    pub fn replaces(&self) -> &[String] {
        &self.replaces
    }
    /// Whether the limit is `unlimited` (always OK, never counted).
    #[must_use]
    pub const fn unlimited(&self) -> bool {
        self.unlimited
    }
    /// Whether the limit is in shadow mode (counted, never refused).
    #[must_use]
    pub const fn shadow_mode(&self) -> bool {
        self.shadow_mode
    }
    /// Whether the limit is in quota mode (a request is refused only when all its quota descriptors are over).
    #[must_use]
    pub const fn quota_mode(&self) -> bool {
        self.quota_mode
    }
    /// Whether metrics name the request's full descriptor path (`detailed_metric`).
    #[must_use]
    pub const fn detailed_metric(&self) -> bool {
        self.detailed_metric
    }
    /// The algorithm that decides it.
    #[must_use]
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    /// The descriptor's path in the configuration, `domain.key_value.key` (upstream's stats key).
    #[must_use]
    pub fn full_key(&self) -> &str {
        &self.full_key
    }
    /// The policy the store decides with (`None`: unlimited, or `requests_per_unit: 0`).
    #[must_use]
    pub const fn policy(&self) -> Option<&Policy> {
        self.policy.as_ref()
    }
}

/// A limit's policy: `requests_per_unit` per unit under `algorithm`; `Ok(None)` for 0 per unit.
pub(crate) fn policy_of(
    requests_per_unit: u32,
    unit: Unit,
    algorithm: Algorithm,
) -> Result<Option<Policy>, String> {
    if requests_per_unit == 0 {
        return Ok(None);
    }
    let quota = tollgate_core::Quota::new(u64::from(requests_per_unit), unit.duration())
        .map_err(|e| e.to_string())?;
    Policy::new(algorithm, quota)
        .map(Some)
        .map_err(|e| format!("{requests_per_unit} per {unit:?} under {algorithm}: {e}"))
}

/// One level of a domain's descriptor tree.
#[derive(Debug, Default)]
pub(crate) struct Descriptor {
    /// By `key` or `key_value`.
    pub(crate) children: HashMap<String, Descriptor>,
    /// The children whose value has a `*`, in file order, each split on `*`.
    pub(crate) wildcards: Vec<Wildcard>,
    pub(crate) limit: Option<Arc<Limit>>,
    pub(crate) value_to_metric: bool,
    pub(crate) share_threshold: bool,
}

#[derive(Debug)]
pub(crate) struct Wildcard {
    /// The child's `key_value`.
    pub(crate) key: String,
    pub(crate) parts: Vec<String>,
}

/// Every loaded domain: what a reload swaps whole.
#[derive(Debug, Default)]
pub struct RateLimitConfig {
    pub(crate) domains: HashMap<String, Descriptor>,
    pub(crate) files: usize,
}

impl RateLimitConfig {
    /// Whether no domain is configured.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The configured domains' names, sorted.
    #[must_use]
    pub fn domains(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// How many files it was loaded from.
    #[must_use]
    pub const fn files(&self) -> usize {
        self.files
    }
}

/// A configuration that cannot be loaded: the file, the place in it (1-based line and column; 0 when unknown) and
/// the cause, in upstream's words where it has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The file.
    pub file: String,
    /// The line (0: unknown).
    pub line: u64,
    /// The column (0: unknown).
    pub column: u64,
    /// What is wrong.
    pub cause: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.cause)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.cause
            )
        }
    }
}

impl std::error::Error for LoadError {}
