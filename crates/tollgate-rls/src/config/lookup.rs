//! Which configured limit applies to a descriptor: envoyproxy/ratelimit's lookup, level by level (`key_value`
//! first, then the wildcards in file order, then `key` alone), the limit taken only at the descriptor's last entry,
//! and the stats key it names the limit by (`detailed_metric`, `value_to_metric`, `share_threshold`).

use std::sync::Arc;

use super::{Descriptor, Limit, RateLimitConfig};

/// One entry of a request's descriptor.
pub trait DescriptorEntry {
    /// The entry's key.
    fn key(&self) -> &str;
    /// The entry's value.
    fn value(&self) -> &str;
}

/// A descriptor entry (key and value), for lookups outside a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    key: &'a str,
    value: &'a str,
}

impl<'a> Entry<'a> {
    /// `key` = `value`.
    #[must_use]
    pub const fn new(key: &'a str, value: &'a str) -> Self {
        Self { key, value }
    }
}

impl DescriptorEntry for Entry<'_> {
    fn key(&self) -> &str {
        self.key
    }
    fn value(&self) -> &str {
        self.value
    }
}

/// The limit a descriptor matched, with what its counter and metrics are keyed by.
#[derive(Debug, Clone)]
pub struct Found<'c> {
    limit: &'c Arc<Limit>,
    /// Per entry, the wildcard pattern that stands for its value (`share_threshold`); `None` when none does.
    shared: Option<Vec<Option<&'c str>>>,
    stats_key: Option<String>,
}

impl<'c> Found<'c> {
    /// The limit.
    #[must_use]
    pub const fn limit(&self) -> &'c Arc<Limit> {
        self.limit
    }

    /// The value entry `i`'s counter is keyed by: the wildcard pattern under `share_threshold` (every matching
    /// value shares one counter), else the request's value.
    #[must_use]
    pub fn counted_value<'v>(&self, i: usize, value: &'v str) -> &'v str
    where
        'c: 'v,
    {
        match &self.shared {
            Some(patterns) => patterns.get(i).copied().flatten().unwrap_or(value),
            None => value,
        }
    }

    /// The name metrics give the limit, upstream's stats key: the descriptor's configured path, or the request's
    /// values where `detailed_metric` or `value_to_metric` ask for them (wildcard patterns where
    /// `share_threshold` does).
    #[must_use]
    pub fn stats_key(&self) -> &str {
        self.stats_key.as_deref().unwrap_or(&self.limit.full_key)
    }

    /// Whether [`stats_key`](Self::stats_key) names request values (unbounded), not only the configuration.
    #[must_use]
    pub const fn stats_key_is_detailed(&self) -> bool {
        self.stats_key.is_some()
    }
}

/// How one level was matched.
#[derive(Clone, Copy)]
enum How<'c> {
    /// `key_value` in the configuration.
    Value,
    /// A wildcard child: its `key_value`.
    Wildcard(&'c str),
    /// `key` alone.
    Key,
}

