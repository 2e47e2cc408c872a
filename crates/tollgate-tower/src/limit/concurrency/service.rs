//! The call of the slot limiters (the concurrency limiter and the fleet shedder): the rule's key and ceiling, then
//! the store's decision.

use std::sync::Arc;

use tollgate_core::slot::SlotStore;
use tower_service::Service;

use super::SlotRule;
use super::decide::Shared;
use crate::limit::Machine;
use crate::limit::future::{Deciding, decide_later, pass, refuse};
use crate::permit::Hold;
use crate::{BoxError, HoldPermit, Mode, Permit};

/// Decides `req` by a slot limiter's `shared` state: the state machine of its response future.
pub(crate) fn decide_slot<S, R, L, Req>(
    inner: &mut S,
    shared: &Arc<Shared<R, L>>,
    req: Req,
) -> Machine<S::Future, S, Req, Hold>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    S::Response: HoldPermit,
    R: SlotRule<Req>,
    L: SlotStore,
{
    let judge = &shared.judge;
    let mode = judge.mode();
    if mode == Mode::Off {
        return pass(inner, req, Hold);
    }
    let mut key = String::with_capacity(judge.name.len() + 48);
    key.push_str(&judge.name);
    let limit = match shared.config.rule.rule(&req, &mut key) {
        Ok(limit) => limit,
        Err(err) => return refuse(inner, err.into(), Hold),
    };
    // An in-process store decides at once (the first poll, in `decide_later`): an admitted request then calls
    // the ready inner service directly.
    let decide: Deciding<Permit> = Box::pin(shared.clone().decide(key, limit, mode));
    decide_later(inner, decide, req, Hold)
}
