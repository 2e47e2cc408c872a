//! Which bucket a gRPC call belongs to: a metadata entry (e.g. an API key, stored hashed), the peer's IP address
//! or the called method, alone or combined in tuples.
//!
//! A missing source is a [`KeyError`] (the call fails with `INTERNAL` naming what is missing), never a silent
//! global bucket.
//!
//! ```
//! use tollgate_grpc::key::{GrpcMethod, MetadataKey, PeerIp};
//! use tollgate_tower::KeyExtractor;
//!
//! let req = http::Request::builder()
//!     .uri("/helloworld.Greeter/SayHello")
//!     .header("x-api-key", "secret-1")
//!     .body(())?;
//!
//! let mut key = String::new();
//! (MetadataKey::metadata("x-api-key")?, GrpcMethod).extract(&req, &mut key)?;
//! assert_eq!(key, "f7e7c36e458e80e6b6a2c67d0a9ec09b|/helloworld.Greeter/SayHello"); // the secret is not stored
//!
//! // No peer address: a plain `http::Request` was not served by tonic's transport.
//! let err = PeerIp.extract(&req, &mut String::new()).unwrap_err();
//! assert!(err.to_string().contains("peer address"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use tollgate_tower::{KeyError, KeyExtractor};

/// The value of one metadata entry, hashed (SHA-256, 128 bits, hex): an API key or token is never stored raw, and
/// a long or binary (`-bin`) value costs the same as a short one. Built by [`MetadataKey::metadata`]; an empty value
/// is missing, never a bucket shared by every client sending one. The same extractor as the HTTP adapter's
/// `HeaderKey` (gRPC metadata travels as HTTP/2 headers), so both follow one rule.
pub use tollgate_http::key::HeaderKey as MetadataKey;

/// The peer's IP address, from the `TcpConnectInfo` that tonic's `transport::Server` records on each request:
/// the HTTP adapter's extractor, which reads what axum and tonic record alike (see it for IPv6 networks, TLS and
/// proxies).
pub use tollgate_http::key::PeerIp;

/// The called method's path, `/package.Service/Method`: combine it with a client key, e.g.
/// `(PeerIp, GrpcMethod)`, for one bucket per client and method under a single policy.
///
/// The path is the client's to choose: a limiter runs before tonic's router, so a call to a method that does not
/// exist still gets a bucket, and a client sending endless invented paths fills an in-process store to its key
/// bound (after which new keys fail with the store error policy). When the methods are known, prefer
/// [`ServedMethod`], which keys every other path as one.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMethod;

impl<B> KeyExtractor<http::Request<B>> for GrpcMethod {
    fn extract(&self, req: &http::Request<B>, key: &mut String) -> Result<(), KeyError> {
        key.push_str(req.uri().path());
        Ok(())
    }
}

/// The called method's path if it is one of the served ones, else `<unknown>`: [`GrpcMethod`] with a bounded
/// number of keys, whatever paths clients invent.
///
/// ```
/// use tollgate_grpc::key::ServedMethod;
/// use tollgate_tower::KeyExtractor;
///
/// let served = ServedMethod::new(["/helloworld.Greeter/SayHello"]);
/// let key = |path: &str| -> Result<String, Box<dyn std::error::Error>> {
///     let mut key = String::new();
///     served.extract(&http::Request::builder().uri(path).body(())?, &mut key)?;
///     Ok(key)
/// };
/// assert_eq!(key("/helloworld.Greeter/SayHello")?, "/helloworld.Greeter/SayHello");
/// assert_eq!(key("/helloworld.Greeter/Invented1")?, "<unknown>");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ServedMethod {
    methods: std::sync::Arc<std::collections::HashSet<String>>,
}

impl ServedMethod {
    /// Keys calls to `methods` (paths, `/package.Service/Method`) by their path, and every other call as one.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(methods: I) -> Self {
        Self {
            methods: std::sync::Arc::new(methods.into_iter().map(Into::into).collect()),
        }
    }
}

