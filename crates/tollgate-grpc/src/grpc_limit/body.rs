//! The request body the limited service sees, inside a `tonic::body::Body`: dropped unread (a refused call), it
//! reads the rest of what the client sends before letting go, so that the stream ends as the client ended it.
//!
//! A refusal is answered before the call's message is read. Were the body dropped then, the server's HTTP/2 stack
//! would reset the stream (`RST_STREAM` with `NO_ERROR`, which RFC 9113 allows after a complete response), and a
//! client still sending its message can lose the race: it sees its send fail with a broken pipe and reports a
//! transport error instead of the status. Reading the small rest first ends the stream cleanly. The reading is
//! bounded ([`DRAIN_BYTES`], [`DRAIN_FOR`]); past either the body is dropped as before.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf as _;
use http_body::{Body, Frame, SizeHint};

/// The most a refused call's body is read for.
const DRAIN_BYTES: usize = 64 * 1024;

/// The longest a refused call's body is read for.
const DRAIN_FOR: Duration = Duration::from_secs(1);

/// A request body that reads the rest of itself when dropped before it was first polled.
#[derive(Debug)]
pub(crate) struct RequestBody<B> {
    inner: Option<B>,
    polled: bool,
    // Chosen where the body's bounds are known, so that `Drop` needs none.
    drain: fn(B),
}

impl<B> RequestBody<B>
where
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Send,
{
    pub(crate) fn new(inner: B) -> Self {
        Self {
            inner: Some(inner),
            polled: false,
            drain: drain::<B>,
        }
    }
}

impl<B: Body + Unpin> Body for RequestBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        this.polled = true;
        match &mut this.inner {
            Some(inner) => Pin::new(inner).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<B> Drop for RequestBody<B> {
    fn drop(&mut self) {
        if !self.polled
            && let Some(inner) = self.inner.take()
        {
            (self.drain)(inner);
        }
    }
}

/// Reads `body` to its end on a task of the current runtime, bounded; without a runtime, drops it.
fn drain<B>(body: B)
where
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Send,
{
    if body.is_end_stream() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut body = body;
        let mut read = 0;
        let rest = async {
            while read <= DRAIN_BYTES {
                match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                    Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.remaining()),
                    Some(Err(_)) | None => break,
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_FOR, rest).await;
    });
}
