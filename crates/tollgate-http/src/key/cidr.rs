use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP network such as `10.0.0.0/8` or `2001:db8::/32` (a bare address is a /32 or /128).
///
/// ```
/// use tollgate_http::key::Cidr;
///
/// let net: Cidr = "10.1.0.0/16".parse()?;
/// assert!(net.contains("10.1.255.7".parse()?));
/// assert!(!net.contains("10.2.0.1".parse()?));
/// assert!("::ffff:10.1.2.3".parse::<std::net::IpAddr>().map(|ip| net.contains(ip))?); // IPv4-mapped IPv6
/// assert_eq!("10.0.0.0/33".parse::<Cidr>().unwrap_err().to_string(),
///            "invalid CIDR \"10.0.0.0/33\": prefix length 33 exceeds 32");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The network of `addr` with a `prefix`-bit mask; host bits are cleared.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let max = max_prefix(addr);
        if prefix > max {
            return Err(CidrError::new(
                format!("{addr}/{prefix}"),
                format!("prefix length {prefix} exceeds {max}"),
            ));
        }
        let network = match addr {
            IpAddr::V4(v4) => IpAddr::from(Ipv4Addr::from(u32::from(v4) & mask32(prefix))),
            IpAddr::V6(v6) => IpAddr::from(Ipv6Addr::from(u128::from(v6) & mask128(prefix))),
        };
        Ok(Self { network, prefix })
    }

    /// Whether `ip` lies in this network. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) count as IPv4.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                u32::from(ip) & mask32(self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

const fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| CidrError::new(s.to_owned(), why.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| err("not an IPv4 or IPv6 address"))?;
        let prefix = match prefix {
            None => max_prefix(addr),
            Some(p) => p
                .trim()
                .parse()
                .map_err(|_| err("the prefix length is not a number"))?,
        };
        Self::new(addr, prefix).map_err(|e| CidrError {
            input: s.to_owned(),
            ..e
        })
    }
}

/// A CIDR that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrError {
    input: String,
    why: String,
}

impl CidrError {
    fn new(input: String, why: String) -> Self {
        Self { input, why }
    }
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid CIDR {:?}: {}", self.input, self.why)
    }
}

impl std::error::Error for CidrError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_matches() {
        let all4: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all4.contains(ip("255.255.255.255")));
        assert!(!all4.contains(ip("::1")));
        let host: Cidr = "192.0.2.7".parse().unwrap();
        assert!(host.contains(ip("192.0.2.7")) && !host.contains(ip("192.0.2.8")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        assert_eq!(
            "10.9.8.7/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!("::/0".parse::<Cidr>().unwrap().to_string(), "::/0");
    }

    #[test]
    fn rejects_garbage_with_a_message() {
        for (input, why) in [
            ("", "not an IPv4 or IPv6 address"),
            ("10.0.0/8", "not an IPv4 or IPv6 address"),
            ("10.0.0.0/x", "the prefix length is not a number"),
            ("::1/129", "prefix length 129 exceeds 128"),
        ] {
            let err = input.parse::<Cidr>().unwrap_err();
            assert_eq!(err.to_string(), format!("invalid CIDR {input:?}: {why}"));
        }
    }
}
