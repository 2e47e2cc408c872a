//! A YAML document as a tree of nodes, each with its line and column, so that every error names its place.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// A node: its value and where it starts (1-based line and column; 0 when the parser could not tell).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) value: Value,
    pub(crate) line: u64,
    pub(crate) column: u64,
}

/// A YAML value, its scalars typed as the YAML core schema resolves them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in document order.
    Map(Vec<(Node, Node)>),
}

impl Value {
    /// The scalar as the text a Go YAML decoder gives a string field (`None`: not a scalar).
    pub(crate) fn scalar_text(&self) -> Option<String> {
        match self {
            Self::Null => Some(String::new()),
            Self::Bool(b) => Some(b.to_string()),
            Self::Int(i) => Some(i.to_string()),
            Self::Float(f) => Some(f.to_string()),
            Self::Str(s) => Some(s.clone()),
            Self::Seq(_) | Self::Map(_) => None,
        }
    }

    /// What the value is, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "a boolean",
            Self::Int(_) => "an integer",
            Self::Float(_) => "a float",
            Self::Str(_) => "a string",
            Self::Seq(_) => "a list",
            Self::Map(_) => "a map",
        }
    }
}

impl fmt::Display for Value {
    /// As Go's `%v` prints a decoded YAML value (the form envoyproxy/ratelimit's messages quote).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Null => f.write_str("<nil>"),
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x}"),
            Self::Str(s) => f.write_str(s),
            Self::Seq(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{}", item.value)?;
                }
                f.write_str("]")
            }
            Self::Map(entries) => {
                f.write_str("map[")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{}:{}", k.value, v.value)?;
                }
                f.write_str("]")
            }
        }
    }
}

/// Parses `text` (one document; empty text is a null document).
pub(crate) fn parse(text: &str) -> Result<Node, ParseError> {
    if text.trim().is_empty() {
        return Ok(Node {
            value: Value::Null,
            line: 1,
            column: 1,
        });
    }
    let spanned: Spanned<Value> = serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        // The parser's message, on one line and without a location it repeats.
        let message = e.to_string();
        let message = message.lines().next().unwrap_or_default().trim().to_owned();
        ParseError {
            line,
            column,
            message,
        }
    })?;
    Ok(node(spanned))
}

/// A document that is not YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParseError {
    pub(crate) line: u64,
    pub(crate) column: u64,
    pub(crate) message: String,
}

fn node(spanned: Spanned<Value>) -> Node {
    Node {
        value: spanned.value,
        line: spanned.referenced.line(),
        column: spanned.referenced.column(),
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        i128::try_from(v)
            .map(Value::Int)
            .map_err(|_| E::custom("integer too large"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Value>>()? {
            items.push(node(item));
        }
        Ok(Value::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<Value>>()? {
            let value = map.next_value::<Spanned<Value>>()?;
            entries.push((node(key), node(value)));
        }
        Ok(Value::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_carry_their_places_and_types() {
        let doc = parse(
            "domain: d\ndescriptors:\n  - key: k\n    n: 5\n    f: 0.25\n    b: true\n    x:\n",
        )
        .unwrap();
        let Value::Map(root) = &doc.value else {
            panic!("{doc:?}")
        };
        assert_eq!(root[0].0.value, Value::Str("domain".into()));
        assert_eq!((root[0].1.line, root[0].1.column), (1, 9));
        let Value::Seq(list) = &root[1].1.value else {
            panic!()
        };
        let Value::Map(d) = &list[0].value else {
            panic!()
        };
        assert_eq!((d[0].0.line, d[0].0.column), (3, 5));
        assert_eq!(d[1].1.value, Value::Int(5));
        assert_eq!(d[2].1.value, Value::Float(0.25));
        assert_eq!(d[3].1.value, Value::Bool(true));
        assert_eq!(d[4].1.value, Value::Null);
    }

    #[test]
    fn a_bad_document_says_where() {
        let err = parse("'''\n").unwrap_err();
        assert!(err.line >= 1, "{err:?}");
        assert!(!err.message.is_empty());
    }
}
