//! Server streams charged as they stream: [`GrpcMessages`], the [`Meter`] of a gRPC response body, for rate
//! limiters charged with [`CostAfter::Streamed`](tollgate_tower::CostAfter::Streamed) under
//! [`StreamCostLayer`](tollgate_http::stream::StreamCostLayer). A stream cut at a budget ends with a
//! `RESOURCE_EXHAUSTED` status in its trailers, with the details a refused call carries.
//!
//! ```
//! use tollgate_grpc::stream::GrpcMessages;
//! use tollgate_http::stream::StreamCostLayer;
//!
//! // Ten tokens per message the server streams.
//! let layer = StreamCostLayer::new(GrpcMessages::per_message(10));
//! # let _ = layer;
//! ```

use tollgate_http::stream::{Cut, MakeMeter, Meter, Usage};
use tollgate_tower::{Name, Rejection, RejectionKind};

/// Counts the messages of a gRPC response body (each a 5-byte prefix and its length) as output tokens,
/// `per_message` each; cut, it ends the stream with `RESOURCE_EXHAUSTED` in the trailers.
#[derive(Debug, Clone, Copy)]
pub struct GrpcMessages {
    per_message: u64,
    messages: u64,
    /// Bytes of the current message's prefix read so far, and the prefix.
    prefix: [u8; 5],
    prefix_read: usize,
    /// Bytes of the current message's body still to come.
    body_left: u64,
}

impl GrpcMessages {
    /// `tokens` per message.
    #[must_use]
    pub const fn per_message(tokens: u64) -> Self {
        Self {
            per_message: tokens,
            messages: 0,
            prefix: [0; 5],
            prefix_read: 0,
            body_left: 0,
        }
    }
}

impl Meter for GrpcMessages {
    fn data(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.body_left > 0 {
                let take = usize::try_from(self.body_left)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.body_left -= take as u64;
                data = &data[take..];
                continue;
            }
            let take = (5 - self.prefix_read).min(data.len());
            self.prefix[self.prefix_read..self.prefix_read + take].copy_from_slice(&data[..take]);
            self.prefix_read += take;
            data = &data[take..];
            if self.prefix_read == 5 {
                self.prefix_read = 0;
                self.messages += 1;
                let len = [
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ];
                self.body_left = u64::from(u32::from_be_bytes(len));
            }
        }
    }

    fn usage(&self) -> Usage {
        Usage {
            input: 0,
            output: self.messages.saturating_mul(self.per_message),
        }
    }

    fn cut(&self, limiter: &Name) -> Cut {
        let status = crate::status::rejection_status(&Rejection::new(
            RejectionKind::RateLimited,
            limiter.clone(),
        ));
        // A trailers-only answer's headers are the status's fields; as trailers they carry no content type.
        let mut trailers = status.into_http::<()>().into_parts().0.headers;
        trailers.remove(http::header::CONTENT_TYPE);
        Cut::Trailers(trailers)
    }
}

impl<B> MakeMeter<B> for GrpcMessages {
    type Meter = Self;

    fn make(&self, _: &http::Request<B>) -> Self {
        Self::per_message(self.per_message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_messages_split_across_frames() {
        let mut meter = GrpcMessages::per_message(2);
        let message = |len: u8| {
            let mut m = vec![0, 0, 0, 0, len];
            m.extend(std::iter::repeat_n(7, usize::from(len)));
            m
        };
        let mut all = message(3);
        all.extend(message(0));
        all.extend(message(10));
        for chunk in all.chunks(4) {
            meter.data(chunk);
        }
        assert_eq!(meter.usage().output, 6);
    }

    #[test]
    fn a_cut_is_resource_exhausted_in_the_trailers() {
        let Cut::Trailers(trailers) = GrpcMessages::per_message(1).cut(&"tokens".into()) else {
            panic!("a gRPC stream is cut with trailers");
        };
        assert_eq!(trailers["grpc-status"], "8");
    }
}
