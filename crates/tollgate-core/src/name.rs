//! Limiter names: what clients see in headers and operators in metrics and logs.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// A limiter's name.
///
/// Every admitted request carries its limiter's name (in the tower layers' verdicts), and a store reports its
/// evictions under one ([`MemoryStoreBuilder::name`](crate::MemoryStoreBuilder::name)). A name written as a string
/// literal is kept as a `&'static str`, so carrying it costs nothing; a name built at run time is shared
/// (`Arc<str>`), and carrying it counts a reference — on a counter every worker thread touches.
///
/// ```
/// use tollgate_core::Name;
///
/// let literal = Name::from("per-client");
/// let built = Name::from(format!("tenant-{}", 42));
/// assert_eq!(&*literal, "per-client");
/// assert_eq!(built, Name::from("tenant-42"));
/// assert_eq!(literal.len(), 10); // a `str` otherwise
/// ```
#[derive(Clone)]
pub struct Name(Repr);

#[derive(Clone)]
enum Repr {
    Static(&'static str),
    Shared(Arc<str>),
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        match &self.0 {
            Repr::Static(name) => name,
            Repr::Shared(name) => name,
        }
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self
    }
}

impl From<&'static str> for Name {
    fn from(name: &'static str) -> Self {
        Self(Repr::Static(name))
    }
}

impl From<String> for Name {
    fn from(name: String) -> Self {
        Self(Repr::Shared(name.into()))
    }
}

impl From<Box<str>> for Name {
    fn from(name: Box<str>) -> Self {
        Self(Repr::Shared(name.into()))
    }
}

impl From<Arc<str>> for Name {
    fn from(name: Arc<str>) -> Self {
        Self(Repr::Shared(name))
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Name {}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        **self == *other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        **self == **other
    }
}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}
