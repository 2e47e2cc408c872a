//! [`PaceBody`]: the response body, passed through; it reads what comes after the head (a problem body's
//! `violated-policies`, gRPC trailers) and closes the request when it ends or is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::budget::{Scope, Ticket};
use crate::fields::{Observation, grpc_refusal, violated_policies};

/// The most of a problem body kept to read its `violated-policies`.
const PROBLEM_MAX: usize = 16 * 1024;

/// A request sent and not yet closed: closing it (on drop) gives its scope's concurrency back.
#[derive(Debug)]
pub(crate) struct Open(Arc<Scope>, Ticket);

impl Open {
    pub(crate) fn new(scope: Arc<Scope>, ticket: Ticket) -> Self {
        Self(scope, ticket)
    }

    pub(crate) fn scope(&self) -> &Scope {
        &self.0
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.close(self.1, Instant::now());
    }
}

/// What the body still has to say.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    /// A problem body, collected up to [`PROBLEM_MAX`].
    pub(crate) problem: Option<Vec<u8>>,
    /// gRPC: the status comes in the trailers.
    pub(crate) trailers: bool,
}

pin_project! {
    /// The response body [`Pace`](crate::Pace) returns: the inner body's frames, unchanged.
    #[derive(Debug)]
    pub struct PaceBody<B> {
        #[pin]
        inner: B,
        open: Option<Open>,
        ticket: Ticket,
        watch: Watch,
    }
}

impl<B> PaceBody<B> {
    pub(crate) fn new(inner: B, open: Open, ticket: Ticket, watch: Watch) -> Self {
        Self {
            inner,
            open: Some(open),
            ticket,
            watch,
        }
    }

    /// The inner body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for PaceBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let (Some(buf), Some(data)) = (this.watch.problem.as_mut(), frame.data_ref()) {
                    let room = PROBLEM_MAX.saturating_sub(buf.len());
                    let mut data = bytes::Buf::chunk(data);
                    data = &data[..data.len().min(room)];
                    buf.extend_from_slice(data);
                }
                if let (true, Some(trailers), Some(open)) = (
                    this.watch.trailers,
                    frame.trailers_ref(),
                    this.open.as_ref(),
                ) && let Some((refusal, delay)) = grpc_refusal(trailers)
                {
                    let observation = Observation {
                        refusal: Some(refusal),
                        retry_after: delay,
                        ..Observation::default()
                    };
                    open.scope()
                        .observe(*this.ticket, &observation, Instant::now());
                }
            }
            Some(Err(_)) => {}
            None => {
                if let (Some(buf), Some(open)) = (this.watch.problem.take(), this.open.as_ref()) {
                    let names = violated_policies(&buf);
                    if !names.is_empty() {
                        open.scope().violated(*this.ticket, &names, Instant::now());
                    }
                }
                // Done: the request no longer holds a place.
                *this.open = None;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
