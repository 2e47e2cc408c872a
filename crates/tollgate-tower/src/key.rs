//! Which bucket a request belongs to.
//!
//! A [`KeyExtractor`] appends a request's key to a buffer (the layer has already written its own name, so two
//! limiters never share state by accident). When the source of the key is missing — no peer address, no API-key
//! header — the extractor returns a [`KeyError`] and the request fails with a configuration error: it is never
//! counted against a silent global bucket. A deliberate global limit keys every request by one text: a `&'static str`
//! or a `String` is such a key. A closure `Fn(&Req, &mut String) -> Result<(), KeyError>` is an extractor.
//!
//! Tuples combine extractors: `(PeerIp, RouteKey)` limits each client per route.
//!
//! The text is what a shared store (Redis) keys by. A store that keeps only digests (the in-process one) has the
//! limiter feed the key to its keyed hasher instead ([`KeyExtractor::hash_key`]): the default hashes the text, and
//! extractors of addresses and secrets write bytes ([`hash_ip`], [`hash_bytes`]), so no text is built for a key
//! that no one reads.
//!
//! ```
//! use tollgate_tower::{KeyError, KeyExtractor};
//!
//! struct Req { user: Option<&'static str>, path: &'static str }
//!
//! let user = |req: &Req, key: &mut String| {
//!     key.push_str(req.user.ok_or(KeyError::missing("the user name"))?);
//!     Ok(())
//! };
//! let path = |req: &Req, key: &mut String| {
//!     key.push_str(req.path);
//!     Ok(())
//! };
//!
//! let mut key = String::new();
//! (user, path).extract(&Req { user: Some("ann"), path: "/a" }, &mut key)?;
//! assert_eq!(key, "ann|/a");
//!
//! let mut key = String::new();
//! KeyExtractor::<Req>::extract(&"all", &Req { user: None, path: "/" }, &mut key)?;
//! assert_eq!(key, "all");
//! # Ok::<(), KeyError>(())
//! ```
//!
//! An extractor of its own that keys by an address writes the address's text for Redis and its bits for the
//! in-process store:
//!
//! ```
//! use std::fmt::Write as _;
//! use std::hash::Hasher;
//! use std::net::IpAddr;
//! use tollgate_tower::key::{KeyHasher, hash_ip};
//! use tollgate_tower::{KeyError, KeyExtractor};
//!
//! struct Req { client: IpAddr }
//! struct ByClient;
//!
//! impl KeyExtractor<Req> for ByClient {
//!     fn extract(&self, req: &Req, key: &mut String) -> Result<(), KeyError> {
//!         let _ = write!(key, "{}", req.client);
//!         Ok(())
//!     }
//!
//!     fn hash_key(&self, req: &Req, state: &mut KeyHasher) -> Result<(), KeyError> {
//!         hash_ip(state, req.client);
//!         Ok(())
//!     }
//! }
//!
//! let digest = |client: &str| -> Result<u64, Box<dyn std::error::Error>> {
//!     let mut state = KeyHasher::default();
//!     ByClient.hash_key(&Req { client: client.parse()? }, &mut state)?;
//!     Ok(state.finish())
//! };
//! assert_eq!(digest("10.0.0.1")?, digest("10.0.0.1")?);
//! assert_ne!(digest("10.0.0.1")?, digest("10.0.0.2")?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod addr;

pub use addr::{IPV6_CLIENT_PREFIX, client_network, push_client_ip, push_ipv4};
/// The keyed hasher [`KeyExtractor::hash_key`] writes to (the in-process store's own).
pub use tollgate_core::KeyHasher;

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::hash::Hasher;
use std::net::IpAddr;

