//! The start-up check that Redis will not evict limiter keys.

use std::fmt;

use redis::Value;

use crate::backend::Backend;

/// What `CONFIG GET maxmemory-policy` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionCheck {
    /// `noeviction`: limiter keys are never evicted (writes fail when memory is full, which the failure policy
    /// handles).
    NoEviction,
    /// Another policy: under memory pressure Redis may evict a limiter key, which silently resets that client's
    /// limit.
    Evicting(String),
    /// The policy could not be read (`CONFIG` renamed or forbidden, as on many managed services, or Redis
    /// unreachable); the reason is given.
    Unknown(String),
}

impl fmt::Display for EvictionCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoEviction => f.write_str("maxmemory-policy is noeviction"),
            Self::Evicting(p) => write!(f, "maxmemory-policy is {p}: Redis may evict limiter keys"),
            Self::Unknown(why) => write!(f, "maxmemory-policy could not be checked: {why}"),
        }
    }
}

pub(crate) async fn check(backend: &Backend) -> EvictionCheck {
    let result = match backend.config_get("maxmemory-policy").await {
        Err(e) => EvictionCheck::Unknown(e.to_string()),
        Ok(replies) => {
            // The worst answer wins: one evicting node (of a Cluster) is enough to lose limits.
            let mut result = EvictionCheck::NoEviction;
            for reply in &replies {
                match policy_name(reply) {
                    Some(p) if p == "noeviction" => {}
                    Some(p) => {
                        result = EvictionCheck::Evicting(p);
                        break;
                    }
                    None => {
                        result =
                            EvictionCheck::Unknown(format!("unexpected CONFIG GET reply {reply:?}"))
                    }
                }
            }
            if replies.is_empty() {
                result = EvictionCheck::Unknown("no node answered CONFIG GET".to_owned());
            }
            result
        }
    };
    match &result {
        EvictionCheck::NoEviction => tracing::debug!("Redis maxmemory-policy is noeviction"),
        EvictionCheck::Evicting(p) => tracing::warn!(
            maxmemory_policy = %p,
            "Redis maxmemory-policy is {p}, not noeviction: under memory pressure Redis may EVICT RATE-LIMIT KEYS, \
             silently resetting limits. Set `maxmemory-policy noeviction` on the limiter's Redis"
        ),
        EvictionCheck::Unknown(why) => tracing::warn!(
            reason = %why,
            "could not check Redis maxmemory-policy ({why}): make sure it is noeviction, or limits may be \
             silently reset when Redis evicts their keys"
        ),
    }
    result
}

/// `CONFIG GET` answers `[name, value]` (RESP2) or `{name: value}` (RESP3).
fn policy_name(reply: &Value) -> Option<String> {
    let value = match reply {
        Value::Array(items) if items.len() == 2 => &items[1],
        Value::Map(pairs) if pairs.len() == 1 => &pairs[0].1,
        _ => return None,
    };
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}
