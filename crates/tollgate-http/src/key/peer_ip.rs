use std::net::{IpAddr, SocketAddr};
use tollgate_core::KeyHasher;

#[cfg(feature = "axum")]
use axum::extract::ConnectInfo;
use http::Request;
#[cfg(feature = "axum")]
use tollgate_tower::key::push_ipv4;
use tollgate_tower::key::{IPV6_CLIENT_PREFIX, client_network, hash_ip, push_client_ip};
use tollgate_tower::{KeyError, KeyExtractor};
#[cfg(feature = "tonic")]
use tonic::transport::server::TcpConnectInfo;

/// The peer address of the connection, as the server recorded it on the request: axum's
/// `ConnectInfo<SocketAddr>` (feature `axum`) or tonic's `TcpConnectInfo` (feature `tonic`, which the gRPC adapter
/// turns on: its `key::PeerIp` is this one). An IPv4 peer is keyed by its address, an IPv6 peer by its /64 network
/// (one client can use any address in it; see [`client_network`](tollgate_tower::key::client_network)); the port
/// is left out, so a client opening several connections is still one client. For another IPv6 prefix over HTTP,
/// use [`ClientIp::new`](super::ClientIp::new)`().`[`ipv6_prefix`](super::ClientIp::ipv6_prefix)`(n)`: the same
/// peer, grouped by `n` bits.
///
/// Serve an axum app with `into_make_service_with_connect_info::<SocketAddr>()`, and a tonic service with its
/// `transport::Server` over TCP, or the key is missing (a configuration error, answered with 500 or `INTERNAL`).
/// Behind TLS, tonic records `TlsConnectInfo<TcpConnectInfo>` instead; read it with a closure. Behind a proxy the
/// peer is the proxy: key by what the proxy sets and clients cannot (over HTTP, [`ClientIp`](super::ClientIp)
/// with the proxy's network trusted).
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl PeerIp {
    /// The request's peer address, IPv4-mapped IPv6 addresses folded to IPv4 (the same clients as their IPv4
    /// form).
    ///
    /// # Errors
    /// When the server recorded no peer address on the request.
    pub fn peer_ip<B>(req: &Request<B>) -> Result<IpAddr, KeyError> {
        #[cfg(feature = "axum")]
        let axum = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0);
        #[cfg(not(feature = "axum"))]
        let axum = None;
        recorded_peer(axum, req)
    }
}

/// The peer address axum recorded (`axum`, already looked up), else tonic's, IPv4-mapped IPv6 folded to IPv4.
fn recorded_peer<B>(axum: Option<SocketAddr>, req: &Request<B>) -> Result<IpAddr, KeyError> {
    #[cfg(feature = "tonic")]
    let axum = axum.or_else(|| {
        req.extensions()
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
    });
    #[cfg(not(feature = "tonic"))]
    let _ = req;
    axum.map(|addr| addr.ip().to_canonical())
        .ok_or_else(missing_peer)
}

fn missing_peer() -> KeyError {
    KeyError::missing("the peer address (axum's ConnectInfo<SocketAddr>, tonic's TcpConnectInfo)").with_hint(
        "serve an axum router with `into_make_service_with_connect_info::<SocketAddr>()`, a tonic service with its \
         transport::Server over TCP",
    )
}

impl<B> KeyExtractor<Request<B>> for PeerIp {
    fn extract(&self, req: &Request<B>, key: &mut String) -> Result<(), KeyError> {
        // An IPv4 peer over axum (the common case) goes straight to its octets, without building an `IpAddr` first.
        #[cfg(feature = "axum")]
        if let Some(ConnectInfo(SocketAddr::V4(addr))) =
            req.extensions().get::<ConnectInfo<SocketAddr>>()
        {
            push_ipv4(key, addr.ip().octets());
            return Ok(());
        }
        push_client_ip(key, Self::peer_ip(req)?, IPV6_CLIENT_PREFIX);
        Ok(())
    }

    fn hash_key(&self, req: &Request<B>, state: &mut KeyHasher) -> Result<(), KeyError> {
        // The same IPv4 shortcut as `extract`: through `peer_ip` this costs 35 instructions more per request.
        #[cfg(feature = "axum")]
        let axum = match req.extensions().get::<ConnectInfo<SocketAddr>>() {
            Some(ConnectInfo(SocketAddr::V4(addr))) => {
                hash_ip(state, IpAddr::V4(*addr.ip()));
                return Ok(());
            }
            peer => peer.map(|info| info.0),
        };
        #[cfg(not(feature = "axum"))]
        let axum = None;
        hash_peer_network(axum, req, state)
    }

    /// The peer's whole address: what overrides' addresses and CIDRs are matched against.
    fn match_key(&self, req: &Request<B>, out: &mut Vec<u8>) -> Result<(), KeyError> {
        write_ip(out, Self::peer_ip(req)?);
        Ok(())
    }
}

/// [`PeerIp::hash_key`] for any peer but a plain IPv4 one over axum, handed axum's extension already looked up.
fn hash_peer_network<B>(
    axum: Option<SocketAddr>,
    req: &Request<B>,
    state: &mut KeyHasher,
) -> Result<(), KeyError> {
    hash_ip(
        state,
        client_network(recorded_peer(axum, req)?, IPV6_CLIENT_PREFIX),
    );
    Ok(())
}

/// Appends `ip`'s text to `out` (no allocation: the buffer is reused).
pub(crate) fn write_ip(out: &mut Vec<u8>, ip: IpAddr) {
    use std::io::Write as _;
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{ip}");
}