impl RateLimitConfig {
    /// The limit that applies to `entries` in `domain`, if any (an unknown domain, a descriptor that matches no
    /// limit, or one whose limit sits at another depth: `None`).
    pub fn find<E: DescriptorEntry>(&self, domain: &str, entries: &[E]) -> Option<Found<'_>> {
        let root = self.domains.get(domain)?;
        let mut level = root;
        let mut lookup = String::new();
        let mut found = None;
        // Whether a metrics key other than the configured path may be needed: only then is the walk redone to
        // build it (the common case builds no string but the lookup buffer).
        let mut runtime_key = false;
        let mut shared = false;
        for (i, entry) in entries.iter().enumerate() {
            let Some((next, how)) = step(level, entry, &mut lookup) else {
                break;
            };
            if matches!(how, How::Wildcard(_)) && next.share_threshold {
                shared = true;
            }
            runtime_key |= next.value_to_metric || next.share_threshold;
            if let Some(limit) = &next.limit
                && i == entries.len() - 1
            {
                found = Some(limit);
            }
            if next.children.is_empty() {
                break;
            }
            level = next;
        }
        let limit = found?;
        let mut found = Found {
            limit,
            shared: None,
            stats_key: None,
        };
        if shared || runtime_key || limit.detailed_metric {
            self.keys(domain, root, entries, &mut found);
        }
        Some(found)
    }

    /// The second walk: the share-threshold patterns and the stats key, as upstream builds them.
    fn keys<'c, E: DescriptorEntry>(
        &'c self,
        domain: &str,
        root: &'c Descriptor,
        entries: &[E],
        found: &mut Found<'c>,
    ) {
        let mut lookup = String::new();
        let mut level = root;
        let mut patterns: Vec<Option<&'c str>> = Vec::new();
        let mut detailed = String::from(domain);
        let mut enhanced = String::from(domain);
        for (i, entry) in entries.iter().enumerate() {
            detailed.push('.');
            detailed.push_str(entry.key());
            detailed.push('_');
            detailed.push_str(entry.value());
            enhanced.push('.');
            let Some((next, how)) = step(level, entry, &mut lookup) else {
                enhanced.push_str(entry.key());
                break;
            };
            let pattern = match how {
                How::Wildcard(wildcard) if next.share_threshold => wildcard
                    .strip_prefix(entry.key())
                    .and_then(|rest| rest.strip_prefix('_')),
                _ => None,
            };
            if pattern.is_some() {
                patterns.resize(i, None);
                patterns.push(pattern);
            }
            let value = match how {
                How::Wildcard(wildcard) => match pattern {
                    Some(pattern) => pattern,
                    None if next.value_to_metric => entry.value(),
                    None => wildcard
                        .strip_prefix(entry.key())
                        .and_then(|rest| rest.strip_prefix('_'))
                        .unwrap_or(wildcard),
                },
                How::Value => entry.value(),
                How::Key if next.value_to_metric => entry.value(),
                How::Key => "",
            };
            enhanced.push_str(entry.key());
            if !value.is_empty() {
                enhanced.push('_');
                enhanced.push_str(value);
            }
            if next.children.is_empty() {
                break;
            }
            level = next;
        }
        let limit = found.limit;
        let shared = !patterns.is_empty();
        let key = if limit.detailed_metric {
            if shared {
                let mut key = String::from(domain);
                for (i, entry) in entries.iter().enumerate() {
                    key.push('.');
                    key.push_str(entry.key());
                    match patterns.get(i).copied().flatten() {
                        Some(pattern) => {
                            key.push('_');
                            key.push_str(pattern);
                        }
                        None if !entry.value().is_empty() => {
                            key.push('_');
                            key.push_str(entry.value());
                        }
                        None => {}
                    }
                }
                Some(key)
            } else {
                Some(detailed)
            }
        } else {
            (enhanced != *limit.full_key).then_some(enhanced)
        };
        found.stats_key = key;
        if shared {
            found.shared = Some(patterns);
        }
    }
}

/// One level of the lookup: `key_value`, then the level's wildcards in file order, then `key`.
fn step<'c, E: DescriptorEntry>(
    level: &'c Descriptor,
    entry: &E,
    lookup: &mut String,
) -> Option<(&'c Descriptor, How<'c>)> {
    lookup.clear();
    lookup.push_str(entry.key());
    lookup.push('_');
    lookup.push_str(entry.value());
    if let Some(next) = level.children.get(lookup.as_str()) {
        return Some((next, How::Value));
    }
    for wildcard in &level.wildcards {
        if wildcard_match(&wildcard.parts, lookup)
            && let Some(next) = level.children.get(&wildcard.key)
        {
            return Some((next, How::Wildcard(&wildcard.key)));
        }
    }
    level.children.get(entry.key()).map(|next| (next, How::Key))
}

/// Whether `value` matches a pattern split on `*` (each `*` matches any run of characters, the empty one too).
pub(crate) fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::wildcard_match;

    fn parts(pattern: &str) -> Vec<String> {
        pattern.split('*').map(str::to_owned).collect()
    }

    #[test]
    fn wildcards_match_as_upstream() {
        assert!(wildcard_match(&parts("k_foo*"), "k_foo1"));
        assert!(wildcard_match(&parts("k_foo*"), "k_foo"));
        assert!(!wildcard_match(&parts("k_foo*"), "k_bar"));
        assert!(wildcard_match(&parts("k_bar*b"), "k_barb"));
        assert!(wildcard_match(&parts("k_bar*b"), "k_bar123b"));
        assert!(!wildcard_match(&parts("k_bar*b"), "k_bara"));
        assert!(!wildcard_match(&parts("k_bar*b"), "xk_barb"));
        assert!(wildcard_match(&parts("k_foo*bar*baz"), "k_foobarbaz"));
        assert!(!wildcard_match(&parts("k_foo*bar*baz"), "k_foo123baz"));
        // The prefix and the suffix may not overlap.
        assert!(!wildcard_match(&parts("k_ab*ba"), "k_aba"));
        assert!(wildcard_match(&parts("exact"), "exact"));
        assert!(!wildcard_match(&parts("exact"), "exactly"));
    }
}
