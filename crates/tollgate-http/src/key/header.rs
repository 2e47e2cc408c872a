//! [`HeaderKey`]: one extractor for HTTP headers and gRPC metadata (which travels as HTTP/2 headers), so that
//! both adapters follow one rule.

use http::Request;
use http::header::{HeaderName, HeaderValue, InvalidHeaderName};
use tollgate_core::KeyHasher;
use tollgate_tower::digest::push_hex_digest;
use tollgate_tower::key::hash_bytes;
use tollgate_tower::{KeyError, KeyExtractor};

/// A request header or gRPC metadata entry, e.g. an API key, stored as a digest and never raw.
///
/// The key is the first 128 bits of the SHA-256 of the value's bytes (see [`digest`](tollgate_tower::digest) for
/// why): an API key never lands in a shared store, a long or binary (`-bin`) value never makes a long key, and
/// every instance of a fleet maps the same value to the same bucket. A request without the entry, or with an empty
/// value, is a configuration error (HTTP 500, gRPC `INTERNAL`) unless the layer is meant for authenticated routes only: it
/// is never counted against a shared bucket (an empty value is no key, or every client sending one would share
/// it). The gRPC adapter re-exports it as `tollgate_grpc::key::MetadataKey`.
///
/// ```
/// use tollgate_http::key::HeaderKey;
/// use tollgate_tower::KeyExtractor;
///
/// let api_key = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
/// let req = http::Request::builder().header("x-api-key", "abc").body(())?;
/// let mut key = String::new();
/// api_key.extract(&req, &mut key)?;
/// assert_eq!(key, "ba7816bf8f01cfea414140de5dae2223");
///
/// // gRPC metadata: parsed from text (an invalid name is an error, never a panic), named so in errors.
/// let token = HeaderKey::metadata("X-Token")?;
/// let err = token.extract(&http::Request::new(()), &mut String::new()).unwrap_err();
/// assert_eq!(err.what(), "the x-token metadata");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    /// How a missing entry is named in errors: "header" or "metadata".
    noun: &'static str,
}

impl HeaderKey {
    /// Keys requests by the value of header `name`.
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self {
            name,
            noun: "header",
        }
    }

    /// Keys requests by the value of header `name` (any case).
    ///
    /// # Errors
    /// If `name` is not a valid header name.
    pub fn parse(name: &str) -> Result<Self, InvalidHeaderName> {
        Ok(Self::new(HeaderName::try_from(name.to_ascii_lowercase())?))
    }

    /// Keys gRPC calls by the metadata entry `name` (any case, e.g. `x-api-key`); errors call it metadata.
    ///
    /// # Errors
    /// If `name` is not a valid metadata name.
    pub fn metadata(name: &str) -> Result<Self, InvalidHeaderName> {
        Ok(Self {
            noun: "metadata",
            ..Self::parse(name)?
        })
    }

    /// The header's (or metadata entry's) name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    fn value<'r, B>(&self, req: &'r Request<B>) -> Result<&'r [u8], KeyError> {
        req.headers()
            .get(&self.name)
            .filter(|v| !v.is_empty())
            .map(HeaderValue::as_bytes)
            .ok_or_else(|| self.missing())
    }

    fn missing(&self) -> KeyError {
        KeyError::missing(format!("the {} {}", self.name, self.noun)).with_hint(
            "the client must send a non-empty value, or limit by another key such as the peer address",
        )
    }
}

impl<B> KeyExtractor<Request<B>> for HeaderKey {
    fn extract(&self, req: &Request<B>, key: &mut String) -> Result<(), KeyError> {
        push_hex_digest(self.value(req)?, key);
        Ok(())
    }

    /// The in-process store digests the value itself (keyed, never kept raw): no SHA-256 on its way.
    fn hash_key(&self, req: &Request<B>, state: &mut KeyHasher) -> Result<(), KeyError> {
        hash_bytes(state, self.value(req)?);
        Ok(())
    }

    /// The value itself, as a policy file names it (`gold`), not its digest.
    fn match_key(&self, req: &Request<B>, out: &mut Vec<u8>) -> Result<(), KeyError> {
        out.extend_from_slice(self.value(req)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::hash::Hasher;

    use super::*;

    fn digest(extractor: &HeaderKey, value: Option<&str>) -> Result<u64, KeyError> {
        let mut req = Request::new(());
        if let Some(value) = value {
            req.headers_mut()
                .insert("x-api-key", value.parse().unwrap());
        }
        let mut state = KeyHasher::default();
        extractor.hash_key(&req, &mut state)?;
        Ok(state.finish())
    }

    #[test]
    fn hashed_keys_tell_values_apart_and_missing_ones_are_errors() {
        let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"));
        let k1 = digest(&api_key, Some("k1")).unwrap();
        assert_eq!(k1, digest(&api_key, Some("k1")).unwrap());
        assert_ne!(k1, digest(&api_key, Some("k2")).unwrap());
        assert_eq!(
            digest(&api_key, None).unwrap_err().what(),
            "the x-api-key header"
        );
        assert!(
            digest(&api_key, Some("")).is_err(),
            "an empty value is no key"
        );
    }

    #[test]
    fn metadata_keys_name_their_entry_and_treat_empty_values_as_missing() {
        let token = HeaderKey::metadata("X-Api-Key").unwrap();
        assert_eq!(token.name(), "x-api-key");
        assert_eq!(
            digest(&token, None).unwrap_err().what(),
            "the x-api-key metadata"
        );
        assert_eq!(
            digest(&token, Some("")).unwrap_err().what(),
            "the x-api-key metadata",
            "an empty value is no key: never one bucket shared by every client sending it"
        );
        assert!(HeaderKey::metadata("bad name").is_err());
        assert!(HeaderKey::parse("bad name").is_err());
    }
}
