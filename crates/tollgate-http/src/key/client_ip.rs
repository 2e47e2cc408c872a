use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tollgate_core::KeyHasher;

use http::Request;
use http::header::{FORWARDED, HeaderName};
use tollgate_tower::key::{IPV6_CLIENT_PREFIX, client_network, hash_ip, push_client_ip};
use tollgate_tower::{KeyError, KeyExtractor};

use super::Cidr;
use super::peer_ip::{PeerIp, write_ip};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Which header the trusted proxies append the client address to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default; what most load balancers write).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1` (only its `for` parameters are read).
    Forwarded,
}

/// The client address behind trusted reverse proxies.
///
/// Starts from the connection's peer and walks the forwarding header from the right, skipping only addresses
/// inside the configured trusted proxy networks: the first untrusted address is the client. Entries left of it
/// were written by the client and are never read, so a spoofed header can neither pick a fresh bucket nor land
/// on someone else's. With no trusted proxies (the default), or when the peer itself is not trusted, the headers
/// are ignored and the peer is the client. Only the one configured header is read: a proxy that appends to
/// `X-Forwarded-For` leaves a client-written `Forwarded` untouched, so reading both would trust the client.
///
/// An entry that is not an address (`unknown`, an obfuscated identifier, garbage) stops the walk at the last
/// trusted hop, which then is the key: never the garbage itself.
///
/// The key is the client's address for IPv4 and its /64 network for IPv6 ([`ipv6_prefix`](Self::ipv6_prefix)
/// sets another length): a client can pick any address in the block it was given, a fresh one per request.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use tollgate_http::key::{Cidr, ClientIp};
///
/// let client_ip = ClientIp::trusting(["10.0.0.0/8".parse::<Cidr>()?]);
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2")
///     .body(())?;
/// req.extensions_mut().insert(ConnectInfo("10.0.0.1:5000".parse::<SocketAddr>()?));
/// assert_eq!(client_ip.client_ip(&req)?, "203.0.113.9".parse::<std::net::IpAddr>()?);
///
/// // Without trusted proxies the header is ignored.
/// assert_eq!(ClientIp::new().client_ip(&req)?, "10.0.0.1".parse::<std::net::IpAddr>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Arc<[Cidr]>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::trusting([])
    }
}

impl ClientIp {
    /// Trusts no proxy: the peer address is the client.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts proxies inside `networks`, which append to `X-Forwarded-For`.
    #[must_use]
    pub fn trusting(networks: impl IntoIterator<Item = Cidr>) -> Self {
        Self {
            trusted: networks.into_iter().collect(),
            header: ForwardedHeader::default(),
            ipv6_prefix: IPV6_CLIENT_PREFIX,
        }
    }

    /// Keys IPv6 clients by their first `bits` bits (default 64; 128 or more: each address on its own, which lets
    /// a client with a /64 pick a fresh bucket per request). IPv4 clients are keyed by their address either way.
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    #[must_use]
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }

    /// The client's address for `req`.
    pub fn client_ip<B>(&self, req: &Request<B>) -> Result<IpAddr, KeyError> {
        let peer = PeerIp::peer_ip(req)?;
        if !self.is_trusted(peer) {
            return Ok(peer);
        }
        let name = match self.header {
            ForwardedHeader::XForwardedFor => X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => FORWARDED,
        };
        let mut last_trusted = peer;
        // Field lines in order, each split at commas, walked from the right.
        for line in req.headers().get_all(name).iter().rev() {
            let Ok(line) = line.to_str() else {
                return Ok(last_trusted);
            };
            for entry in line.rsplit(',') {
                let hop = match self.header {
                    ForwardedHeader::XForwardedFor => parse_node(entry),
                    ForwardedHeader::Forwarded => forwarded_for(entry).and_then(parse_node),
                };
                match hop.map(|ip| ip.to_canonical()) {
                    Some(ip) if self.is_trusted(ip) => last_trusted = ip,
                    Some(ip) => return Ok(ip),
                    None => return Ok(last_trusted),
                }
            }
        }
        Ok(last_trusted)
    }
}

impl<B> KeyExtractor<Request<B>> for ClientIp {
    fn extract(&self, req: &Request<B>, key: &mut String) -> Result<(), KeyError> {
        push_client_ip(key, self.client_ip(req)?, self.ipv6_prefix);
        Ok(())
    }

    fn hash_key(&self, req: &Request<B>, state: &mut KeyHasher) -> Result<(), KeyError> {
        hash_ip(
            state,
            client_network(self.client_ip(req)?, self.ipv6_prefix),
        );
        Ok(())
    }

    /// The client's whole address (not its IPv6 network): what overrides' addresses and CIDRs are matched against.
    fn match_key(&self, req: &Request<B>, out: &mut Vec<u8>) -> Result<(), KeyError> {
        write_ip(out, self.client_ip(req)?);
        Ok(())
    }
}

/// The `for` parameter of one `Forwarded` element, unquoted.
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then(|| {
            let value = value.trim();
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value)
        })
    })
}

/// An address with an optional port: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`, `[2001:db8::1]:80`.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = node.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    node.strip_prefix('[')?
        .strip_suffix(']')?
        .parse::<IpAddr>()
        .ok()
}

