//! Client addresses as keys, shared by the HTTP and gRPC extractors.
//!
//! An IPv4 address is one client. An IPv6 address is not: a subscriber is normally given a whole /64 (or more),
//! and a client can pick a fresh address in it for every request, so a limit per IPv6 address is no limit at all.
//! IPv6 clients are therefore keyed by their network, /64 unless configured otherwise; IPv4-mapped IPv6
//! addresses (`::ffff:a.b.c.d`) are the IPv4 client they map.
//!
//! ```
//! use tollgate_tower::key::{IPV6_CLIENT_PREFIX, client_network, push_client_ip};
//!
//! let a = "2001:db8:0:7:1:2:3:4".parse()?;
//! let b = "2001:db8:0:7:ffff::9".parse()?;
//! assert_eq!(client_network(a, IPV6_CLIENT_PREFIX), client_network(b, IPV6_CLIENT_PREFIX));
//! assert_ne!(client_network(a, 128), client_network(b, 128));
//!
//! let mut key = String::new();
//! push_client_ip(&mut key, a, IPV6_CLIENT_PREFIX);
//! assert_eq!(key, "2001:db8:0:7::/64");
//!
//! let mut key = String::new();
//! push_client_ip(&mut key, "::ffff:192.0.2.1".parse()?, IPV6_CLIENT_PREFIX);
//! assert_eq!(key, "192.0.2.1");
//! # Ok::<(), std::net::AddrParseError>(())
//! ```

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};

/// The network length IPv6 clients are keyed by unless configured otherwise: a /64, the block one subscriber's
/// link is given (RFC 4291's interface identifiers are its low 64 bits).
pub const IPV6_CLIENT_PREFIX: u8 = 64;

/// The address a client is keyed by: an IPv4-mapped IPv6 address as the IPv4 address it maps, an IPv6 address
/// cut to its first `v6_prefix` bits (128 or more: the whole address), an IPv4 address as it is.
#[must_use]
pub fn client_network(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) if v6_prefix < 128 => {
            let mask = u128::MAX
                .checked_shl(u32::from(128 - v6_prefix))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & mask))
        }
        ip => ip,
    }
}

/// Appends the text key of the client at `ip`: its [`client_network`], IPv6 networks with their length
/// (`2001:db8::/64`).
pub fn push_client_ip(key: &mut String, ip: IpAddr, v6_prefix: u8) {
    match client_network(ip, v6_prefix) {
        IpAddr::V4(v4) => push_ipv4(key, v4.octets()),
        IpAddr::V6(v6) => push_ipv6(key, v6, v6_prefix),
    }
}

/// Appends an IPv4 address in dotted decimal, without the formatting machinery (the common case, per request).
#[inline]
pub fn push_ipv4(key: &mut String, octets: [u8; 4]) {
    for (i, octet) in octets.into_iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        if octet >= 100 {
            key.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            key.push(char::from(b'0' + octet / 10 % 10));
        }
        key.push(char::from(b'0' + octet % 10));
    }
}

/// IPv6 through the formatting machinery (IPv4, the common case, writes its octets itself).
fn push_ipv6(key: &mut String, network: Ipv6Addr, prefix: u8) {
    let _ = write!(key, "{network}");
    if prefix < 128 {
        let _ = write!(key, "/{prefix}");
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn text(address: &str, prefix: u8) -> String {
        let mut key = String::from("name:");
        push_client_ip(&mut key, ip(address), prefix);
        key
    }

    #[test]
    fn ipv6_clients_are_their_network() {
        let a = ip("2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff");
        for (prefix, network) in [
            (0, "::"),
            (1, "::"),
            (16, "2001::"),
            (48, "2001:db8:aaaa::"),
            (63, "2001:db8:aaaa:bbba::"),
            (64, "2001:db8:aaaa:bbbb::"),
            (65, "2001:db8:aaaa:bbbb:8000::"),
            (127, "2001:db8:aaaa:bbbb:cccc:dddd:eeee:fffe"),
            (128, "2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff"),
            (200, "2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff"),
        ] {
            assert_eq!(client_network(a, prefix), ip(network), "/{prefix}");
        }
        assert_eq!(text("2001:db8:0:1:2:3:4:5", 64), "name:2001:db8:0:1::/64");
        assert_eq!(text("2001:db8::5", 128), "name:2001:db8::5");
        assert_eq!(text("2001:db8::5", 255), "name:2001:db8::5");
        assert_eq!(text("::", 0), "name:::/0");
    }

    #[test]
    fn ipv4_clients_are_their_address_mapped_or_not() {
        for prefix in [0, 64, 128] {
            assert_eq!(client_network(ip("192.0.2.1"), prefix), ip("192.0.2.1"));
            assert_eq!(
                client_network(ip("::ffff:192.0.2.1"), prefix),
                ip("192.0.2.1")
            );
            assert_eq!(text("::ffff:192.0.2.1", prefix), "name:192.0.2.1");
        }
        // Not mapped: an IPv6 address like any other (IPv4-compatible `::a.b.c.d` is deprecated, not folded).
        assert_eq!(client_network(ip("::192.0.2.1"), 64), ip("::"));
    }

    #[test]
    fn every_octet_in_every_position_renders_as_std_does() {
        for octet in 0..=255u8 {
            for position in 0..4 {
                let mut octets = [1, 22, 233, 4];
                octets[position] = octet;
                let v4 = Ipv4Addr::from(octets);
                // After other key material, which must be kept as it was.
                let mut key = String::from("name:");
                push_ipv4(&mut key, octets);
                assert_eq!(key, format!("name:{v4}"));
            }
        }
    }
}
