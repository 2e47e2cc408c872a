//! How every tollgate HTTP layer answers: rate-limit headers on the response, rejections as problem responses.

use std::convert::Infallible;

use http::{Request, Response};
use tollgate_tower::respond::Respond;
use tollgate_tower::{BoxError, Rejection, Verdict, Verdicts};

use crate::HeaderSet;
use crate::problem::ProblemTypes;

/// The HTTP [`Respond`]er: a [`RateLimit`](tollgate_tower::RateLimit) answering through it stays `Infallible`,
/// writes the rate-limit headers itself and turns its rejections into 429/503 responses. Built by
/// [`HttpLimitLayer`](crate::HttpLimitLayer); opaque otherwise.
#[derive(Debug, Clone, Copy)]
pub struct HttpResponder {
    headers: HeaderSet,
    problems: &'static ProblemTypes,
}

/// Left in the request's extensions by every tollgate HTTP layer: an inner one that finds it knows an outer one
/// will render the headers again, and leaves its verdict on the response for it.
#[derive(Debug, Clone, Copy)]
struct AdapterAbove;

impl HttpResponder {
    pub(crate) const fn new(headers: HeaderSet) -> Self {
        Self {
            headers,
            problems: &ProblemTypes::IETF,
        }
    }

    pub(crate) const fn with_headers(self, headers: HeaderSet) -> Self {
        Self { headers, ..self }
    }

    pub(crate) const fn with_problem_types(self, problems: &'static ProblemTypes) -> Self {
        Self { problems, ..self }
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
            Ok(mut response) => {
                // Boxed only here, where `respond` is handed a response with a verdict: the limiter's own future
                // answers responses through `amend_ok`, with the verdict boxed already.
                self.amend(outer, &mut response, own.map(Box::new));
                response
            }
            Err(err) => self.answer_error(outer, &err, own),
        }
    }

    /// Writes this layer's headers onto a response of the inner service, in place.
    #[inline]
    fn amend<B>(&self, outer: bool, response: &mut Response<B>, own: Option<Box<Verdict>>) {
        // The common case, kept small: a lone limiter's admitted response.
        if outer || response.extensions().get::<Verdicts>().is_some() {
            return self.gather(outer, response, own.map(|own| *own));
        }
        if let Some(own) = &own {
            self.headers.render_one(own, response.headers_mut());
        }
    }

    /// The response for a rejection, or for any other error, with its headers.
    fn answer_error<B: From<String>>(
        &self,
        outer: bool,
        err: &BoxError,
        own: Option<Verdict>,
    ) -> Response<B> {
        let mut response = self.problems.error_response(err);
        let Some(rejection) = err.downcast_ref::<Rejection>() else {
            self.gather(outer, &mut response, own);
            return response;
        };
        // The rejecting limiter's verdict, those of the limiters it passed on its way out (which had counted the
        // request), and this layer's own if it admitted it (an inner limiter rejected): all were counted.
        let mut carried = rejection
            .verdict()
            .into_iter()
            .chain(rejection.admitted())
            .cloned();
        match (carried.next(), own) {
            (None, own) => self.gather(outer, &mut response, own),
            // The common case: this layer's limiter rejected, alone.
            (Some(rejected), None) if rejection.admitted().is_empty() => {
                self.gather(outer, &mut response, Some(rejected));
            }
            (Some(first), own) => {
                let verdicts = response
                    .extensions_mut()
                    .get_or_insert_default::<Verdicts>();
                verdicts.push(first);
                verdicts.extend(carried);
                self.gather(outer, &mut response, own);
            }
        }
        response
    }

    /// Renders the headers when several layers' verdicts meet on one response, or for an error's response.
    ///
    /// Layers may ask for different header families: each one that leaves its verdict for an outer layer also
    /// leaves the families it asked for, and a layer renders the union of its own and those, so that the outermost
    /// renders every family anyone asked for over every verdict (an inner layer's own rendering, for itself alone,
    /// is then overwritten: the GitHub fields name the binding limiter of all of them, not of the inner one).
    fn gather<B>(&self, outer: bool, response: &mut Response<B>, own: Option<Verdict>) {
        // The header map is taken out (an empty one allocates nothing) while the extensions are borrowed: a
        // `Response` lends one part at a time.
        let mut headers = std::mem::take(response.headers_mut());
        let extensions = response.extensions_mut();
        let fields = match extensions.get::<AskedFor>() {
            Some(AskedFor(asked)) => self.headers.union(*asked),
            None => self.headers,
        };
        match (extensions.get_mut::<Verdicts>(), own) {
            // Inner limiters left theirs: add this one (the outermost so far) and render them all.
            (Some(verdicts), own) => {
                verdicts.extend(own);
                fields.render(verdicts, &mut headers);
            }
            // An outer layer will render again: leave the verdict for it.
            (None, Some(own)) if outer => {
                let verdicts = extensions.get_or_insert_default::<Verdicts>();
                verdicts.push(own);
                fields.render(verdicts, &mut headers);
            }
            (None, own) => {
                if let Some(own) = &own {
                    fields.render_one(own, &mut headers);
                }
            }
        }
        if outer && fields != HeaderSet::NONE {
            extensions.insert(AskedFor(fields));
        }
        *response.headers_mut() = headers;
    }
}

/// The header families as the tower layers carry them opaquely (a rate-limit set keeps them in one byte).
impl From<HeaderSet> for u8 {
    fn from(families: HeaderSet) -> Self {
        families.bits()
    }
}

/// Left on a response by a layer that leaves its verdict for an outer one: the header families it (and the layers
/// inside it) asked for.
#[derive(Debug, Clone, Copy)]
struct AskedFor(HeaderSet);

impl<ReqBody, ResBody: From<String>> Respond<Request<ReqBody>, Response<ResBody>>
    for HttpResponder
{
    type Response = Response<ResBody>;
    type Error = Infallible;
    type Ticket = bool;

    /// A reloaded policy file's header families.
    fn with_header_families(self, families: u8) -> Self {
        self.with_headers(HeaderSet::from_bits(families))
    }

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
    fn amend_ok(
        &self,
        outer: &bool,
        response: &mut Response<ResBody>,
        verdict: Option<Box<Verdict>>,
    ) -> Option<Box<Verdict>> {
        self.amend(*outer, response, verdict);
        None
    }

    /// What the response states ([`VerdictSink::final_cost`](tollgate_tower::VerdictSink::final_cost)): the
    /// [`FinalCost`](tollgate_tower::FinalCost) extension, or the header's whole number.
    fn final_cost(
        &self,
        _: &bool,
        response: &Response<ResBody>,
        source: &tollgate_tower::CostAfter,
    ) -> Option<u64> {
        tollgate_tower::VerdictSink::final_cost(response, source)
    }

    fn stream_charges<'a>(
        &self,
        _: &bool,
        response: &'a mut Response<ResBody>,
    ) -> Option<&'a mut tollgate_tower::stream_cost::StreamCharges> {
        tollgate_tower::VerdictSink::stream_charges(response)
    }

    #[inline]
    fn finish_ok(
        &self,
        _: bool,
        response: Response<ResBody>,
        _: Option<Box<Verdict>>,
    ) -> Result<Response<ResBody>, Infallible> {
        Ok(response)
    }
}
