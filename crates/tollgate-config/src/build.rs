//! From checked limiters to the layers' parts: the key, the cost and the routes of each, for HTTP or gRPC.

use std::hash::Hasher;

use std::sync::Arc;
use tollgate_core::KeyHasher;

use http::Request;
use tollgate_core::Store;
use tollgate_http::key::{Cidr, HeaderKey};
#[cfg(feature = "axum")]
use tollgate_http::key::{ClientIp, RouteKey};
use tollgate_tower::limit::rate::Applies;
use tollgate_tower::{Cost, KeyError, KeyExtractor, RateLimitLayer};

use crate::resolve::Limiter;
use crate::schema::KeyPart;

/// Which adapter the layers are for: it decides what `client-ip`, `header:` and `route` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    #[cfg(feature = "axum")]
    Http,
    #[cfg(feature = "tonic")]
    Grpc,
}

impl Protocol {
    /// Whether its answers write the file's header families (gRPC answers carry every field as metadata).
    pub(crate) fn writes_headers(self) -> bool {
        match self {
            #[cfg(feature = "axum")]
            Self::Http => true,
            #[cfg(feature = "tonic")]
            Self::Grpc => false,
        }
    }
}

/// A policy file's key: its parts in order, each keyed as the code-built extractor of the same name keys it
/// (`ClientIp`, `HeaderKey`, `RouteKey`, gRPC's `PeerIp` and `GrpcMethod`, a constant text), a tuple's parts apart as in
/// code (`|` in the text, a separator byte in digests). A one-part key is exactly that extractor's key.
#[derive(Debug, Clone)]
pub struct FileKey {
    parts: Arc<[Part]>,
}

#[derive(Debug, Clone)]
enum Part {
    #[cfg(feature = "axum")]
    ClientIp(ClientIp),
    #[cfg(feature = "tonic")]
    GrpcPeer(tollgate_grpc::key::PeerIp),
    Header(HeaderKey),
    #[cfg(feature = "axum")]
    Route(RouteKey),
    #[cfg(feature = "tonic")]
    Method(tollgate_grpc::key::GrpcMethod),
    Global(&'static str),
}

impl FileKey {
    pub(crate) fn new(parts: &[KeyPart], protocol: Protocol, proxies: &[Cidr]) -> Self {
        // Only an HTTP client's address is read behind proxies: a gRPC key is the peer's own.
        #[cfg(not(feature = "axum"))]
        let _ = proxies;
        let part = |part: &KeyPart| match (part, protocol) {
            #[cfg(feature = "axum")]
            (KeyPart::ClientIp, Protocol::Http) => {
                Part::ClientIp(ClientIp::trusting(proxies.iter().copied()))
            }
            #[cfg(feature = "tonic")]
            (KeyPart::ClientIp, Protocol::Grpc) => Part::GrpcPeer(tollgate_grpc::key::PeerIp),
            #[cfg(feature = "axum")]
            (KeyPart::Header(name), Protocol::Http) => {
                Part::Header(HeaderKey::parse(name).expect("checked when the file was read"))
            }
            #[cfg(feature = "tonic")]
            (KeyPart::Header(name), Protocol::Grpc) => {
                Part::Header(HeaderKey::metadata(name).expect("checked when the file was read"))
            }
            #[cfg(feature = "axum")]
            (KeyPart::Route, Protocol::Http) => Part::Route(RouteKey),
            #[cfg(feature = "tonic")]
            (KeyPart::Route, Protocol::Grpc) => Part::Method(tollgate_grpc::key::GrpcMethod),
            (KeyPart::Global, _) => Part::Global("global"),
        };
        Self {
            parts: parts.iter().map(part).collect(),
        }
    }
}

macro_rules! each_part {
    ($part:expr, $p:ident => $body:expr) => {
        match $part {
            #[cfg(feature = "axum")]
            Part::ClientIp($p) => $body,
            #[cfg(feature = "tonic")]
            Part::GrpcPeer($p) => $body,
            Part::Header($p) => $body,
            #[cfg(feature = "axum")]
            Part::Route($p) => $body,
            #[cfg(feature = "tonic")]
            Part::Method($p) => $body,
            Part::Global($p) => $body,
        }
    };
}

impl<B> KeyExtractor<Request<B>> for FileKey {
    // A one-part key (most of them) is that part's key, without the tuple's loop: a file-built limiter then costs a
    // request what the same extractor costs in code (the figures are in docs/BENCHMARKS.md, "Policy files").
    #[inline]
    fn extract(&self, req: &Request<B>, key: &mut String) -> Result<(), KeyError> {
        if let [part] = &*self.parts {
            return each_part!(part, p => p.extract(req, key));
        }
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                key.push('|');
            }
            each_part!(part, p => p.extract(req, key))?;
        }
        Ok(())
    }

    #[inline]
    fn hash_key(&self, req: &Request<B>, state: &mut KeyHasher) -> Result<(), KeyError> {
        if let [part] = &*self.parts {
            return each_part!(part, p => p.hash_key(req, state));
        }
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                state.write(b"|");
            }
            each_part!(part, p => p.hash_key(req, state))?;
        }
        Ok(())
    }

    #[inline]
    fn match_key(&self, req: &Request<B>, out: &mut Vec<u8>) -> Result<(), KeyError> {
        if let [part] = &*self.parts {
            return each_part!(part, p => p.match_key(req, out));
        }
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push(b'|');
            }
            each_part!(part, p => p.match_key(req, out))?;
        }
        Ok(())
    }
}

