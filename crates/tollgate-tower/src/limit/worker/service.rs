use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::layer::WorkerState;
use crate::limit::core::Conclusion;
use crate::limit::future::{pass, refuse};
use crate::limit::{Machine, Machinery, ResponseFuture};
use crate::permit::Hold;
use crate::{BoxError, Classify, HoldPermit, Mode, Permit, Rejection, RejectionKind};

/// A service shedding by priority when its instance is busy: built by a
/// [`WorkerShedLayer`](super::WorkerShedLayer).
///
/// Errors are the inner service's, boxed, plus [`Rejection`](crate::Rejection)s of kind
/// [`Shed`](crate::RejectionKind::Shed).
pub struct WorkerShed<S, P> {
    inner: S,
    state: Arc<WorkerState>,
    classifier: Arc<P>,
}

impl<S, P> WorkerShed<S, P> {
    pub(super) fn new(inner: S, state: Arc<WorkerState>, classifier: Arc<P>) -> Self {
        Self {
            inner,
            state,
            classifier,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, P> Clone for WorkerShed<S, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            state: self.state.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<S: fmt::Debug, P> fmt::Debug for WorkerShed<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerShed")
            .field("inner", &self.inner)
            .field("limiter", &self.state.judge.name)
            .field("in_flight", &self.state.controller.in_flight())
            .finish_non_exhaustive()
    }
}

/// One request counted in flight; dropping it (with the response body) counts it out.
struct InFlight(Arc<WorkerState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.controller.leave();
    }
}

impl<S, P, Req> Service<Req> for WorkerShed<S, P>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    S::Response: HoldPermit,
    P: Classify<Req>,
{
    type Response = <S::Response as HoldPermit>::Held;
    type Error = BoxError;
    type Future = ResponseFuture<Self, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture::new(self.decide(req))
    }
}

impl<S, P, Req> Machinery<Req> for WorkerShed<S, P>
where
    S: Service<Req>,
{
    type Machine = Machine<S::Future, S, Req, Hold>;
}

impl<S, P> WorkerShed<S, P> {
    /// Admits or sheds `req`: the state machine of its response future.
    fn decide<Req>(&mut self, req: Req) -> Machine<S::Future, S, Req, Hold>
    where
        S: Service<Req> + Clone,
        S::Response: HoldPermit,
        P: Classify<Req>,
    {
        let state = &self.state;
        let mode = state.judge.mode();
        if mode == Mode::Off {
            return pass(&mut self.inner, req, Hold);
        }
        let priority = self.classifier.classify(&req);
        state.controller.tick();
        match state.controller.admit(priority) {
            Ok(()) => state.judge.admitted_unmetered(),
            Err(by) => {
                let shed = state.judge.over_limit::<Permit>(
                    mode,
                    0,
                    &format_args!(
                        "{} request shed by the {} with {} in flight (line {})",
                        priority.as_str(),
                        by.as_str(),
                        state.controller.in_flight(),
                        state.controller.line(priority)
                    ),
                    || None,
                    || {
                        Rejection::new(RejectionKind::Shed, state.judge.name.clone())
                            .with_retry_after(state.retry_after)
                    },
                );
                if let Conclusion::Reject(rejection) = shed {
                    state.shed_by[by as usize].increment(1);
                    return refuse(&mut self.inner, rejection, Hold);
                }
                // Shadow mode: admitted whatever the lines.
                state.controller.enter();
            }
        }
        let permit = Permit::new(InFlight(state.clone()));
        Machine::calling(self.inner.call(req), Some(permit), Hold)
    }
}
