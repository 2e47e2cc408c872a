//! The tokens a request reserves: an OpenAI-style body's `max_tokens`, read before the limiters decide.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use tollgate_tower::stream_cost::{Tokens, Usage};
use tower_layer::Layer;
use tower_service::Service;

/// The largest `max_tokens` a request may ask for (2^32 − 1); a larger one is refused with 400.
const MAX_TOKENS_LIMIT: u64 = u32::MAX as u64;

/// What a request is expected to cost, put in its extensions by [`MaxTokensLayer`]: its input tokens (estimated
/// as its body's size over 4, rounded up) and the `max_tokens` it asked for, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenEstimate {
    /// Input tokens: the body's bytes over 4, rounded up.
    pub input: u64,
    /// The body's `max_tokens` (or `max_completion_tokens`), if it has one.
    pub max_tokens: Option<u64>,
}

/// Reads a JSON request body, up to `limit` bytes, for its `max_tokens` (or `max_completion_tokens`) and
/// puts a [`TokenEstimate`] in the request's extensions; the body is passed on whole. A body that is empty passes
/// with no estimate. Answered with a problem body instead (the request goes no further): a body over `limit`
/// (413), one that is not a JSON object (400), a `max_tokens` that is not a whole number from 0 to 2^32 − 1
/// (400), a body that fails to arrive (400).
#[must_use]
#[derive(Debug, Clone, Copy)]
pub struct MaxTokensLayer {
    limit: usize,
}

impl MaxTokensLayer {
    /// Buffers at most `limit` bytes of a body.
    pub const fn new(limit: usize) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for MaxTokensLayer {
    type Service = MaxTokens<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MaxTokens {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of a [`MaxTokensLayer`].
#[derive(Debug, Clone)]
pub struct MaxTokens<S> {
    inner: S,
    limit: usize,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for MaxTokens<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<tollgate_tower::BoxError>,
    ResBody: From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The ready clone serves this request; the fresh one waits for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit;
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let bytes = match Limited::new(body, limit).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(err) => {
                    let too_large = err.is::<http_body_util::LengthLimitError>();
                    let (status, detail) = if too_large {
                        (
                            StatusCode::PAYLOAD_TOO_LARGE,
                            format!("the request body is over {limit} bytes"),
                        )
                    } else {
                        (
                            StatusCode::BAD_REQUEST,
                            format!("the request body failed to arrive: {err}"),
                        )
                    };
                    return Ok(crate::problem::problem(status, None, &detail, None));
                }
            };
            if !bytes.is_empty() {
                match estimate(&bytes) {
                    Ok(estimate) => {
                        parts.extensions.insert(estimate);
                    }
                    Err(detail) => {
                        return Ok(crate::problem::problem(
                            StatusCode::BAD_REQUEST,
                            None,
                            &detail,
                            None,
                        ));
                    }
                }
            }
            inner
                .call(Request::from_parts(parts, Full::new(bytes)))
                .await
        })
    }
}

/// The estimate of a JSON body, or why it has none.
fn estimate(body: &[u8]) -> Result<TokenEstimate, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the request body is not JSON: {e}"))?;
    let object = value
        .as_object()
        .ok_or_else(|| "the request body is not a JSON object".to_owned())?;
    let field = ["max_tokens", "max_completion_tokens"]
        .into_iter()
        .find_map(|name| object.get(name).map(|v| (name, v)));
    let max_tokens = match field {
        None | Some((_, serde_json::Value::Null)) => None,
        Some((name, value)) => Some(
            value
                .as_u64()
                .filter(|n| *n <= MAX_TOKENS_LIMIT)
                .ok_or_else(|| {
                    format!(
                        "{name} must be a whole number from 0 to {MAX_TOKENS_LIMIT}, not {value}"
                    )
                })?,
        ),
    };
    Ok(TokenEstimate {
        input: (body.len() as u64).div_ceil(4),
        max_tokens,
    })
}

/// A limiter's cost from the request's [`TokenEstimate`]: its input tokens, its `max_tokens` (or `default` when it
/// asked for none), or both, as [`Tokens`] says; `default` alone for a request with no estimate.
#[derive(Debug, Clone, Copy)]
pub struct Reserve {
    tokens: Tokens,
    default: u64,
}

impl Reserve {
    /// Reserves `tokens`, `default` output tokens for a request that names no `max_tokens`.
    pub const fn new(tokens: Tokens, default: u64) -> Self {
        Self { tokens, default }
    }
}

impl<B> tollgate_tower::Cost<Request<B>> for Reserve {
    fn cost(&self, req: &Request<B>) -> u64 {
        let estimate = req
            .extensions()
            .get::<TokenEstimate>()
            .copied()
            .unwrap_or_default();
        self.tokens.of(Usage {
            input: estimate.input,
            output: estimate.max_tokens.unwrap_or(self.default),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_max_tokens_or_none() {
        assert_eq!(
            estimate(br#"{"max_tokens": 50, "messages": []}"#)
                .unwrap()
                .max_tokens,
            Some(50)
        );
        assert_eq!(
            estimate(br#"{"max_completion_tokens": 7}"#)
                .unwrap()
                .max_tokens,
            Some(7)
        );
        assert_eq!(estimate(br#"{"messages": []}"#).unwrap().max_tokens, None);
        assert_eq!(
            estimate(br#"{"max_tokens": null}"#).unwrap().max_tokens,
            None
        );
        assert_eq!(estimate(b"{}").unwrap().input, 1);
    }

    #[test]
    fn bad_bodies_are_refused_with_a_reason() {
        for (body, says) in [
            (&b"not json"[..], "not JSON"),
            (b"[1, 2]", "not a JSON object"),
            (br#"{"max_tokens": -1}"#, "whole number"),
            (br#"{"max_tokens": 1.5}"#, "whole number"),
            (br#"{"max_tokens": "10"}"#, "whole number"),
            (br#"{"max_tokens": 99999999999999}"#, "whole number"),
        ] {
            let err = estimate(body).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