#[cfg(test)]
mod tests {
    use axum::extract::ConnectInfo;

    use super::*;

    fn req(peer: &str, header: &str, values: &[&str]) -> Request<()> {
        let mut builder = Request::builder();
        for v in values {
            builder = builder.header(header, *v);
        }
        let mut req = builder.body(()).unwrap();
        req.extensions_mut().insert(ConnectInfo(
            format!("{peer}:1234").parse::<SocketAddr>().unwrap(),
        ));
        req
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies() -> ClientIp {
        ClientIp::trusting(["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()])
    }

    #[test]
    fn untrusted_peer_ignores_headers() {
        let r = req("198.51.100.1", "x-forwarded-for", &["1.1.1.1"]);
        assert_eq!(proxies().client_ip(&r).unwrap(), ip("198.51.100.1"));
        assert_eq!(ClientIp::new().client_ip(&r).unwrap(), ip("198.51.100.1"));
    }

    #[test]
    fn walks_from_the_right_over_trusted_hops_and_lines() {
        let r = req(
            "10.0.0.1",
            "x-forwarded-for",
            &["9.9.9.9, 203.0.113.5", "10.1.1.1:8080"],
        );
        assert_eq!(proxies().client_ip(&r).unwrap(), ip("203.0.113.5"));
        // All hops trusted: the leftmost trusted hop.
        let r = req("10.0.0.1", "x-forwarded-for", &["10.2.2.2, 10.3.3.3"]);
        assert_eq!(proxies().client_ip(&r).unwrap(), ip("10.2.2.2"));
        // No header at all: the trusted peer.
        let r = req("10.0.0.1", "x-forwarded-for", &[]);
        assert_eq!(proxies().client_ip(&r).unwrap(), ip("10.0.0.1"));
    }

    #[test]
    fn garbage_stops_at_the_last_trusted_hop() {
        for garbage in ["not-an-ip", "unknown", "", "1.2.3.4.5"] {
            let r = req(
                "10.0.0.1",
                "x-forwarded-for",
                &[&format!("8.8.8.8, {garbage}, 10.0.0.9")],
            );
            assert_eq!(
                proxies().client_ip(&r).unwrap(),
                ip("10.0.0.9"),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn forwarded_header_variants() {
        let fwd = proxies().header(ForwardedHeader::Forwarded);
        let r = req(
            "10.0.0.1",
            "forwarded",
            &[r#"for=6.6.6.6, For="[2001:db8::7]:4711";proto=https, for=10.0.0.3;by=10.0.0.1"#],
        );
        assert_eq!(fwd.client_ip(&r).unwrap(), ip("2001:db8::7"));
        let r = req("10.0.0.1", "forwarded", &["for=192.0.2.43:47011"]);
        assert_eq!(fwd.client_ip(&r).unwrap(), ip("192.0.2.43"));
        let r = req("10.0.0.1", "forwarded", &["for=_hidden, for=10.0.0.4"]);
        assert_eq!(fwd.client_ip(&r).unwrap(), ip("10.0.0.4"));
        // The X-Forwarded-For extractor never reads Forwarded, and vice versa.
        assert_eq!(proxies().client_ip(&r).unwrap(), ip("10.0.0.1"));
    }

    /// `extractor`'s text key for a request from `peer` forwarded for `client`.
    fn text(extractor: &impl KeyExtractor<Request<()>>, peer: &str, client: &str) -> String {
        let mut key = String::new();
        let r = req(peer, "x-forwarded-for", &[client]);
        extractor.extract(&r, &mut key).unwrap();
        key
    }

    #[test]
    fn keys_are_ipv4_addresses_and_ipv6_networks() {
        for (peer, key) in [
            ("0.0.0.0", "0.0.0.0"),
            ("9.10.99.100", "9.10.99.100"),
            ("255.255.255.255", "255.255.255.255"),
            ("[::ffff:10.0.0.1]", "10.0.0.1"),
            ("[2001:db8:0:7:1:2:3:4]", "2001:db8:0:7::/64"),
            ("[::1]", "::/64"),
        ] {
            assert_eq!(text(&PeerIp, peer, "-"), key);
            assert_eq!(text(&ClientIp::new(), peer, "-"), key);
            assert_eq!(
                text(&proxies(), "10.0.0.1", peer.trim_matches(['[', ']'])),
                key
            );
        }
        assert_eq!(
            text(&ClientIp::new().ipv6_prefix(48), "[2001:db8:0:7::1]", "-"),
            "2001:db8::/48"
        );
        assert_eq!(
            text(&ClientIp::new().ipv6_prefix(128), "[2001:db8:0:7::1]", "-"),
            "2001:db8:0:7::1"
        );
        assert_eq!(
            text(&proxies().ipv6_prefix(128), "[fd00::1]", "2001:db8:0:7::1"),
            "2001:db8:0:7::1"
        );
    }

    #[test]
    fn an_ipv6_client_cannot_rotate_addresses_into_fresh_buckets() {
        let peer = |text: &str| digest(|s| PeerIp.hash_key(&req(text, "x-forwarded-for", &[]), s));
        let forwarded = |extractor: &ClientIp, client: &str| {
            let r = req("[fd00::1]", "x-forwarded-for", &[client]);
            digest(|s| extractor.hash_key(&r, s))
        };
        let (a, b, other) = (
            "2001:db8:0:7::1",
            "2001:db8:0:7:ffff:ffff:ffff:ffff",
            "2001:db8:0:8::1",
        );
        assert_eq!(peer(&format!("[{a}]")), peer(&format!("[{b}]")));
        assert_ne!(peer(&format!("[{a}]")), peer(&format!("[{other}]")));
        assert_eq!(forwarded(&proxies(), a), forwarded(&proxies(), b));
        assert_ne!(forwarded(&proxies(), a), forwarded(&proxies(), other));
        let exact = proxies().ipv6_prefix(128);
        assert_ne!(forwarded(&exact, a), forwarded(&exact, b));
        let wide = proxies().ipv6_prefix(48);
        assert_eq!(forwarded(&wide, a), forwarded(&wide, other));
    }

    fn digest(hash: impl FnOnce(&mut KeyHasher) -> Result<(), KeyError>) -> u64 {
        use std::hash::Hasher;
        let mut state = KeyHasher::default();
        hash(&mut state).unwrap();
        state.finish()
    }

    #[test]
    fn hashed_keys_are_the_client_addresses() {
        let peer = |text: &str| digest(|s| PeerIp.hash_key(&req(text, "x-forwarded-for", &[]), s));
        let address = |text: &str| {
            digest(|s| {
                hash_ip(s, ip(text));
                Ok(())
            })
        };
        assert_eq!(peer("10.0.0.1"), address("10.0.0.1"));
        assert_eq!(peer("[::ffff:10.0.0.1]"), address("10.0.0.1"));
        assert_eq!(peer("[2001:db8::1]"), address("2001:db8::"));
        assert_ne!(peer("10.0.0.1"), peer("10.0.0.2"));

        let forwarded = req("10.0.0.2", "x-forwarded-for", &["6.6.6.6, 203.0.113.9"]);
        assert_eq!(
            digest(|s| proxies().hash_key(&forwarded, s)),
            address("203.0.113.9")
        );
        assert_eq!(
            digest(|s| ClientIp::new().hash_key(&forwarded, s)),
            address("10.0.0.2")
        );
        let err = PeerIp
            .hash_key(&Request::new(()), &mut KeyHasher::default())
            .unwrap_err();
        assert!(err.what().contains("peer address"));
    }

    #[test]
    fn ipv4_mapped_peers_fold_to_ipv4() {
        let r = req("[::ffff:10.0.0.1]", "x-forwarded-for", &["203.0.113.5"]);
        assert_eq!(proxies().client_ip(&r).unwrap(), ip("203.0.113.5"));
    }
}
