//! The adaptive limiter's decision.

use tower_service::Service;

use super::AdaptiveLimitLayer;
use crate::limit::Machine;
use crate::limit::core::Conclusion;
use crate::limit::future::{pass, refuse};
use crate::limit::in_flight::in_flight_service;
use crate::permit::Hold;
use crate::{Classify, HoldPermit, Mode, Permit, Rejection, RejectionKind};

in_flight_service!(decide for AdaptiveLimitLayer<P> where P: Classify<Req>);

/// Admits or sheds `req`: the state machine of its response future.
fn decide<S, P, Req>(
    inner: &mut S,
    layer: &AdaptiveLimitLayer<P>,
    req: Req,
) -> Machine<S::Future, S, Req, Hold>
where
    S: Service<Req> + Clone,
    S::Response: HoldPermit,
    P: Classify<Req>,
{
    let limiter = &layer.limiter;
    let mode = limiter.judge.mode();
    if mode == Mode::Off {
        return pass(inner, req, Hold);
    }
    let priority = layer.classifier.classify(&req);
    if let Some(permit) = limiter.try_acquire(priority) {
        limiter.judge.admitted(
            limiter.limit().saturating_sub(limiter.in_flight()),
            limiter.limit(),
        );
        let permit = Permit::new(permit);
        return Machine::calling(inner.call(req), Some(permit), Hold);
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
                .with_retry_after(limiter.retry_after())
        },
    );
    match over {
        Conclusion::Admit(permit) => Machine::calling(inner.call(req), permit, Hold),
        Conclusion::Reject(rejection) => {
            limiter.shed.increment(1);
            refuse(inner, rejection, Hold)
        }
    }
}
