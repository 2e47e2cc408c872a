//! What a limiter does with a finished request: the seam where protocol adapters plug into the limiter itself.
//!
//! A [`RateLimit`](crate::RateLimit) ends every request by handing the inner service's result (or its own
//! rejection) and its [`Verdict`] to a [`Respond`]er. The default, `()`, is plain tower: the verdict goes into
//! the response (through [`VerdictSink`]) and errors stay errors, for any adapter further out to read. A protocol
//! adapter can instead answer in place — `tollgate-http` renders headers and turns rejections into 429s right there
//! — which saves the adapter its own service layer and the response a heap-allocated extension per request.
//!
//! ```
//! use std::convert::Infallible;
//! use tollgate_tower::{BoxError, Rejection, Verdict};
//! use tollgate_tower::respond::Respond;
//!
//! /// Answers with text: the limiter's remaining quota, or why the request was turned away.
//! #[derive(Clone)]
//! struct Text;
//!
//! impl<Req> Respond<Req, String> for Text {
//!     type Response = String;
//!     type Error = Infallible;
//!     type Ticket = ();
//!
//!     fn prepare(&self, _: &mut Req) {}
//!
//!     fn respond(&self, _: (), result: Result<String, BoxError>, verdict: Option<Verdict>) -> Result<String, Infallible> {
//!         Ok(match (result, verdict) {
//!             (Ok(body), Some(v)) => format!("{body} ({} left)", v.decision.remaining),
//!             (Ok(body), None) => body,
//!             (Err(err), _) => match err.downcast_ref::<Rejection>() {
//!                 Some(rejection) => format!("slow down: {rejection}"),
//!                 None => format!("failed: {err}"),
//!             },
//!         })
//!     }
//! }
//! # let _ = Text;
//! ```

use tower_layer::{Identity, Layer, Stack};

use crate::{BoxError, Rejection, Verdict, VerdictSink};

/// Turns a limited request's outcome into the service's response (see the [module docs](self)).
///
/// `Req` is the request type and `T` the inner service's response type.
pub trait Respond<Req, T> {
    /// The limited service's response.
    type Response;
    /// The limited service's error.
    type Error;
    /// What [`prepare`](Self::prepare) learns from the request, handed back to [`respond`](Self::respond).
    type Ticket;

    /// This responder writing the response header families `families` (as its adapter encodes them:
    /// `tollgate_http::HeaderSet`) instead of its own: what a
    /// [`RateLimitSet`](crate::limit::rate::RateLimitSet) answers with once its layer was given header families
    /// ([`RateLimitSetLayer::set_headers`](crate::limit::rate::RateLimitSetLayer::set_headers), a policy file's
    /// reload). Defaults to `self`, for a responder that writes no headers.
    #[must_use]
    fn with_header_families(self, families: u8) -> Self
    where
        Self: Sized,
    {
        let _ = families;
        self
    }

    /// Called once per request before it is decided and passed on.
    fn prepare(&self, req: &mut Req) -> Self::Ticket;

    /// Whether [`respond`](Self::respond) reads the verdict of an admitted request with this ticket; when it does
    /// not, the limiter does not build one (a rejection always carries its verdict). Defaults to `true`.
    fn wants_verdict(&self, ticket: &Self::Ticket) -> bool {
        let _ = ticket;
        true
    }

    /// Builds the response from the inner service's result — or the limiter's error: a
    /// [`Rejection`], a [`KeyError`](crate::KeyError), or an inner service that failed to become
    /// ready — and the limiter's verdict (`None` when nothing was decided: enforcement off, a failed-open store, or
    /// an error).
    fn respond(
        &self,
        ticket: Self::Ticket,
        result: Result<T, BoxError>,
        verdict: Option<Verdict>,
    ) -> Result<Self::Response, Self::Error>;

    /// Writes this responder's part of an admitted response into it, in place: the path nearly every request
    /// takes, kept free of moves of the response (a response is often over a hundred bytes). Returns what
    /// [`finish_ok`](Self::finish_ok) still needs of the verdict. Defaults to leaving the response alone and
    /// passing the verdict on (boxed, as the limiter holds it).
    fn amend_ok(
        &self,
        ticket: &Self::Ticket,
        response: &mut T,
        verdict: Option<Box<Verdict>>,
    ) -> Option<Box<Verdict>> {
        let _ = (ticket, response);
        verdict
    }

    /// The request's real cost read from its admitted `response` at `source`, for a limiter that charges the
    /// cost after the response ([`RateLimitLayer::cost_after`](crate::RateLimitLayer::cost_after)); `None`
    /// (the default) leaves the cost charged up front. The HTTP adapter reads the [`FinalCost`](crate::FinalCost)
    /// extension or the header.
    fn final_cost(
        &self,
        ticket: &Self::Ticket,
        response: &T,
        source: &crate::CostAfter,
    ) -> Option<u64> {
        let _ = (ticket, response, source);
        None
    }

