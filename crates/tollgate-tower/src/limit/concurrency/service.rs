use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tollgate_core::slot::SlotStore;
use tower_service::Service;

use super::SlotRule;
use super::decide::Shared;
use crate::limit::ResponseFuture;
use crate::limit::future::{Deciding, decide_later, pass, refuse};
use crate::permit::Hold;
use crate::{BoxError, EnforcementSwitch, HoldPermit, Mode, Permit};

/// A service whose requests hold a slot while in flight: built by a
/// [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) or a [`FleetShedLayer`](crate::FleetShedLayer).
///
/// Errors are the inner service's, boxed, plus [`Rejection`](crate::Rejection) (too many in flight, or
/// the store failed closed) and [`KeyError`](crate::KeyError) (the key's source is missing).
pub struct SlotLimit<S, R, L> {
    inner: S,
    shared: Arc<Shared<R, L>>,
}

impl<S, R, L> SlotLimit<S, R, L> {
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
        self.shared.judge.switch.clone()
    }
}

impl<S: Clone, R, L> Clone for SlotLimit<S, R, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, R, L> fmt::Debug for SlotLimit<S, R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.judge.name)
            .field("mode", &self.shared.judge.mode())
            .finish_non_exhaustive()
    }
}

impl<S, R, L, Req> Service<Req> for SlotLimit<S, R, L>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    S::Response: HoldPermit,
    R: SlotRule<Req>,
    L: SlotStore,
{
    type Response = <S::Response as HoldPermit>::Held;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, Req, Hold>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let judge = &self.shared.judge;
        let mode = judge.mode();
        if mode == Mode::Off {
            return pass(&mut self.inner, req, Hold);
        }
        let mut key = String::with_capacity(judge.name.len() + 48);
        key.push_str(&judge.name);
        let limit = match self.shared.rule.rule(&req, &mut key) {
            Ok(limit) => limit,
            Err(err) => return refuse(&mut self.inner, err.into(), Hold),
        };
        // An in-process store decides at once (the first poll, in `decide_later`): an admitted request then calls
        // the ready inner service directly.
        let decide: Deciding<Permit> = Box::pin(self.shared.clone().decide(key, limit, mode));
        decide_later(&mut self.inner, decide, req, Hold)
    }
}
