use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::limit::core::Conclusion;
use crate::{BoxError, Classify, Mode, Rejection, RejectionKind};
use tower_service::Service;

use super::limiter::Limiter;
use crate::limit::future::{pass, refuse};
use crate::limit::{Machine, Machinery, ResponseFuture};
use crate::permit::Hold;
use crate::{HoldPermit, Permit};

/// A service whose requests are admitted within an adaptive concurrency limit: built by an
/// [`AdaptiveLimitLayer`](super::AdaptiveLimitLayer).
///
/// Errors are the inner service's, boxed, plus [`Rejection`](crate::Rejection)s of kind
/// [`Shed`](crate::RejectionKind::Shed) (HTTP 503, gRPC `UNAVAILABLE`).
pub struct AdaptiveLimit<S, P> {
    inner: S,
    limiter: Arc<Limiter>,
    classifier: Arc<P>,
}

impl<S, P> AdaptiveLimit<S, P> {
    pub(super) fn new(inner: S, limiter: Arc<Limiter>, classifier: Arc<P>) -> Self {
        Self {
            inner,
            limiter,
            classifier,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, P> Clone for AdaptiveLimit<S, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<S: fmt::Debug, P> fmt::Debug for AdaptiveLimit<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter.judge.name)
            .field("limit", &self.limiter.limit())
            .field("in_flight", &self.limiter.in_flight())
            .finish_non_exhaustive()
    }
}

impl<S, P, Req> Service<Req> for AdaptiveLimit<S, P>
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

impl<S, P, Req> Machinery<Req> for AdaptiveLimit<S, P>
where
    S: Service<Req>,
{
    type Machine = Machine<S::Future, S, Req, Hold>;
}

impl<S, P> AdaptiveLimit<S, P> {
    /// Admits or sheds `req`: the state machine of its response future.
    fn decide<Req>(&mut self, req: Req) -> Machine<S::Future, S, Req, Hold>
    where
        S: Service<Req> + Clone,
        S::Response: HoldPermit,
        P: Classify<Req>,
    {
        let limiter = &self.limiter;
        let mode = limiter.judge.mode();
        if mode == Mode::Off {
            return pass(&mut self.inner, req, Hold);
        }
        let priority = self.classifier.classify(&req);
        if let Some(permit) = limiter.try_acquire(priority) {
            limiter.judge.admitted(
                limiter.limit().saturating_sub(limiter.in_flight()),
                limiter.limit(),
            );
            let permit = Permit::new(permit);
            return Machine::calling(self.inner.call(req), Some(permit), Hold);
        }
        let over = limiter.judge.over_limit(
            mode,
            0,
            &format_args!(
                "{} request over the adaptive limit of {} ({} in flight)",
                priority.as_str(),
                limiter.limit(),
                limiter.in_flight()
            ),
            // Shadow mode: admitted and counted whatever the limit, so that the limit keeps learning.
            || Some(Permit::new(limiter.force_acquire(priority))),
            || {
                Rejection::new(RejectionKind::Shed, limiter.judge.name.clone())
                    .with_retry_after(limiter.retry_after)
            },
        );
        match over {
            Conclusion::Admit(permit) => Machine::calling(self.inner.call(req), permit, Hold),
            Conclusion::Reject(rejection) => {
                limiter.shed.increment(1);
                refuse(&mut self.inner, rejection, Hold)
            }
        }
    }
}
