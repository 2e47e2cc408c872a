use std::hash::DefaultHasher;

use http::Request;
use http::header::{HeaderName, HeaderValue};
use tollgate_tower::digest::push_hex_digest;
use tollgate_tower::key::hash_bytes;
use tollgate_tower::{KeyError, KeyExtractor};

/// A request header, e.g. an API key, stored as a digest and never raw.
///
/// The key is the first 128 bits of the SHA-256 of the header's bytes (see
/// [`tollgate_tower::digest`] for why): an API key never lands in a shared store, a long value never makes a long
/// key, and every instance of a fleet maps the same value to the same bucket. A request without the header is a
/// configuration error (500) unless the layer is meant for authenticated routes only: it is never counted
/// against a shared bucket.
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
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by the value of header `name`.
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl HeaderKey {
    fn value<'r, B>(&self, req: &'r Request<B>) -> Result<&'r [u8], KeyError> {
        req.headers()
            .get(&self.name)
            .filter(|v| !v.is_empty())
            .map(HeaderValue::as_bytes)
            .ok_or_else(|| KeyError::missing(format!("the {} header", self.name)))
    }
}

impl<B> KeyExtractor<Request<B>> for HeaderKey {
    fn extract(&self, req: &Request<B>, key: &mut String) -> Result<(), KeyError> {
        push_hex_digest(self.value(req)?, key);
        Ok(())
    }

    /// The in-process store digests the value itself (keyed, never kept raw): no SHA-256 on its way.
    fn hash_key(&self, req: &Request<B>, state: &mut DefaultHasher) -> Result<(), KeyError> {
        hash_bytes(state, self.value(req)?);
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
        let mut state = DefaultHasher::new();
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
}
