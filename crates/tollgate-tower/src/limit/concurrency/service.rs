use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::{BoxError, EnforcementSwitch, Mode};
use tollgate_core::lease::LeaseStore;
use tower_service::Service;

use super::LeaseRule;
use super::decide::{Conclusion, Shared};
use super::future::{Deciding, ResponseFuture};
use crate::HoldPermit;

/// A service whose requests hold a lease while in flight: built by a
/// [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) or a [`FleetShedLayer`](crate::FleetShedLayer).
///
/// Errors are the inner service's, boxed, plus [`Rejection`](crate::Rejection) (too many in flight, or
/// the store failed closed) and [`KeyError`](crate::KeyError) (the key's source is missing).
pub struct LeaseLimit<S, R, L> {
    inner: S,
    shared: Arc<Shared<R, L>>,
}

impl<S, R, L> LeaseLimit<S, R, L> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<R, L>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The enforcement switch shared with the layer that built this service.
    #[must_use]
    pub fn enforcement(&self) -> EnforcementSwitch {
        self.shared.settings.switch.clone()
    }
}

impl<S: Clone, R, L> LeaseLimit<S, R, L> {
    /// Takes the inner service that `poll_ready` made ready, leaving a clone in its place, so that a rejected or
    /// deferred request neither holds nor leaks the readiness it was granted.
    fn take_ready(&mut self) -> S {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

impl<S: Clone, R, L> Clone for LeaseLimit<S, R, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, R, L> fmt::Debug for LeaseLimit<S, R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.settings.name)
            .field("mode", &self.shared.settings.switch.mode())
            .finish_non_exhaustive()
    }
}

impl<S, R, L, Req> Service<Req> for LeaseLimit<S, R, L>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    S::Response: HoldPermit,
    R: LeaseRule<Req>,
    L: LeaseStore,
{
    type Response = <S::Response as HoldPermit>::Held;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let settings = &self.shared.settings;
        let mode = settings.switch.mode();
        if mode == Mode::Off {
            return ResponseFuture::calling(self.inner.call(req), None);
        }
        let mut key = String::with_capacity(settings.name.len() + 48);
        key.push_str(&settings.name);
        let limit = match self.shared.rule.rule(&req, &mut key) {
            Ok(limit) => limit,
            Err(err) => {
                drop(self.take_ready());
                return ResponseFuture::failed(err.into());
            }
        };
        let mut decide: Deciding = Box::pin(self.shared.clone().decide(key, limit, mode));
        // An in-process store decides at once: an admitted request then calls the ready inner service directly.
        // A store that has to wait is polled again, with the real waker, by the response future.
        match decide
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Conclusion::Admit(permit)) => {
                ResponseFuture::calling(self.inner.call(req), permit)
            }
            Poll::Ready(Conclusion::Reject(rejection)) => {
                drop(self.take_ready());
                ResponseFuture::failed(rejection.into())
            }
            Poll::Pending => ResponseFuture::deciding(decide, self.take_ready(), req),
        }
    }
}
