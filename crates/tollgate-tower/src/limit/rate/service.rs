use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tollgate_core::Store;
use tower_service::Service;

use super::decide::{Conclusion, Shared};
use super::deny_cache::KeyDigests;
use crate::key::with_key_buffer;
use crate::limit::future::Responder;
use crate::limit::future::Settle;
use crate::limit::future::{Deciding, decide_later, pass, refuse};
use crate::limit::{Machine, Machinery, ResponseFuture};
use crate::readiness::DeferredReadiness;
use crate::respond::Respond;
use crate::{BoxError, Cost, KeyError, KeyExtractor, Mode};

/// A service limited by a [`RateLimitLayer`](super::RateLimitLayer), answering through the [`Respond`]er `R`.
///
/// With the default responder `()`, errors are the inner service's, boxed, plus [`Rejection`](crate::Rejection) (over
/// the limit, or the store failed closed) and [`KeyError`](crate::KeyError) (the key's source is missing: a
/// configuration error). An inner service that fails to become ready is reported by the next call, not by
/// `poll_ready`, so that a responder that never fails (an HTTP adapter) can answer it.
pub struct RateLimit<S, K, St, C, R = ()> {
    inner: S,
    shared: Arc<Shared<K, St, C>>,
    respond: R,
    not_ready: DeferredReadiness,
}

impl<S, K, St, C, R> RateLimit<S, K, St, C, R> {
    pub(super) fn from_shared(inner: S, shared: Arc<Shared<K, St, C>>, respond: R) -> Self {
        Self {
            inner,
            shared,
            respond,
            not_ready: DeferredReadiness::default(),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The enforcement switch shared with the layer that built this service.
    #[must_use]
    pub fn enforcement(&self) -> crate::EnforcementSwitch {
        self.shared.judge.switch.clone()
    }
}

impl<S: Clone, K, St, C, R: Clone> Clone for RateLimit<S, K, St, C, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            respond: self.respond.clone(),
            not_ready: self.not_ready.clone(),
        }
    }
}

impl<S: fmt::Debug, K, St, C, R> fmt::Debug for RateLimit<S, K, St, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.judge.name)
            .field("policy", &self.shared.policy)
            .field("mode", &self.shared.judge.mode())
            .finish_non_exhaustive()
    }
}

impl<S, K, St, C, R, Req> Service<Req> for RateLimit<S, K, St, C, R>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    K: KeyExtractor<Req>,
    St: Store,
    C: Cost<Req>,
    R: Respond<Req, S::Response> + Clone,
    R::Ticket: Copy,
{
    type Response = R::Response;
    type Error = R::Error;
    type Future = ResponseFuture<Self, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.not_ready.poll_ready(&mut self.inner, cx).map(Ok)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture::new(self.decide(req))
    }
}

impl<S, K, St, C, R, Req> Machinery<Req> for RateLimit<S, K, St, C, R>
where
    S: Service<Req>,
    R: Respond<Req, S::Response>,
{
    type Machine = Machine<S::Future, S, Req, Responder<R, R::Ticket>>;
}

