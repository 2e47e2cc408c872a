//! [`MeteredBody`]: a response body counted as it streams, cut at a budget.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate_tower::stream_cost::StreamCharges;

use super::{Cut, Meter};

pin_project! {
    /// A response body whose data frames a [`Meter`] counts, reported to the limiters' [`StreamCharges`]: settled
    /// when the body ends, fails or is dropped (the client went away); ended at its next frame when a limiter that
    /// cuts finds its budget spent. Without charges (no streamed limiter decided the request) it is the body as it
    /// is.
    pub struct MeteredBody<B, M> {
        #[pin]
        inner: B,
        // `None` only for a body made from a string (an error answer): it has no charges either.
        meter: Option<M>,
        charges: Option<StreamCharges>,
        state: State,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Streaming,
    /// Cut: the last frame is out, the end comes next.
    Cut,
    Done,
}

impl<B, M> MeteredBody<B, M> {
    pub(crate) fn new(inner: B, meter: M, charges: Option<StreamCharges>) -> Self {
        Self {
            inner,
            meter: Some(meter),
            charges: charges.filter(|c| !c.is_empty()),
            state: State::Streaming,
        }
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

/// An error answer built further out (a 400 for a bad body) is metered by nothing.
impl<B: From<String>, M> From<String> for MeteredBody<B, M> {
    fn from(s: String) -> Self {
        Self {
            inner: B::from(s),
            meter: None,
            charges: None,
            state: State::Streaming,
        }
    }
}

impl<B: std::fmt::Debug, M> std::fmt::Debug for MeteredBody<B, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredBody")
            .field("inner", &self.inner)
            .field("charges", &self.charges)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<B, M> Body for MeteredBody<B, M>
where
    B: Body<Data = Bytes>,
    M: Meter,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let (Some(charges), Some(meter)) = (this.charges.as_mut(), this.meter.as_mut()) else {
            if *this.state != State::Streaming {
                return Poll::Ready(None);
            }
            return this.inner.poll_frame(cx);
        };
        match *this.state {
            State::Streaming => {}
            State::Cut | State::Done => {
                *this.state = State::Done;
                return Poll::Ready(None);
            }
        }
        if let Some(limiter) = charges.cut_by().cloned() {
            charges.settle(meter.usage(), true);
            return Poll::Ready(match meter.cut(&limiter) {
                Cut::Data(data) => {
                    *this.state = State::Cut;
                    Some(Ok(Frame::data(data)))
                }
                Cut::Trailers(trailers) => {
                    *this.state = State::Cut;
                    Some(Ok(Frame::trailers(trailers)))
                }
                Cut::End => {
                    *this.state = State::Done;
                    None
                }
            });
        }
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    meter.data(data);
                    charges.count(meter.usage());
                }
                if this.inner.is_end_stream() {
                    charges.settle(meter.usage(), false);
                    *this.state = State::Done;
                }
            }
            // Failed or finished: settled at what streamed.
            Some(Err(_)) | None => {
                charges.settle(meter.usage(), false);
                *this.state = State::Done;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match self.state {
            State::Streaming => self.inner.is_end_stream(),
            State::Cut => false,
            State::Done => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        // A metered stream may be cut: its length is not promised.
        if self.charges.is_some() {
            let mut hint = SizeHint::new();
            hint.set_lower(0);
            hint
        } else {
            self.inner.size_hint()
        }
    }
}
