//! The stand-in upstream: an OpenAI-compatible `POST /v1/chat/completions` that streams tokens at a set pace.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// How the stand-in streams.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Upstream {
    /// Tokens in a completion that names no `max_tokens`.
    pub(crate) tokens: u64,
    /// The time between two tokens.
    pub(crate) pace: Duration,
}

impl Upstream {
    /// Answers a chat completion: with `"stream": true`, one SSE chunk per token, the `usage` in a last chunk
    /// when `stream_options.include_usage` is set, then `data: [DONE]`; without, one JSON body.
    pub(crate) async fn complete(self, body: Bytes) -> Response {
        let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return (StatusCode::BAD_REQUEST, "the body is not JSON\n").into_response();
        };
        // A completion ends by itself after `tokens`, or at the request's `max_tokens` if sooner.
        let tokens = request
            .get("max_tokens")
            .and_then(serde_json::Value::as_u64)
            .map_or(self.tokens, |max| max.min(self.tokens));
        let prompt = (body.len() as u64).div_ceil(4);
        let usage = serde_json::json!({
            "prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens
        });
        if request.get("stream").and_then(serde_json::Value::as_bool) != Some(true) {
            let text = "tok ".repeat(usize::try_from(tokens).unwrap_or(0));
            let body = serde_json::json!({
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                "usage": usage,
            });
            return axum::Json(body).into_response();
        }
        let include_usage = request
            .pointer("/stream_options/include_usage")
            .and_then(serde_json::Value::as_bool)
            == Some(true);
        let pace = self.pace;
        // (sent so far, the usage chunk sent, done)
        let events = futures_util::stream::unfold(
            (0u64, false, false),
            move |(sent, told, done)| {
                let usage = usage.clone();
                async move {
                    if done {
                        return None;
                    }
                    if sent < tokens {
                        tokio::time::sleep(pace).await;
                        let chunk = serde_json::json!({
                            "object": "chat.completion.chunk",
                            "choices": [{"index": 0, "delta": {"content": "tok "}}],
                        });
                        let event = format!("data: {chunk}\n\n");
                        return Some((
                            Ok::<_, std::convert::Infallible>(Bytes::from(event)),
                            (sent + 1, told, false),
                        ));
                    }
                    if include_usage && !told {
                        let chunk = serde_json::json!({"object": "chat.completion.chunk", "choices": [], "usage": usage});
                        return Some((
                            Ok(Bytes::from(format!("data: {chunk}\n\n"))),
                            (sent, true, false),
                        ));
                    }
                    Some((
                        Ok(Bytes::from_static(b"data: [DONE]\n\n")),
                        (sent, told, true),
                    ))
                }
            },
        );
        let mut response = Response::new(Body::from_stream(events));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        response
    }
}
