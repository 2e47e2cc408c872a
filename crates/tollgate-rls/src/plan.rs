//! What a request's descriptors are decided by: each one's limit, the key its counter lives under, and its cost
//! (made by the service, decided by the engine, counted by the metrics).

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Limit, Unit};

/// One descriptor's plan: its limit (none: `OK` with no limit) and its cost.
#[derive(Debug)]
pub(crate) struct Planned<'c> {
    pub(crate) limit: Option<PlannedLimit<'c>>,
    pub(crate) cost: u64,
}

/// A limit to decide, under its store key.
#[derive(Debug)]
pub(crate) struct PlannedLimit<'c> {
    pub(crate) limit: LimitRef<'c>,
    pub(crate) key: String,
    /// The metrics name where it is not the configured path (`detailed_metric`, `value_to_metric`).
    pub(crate) stats_key: Option<String>,
}

impl PlannedLimit<'_> {
    /// The window clients are told of.
    pub(crate) fn window(&self) -> Duration {
        self.limit.policy.as_ref().map_or_else(
            || {
                self.limit
                    .unit
                    .map_or(Duration::from_secs(1), Unit::duration)
            },
            |p| p.quota().window(),
        )
    }

    pub(crate) fn stats_key(&self) -> &str {
        self.stats_key.as_deref().unwrap_or(&self.limit.full_key)
    }
}

/// A configured limit, or one Envoy sent.
#[derive(Debug)]
pub(crate) enum LimitRef<'c> {
    Config(&'c Arc<Limit>),
    Owned(Arc<Limit>),
}

impl std::ops::Deref for LimitRef<'_> {
    type Target = Arc<Limit>;
    fn deref(&self) -> &Arc<Limit> {
        match self {
            Self::Config(l) => l,
            Self::Owned(l) => l,
        }
    }
}