/// A policy file's cost: the same number of tokens for every request (`cost = N`, default 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileCost(u64);

impl<B> Cost<Request<B>> for FileCost {
    #[inline]
    fn cost(&self, _: &Request<B>) -> u64 {
        self.0
    }
}

/// The requests a file's limiter decides: the paths of its `routes` (HTTP) or `methods` (gRPC), exact or, ending
/// in `*`, a prefix; none listed: every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl Routes {
    pub(crate) fn new(paths: &[String]) -> Self {
        let (prefixes, exact): (Vec<_>, Vec<_>) = paths.iter().partition(|p| p.ends_with('*'));
        Self {
            exact: exact.into_iter().cloned().collect(),
            prefixes: prefixes
                .into_iter()
                .map(|p| p.trim_end_matches('*').to_owned())
                .collect(),
        }
    }

    /// Whether the limiter decides a request for `path`.
    #[must_use]
    pub fn covers(&self, path: &str) -> bool {
        (self.exact.is_empty() && self.prefixes.is_empty())
            || self.exact.iter().any(|p| p == path)
            || self.prefixes.iter().any(|p| path.starts_with(p.as_str()))
    }
}

impl<B> Applies<Request<B>> for Routes {
    #[inline]
    fn applies(&self, req: &Request<B>) -> bool {
        self.covers(req.uri().path())
    }
}

/// The layers' entry for a file's limiter on store `St`: the limiter and the requests it decides.
pub type FileEntry<St> = (RateLimitLayer<FileKey, St, FileCost>, Routes);

/// Builds `limiter` on `store`; `None` for a limiter of the other protocol only (it names only gRPC methods, and
/// this is HTTP, or only routes, and this is gRPC): one file can describe both servers.
pub(crate) fn entry<St: Store>(
    limiter: &Limiter,
    store: &Arc<St>,
    protocol: Protocol,
    proxies: &[Cidr],
) -> Option<FileEntry<St>> {
    let (paths, others) = match protocol {
        #[cfg(feature = "axum")]
        Protocol::Http => (&limiter.routes, &limiter.methods),
        #[cfg(feature = "tonic")]
        Protocol::Grpc => (&limiter.methods, &limiter.routes),
    };
    if paths.is_empty() && !others.is_empty() {
        return None;
    }
    let key = FileKey::new(&limiter.key, protocol, proxies);
    let mut layer = RateLimitLayer::new(limiter.name.clone(), limiter.policy, store.clone(), key);
    if let Some(source) = &limiter.cost_after {
        layer = layer.cost_after(source.clone());
    }
    let layer = layer
        .cost(FileCost(limiter.cost))
        .on_store_error(limiter.on_store_error)
        .overrides(limiter.overrides.clone())
        .state_per_policy(true)
        .mode(limiter.mode);
    Some((layer, Routes::new(paths)))
}
