use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tollgate_tower::{BoxError, Classify, Mode, Rejection, RejectionKind};
use tower_service::Service;

use super::ResponseFuture;
use super::layer::WorkerState;
use crate::{HoldPermit, Permit};

/// A service shedding by priority when its instance is busy: built by a
/// [`WorkerShedLayer`](super::WorkerShedLayer).
///
/// Errors are the inner service's, boxed, plus [`Rejection`](tollgate_tower::Rejection)s of kind
/// [`Shed`](tollgate_tower::RejectionKind::Shed).
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
            .field("limiter", &self.state.name)
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
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let state = &self.state;
        let mode = state.switch.mode();
        if mode == Mode::Off {
            return ResponseFuture::calling(self.inner.call(req), None);
        }
        let priority = self.classifier.classify(&req);
        state.controller.tick();
        match state.controller.admit(priority) {
            Ok(()) => state.counters.allowed.increment(1),
            Err(by) if mode == Mode::Enforce => {
                state.counters.rejected.increment(1);
                state.shed_by[by as usize].increment(1);
                tracing::debug!(
                    limiter = &*state.name,
                    priority = priority.as_str(),
                    in_flight = state.controller.in_flight(),
                    line = state.controller.line(priority),
                    shed_by = by.as_str(),
                    "request shed"
                );
                // Release the readiness this request was granted: it will not use it.
                let clone = self.inner.clone();
                drop(std::mem::replace(&mut self.inner, clone));
                let rejection = Rejection::new(RejectionKind::Shed, state.name.clone())
                    .with_retry_after(state.retry_after);
                return ResponseFuture::failed(rejection.into());
            }
            Err(by) => {
                state.counters.shadow_rejected.increment(1);
                if state.log_gate.open() {
                    tracing::info!(
                        limiter = &*state.name,
                        priority = priority.as_str(),
                        shed_by = by.as_str(),
                        "shadow mode: request that would be shed admitted"
                    );
                }
                state.controller.enter();
            }
        }
        let permit = Permit::new(InFlight(state.clone()));
        ResponseFuture::calling(self.inner.call(req), Some(permit))
    }
}
