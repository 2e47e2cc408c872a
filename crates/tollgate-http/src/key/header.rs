use http::Request;
use http::header::HeaderName;
use tollgate_tower::digest::push_hex_digest;
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

impl<B> KeyExtractor<Request<B>> for HeaderKey {
    fn extract(&self, req: &Request<B>, key: &mut String) -> Result<(), KeyError> {
        let value = req
            .headers()
            .get(&self.name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| KeyError::missing(format!("the {} header", self.name)))?;
        push_hex_digest(value.as_bytes(), key);
        Ok(())
    }
}
