//! [`PermitBody`]: a response body that holds a [`Permit`] until it is done or dropped.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::Permit;

pin_project! {
    /// A body that releases its [`Permit`] when its last frame has been read, when it fails, or when it is dropped
    /// (the client went away, the server shut the connection): a concurrency slot is held exactly as long as the
    /// response is being produced, streams included.
    pub struct PermitBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

impl<B> PermitBody<B> {
    /// `inner`, holding `permit`.
    pub fn new(inner: B, permit: Option<Permit>) -> Self {
        Self { inner, permit }
    }

    /// Whether the body still holds a permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for PermitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermitBody")
            .field("inner", &self.inner)
            .field("holds_permit", &self.permit.is_some())
            .finish()
    }
}

impl<B: Default> Default for PermitBody<B> {
    fn default() -> Self {
        Self::new(B::default(), None)
    }
}

/// Error responses built by the adapters (429/503 problem bodies) hold no permit.
impl<B: From<String>> From<String> for PermitBody<B> {
    fn from(s: String) -> Self {
        Self::new(B::from(s), None)
    }
}

impl<B: Body> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        // Done (no more frames, or the last one just came) or failed: the response is finished.
        if !matches!(frame, Some(Ok(_))) || this.inner.is_end_stream() {
            this.permit.take();
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
