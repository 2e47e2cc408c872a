//! Readiness errors kept for the next call, for services that must answer every request.

use std::task::{Context, Poll, ready};

use tower_service::Service;

use crate::BoxError;

/// An inner service's readiness error, kept for the next call.
///
/// A service that answers every request — an `Infallible` adapter, or a limiter whose responder is one — cannot
/// fail `poll_ready`: it reports itself ready and answers the next call with the inner service's error instead.
/// A clone starts without one (it has not been made ready).
#[derive(Debug, Default)]
pub struct DeferredReadiness(Option<BoxError>);

impl Clone for DeferredReadiness {
    fn clone(&self) -> Self {
        Self(None)
    }
}

impl DeferredReadiness {
    /// No error kept.
    #[must_use]
    pub const fn new() -> Self {
        Self(None)
    }

    /// Polls `inner` for readiness, keeping an error for [`take`](Self::take): ready either way once `inner` is.
    pub fn poll_ready<S, Req>(&mut self, inner: &mut S, cx: &mut Context<'_>) -> Poll<()>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
    {
        if self.0.is_none()
            && let Err(err) = ready!(inner.poll_ready(cx))
        {
            self.0 = Some(err.into());
        }
        Poll::Ready(())
    }

    /// The kept error, if the last readiness check failed; the call it belongs to must answer it.
    pub fn take(&mut self) -> Option<BoxError> {
        self.0.take()
    }
}
