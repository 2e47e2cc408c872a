use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tollgate_tower::BoxError;
use tower_service::Service;

const POLLED_AFTER_COMPLETION: &str = "per-method response future polled after completion";

pin_project! {
    /// Response future of [`MethodLimit`](super::MethodLimit).
    pub struct ResponseFuture<L, S, Req>
    where
        L: Service<Req>,
        S: Service<Req>,
    {
        #[pin]
        state: State<L, S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<L, S, Req>
    where
        L: Service<Req>,
        S: Service<Req>,
    {
        // The call's limit (or the unlimited inner service) is being made ready.
        ReadyLimited { svc: L, req: Option<Req> },
        ReadyUnlimited { svc: S, req: Option<Req> },
        CallingLimited { #[pin] fut: L::Future },
        CallingUnlimited { #[pin] fut: S::Future },
    }
}

impl<L: Service<Req>, S: Service<Req>, Req> ResponseFuture<L, S, Req> {
    pub(super) fn limited(svc: L, req: Req) -> Self {
        Self {
            state: State::ReadyLimited {
                svc,
                req: Some(req),
            },
        }
    }

    pub(super) fn unlimited(svc: S, req: Req) -> Self {
        Self {
            state: State::ReadyUnlimited {
                svc,
                req: Some(req),
            },
        }
    }
}

impl<L: Service<Req>, S: Service<Req>, Req> fmt::Debug for ResponseFuture<L, S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::ReadyLimited { .. } | State::ReadyUnlimited { .. } => "ready",
            State::CallingLimited { .. } | State::CallingUnlimited { .. } => "calling",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<L, S, Req, T> Future for ResponseFuture<L, S, Req>
where
    L: Service<Req, Response = T>,
    L::Error: Into<BoxError>,
    S: Service<Req, Response = T>,
    S::Error: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::ReadyLimited { svc, req } => {
                    ready!(svc.poll_ready(cx)).map_err(Into::into)?;
                    let req = req.take().ok_or(POLLED_AFTER_COMPLETION)?;
                    let fut = svc.call(req);
                    this.state.set(State::CallingLimited { fut });
                }
                StateProj::ReadyUnlimited { svc, req } => {
                    ready!(svc.poll_ready(cx)).map_err(Into::into)?;
                    let req = req.take().ok_or(POLLED_AFTER_COMPLETION)?;
                    let fut = svc.call(req);
                    this.state.set(State::CallingUnlimited { fut });
                }
                StateProj::CallingLimited { fut } => return fut.poll(cx).map_err(Into::into),
                StateProj::CallingUnlimited { fut } => return fut.poll(cx).map_err(Into::into),
            }
        }
    }
}
