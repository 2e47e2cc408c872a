//! Key extractors for HTTP requests: which bucket a request counts against.
//!
//! | extractor | key |
//! |---|---|
//! | [`PeerIp`] | the connection's peer address |
//! | [`ClientIp`] | the client address behind trusted proxies ([`Cidr`]s), else the peer |
//! | [`HeaderKey`] | a header such as an API key, as a SHA-256 digest |
//! | [`RouteKey`] | method and matched route template |
//! | tuples, e.g. `(ClientIp, RouteKey)` | each client per route |
//!
//! A missing source (no `ConnectInfo`, no header, no matched route) is a [`KeyError`](tollgate_tower::KeyError):
//! the adapter answers 500 with the reason, rather than counting the request against a silent global bucket.

mod cidr;
mod client_ip;
mod header;
mod route;

pub use cidr::{Cidr, CidrError};
pub use client_ip::{ClientIp, ForwardedHeader, PeerIp};
pub use header::HeaderKey;
pub use route::RouteKey;
