//! Costs known only as the response streams: a body meter that counts tokens as they leave, for rate limiters
//! charged with [`CostAfter::Streamed`](tollgate_tower::CostAfter::Streamed) (see
//! [`tollgate_tower::stream_cost`] for reserve, debit, settle and refund).
//!
//! [`StreamCostLayer`] goes outside the limiters: it meters each response's body with a [`Meter`] made for its
//! request — [`OpenAiSse`] (OpenAI-style server-sent events: their `usage` when present, else an estimate per
//! chunk), [`ByteCount`], or your own — and hands the counts to the limiters' ledger, which debits in batches and,
//! at a budget that cuts, ends the stream at its next chunk as the meter says ([`Cut`]). [`MaxTokensLayer`] reads
//! an OpenAI-style JSON body's `max_tokens` (buffering at most a stated number of bytes) into a [`TokenEstimate`],
//! which [`Reserve`] turns into the tokens a limiter reserves up front.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_core::{MemoryStore, Policy, Quota};
//! use tollgate_http::stream::{MaxTokensLayer, OpenAiSse, Reserve, StreamCostLayer};
//! use tollgate_http::{HttpLimitLayer, key::HeaderKey};
//! use tollgate_tower::stream_cost::{Exhausted, Streamed, Tokens};
//! use tollgate_tower::{CostAfter, RateLimitLayer};
//! use tower::ServiceBuilder;
//!
//! let tokens_per_minute = Policy::token_bucket(Quota::per_minute(100_000)?);
//! let key = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
//! let limit = RateLimitLayer::new("tokens", tokens_per_minute, Arc::new(MemoryStore::new()), key)
//!     .cost(Reserve::new(Tokens::Total, 256))
//!     .cost_after(CostAfter::Streamed(Streamed::new(Tokens::Total).on_exhausted(Exhausted::Cut)));
//! let layers = ServiceBuilder::new()
//!     .layer(MaxTokensLayer::new(64 * 1024))
//!     .layer(StreamCostLayer::new(OpenAiSse::new()))
//!     .layer(HttpLimitLayer::new(limit));
//! # let _ = layers;
//! # Ok::<(), tollgate_core::PolicyError>(())
//! ```

mod body;
mod estimate;
mod layer;
mod meters;

pub use body::MeteredBody;
pub use estimate::{MaxTokens, MaxTokensLayer, Reserve, TokenEstimate};
pub use layer::{StreamCost, StreamCostFuture, StreamCostLayer};
pub use meters::{ByteCount, OpenAiSse};
pub use tollgate_tower::stream_cost::Usage;

/// Counts a response body's tokens as it streams: one meter per response, made by its [`MakeMeter`].
pub trait Meter: Send + 'static {
    /// Reads the body's next data frame.
    fn data(&mut self, data: &[u8]);

    /// The counts so far: what the stream itself stated (an SSE `usage`), else what was counted.
    fn usage(&self) -> Usage;

    /// How the stream ends when `limiter` cuts it at its budget; the default ends it with no more frames.
    fn cut(&self, limiter: &tollgate_tower::Name) -> Cut {
        let _ = limiter;
        Cut::End
    }
}

/// How a cut stream ends.
#[derive(Debug, Clone)]
pub enum Cut {
    /// One last data frame (an SSE `event: error`), then the end.
    Data(bytes::Bytes),
    /// Trailers (a gRPC status), then the end.
    Trailers(http::HeaderMap),
    /// The end, with nothing more.
    End,
}

/// Makes the [`Meter`] for one request's response.
pub trait MakeMeter<ReqBody>: Clone + Send + Sync + 'static {
    /// The meter.
    type Meter: Meter;

    /// The meter for the response to `req`.
    fn make(&self, req: &http::Request<ReqBody>) -> Self::Meter;
}

/// A closure that makes a meter.
impl<ReqBody, F, M> MakeMeter<ReqBody> for F
where
    F: Fn(&http::Request<ReqBody>) -> M + Clone + Send + Sync + 'static,
    M: Meter,
{
    type Meter = M;

    fn make(&self, req: &http::Request<ReqBody>) -> M {
        self(req)
    }
}