/// Appends the key identifying a request's bucket.
pub trait KeyExtractor<Req>: Send + Sync + 'static {
    /// Appends the key for `req` to `key`, or says why it cannot be found.
    fn extract(&self, req: &Req, key: &mut String) -> Result<(), KeyError>;

    /// Feeds the key for `req` to `state`, the keyed hasher of a store that keeps only digests of its keys (the
    /// in-process one; see [`Store::key_hasher`](tollgate_core::Store::key_hasher)), instead of writing its text.
    ///
    /// The default writes the bytes of the text [`extract`](Self::extract) appends. Override it to skip building
    /// text no one reads, as [`hash_ip`] and [`hash_bytes`] let an extractor do: the bytes written must tell keys
    /// apart as their text does, and no key's bytes may begin another key's (a tag and a fixed length, or the
    /// length first, see to it), so that a tuple's parts stay apart.
    fn hash_key(&self, req: &Req, state: &mut KeyHasher) -> Result<(), KeyError> {
        with_key_buffer(|key| {
            self.extract(req, key)?;
            state.write(key.as_bytes());
            Ok(())
        })
    }

    /// Appends the key's value as [overrides and exemptions](crate::limit::rate::Overrides) name it: what an
    /// operator writes in a policy file (`gold` for an API-key header, an address for a client IP), not the stored
    /// form (a header's digest, an IPv6 client's network). The default appends the bytes of
    /// [`extract`](Self::extract)'s text; tuples join their parts' values with `|`.
    ///
    /// Only a limiter with overrides calls it, into a reused buffer (no allocation per request).
    fn match_key(&self, req: &Req, out: &mut Vec<u8>) -> Result<(), KeyError> {
        with_key_buffer(|key| {
            self.extract(req, key)?;
            out.extend_from_slice(key.as_bytes());
            Ok(())
        })
    }
}

/// Feeds an IP address to a key hasher, for [`KeyExtractor::hash_key`]: a tag and the address's bits, no text.
/// Pass a client's [`client_network`], as its text form ([`push_client_ip`]) does.
#[inline]
pub fn hash_ip(state: &mut KeyHasher, ip: IpAddr) {
    match ip {
        // One fixed-size write, the family tag above the address.
        IpAddr::V4(v4) => state.write_u64(4 << 32 | u64::from(v4.to_bits())),
        IpAddr::V6(v6) => {
            state.write_u64(6 << 32);
            state.write_u128(v6.to_bits());
        }
    }
}

/// Feeds raw key material (a secret such as an API key) to a key hasher, for [`KeyExtractor::hash_key`]: its length,
/// then its bytes. The in-process store keeps only a keyed digest, so a secret needs no cryptographic hash first.
pub fn hash_bytes(state: &mut KeyHasher, bytes: &[u8]) {
    state.write_usize(bytes.len());
    state.write(bytes);
}

thread_local! {
    static KEY_BUFFER: RefCell<String> = RefCell::new(String::with_capacity(128));
}

/// Runs `f` with an empty string buffer: this thread's reused one, or a fresh one if it is in use (an extractor
/// that itself calls a limited service, or a tuple's part hashing its text) or gone (thread teardown).
pub(crate) fn with_key_buffer<R>(mut f: impl FnMut(&mut String) -> R) -> R {
    let reused = KEY_BUFFER.try_with(|cell| {
        let mut key = cell.try_borrow_mut().ok()?;
        key.clear();
        Some(f(&mut key))
    });
    match reused {
        Ok(Some(result)) => result,
        _ => f(&mut String::new()),
    }
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

/// The same key for every request: one deliberate global bucket, named by this text.
macro_rules! const_key {
    ($($text:ty),*) => {$(
        impl<Req> KeyExtractor<Req> for $text {
            fn extract(&self, _: &Req, key: &mut String) -> Result<(), KeyError> {
                key.push_str(self);
                Ok(())
            }

            fn hash_key(&self, _: &Req, state: &mut KeyHasher) -> Result<(), KeyError> {
                state.write(self.as_bytes());
                Ok(())
            }

            fn match_key(&self, _: &Req, out: &mut Vec<u8>) -> Result<(), KeyError> {
                out.extend_from_slice(self.as_bytes());
                Ok(())
            }
        }
    )*};
}
const_key!(&'static str, String, Cow<'static, str>);

/// A key computed by a closure: it appends the request's key to the buffer, or says why it cannot be found.
impl<Req, F> KeyExtractor<Req> for F
where
    F: Fn(&Req, &mut String) -> Result<(), KeyError> + Send + Sync + 'static,
{
    fn extract(&self, req: &Req, key: &mut String) -> Result<(), KeyError> {
        self(req, key)
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

            #[allow(non_snake_case)]
            fn hash_key(&self, req: &Req, state: &mut KeyHasher) -> Result<(), KeyError> {
                let ($first, $($rest),+) = self;
                $first.hash_key(req, state)?;
                $(
                    state.write(&[SEPARATOR as u8]);
                    $rest.hash_key(req, state)?;
                )+
                Ok(())
            }

            #[allow(non_snake_case)]
            fn match_key(&self, req: &Req, out: &mut Vec<u8>) -> Result<(), KeyError> {
                let ($first, $($rest),+) = self;
                $first.match_key(req, out)?;
                $(
                    out.push(SEPARATOR as u8);
                    $rest.match_key(req, out)?;
                )+
                Ok(())
            }
        }
    };
}

