//! The ready-made meters: OpenAI-style server-sent events, and bytes.

use bytes::Bytes;

use super::{Cut, MakeMeter, Meter, TokenEstimate, Usage};

/// Longest SSE line kept while waiting for its end: a longer one is counted as a chunk and not parsed.
const MAX_LINE: usize = 64 * 1024;

/// Meters an OpenAI-style chat completion stream (`text/event-stream`, one `data: {json}` event per chunk,
/// `data: [DONE]` at the end): output tokens are the `usage` the stream states (its last chunk, when the request
/// asked for `stream_options.include_usage`), else `per_chunk` per content chunk (1 by default: OpenAI sends about
/// one token per chunk); input tokens are the `usage`'s, else the request's [`TokenEstimate`] (its body's size
/// over 4), else 0. A `usage` that is not a whole number (negative, fractional, absurd) is ignored. A cut stream
/// ends with an `event: error` whose data is a problem body naming the limiter (as a 429's), then the end.
#[derive(Debug, Clone)]
pub struct OpenAiSse {
    per_chunk: u64,
    input: u64,
    chunks: u64,
    stated: Option<Usage>,
    line: Vec<u8>,
    skipping: bool,
}

impl OpenAiSse {
    /// One token per content chunk until the stream states its usage.
    #[must_use]
    pub const fn new() -> Self {
        Self::per_chunk(1)
    }

    /// `tokens` per content chunk until the stream states its usage.
    #[must_use]
    pub const fn per_chunk(tokens: u64) -> Self {
        Self {
            per_chunk: tokens,
            input: 0,
            chunks: 0,
            stated: None,
            line: Vec::new(),
            skipping: false,
        }
    }

    fn line(&mut self) {
        let line = std::mem::take(&mut self.line);
        self.event(&line);
        self.line = line;
        self.line.clear();
    }

    fn event(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data.is_empty() || data == b"[DONE]" {
            return;
        }
        // Only a chunk that names its usage is parsed; the others are counted.
        if memchr(data, b"\"usage\"")
            && let Some(usage) = stated_usage(data)
        {
            self.stated = Some(usage);
            return;
        }
        if memchr(data, b"\"content\"") || memchr(data, b"\"text\"") {
            self.chunks += 1;
        }
    }
}

impl Default for OpenAiSse {
    fn default() -> Self {
        Self::new()
    }
}

