//! Which bucket a request belongs to.
//!
//! A [`KeyExtractor`] appends a request's key to a buffer (the layer has already written its own name, so two
//! limiters never share state by accident). When the source of the key is missing — no peer address, no API-key
//! header — the extractor returns a [`KeyError`] and the request fails with a configuration error: it is never
//! counted against a silent global bucket. A deliberate global limit uses [`ConstKey`].
//!
//! Tuples combine extractors: `(PeerIp, RouteKey)` limits each client per route.
//!
//! ```
//! use tollgate_tower::{ConstKey, KeyError, KeyExtractor, KeyFn};
//!
//! struct Req { user: Option<&'static str>, path: &'static str }
//!
//! let user = KeyFn::new(|req: &Req, key: &mut String| {
//!     key.push_str(req.user.ok_or(KeyError::missing("the user name"))?);
//!     Ok(())
//! });
//! let path = KeyFn::new(|req: &Req, key: &mut String| {
//!     key.push_str(req.path);
//!     Ok(())
//! });
//!
//! let mut key = String::new();
//! (user, path).extract(&Req { user: Some("ann"), path: "/a" }, &mut key)?;
//! assert_eq!(key, "ann|/a");
//!
//! let mut key = String::new();
//! let global = ConstKey::new("all");
//! KeyExtractor::<Req>::extract(&global, &Req { user: None, path: "/" }, &mut key)?;
//! assert_eq!(key, "all");
//! # Ok::<(), KeyError>(())
//! ```

use std::borrow::Cow;
use std::fmt;

/// Appends the key identifying a request's bucket.
pub trait KeyExtractor<Req>: Send + Sync + 'static {
    /// Appends the key for `req` to `key`, or says why it cannot be found.
    fn extract(&self, req: &Req, key: &mut String) -> Result<(), KeyError>;
}

/// A request's key could not be found: a configuration error, never a reason to share one global bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    source_name: Cow<'static, str>,
    hint: Option<Cow<'static, str>>,
}

impl KeyError {
    /// The key's source (`what`, e.g. "the x-api-key header") is missing from the request.
    pub fn missing(what: impl Into<Cow<'static, str>>) -> Self {
        Self {
            source_name: what.into(),
            hint: None,
        }
    }

    /// Adds a hint on how to fix the configuration.
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<Cow<'static, str>>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// What was missing.
    #[must_use]
    pub fn what(&self) -> &str {
        &self.source_name
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate-limit key not found: {} is missing from the request",
            self.source_name
        )?;
        if let Some(hint) = &self.hint {
            write!(f, " ({hint})")?;
        }
        Ok(())
    }
}

impl std::error::Error for KeyError {}

/// The same key for every request: one deliberate global bucket.
#[derive(Debug, Clone)]
pub struct ConstKey(Cow<'static, str>);

impl ConstKey {
    /// Always the key `key`.
    pub fn new(key: impl Into<Cow<'static, str>>) -> Self {
        Self(key.into())
    }
}

impl<Req> KeyExtractor<Req> for ConstKey {
    fn extract(&self, _: &Req, key: &mut String) -> Result<(), KeyError> {
        key.push_str(&self.0);
        Ok(())
    }
}

/// A key computed by a closure `Fn(&Req, &mut String) -> Result<(), KeyError>`.
#[derive(Clone, Copy)]
pub struct KeyFn<F>(F);

impl<F> KeyFn<F> {
    /// Wraps `f`.
    pub const fn new(f: F) -> Self {
        Self(f)
    }
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFn")
    }
}

impl<Req, F> KeyExtractor<Req> for KeyFn<F>
where
    F: Fn(&Req, &mut String) -> Result<(), KeyError> + Send + Sync + 'static,
{
    fn extract(&self, req: &Req, key: &mut String) -> Result<(), KeyError> {
        (self.0)(req, key)
    }
}

/// Separates the parts of a combined key. Extractors never emit it raw (addresses, routes and digests do not
/// contain it), so `(a, b)` keys cannot collide across different splits.
const SEPARATOR: char = '|';

macro_rules! tuple_extractor {
    ($first:ident $(, $rest:ident)+) => {
        impl<Req, $first, $($rest),+> KeyExtractor<Req> for ($first, $($rest),+)
        where
            $first: KeyExtractor<Req>,
            $($rest: KeyExtractor<Req>),+
        {
            #[allow(non_snake_case)]
            fn extract(&self, req: &Req, key: &mut String) -> Result<(), KeyError> {
                let ($first, $($rest),+) = self;
                $first.extract(req, key)?;
                $(
                    key.push(SEPARATOR);
                    $rest.extract(req, key)?;
                )+
                Ok(())
            }
        }
    };
}

tuple_extractor!(A, B);
tuple_extractor!(A, B, C);
tuple_extractor!(A, B, C, D);