tuple_extractor!(A, B);
tuple_extractor!(A, B, C);
tuple_extractor!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest `hash` leaves in a hasher with fixed keys.
    fn digest(hash: impl FnOnce(&mut KeyHasher) -> Result<(), KeyError>) -> u64 {
        let mut state = KeyHasher::default();
        hash(&mut state).unwrap();
        state.finish()
    }

    /// An address key that hashes as [`hash_ip`], whatever the request.
    struct Ip(&'static str);

    impl KeyExtractor<()> for Ip {
        fn extract(&self, _: &(), key: &mut String) -> Result<(), KeyError> {
            key.push_str(self.0);
            Ok(())
        }

        fn hash_key(&self, _: &(), state: &mut KeyHasher) -> Result<(), KeyError> {
            hash_ip(state, self.0.parse().unwrap());
            Ok(())
        }
    }

    /// Raw key material that hashes as [`hash_bytes`].
    struct Secret(&'static str);

    impl KeyExtractor<()> for Secret {
        fn extract(&self, _: &(), key: &mut String) -> Result<(), KeyError> {
            key.push_str(self.0);
            Ok(())
        }

        fn hash_key(&self, _: &(), state: &mut KeyHasher) -> Result<(), KeyError> {
            hash_bytes(state, self.0.as_bytes());
            Ok(())
        }
    }

    #[test]
    fn text_keys_hash_as_their_text_tuples_included() {
        let user = |_: &(), key: &mut String| {
            key.push_str("ann");
            Ok(())
        };
        let tuple = ("a", user);
        let hashed = digest(|s| tuple.hash_key(&(), s));
        // Each part's text in a write of its own, the separator between them.
        let text = digest(|s| {
            s.write(b"a");
            s.write(b"|");
            s.write(b"ann");
            Ok(())
        });
        assert_eq!(hashed, text);
    }

    #[test]
    fn binary_parts_keep_tuple_keys_apart() {
        let keys = [
            digest(|s| (Ip("10.0.0.1"), "x").hash_key(&(), s)),
            digest(|s| (Ip("10.0.0.2"), "x").hash_key(&(), s)),
            digest(|s| ("x", Ip("10.0.0.1")).hash_key(&(), s)),
            digest(|s| ("x", Ip("::a00:1")).hash_key(&(), s)),
            digest(|s| (Secret("ab"), "c").hash_key(&(), s)),
            digest(|s| (Secret("a"), "bc").hash_key(&(), s)),
            digest(|s| (Secret("a|b"), "c").hash_key(&(), s)),
            digest(|s| (Secret("a"), "b|c").hash_key(&(), s)),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b, "two keys share a digest: {keys:?}");
            }
        }
        // And one key is always the same digest.
        assert_eq!(keys[0], digest(|s| (Ip("10.0.0.1"), "x").hash_key(&(), s)));
    }

    #[test]
    fn a_missing_part_is_an_error_when_hashing_too() {
        let missing = |_: &(), _: &mut String| Err(KeyError::missing("the user"));
        let mut state = KeyHasher::default();
        let err = ("a", missing).hash_key(&(), &mut state).unwrap_err();
        assert_eq!(err.what(), "the user");
    }
}
