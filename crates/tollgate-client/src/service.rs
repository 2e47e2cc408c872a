//! [`Pace`]: the service; the wait for room happens in its response future.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_service::Service;

use crate::budget::Scope;
use crate::future::ResponseFuture;
use crate::layer::Shared;
use crate::{BoxError, PaceBody};

/// The service [`PaceLayer`](crate::PaceLayer) makes around `S`.
///
/// `poll_ready` is the inner service's; `call` spends the request's budget and sends it at once when there is
/// room, or returns a future that waits for its turn first (the inner service it was ready with waits with it).
#[derive(Clone)]
pub struct Pace<S> {
    inner: S,
    shared: Arc<Shared>,
    /// The scope of this clone's last request: most clients talk to one origin, found again without a lock.
    last: Option<(String, Arc<Scope>)>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Pace<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pace")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Pace<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self {
            inner,
            shared,
            last: None,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqB, ResB> Service<http::Request<ReqB>> for Pace<S>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<PaceBody<ResB>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<ReqB>) -> Self::Future {
        let scope = self
            .shared
            .scope(request.uri(), request.headers(), &mut self.last);
        let now = Instant::now();
        if let Some(ticket) = scope.try_send(now) {
            metrics::histogram!("tollgate_client_wait_seconds").record(0.0);
            return ResponseFuture::calling(self.inner.call(request), scope, ticket);
        }
        // Take the service that is ready, leaving a clone to be made ready for the next call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(ready, request, scope, &self.shared, now)
    }
}