fn memchr(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The `usage` of a chunk: `prompt_tokens` and `completion_tokens` as whole numbers up to 2^53 (`None` for
/// anything else, and for `"usage": null`).
fn stated_usage(data: &[u8]) -> Option<Usage> {
    let value: serde_json::Value = serde_json::from_slice(data).ok()?;
    let usage = value.get("usage")?;
    let count = |name: &str| {
        usage
            .get(name)
            .and_then(serde_json::Value::as_u64)
            .filter(|n| *n <= 1 << 53)
    };
    Some(Usage {
        input: count("prompt_tokens")?,
        output: count("completion_tokens")?,
    })
}

impl Meter for OpenAiSse {
    fn data(&mut self, mut data: &[u8]) {
        while let Some(end) = data.iter().position(|b| *b == b'\n') {
            if !self.skipping {
                self.line.extend_from_slice(&data[..end]);
                self.line();
            } else {
                self.chunks += 1;
            }
            self.skipping = false;
            data = &data[end + 1..];
        }
        if self.skipping {
            return;
        }
        self.line.extend_from_slice(data);
        if self.line.len() > MAX_LINE {
            self.line.clear();
            self.skipping = true;
        }
    }

    fn usage(&self) -> Usage {
        self.stated.unwrap_or(Usage {
            input: self.input,
            output: self.chunks.saturating_mul(self.per_chunk),
        })
    }

    fn cut(&self, limiter: &tollgate_tower::Name) -> Cut {
        let rejection = tollgate_tower::Rejection::new(
            tollgate_tower::RejectionKind::RateLimited,
            limiter.clone(),
        );
        let problem = crate::problem::rejection_response::<String>(&rejection);
        Cut::Data(Bytes::from(format!(
            "event: error\ndata: {}\n\n",
            problem.body()
        )))
    }
}

impl<B> MakeMeter<B> for OpenAiSse {
    type Meter = Self;

    /// A fresh meter, its input tokens the request's estimate.
    fn make(&self, req: &http::Request<B>) -> Self {
        let mut meter = Self::per_chunk(self.per_chunk);
        meter.input = req
            .extensions()
            .get::<TokenEstimate>()
            .map_or(0, |e| e.input);
        meter
    }
}

/// Meters a body's bytes as output tokens: one token per `bytes_per_token` bytes (rounded up).
#[derive(Debug, Clone, Copy)]
pub struct ByteCount {
    bytes_per_token: u64,
    bytes: u64,
}

impl ByteCount {
    /// One token per `bytes_per_token` bytes (at least 1).
    #[must_use]
    pub const fn new(bytes_per_token: u64) -> Self {
        Self {
            bytes_per_token: if bytes_per_token == 0 {
                1
            } else {
                bytes_per_token
            },
            bytes: 0,
        }
    }
}

impl Meter for ByteCount {
    fn data(&mut self, data: &[u8]) {
        self.bytes = self.bytes.saturating_add(data.len() as u64);
    }

    fn usage(&self) -> Usage {
        Usage {
            input: 0,
            output: self.bytes.div_ceil(self.bytes_per_token),
        }
    }
}

impl<B> MakeMeter<B> for ByteCount {
    type Meter = Self;

    fn make(&self, _: &http::Request<B>) -> Self {
        Self::new(self.bytes_per_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(frames: &[&str]) -> OpenAiSse {
        let mut meter = OpenAiSse::new();
        for frame in frames {
            meter.data(frame.as_bytes());
        }
        meter
    }

    #[test]
    fn counts_content_chunks_across_frames() {
        let meter = fed(&[
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"con",
            "tent\":\"b\"}}]}\n\ndata: [DONE]\n\n",
        ]);
        assert_eq!(
            meter.usage(),
            Usage {
                input: 0,
                output: 2
            }
        );
    }

    #[test]
    fn stated_usage_replaces_the_count() {
        let meter = fed(&[
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":9,\"total_tokens\":16}}\n\n",
        ]);
        assert_eq!(
            meter.usage(),
            Usage {
                input: 7,
                output: 9
            }
        );
    }

    #[test]
    fn absurd_or_negative_usage_is_ignored() {
        for usage in [
            "{\"prompt_tokens\":-1,\"completion_tokens\":3}",
            "{\"prompt_tokens\":1.5,\"completion_tokens\":3}",
            "{\"prompt_tokens\":1,\"completion_tokens\":1e300}",
            "null",
        ] {
            let meter = fed(&[
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n",
                &format!("data: {{\"usage\":{usage}}}\n"),
            ]);
            assert_eq!(
                meter.usage(),
                Usage {
                    input: 0,
                    output: 1
                },
                "{usage}"
            );
        }
    }

    #[test]
    fn an_overlong_line_counts_as_a_chunk() {
        let long = "x".repeat(MAX_LINE + 10);
        let meter = fed(&["data: ", &long, &long, "\n"]);
        assert_eq!(meter.usage().output, 1);
    }

    #[test]
    fn a_cut_is_an_sse_error_event_with_a_problem_body() {
        let Cut::Data(data) = OpenAiSse::new().cut(&"tokens".into()) else {
            panic!("an SSE stream is cut with a last event");
        };
        let text = std::str::from_utf8(&data).unwrap();
        assert!(text.starts_with("event: error\ndata: {\"type\":"), "{text}");
        assert!(text.contains("\"limiter\":\"tokens\""), "{text}");
        assert!(text.ends_with("}\n\n"), "{text}");
    }

    #[test]
    fn bytes_round_up() {
        let mut meter = ByteCount::new(4);
        meter.data(b"hello");
        assert_eq!(meter.usage().output, 2);
    }
}
