//! The response future: waits for the request's turn (rarely), calls the inner service, reads the answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::header::CONTENT_TYPE;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::body::{Open, PaceBody, Watch};
use crate::budget::{Scope, Ticket};
use crate::fields::{Observation, grpc_refusal};
use crate::layer::{OnMaxWait, Shared};
use crate::{BoxError, Waited, WaitedTooLong};

/// A request waiting for its turn: its place in the scope's queue, left when the future is dropped.
struct Queued<S, ReqB> {
    scope: Arc<Scope>,
    id: u64,
    started: Instant,
    deadline: Instant,
    on_max_wait: OnMaxWait,
    sleep: Pin<Box<Sleep>>,
    /// The ready inner service and the request, until sent.
    call: Option<(S, http::Request<ReqB>)>,
}

impl<S, ReqB> Drop for Queued<S, ReqB> {
    fn drop(&mut self) {
        if self.call.is_some() {
            self.scope.leave(self.id, Instant::now());
        }
    }
}

pin_project! {
    /// The future [`Pace`](crate::Pace) returns.
    pub struct ResponseFuture<S: Service<http::Request<ReqB>>, ReqB> {
        #[pin]
        state: State<S, ReqB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S: Service<http::Request<ReqB>>, ReqB> {
        // Boxed: the slow path, kept out of the size of every future.
        Waiting { queued: Box<Queued<S, ReqB>> },
        Calling { #[pin] fut: S::Future, open: Option<Open>, ticket: Ticket, waited: Option<Duration> },
        Done,
    }
}

impl<S: Service<http::Request<ReqB>>, ReqB> std::fmt::Debug for ResponseFuture<S, ReqB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S: Service<http::Request<ReqB>>, ReqB> ResponseFuture<S, ReqB> {
    pub(crate) fn calling(fut: S::Future, scope: Arc<Scope>, ticket: Ticket) -> Self {
        Self {
            state: State::Calling {
                fut,
                open: Some(Open::new(scope, ticket)),
                ticket,
                waited: None,
            },
        }
    }

    pub(crate) fn waiting(
        service: S,
        request: http::Request<ReqB>,
        scope: Arc<Scope>,
        shared: &Shared,
        now: Instant,
    ) -> Self {
        let id = scope.enqueue();
        let deadline = now + shared.max_wait;
        Self {
            state: State::Waiting {
                queued: Box::new(Queued {
                    scope,
                    id,
                    started: now,
                    deadline,
                    on_max_wait: shared.on_max_wait,
                    sleep: Box::pin(tokio::time::sleep_until(deadline)),
                    call: Some((service, request)),
                }),
            },
        }
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<http::Response<PaceBody<ResB>>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Waiting { queued } => {
                    let ticket = ready!(poll_turn(queued, cx));
                    let waited = queued.started.elapsed();
                    metrics::histogram!("tollgate_client_wait_seconds")
                        .record(waited.as_secs_f64());
                    let ticket = match ticket {
                        Ok(ticket) => ticket,
                        Err(()) => {
                            let _ = queued.call.take();
                            this.state.set(State::Done);
                            return Poll::Ready(Err(Box::new(WaitedTooLong { waited })));
                        }
                    };
                    let scope = queued.scope.clone();
                    let (mut service, request) = queued.call.take().expect("sent once");
                    let fut = service.call(request);
                    this.state.set(State::Calling {
                        fut,
                        open: Some(Open::new(scope, ticket)),
                        ticket,
                        waited: Some(waited),
                    });
                }
                StateProj::Calling {
                    fut,
                    open,
                    ticket,
                    waited,
                } => {
                    let result = ready!(fut.poll(cx));
                    let (open, ticket, waited) =
                        (open.take().expect("answered once"), *ticket, *waited);
                    this.state.set(State::Done);
                    return Poll::Ready(match result {
                        Ok(response) => Ok(answer(response, open, ticket, waited)),
                        // Dropping `open` closes the request.
                        Err(err) => Err(err.into()),
                    });
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// The waiting request's turn: `Ok` once granted (or sent anyway after the longest wait), `Err` when it gives up.
fn poll_turn<S, ReqB>(
    queued: &mut Queued<S, ReqB>,
    cx: &mut Context<'_>,
) -> Poll<Result<Ticket, ()>> {
    loop {
        let now = Instant::now();
        if now >= queued.deadline {
            queued.scope.leave(queued.id, now);
            return Poll::Ready(match queued.on_max_wait {
                OnMaxWait::Fail => Err(()),
                OnMaxWait::Send => Ok(queued.scope.send_anyway(now)),
            });
        }
        match queued.scope.poll_waiter(queued.id, now, cx.waker()) {
            Ok(ticket) => return Poll::Ready(Ok(ticket)),
            Err(next) => {
                // The head of the queue also wakes when the budget may have room again; every waiter at its own
                // deadline. Never at an instant already past: that would spin.
                let wake = next
                    .filter(|&at| at > now)
                    .map_or(queued.deadline, |at| at.min(queued.deadline));
                if queued.sleep.deadline() != wake {
                    queued.sleep.as_mut().reset(wake);
                }
                if queued.sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        }
    }
}

/// Reads what the response says, and wraps its body to read the rest (a problem body, gRPC trailers) and to close
/// the request when it ends.
fn answer<B>(
    response: http::Response<B>,
    open: Open,
    ticket: Ticket,
    waited: Option<Duration>,
) -> http::Response<PaceBody<B>> {
    let (mut parts, body) = response.into_parts();
    if let Some(waited) = waited {
        parts.extensions.insert(Waited(waited));
    }
    let now = Instant::now();
    let mut observation = Observation::read(parts.status, &parts.headers);
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .map_or(&b""[..], |v| v.as_bytes());
    let grpc = content_type.starts_with(b"application/grpc");
    let mut watch = Watch::default();
    if grpc {
        match grpc_refusal(&parts.headers) {
            Some((refusal, delay)) => {
                observation.refusal = Some(refusal);
                observation.retry_after = delay.or(observation.retry_after);
            }
            None if !parts.headers.contains_key("grpc-status") => watch.trailers = true,
            None => {}
        }
    } else if observation.refusal.is_some() && content_type.starts_with(b"application/problem+json")
    {
        watch.problem = Some(Vec::new());
    }
    open.scope().observe(ticket, &observation, now);
    let body = PaceBody::new(body, open, ticket, watch);
    http::Response::from_parts(parts, body)
}
