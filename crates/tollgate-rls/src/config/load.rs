//! Loading: every file checked as envoyproxy/ratelimit checks it (the same keys, the same causes), then merged into
//! one set of domains.

use std::collections::HashMap;
use std::sync::Arc;

use super::yaml::{self, Node, Value};
use super::{
    Algorithm, DEFAULT_ALGORITHM, Descriptor, Limit, LoadError, RateLimitConfig, Unit, Wildcard,
    parse_algorithm, policy_of,
};

/// The keys envoyproxy/ratelimit accepts anywhere in a file, and tollgate's `algorithm`.
const VALID_KEYS: [&str; 17] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "algorithm",
];

/// Loads configuration files into a [`RateLimitConfig`].
#[derive(Debug, Clone)]
#[must_use]
pub struct Loader {
    algorithm: Algorithm,
    merge_domains: bool,
}

impl Default for Loader {
    fn default() -> Self {
        Self {
            algorithm: DEFAULT_ALGORITHM,
            merge_domains: false,
        }
    }
}

impl Loader {
    /// Limits without an `algorithm` of their own or their file's are sliding windows; a domain may be in one file
    /// only.
    pub fn new() -> Self {
        Self::default()
    }

    /// The algorithm of limits that name none, in their `rate_limit` or at their file's top (`algorithm:`).
    pub const fn default_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Whether files that name the same domain are merged into it (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`)
    /// rather than rejected; a descriptor defined twice is an error either way.
    pub const fn merge_domains(mut self, merge: bool) -> Self {
        self.merge_domains = merge;
        self
    }

    /// Loads `files` (name, contents), in the order given: the first error stops the load.
    pub fn load<'a, I, N, C>(&self, files: I) -> Result<RateLimitConfig, LoadError>
    where
        I: IntoIterator<Item = (N, C)>,
        N: AsRef<str> + 'a,
        C: AsRef<str> + 'a,
    {
        let mut config = RateLimitConfig::default();
        for (name, contents) in files {
            let file = File {
                name: name.as_ref(),
                loader: self,
            };
            file.load(contents.as_ref(), &mut config)?;
            config.files += 1;
        }
        Ok(config)
    }
}

struct File<'a> {
    name: &'a str,
    loader: &'a Loader,
}

impl File<'_> {
    fn error(&self, at: &Node, cause: impl Into<String>) -> LoadError {
        LoadError {
            file: self.name.to_owned(),
            line: at.line,
            column: at.column,
            cause: cause.into(),
        }
    }

    fn load(&self, contents: &str, config: &mut RateLimitConfig) -> Result<(), LoadError> {
        let root = yaml::parse(contents).map_err(|e| LoadError {
            file: self.name.to_owned(),
            line: e.line,
            column: e.column,
            cause: format!("error loading config file: {}", e.message),
        })?;
        let entries: &[(Node, Node)] = match &root.value {
            Value::Map(entries) => entries,
            Value::Null => &[],
            other => {
                return Err(self.error(
                    &root,
                    format!(
                        "error loading config file: the document is {}, not a map",
                        other.kind()
                    ),
                ));
            }
        };
        self.validate_keys(entries)?;
        let map = Fields::new(self, entries)?;
        let domain = map.text("domain")?.unwrap_or_default();
        let domain_node = map.node("domain").unwrap_or(&root);
        if domain.is_empty() {
            return Err(self.error(domain_node, "config file cannot have empty domain"));
        }
        let algorithm = match map.node("algorithm") {
            Some(node) => self.algorithm(node)?,
            None => self.loader.algorithm,
        };
        let descriptors = map.list("descriptors")?;
        let level = Level {
            file: self,
            algorithm,
        };
        match config.domains.get_mut(&domain) {
            Some(existing) => {
                if !self.loader.merge_domains {
                    return Err(self.error(
                        domain_node,
                        format!("duplicate domain '{domain}' in config file"),
                    ));
                }
                level.load(existing, &format!("{domain}."), descriptors)?;
            }
            None => {
                let mut root = Descriptor::default();
                level.load(&mut root, &format!("{domain}."), descriptors)?;
                config.domains.insert(domain, root);
            }
        }
        Ok(())
    }

    /// Upstream's key check over the whole tree: string keys from the known set, lists of maps only, scalars of
    /// the types a field can hold; `metadata` is free-form.
    fn validate_keys(&self, entries: &[(Node, Node)]) -> Result<(), LoadError> {
        for (key, value) in entries {
            let Value::Str(name) = &key.value else {
                return Err(self.error(
                    key,
                    format!("config error, key is not of type string: {}", key.value),
                ));
            };
            if !VALID_KEYS.contains(&name.as_str()) {
                return Err(self.error(key, format!("config error, unknown key '{name}'")));
            }
            if name == "metadata" {
                continue;
            }
            match &value.value {
                Value::Seq(items) => {
                    for item in items {
                        let Value::Map(inner) = &item.value else {
                            return Err(self.error(
                                item,
                                format!(
                                    "config error, yaml file contains list of type other than map: {}",
                                    item.value
                                ),
                            ));
                        };
                        self.validate_keys(inner)?;
                    }
                }
                Value::Map(inner) => self.validate_keys(inner)?,
                Value::Str(_) | Value::Int(_) | Value::Bool(_) | Value::Null => {}
                Value::Float(_) => {
                    return Err(self.error(
                        value,
                        format!("error checking config: '{name}' cannot be a float"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn algorithm(&self, node: &Node) -> Result<Algorithm, LoadError> {
        let name = node.value.scalar_text().unwrap_or_default();
        parse_algorithm(&name).ok_or_else(|| {
            self.error(
                node,
                format!(
                    "invalid algorithm '{name}' (sliding_window, token_bucket or fixed_window)"
                ),
            )
        })
    }
}

/// A map node and its entries.
type MapNode<'a> = (&'a Node, &'a [(Node, Node)]);

/// A map's fields by name, each read as the type its struct field has upstream.
struct Fields<'a> {
    file: &'a File<'a>,
    by_name: HashMap<&'a str, &'a Node>,
}

impl<'a> Fields<'a> {
    fn new(file: &'a File<'a>, entries: &'a [(Node, Node)]) -> Result<Self, LoadError> {
        let mut by_name = HashMap::new();
        for (key, value) in entries {
            // Keys are strings: checked before.
            if let Value::Str(name) = &key.value
                && by_name.insert(name.as_str(), value).is_some()
            {
                return Err(file.error(key, format!("config error, key '{name}' appears twice")));
            }
        }
        Ok(Self { file, by_name })
    }

    fn node(&self, name: &str) -> Option<&'a Node> {
        self.by_name.get(name).copied()
    }

    /// A string field: any scalar, as its text (a Go YAML decoder takes `value: 42` as "42").
    fn text(&self, name: &str) -> Result<Option<String>, LoadError> {
        let Some(node) = self.node(name) else {
            return Ok(None);
        };
        match node.value.scalar_text() {
            Some(text) => Ok(Some(text)),
            None => Err(self.file.error(
                node,
                format!("'{name}' must be a string, not {}", node.value.kind()),
            )),
        }
    }

    fn flag(&self, name: &str) -> Result<bool, LoadError> {
        match self.node(name).map(|n| (n, &n.value)) {
            None | Some((_, Value::Null)) => Ok(false),
            Some((_, Value::Bool(b))) => Ok(*b),
            Some((node, other)) => Err(self.file.error(
                node,
                format!("'{name}' must be true or false, not {}", other.kind()),
            )),
        }
    }

    fn u32(&self, name: &str) -> Result<u32, LoadError> {
        match self.node(name).map(|n| (n, &n.value)) {
            None | Some((_, Value::Null)) => Ok(0),
            Some((node, Value::Int(i))) => u32::try_from(*i).map_err(|_| {
                self.file.error(
                    node,
                    format!(
                        "'{name}' must be an integer from 0 to {}, not {i}",
                        u32::MAX
                    ),
                )
            }),
            Some((node, other)) => Err(self.file.error(
                node,
                format!(
                    "'{name}' must be an integer, not {other} ({})",
                    other.kind()
                ),
            )),
        }
    }

    /// A list of maps (already checked to hold maps only); absent or null: empty.
    fn list(&self, name: &str) -> Result<&'a [Node], LoadError> {
        match self.node(name).map(|n| (n, &n.value)) {
            None | Some((_, Value::Null)) => Ok(&[]),
            Some((_, Value::Seq(items))) => Ok(items),
            Some((node, other)) => Err(self.file.error(
                node,
                format!("'{name}' must be a list, not {}", other.kind()),
            )),
        }
    }

    fn map(&self, name: &str) -> Result<Option<MapNode<'a>>, LoadError> {
        match self.node(name).map(|n| (n, &n.value)) {
            None | Some((_, Value::Null)) => Ok(None),
            Some((node, Value::Map(entries))) => Ok(Some((node, entries))),
            Some((node, other)) => Err(self.file.error(
                node,
                format!("'{name}' must be a map, not {}", other.kind()),
            )),
        }
    }
}

/// Loads one level of descriptors into a node of the tree.
struct Level<'a> {
    file: &'a File<'a>,
    /// The file's algorithm.
    algorithm: Algorithm,
}

impl Level<'_> {
    fn load(
        &self,
        parent: &mut Descriptor,
        parent_key: &str,
        items: &[Node],
    ) -> Result<(), LoadError> {
        let file = self.file;
        for item in items {
            let Value::Map(entries) = &item.value else {
                unreachable!("checked: lists hold maps")
            };
            let fields = Fields::new(file, entries)?;
            let key = fields.text("key")?.unwrap_or_default();
            if key.is_empty() {
                return Err(file.error(item, "descriptor has empty key"));
            }
            let value = fields.text("value")?.unwrap_or_default();
            let final_key = if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            };
            let full_key = format!("{parent_key}{final_key}");
            if parent.children.contains_key(&final_key) {
                return Err(file.error(
                    fields.node("key").unwrap_or(item),
                    format!("duplicate descriptor composite key '{full_key}'"),
                ));
            }
            let limit = match fields.map("rate_limit")? {
                Some((at, entries)) => Some(Arc::new(self.limit(&fields, at, entries, &full_key)?)),
                None => None,
            };
            let share_threshold = fields.flag("share_threshold")?;
            if share_threshold && !final_key.contains('*') {
                return Err(file.error(
                    fields.node("share_threshold").unwrap_or(item),
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                    ),
                ));
            }
            if let Some((at, _)) = fields.map("metadata")? {
                // Free-form; upstream turns it into dynamic metadata, which tollgate-rls does not send.
                let _ = at;
            }
            if final_key.contains('*') {
                parent.wildcards.push(Wildcard {
                    key: final_key.clone(),
                    parts: final_key.split('*').map(str::to_owned).collect(),
                });
            }
            let mut node = Descriptor {
                limit,
                value_to_metric: fields.flag("value_to_metric")?,
                share_threshold,
                ..Descriptor::default()
            };
            self.load(
                &mut node,
                &format!("{full_key}."),
                fields.list("descriptors")?,
            )?;
            parent.children.insert(final_key, node);
        }
        Ok(())
    }

    fn limit(
        &self,
        descriptor: &Fields<'_>,
        at: &Node,
        entries: &[(Node, Node)],
        full_key: &str,
    ) -> Result<Limit, LoadError> {
        let file = self.file;
        let fields = Fields::new(file, entries)?;
        let unlimited = fields.flag("unlimited")?;
        let unit_text = fields.text("unit")?.unwrap_or_default();
        let unit = Unit::parse(&unit_text);
        let unit_node = fields.node("unit").unwrap_or(at);
        if unlimited {
            if unit.is_some() {
                return Err(file.error(
                    unit_node,
                    "should not specify rate limit unit when unlimited",
                ));
            }
        } else if unit.is_none() {
            return Err(file.error(unit_node, format!("invalid rate limit unit '{unit_text}'")));
        }
        let name = fields.text("name")?.unwrap_or_default();
        let mut replaces = Vec::new();
        for entry in fields.list("replaces")? {
            let Value::Map(inner) = &entry.value else {
                unreachable!("checked: lists hold maps")
            };
            let entry_fields = Fields::new(file, inner)?;
            let replaced = entry_fields.text("name")?.unwrap_or_default();
            if replaced.is_empty() {
                return Err(file.error(entry, "should not have an empty replaces entry"));
            }
            if replaced == name {
                return Err(file.error(
                    entry_fields.node("name").unwrap_or(entry),
                    "replaces should not contain name of same descriptor",
                ));
            }
            replaces.push(replaced);
        }
        let algorithm = match fields.node("algorithm") {
            Some(node) => file.algorithm(node)?,
            None => self.algorithm,
        };
        let requests_per_unit = fields.u32("requests_per_unit")?;
        let policy = match unit {
            Some(unit) if !unlimited => policy_of(requests_per_unit, unit, algorithm)
                .map_err(|e| file.error(fields.node("requests_per_unit").unwrap_or(at), e))?,
            _ => None,
        };
        Ok(Limit {
            requests_per_unit,
            unit,
            name,
            replaces,
            unlimited,
            shadow_mode: descriptor.flag("shadow_mode")?,
            quota_mode: descriptor.flag("quota_mode")?,
            detailed_metric: descriptor.flag("detailed_metric")?,
            algorithm,
            full_key: full_key.into(),
            policy,
            counters: std::sync::OnceLock::new(),
        })
    }
}
