//! A tower layer for the **outbound** side: it reads what servers say of their quota and waits before sending
//! rather than being refused.
//!
//! [`PaceLayer`] wraps any `Service<http::Request<B>>` — hyper-util's client, a tonic `Channel`, a tower stack of
//! either — and keeps a budget per scope (by default the request's origin; [`PaceLayer::scope_by`] for your own)
//! and, inside it, per policy the server names (its name and `pk`). Every response refreshes the budget from:
//!
//! - `RateLimit-Policy` / `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11, whose `r` is the available quota and
//!   `t` the effective window within which it may be spent; -10's fields read the same), parsed as Structured
//!   Fields (RFC 9651);
//! - `X-RateLimit-Limit` / `-Remaining` / `-Reset` (reset as epoch or delta seconds);
//! - `Retry-After` (seconds or an HTTP-date), 429 and 503 with their problem details' `violated-policies`;
//! - gRPC `RESOURCE_EXHAUSTED` / `UNAVAILABLE` with a `google.rpc.RetryInfo` delay.
//!
//! A request with room in its budget is sent at once. Otherwise it waits its turn — first come, first served, so
//! that when the window opens the queue drains at the budget's pace instead of all at once — for at most
//! [`PaceLayer::max_wait`], then fails with [`WaitedTooLong`] or is sent anyway ([`OnMaxWait`]). After a refusal
//! the whole scope waits out the server's delay, with jitter. The layer **never retries** a request: put tower's
//! retry layer around it for that (`examples/paced_client_retry.rs` does), and each retry is paced like any
//! request. The budget rules, and how the layer stays bounded against servers that send garbage, are in
//! the `budget` module and `docs/design/ratelimit-fields.md`.
//!
//! Metrics (the `metrics` facade, beside the server's `tollgate_*` series): `tollgate_client_wait_seconds`, a
//! histogram of the time each request waited for its turn (0 for most), and `tollgate_client_refused_total`, the
//! refusals received, by `reason` (`http_429`, `http_503`, `grpc_resource_exhausted`, `grpc_unavailable`).
//!
//! ```
//! use std::time::Duration;
//! use tollgate_client::{OnMaxWait, PaceLayer};
//! use tower::ServiceBuilder;
//!
//! # fn wrap<S>(client: S) -> tollgate_client::Pace<S> {
//! // `client`: e.g. hyper_util's `Client::builder(TokioExecutor::new()).build_http()`.
//! let paced = ServiceBuilder::new()
//!     .layer(PaceLayer::new().max_wait(Duration::from_secs(5)).on_max_wait(OnMaxWait::Fail))
//!     .service(client);
//! # paced
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod budget;
pub mod fields;
mod future;
mod layer;
mod service;

use std::time::Duration;

pub use body::PaceBody;
pub use future::ResponseFuture;
pub use layer::{OnMaxWait, PaceLayer};
pub use service::Pace;

/// The error type of [`Pace`]: the inner service's error, or [`WaitedTooLong`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a request waited for its turn: in the extensions of a response whose request waited (absent when it
/// was sent at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited(pub Duration);

/// A request waited [`PaceLayer::max_wait`] and its budget still had no room; it was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitedTooLong {
    /// How long it waited.
    pub waited: Duration,
}

impl std::fmt::Display for WaitedTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not sent: waited {:?} and the server's quota still had no room",
            self.waited
        )
    }
}

impl std::error::Error for WaitedTooLong {}