impl<S, K, St, C, R> RateLimit<S, K, St, C, R> {
    /// Decides `req`: the state machine of its response future.
    #[inline]
    fn decide<Req>(&mut self, mut req: Req) -> Machine<S::Future, S, Req, Responder<R, R::Ticket>>
    where
        S: Service<Req> + Clone,
        K: KeyExtractor<Req>,
        St: Store,
        C: Cost<Req>,
        R: Respond<Req, S::Response> + Clone,
        R::Ticket: Copy,
    {
        let ticket = self.respond.prepare(&mut req);
        let keep = self.respond.wants_verdict(&ticket);
        let answer = Responder::new(self.respond.clone(), ticket);
        if let Some(err) = self.not_ready.take() {
            return Machine::failed(err, answer);
        }
        let mode = self.shared.judge.mode();
        if mode == Mode::Off {
            return pass(&mut self.inner, req, answer);
        }
        // An override's own state, or none for an exempt key (counted); one branch without overrides.
        let Some(shared) = Shared::select(&self.shared, &req) else {
            return pass(&mut self.inner, req, answer);
        };
        if shared.after.is_some() {
            let shared = shared.clone();
            return call_settled(&mut self.inner, shared, req, mode, answer);
        }
        // A store that keeps only digests of its keys (the in-process one) is fed the key's parts: no text is built
        // and no future is boxed. A store that needs the text but answers at once only borrows it, built in a reused
        // buffer. Any other store gets an owned key and a boxed decision.
        //
        // Every outcome but an admission returns early, so the request moves once, straight into the inner call,
        // and the admitted future is built in one place (each extra move of a request or future is a memcpy per
        // request); each path matches its own conclusion rather than funnelling it through a shared `Result`.
        let verdict = match shared.decide_digested(&req, mode, keep) {
            Some(Ok(Conclusion::Admit(verdict))) => verdict,
            Some(Ok(Conclusion::Reject(rejection))) => {
                return refuse(&mut self.inner, rejection, answer);
            }
            Some(Err(err)) => return refuse(&mut self.inner, err.into(), answer),
            None => {
                // A cached denial refuses by the digests of the key's parts, before any text is built.
                let deny = match shared.deny_key(&req) {
                    Ok(deny) => deny,
                    Err(err) => return refuse(&mut self.inner, err.into(), answer),
                };
                let cost = shared.cost.cost(&req);
                let decided = match shared.decide_denied(deny, cost, mode, keep) {
                    Some(conclusion) => Ok(Ok(conclusion)),
                    None => with_key_buffer(
                        #[inline]
                        |key| {
                            shared.write_key(&req, key)?;
                            Ok::<_, KeyError>(
                                shared
                                    .decide_at_once(key, cost, mode, keep)
                                    .ok_or_else(|| key.clone()),
                            )
                        },
                    ),
                };
                match decided {
                    Ok(Ok(Conclusion::Admit(verdict))) => verdict,
                    Ok(Ok(Conclusion::Reject(rejection))) => {
                        return refuse(&mut self.inner, rejection, answer);
                    }
                    Ok(Err(key)) => {
                        let shared = shared.clone();
                        let later = Later {
                            key,
                            deny,
                            cost,
                            mode,
                            keep,
                        };
                        return decide_shared_later(&mut self.inner, shared, later, req, answer);
                    }
                    Err(err) => return refuse(&mut self.inner, err.into(), answer),
                }
            }
        };
        Machine::calling(self.inner.call(req), verdict, answer)
    }
}

// The path a request through the in-process store never takes stays out of `call`'s body: a hot path that is
// short in code, not only in instructions, leaves more of the instruction cache to the service it protects.

/// A request's decision left to a store that cannot answer at once: its key, as text and as the deny cache's
/// digests of its parts (`None` where the cache digests the text), its cost and how it is decided.
struct Later {
    key: String,
    deny: Option<KeyDigests>,
    cost: u64,
    mode: Mode,
    keep: bool,
}

/// Decides through a store that cannot answer at once (Redis): with an owned key and a boxed decision.
fn decide_shared_later<S, K, St, C, R, Req, Tk>(
    inner: &mut S,
    shared: Arc<Shared<K, St, C>>,
    later: Later,
    req: Req,
    answer: Responder<R, Tk>,
) -> Machine<S::Future, S, Req, Responder<R, Tk>>
where
    S: Service<Req> + Clone,
    K: Send + Sync + 'static,
    St: Store,
    C: Send + Sync + 'static,
    R: crate::respond::Respond<Req, S::Response, Ticket = Tk>,
    Tk: Copy,
{
    let Later {
        key,
        deny,
        cost,
        mode,
        keep,
    } = later;
    let decide: Deciding<Box<crate::Verdict>> =
        Box::pin(async move { shared.decide(key, deny, cost, mode, keep).await });
    decide_later(inner, decide, req, answer)
}

/// Decides a request of a limiter that charges the cost after the response: by the key's text, which the
/// response future keeps for the charge, always with a verdict (its instant dates the charge).
fn call_settled<S, K, St, C, R, Req, Tk>(
    inner: &mut S,
    shared: Arc<Shared<K, St, C>>,
    req: Req,
    mode: Mode,
    mut answer: Responder<R, Tk>,
) -> Machine<S::Future, S, Req, Responder<R, Tk>>
where
    S: Service<Req> + Clone,
    K: KeyExtractor<Req>,
    St: Store,
    C: Cost<Req>,
    R: crate::respond::Respond<Req, S::Response, Ticket = Tk>,
    Tk: Copy,
{
    let mut key = String::new();
    if let Err(err) = shared.write_key(&req, &mut key) {
        return refuse(inner, err.into(), answer);
    }
    let cost = shared.cost.cost(&req);
    let source = shared.after.clone().unwrap_or(crate::CostAfter::Extension);
    answer.settle(Settle {
        charger: shared.clone(),
        key: key.clone(),
        upfront: cost,
        source,
    });
    match shared.decide_at_once(&key, cost, mode, true) {
        Some(Conclusion::Admit(verdict)) => Machine::calling(inner.call(req), verdict, answer),
        Some(Conclusion::Reject(rejection)) => refuse(inner, rejection, answer),
        None => {
            let later = Later {
                key,
                deny: None,
                cost,
                mode,
                keep: true,
            };
            decide_shared_later(inner, shared, later, req, answer)
        }
    }
}
