//! Key extractors for HTTP requests: which bucket a request counts against.
//!
//! | extractor | key |
//! |---|---|
//! | [`PeerIp`] | the connection's peer address, as axum or tonic recorded it (IPv6: its /64 network) |
//! | [`ClientIp`] | the client address behind trusted proxies ([`Cidr`]s), else the peer (IPv6: its network, /64 unless [`ClientIp::ipv6_prefix`] says otherwise) |
//! | [`HeaderKey`] | a header such as an API key, as a SHA-256 digest |
//! | [`RouteKey`] | method and matched route template; requests that matched no route (404s) as one |
//! | tuples, e.g. `(ClientIp, RouteKey)` | each client per route |
//!
//! IPv6 clients are keyed by network because one client is given a whole /64 and may send every request from
//! another address of it; IPv4-mapped IPv6 peers are the IPv4 client they map.
//!
//! A missing source (no peer address, no header) is a [`KeyError`](tollgate_tower::KeyError):
//! the adapter answers 500 with the reason, rather than counting the request against a silent global bucket.

mod cidr;
#[cfg(feature = "axum")]
mod client_ip;
mod header;
#[cfg(any(feature = "axum", feature = "tonic"))]
mod peer_ip;
#[cfg(feature = "axum")]
mod route;

pub use cidr::{Cidr, CidrError};
#[cfg(feature = "axum")]
pub use client_ip::{ClientIp, ForwardedHeader};
pub use header::HeaderKey;
#[cfg(any(feature = "axum", feature = "tonic"))]
pub use peer_ip::PeerIp;
#[cfg(feature = "axum")]
pub use route::RouteKey;
