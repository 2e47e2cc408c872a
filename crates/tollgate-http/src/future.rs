use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tollgate_tower::BoxError;

use crate::HttpResponder;

const POLLED_AFTER_COMPLETION: &str = "http limit response future polled after completion";

pin_project! {
    /// Response future of [`HttpLimit`](crate::HttpLimit).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        responder: HttpResponder,
        outer: bool,
        // Set once answered: polling again answers "polled after completion" instead of polling a finished inner
        // future (which may panic).
        answered: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Running { #[pin] fut: F },
        // The inner service failed to become ready.
        Failed { error: Option<BoxError> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(fut: F, responder: HttpResponder, outer: bool) -> Self {
        Self {
            state: State::Running { fut },
            responder,
            outer,
            answered: false,
        }
    }

    pub(crate) fn failed(error: BoxError, responder: HttpResponder, outer: bool) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            responder,
            outer,
            answered: false,
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("responder", &self.responder)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: From<String>,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = match this.state.project() {
            _ if *this.answered => Err(POLLED_AFTER_COMPLETION.into()),
            StateProj::Running { fut } => ready!(fut.poll(cx)).map_err(Into::into),
            StateProj::Failed { error } => Err(error
                .take()
                .unwrap_or_else(|| POLLED_AFTER_COMPLETION.into())),
        };
        *this.answered = true;
        Poll::Ready(Ok(this.responder.answer(*this.outer, result, None)))
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    #[test]
    fn polling_again_after_the_answer_never_polls_the_inner_future() {
        let mut polls = 0;
        let inner = std::future::poll_fn(|_| {
            polls += 1;
            assert_eq!(polls, 1, "the inner future was polled after it finished");
            Poll::Ready(Ok::<_, Infallible>(Response::new(String::from("ok"))))
        });
        let mut fut = std::pin::pin!(ResponseFuture::new(
            inner,
            HttpResponder::new(crate::HeaderSet::NONE),
            false
        ));
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(Ok(first)) = fut.as_mut().poll(&mut cx) else {
            panic!("the first poll answers");
        };
        assert_eq!(first.status(), 200);
        let Poll::Ready(Ok(again)) = fut.as_mut().poll(&mut cx) else {
            panic!("a second poll answers too");
        };
        assert_eq!(again.status(), 500);
    }
}
