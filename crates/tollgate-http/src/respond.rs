//! How every tollgate HTTP layer answers: rate-limit headers on the response, rejections as problem responses.

use std::convert::Infallible;

use http::{Request, Response};
use tollgate_tower::respond::Respond;
use tollgate_tower::{BoxError, Rejection, Verdict, Verdicts};

use crate::HeaderSet;
use crate::problem::error_response;

/// The HTTP [`Respond`]er: a [`RateLimit`](tollgate_tower::RateLimit) answering through it stays `Infallible`,
/// writes the rate-limit headers itself and turns its rejections into 429/503 responses. Built by
/// [`HttpLimitLayer`](crate::HttpLimitLayer); opaque otherwise.
#[derive(Debug, Clone, Copy)]
pub struct HttpResponder {
    headers: HeaderSet,
}

/// Left in the request's extensions by every tollgate HTTP layer: an inner one that finds it knows an outer one
/// will render the headers again, and leaves its verdict on the response for it.
#[derive(Debug, Clone, Copy)]
struct AdapterAbove;

impl HttpResponder {
    pub(crate) const fn new(headers: HeaderSet) -> Self {
        Self { headers }
    }

    /// Marks `req` for inner layers; whether an outer layer had marked it already. A layer that renders no
    /// fields only looks: inner layers' verdicts are of no use to it, so they may as well render their own.
    pub(crate) fn mark<B>(&self, req: &mut Request<B>) -> bool {
        if self.headers == HeaderSet::NONE {
            return req.extensions().get::<AdapterAbove>().is_some();
        }
        req.extensions_mut().insert(AdapterAbove).is_some()
    }

    /// The response for `result`, with the headers of every verdict it carries plus `own` (this layer's).
    ///
    /// A single limiter's verdict needs no response extension: it is rendered straight onto the response, and
    /// stored on it only when an outer layer (`outer`) will render again.
    #[inline]
    pub(crate) fn answer<B: From<String>>(
        &self,
        outer: bool,
        result: Result<Response<B>, BoxError>,
        own: Option<Verdict>,
    ) -> Response<B> {
        match result {
            Ok(response) => self.answer_ok(outer, response, own),
            result => self.answer_gathered(outer, result, own),
        }
    }

    /// [`answer`](Self::answer) for a response of the inner service.
    #[inline(always)]
    fn answer_ok<B: From<String>>(
        &self,
        outer: bool,
        mut response: Response<B>,
        own: Option<impl OwnVerdict>,
    ) -> Response<B> {
        // The common case, kept small: a lone limiter's admitted response, changed in place.
        if outer || response.extensions().get::<Verdicts>().is_some() {
            return self.answer_gathered(outer, Ok(response), own.map(OwnVerdict::into_verdict));
        }
        if let Some(own) = &own {
            self.headers
                .render_one(own.verdict(), response.headers_mut());
        }
        response
    }

    /// [`answer`](Self::answer) for a rejection, or when several layers' verdicts meet on one response.
    #[inline(never)]
    fn answer_gathered<B: From<String>>(
        &self,
        outer: bool,
        result: Result<Response<B>, BoxError>,
        own: Option<Verdict>,
    ) -> Response<B> {
        let (response, own) = match result {
            Ok(response) => (response, own),
            Err(err) => {
                let rejected = err.downcast_ref::<Rejection>().and_then(Rejection::verdict);
                let verdict = rejected.cloned().or(own);
                (error_response(&err), verdict)
            }
        };
        let (mut parts, body) = response.into_parts();
        let headers = &mut parts.headers;
        match (parts.extensions.get_mut::<Verdicts>(), own) {
            // Inner limiters left theirs: add this one (the outermost so far) and render them all.
            (Some(verdicts), own) => {
                verdicts.extend(own);
                self.headers.render(verdicts, headers);
            }
            // An outer layer will render again: leave the verdict for it.
            (None, Some(own)) if outer => {
                let verdicts = parts.extensions.get_or_insert_default::<Verdicts>();
                verdicts.push(own);
                self.headers.render(verdicts, headers);
            }
            (None, own) => {
                if let Some(own) = &own {
                    self.headers.render_one(own, headers);
                }
            }
        }
        Response::from_parts(parts, body)
    }
}

/// A layer's own verdict as the responder gets it: boxed from the response future (moving the box is cheaper
/// than moving the verdict), unboxed from [`Respond::respond`].
trait OwnVerdict {
    fn verdict(&self) -> &Verdict;
    fn into_verdict(self) -> Verdict;
}

impl OwnVerdict for Verdict {
    fn verdict(&self) -> &Verdict {
        self
    }

    fn into_verdict(self) -> Verdict {
        self
    }
}

impl OwnVerdict for Box<Verdict> {
    fn verdict(&self) -> &Verdict {
        self
    }

    fn into_verdict(self) -> Verdict {
        *self
    }
}

impl<ReqBody, ResBody: From<String>> Respond<Request<ReqBody>, Response<ResBody>>
    for HttpResponder
{
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Ticket = bool;

    fn prepare(&self, req: &mut Request<ReqBody>) -> bool {
        self.mark(req)
    }

    /// Only to render it, or to leave it for an outer layer.
    fn wants_verdict(&self, outer: &bool) -> bool {
        *outer || self.headers != HeaderSet::NONE
    }

    #[inline]
    fn respond(
        &self,
        outer: bool,
        result: Result<Response<ResBody>, BoxError>,
        verdict: Option<Verdict>,
    ) -> Result<Response<ResBody>, Infallible> {
        Ok(self.answer(outer, result, verdict))
    }

    #[inline]
    fn respond_ok(
        &self,
        outer: bool,
        response: Response<ResBody>,
        verdict: Option<Box<Verdict>>,
    ) -> Result<Response<ResBody>, Infallible> {
        Ok(self.answer_ok(outer, response, verdict))
    }
}
