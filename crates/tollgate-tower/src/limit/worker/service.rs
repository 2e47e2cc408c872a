//! The worker shedder's decision.

use std::sync::Arc;

use tower_service::Service;

use super::WorkerShedLayer;
use super::layer::WorkerState;
use crate::limit::Machine;
use crate::limit::core::Conclusion;
use crate::limit::future::{pass, refuse};
use crate::limit::in_flight::in_flight_service;
use crate::permit::Hold;
use crate::{Classify, HoldPermit, Mode, Permit, Rejection, RejectionKind};

/// One request counted in flight; dropping it (with the response body) counts it out.
struct InFlight(Arc<WorkerState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.controller.leave();
    }
}

in_flight_service!(decide for WorkerShedLayer<P> where P: Classify<Req>);

/// Admits or sheds `req`: the state machine of its response future.
fn decide<S, P, Req>(
    inner: &mut S,
    layer: &WorkerShedLayer<P>,
    req: Req,
) -> Machine<S::Future, S, Req, Hold>
where
    S: Service<Req> + Clone,
    S::Response: HoldPermit,
    P: Classify<Req>,
{
    let state = &layer.state;
    let mode = state.judge.mode();
    if mode == Mode::Off {
        return pass(inner, req, Hold);
    }
    let priority = layer.classifier.classify(&req);
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
                        .with_retry_after(state.settings.retry_after)
                },
            );
            if let Conclusion::Reject(rejection) = shed {
                state.shed_by[by as usize].increment(1);
                return refuse(inner, rejection, Hold);
            }
            // Shadow mode: admitted whatever the lines.
            state.controller.enter();
        }
    }
    let permit = Permit::new(InFlight(state.clone()));
    Machine::calling(inner.call(req), Some(permit), Hold)
}