    /// The ledger a limiter that charges the response as it streams leaves on it (see
    /// [`VerdictSink::stream_charges`]); `None` (the default): the reservation stands as the request's cost.
    fn stream_charges<'a>(
        &self,
        ticket: &Self::Ticket,
        response: &'a mut T,
    ) -> Option<&'a mut crate::stream_cost::StreamCharges> {
        let _ = (ticket, response);
        None
    }

    /// The answer for an admitted response, after [`amend_ok`](Self::amend_ok). Defaults to
    /// `respond(ticket, Ok(response), verdict)`; an override must answer, with `amend_ok`, as `respond` would.
    fn finish_ok(
        &self,
        ticket: Self::Ticket,
        response: T,
        verdict: Option<Box<Verdict>>,
    ) -> Result<Self::Response, Self::Error> {
        self.respond(ticket, Ok(response), verdict.map(|v| *v))
    }
}

/// The default [`Respond`]er, `()`: puts the verdict into the response for adapters further out, passes errors
/// on.
impl<Req, T: VerdictSink> Respond<Req, T> for () {
    type Response = T;
    type Error = BoxError;
    type Ticket = ();

    fn prepare(&self, _: &mut Req) {}

    fn respond(
        &self,
        (): (),
        result: Result<T, BoxError>,
        verdict: Option<Verdict>,
    ) -> Result<T, BoxError> {
        let mut response = match result {
            Ok(response) => response,
            Err(mut err) => {
                // Rejected further in after this limiter admitted (and counted) the request: the verdict travels
                // with the rejection, for the adapter that answers it.
                if let (Some(verdict), Some(rejection)) = (verdict, err.downcast_mut::<Rejection>())
                {
                    rejection.push_admitted(verdict);
                }
                return Err(err);
            }
        };
        if let Some(verdict) = verdict {
            response.verdicts_mut().push(verdict);
        }
        Ok(response)
    }

    fn amend_ok(
        &self,
        (): &(),
        response: &mut T,
        verdict: Option<Box<Verdict>>,
    ) -> Option<Box<Verdict>> {
        if let Some(verdict) = verdict {
            response.verdicts_mut().push(*verdict);
        }
        None
    }

    /// What the response states ([`VerdictSink::final_cost`]): the HTTP and gRPC adapters around a limiter that
    /// forwards read it as the in-place HTTP one does.
    fn final_cost(&self, (): &(), response: &T, source: &crate::CostAfter) -> Option<u64> {
        response.final_cost(source)
    }

    fn stream_charges<'a>(
        &self,
        (): &(),
        response: &'a mut T,
    ) -> Option<&'a mut crate::stream_cost::StreamCharges> {
        response.stream_charges()
    }

    fn finish_ok(&self, (): (), response: T, _: Option<Box<Verdict>>) -> Result<T, BoxError> {
        Ok(response)
    }
}

/// A layer built with a [`Respond`]er: what a protocol adapter's one layer type (`tollgate_http::HttpLimitLayer`)
/// asks of whatever it wraps. The rate limiters answer through the responder in place (one service, no verdict
/// stored on the response); every other layer — the Stripe-stack layers, a `tower::ServiceBuilder` stack, which
/// may hold foreign layers — is built as it is and wrapped in the responder's own service: the responder is a
/// [`Layer`] too, whose service reads the verdicts those layers leave on the response and answers their rejections
/// (`tollgate_http::HttpLimit` for the HTTP responder).
pub trait LayerWith<S, R> {
    /// The service built.
    type Service;

    /// Wraps `inner`, answering through `respond`.
    fn layer_with(&self, inner: S, respond: R) -> Self::Service;
}

/// [`LayerWith`] for layers built as they are and wrapped in the responder's service.
macro_rules! adapted {
    ($([$($generics:tt)*] $layer:ty),* $(,)?) => {$(
        impl<S, Resp, $($generics)*> LayerWith<S, Resp> for $layer
        where
            $layer: Layer<S>,
            Resp: Layer<<$layer as Layer<S>>::Service>,
        {
            type Service = Resp::Service;

            fn layer_with(&self, inner: S, respond: Resp) -> Self::Service {
                respond.layer(self.layer(inner))
            }
        }
    )*};
}
adapted!(
    [] Identity,
    [Inner, Outer] Stack<Inner, Outer>,
    [L] tower::ServiceBuilder<L>,
);

#[cfg(feature = "stack")]
adapted!(
    [W, R, C, F, A] crate::StackLayer<W, R, C, F, A>,
    [K, L] crate::ConcurrencyLimitLayer<K, L>,
    [P, L] crate::FleetShedLayer<P, L>,
    [P] crate::WorkerShedLayer<P>,
    [P] crate::AdaptiveLimitLayer<P>,
);