impl<B> KeyExtractor<http::Request<B>> for ServedMethod {
    fn extract(&self, req: &http::Request<B>, key: &mut String) -> Result<(), KeyError> {
        let path = req.uri().path();
        key.push_str(if self.methods.contains(path) {
            path
        } else {
            "<unknown>"
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use tollgate_core::KeyHasher;

    use tonic::transport::server::TcpConnectInfo;

    use super::*;

    fn request_from(peer: &str) -> http::Request<()> {
        let mut req = http::Request::new(());
        let remote_addr: SocketAddr = peer.parse().unwrap();
        req.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(remote_addr),
        });
        req
    }

    #[test]
    fn peer_ip_ignores_the_port_and_unmaps_ipv4() {
        let mut a = String::new();
        PeerIp
            .extract(&request_from("10.1.2.3:5000"), &mut a)
            .unwrap();
        let mut b = String::new();
        PeerIp
            .extract(&request_from("[::ffff:10.1.2.3]:6000"), &mut b)
            .unwrap();
        assert_eq!(a, "10.1.2.3");
        assert_eq!(a, b);
    }

    #[test]
    fn an_ipv6_peer_is_its_64_network() {
        let text = |peer: &str| {
            let mut key = String::new();
            PeerIp.extract(&request_from(peer), &mut key).unwrap();
            key
        };
        let digest = |peer: &str| {
            use std::hash::Hasher;
            let mut state = KeyHasher::default();
            PeerIp.hash_key(&request_from(peer), &mut state).unwrap();
            state.finish()
        };
        let (a, b, other) = (
            "[2001:db8:0:7::1]:1",
            "[2001:db8:0:7:ffff::9]:2",
            "[2001:db8:0:8::1]:1",
        );
        assert_eq!(text(a), "2001:db8:0:7::/64");
        assert_eq!(text(a), text(b));
        assert_ne!(text(a), text(other));
        assert_eq!(digest(a), digest(b));
        assert_ne!(digest(a), digest(other));
    }

    #[test]
    fn metadata_keys_are_hashed_and_missing_ones_are_errors() {
        let extractor = MetadataKey::metadata("X-Api-Key").unwrap();
        assert_eq!(extractor.name(), "x-api-key");
        let mut req = http::Request::new(());
        let err = extractor.extract(&req, &mut String::new()).unwrap_err();
        assert_eq!(err.what(), "the x-api-key metadata");

        req.headers_mut().insert("x-api-key", "k1".parse().unwrap());
        let mut key = String::new();
        extractor.extract(&req, &mut key).unwrap();
        assert_eq!(key.len(), 32);
        assert!(!key.contains("k1"));
    }

    #[test]
    fn hashed_keys_ignore_the_port_unmap_ipv4_and_tell_values_apart() {
        use std::hash::Hasher;
        fn digest<K: KeyExtractor<http::Request<()>>>(key: &K, req: &http::Request<()>) -> u64 {
            let mut state = KeyHasher::default();
            key.hash_key(req, &mut state).unwrap();
            state.finish()
        }
        let a = digest(&PeerIp, &request_from("10.1.2.3:5000"));
        assert_eq!(a, digest(&PeerIp, &request_from("[::ffff:10.1.2.3]:6000")));
        assert_ne!(a, digest(&PeerIp, &request_from("10.1.2.4:5000")));

        let api_key = MetadataKey::metadata("x-api-key").unwrap();
        let mut req = http::Request::new(());
        let err = api_key
            .hash_key(&req, &mut KeyHasher::default())
            .unwrap_err();
        assert_eq!(err.what(), "the x-api-key metadata");
        req.headers_mut().insert("x-api-key", "k1".parse().unwrap());
        let k1 = digest(&api_key, &req);
        req.headers_mut().insert("x-api-key", "k2".parse().unwrap());
        assert_ne!(k1, digest(&api_key, &req));
    }

    #[test]
    fn invalid_metadata_names_are_errors() {
        assert!(MetadataKey::metadata("bad name").is_err());
    }
}
