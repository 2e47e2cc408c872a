//! How many tokens a request takes.
//!
//! ```
//! use tollgate_tower::Cost;
//!
//! // A number is the same cost for every request (a limiter's default is 1).
//! assert_eq!(Cost::<&str>::cost(&1, &"anything"), 1);
//! // A closure computes it: a batch request costs one token per item.
//! let per_item = |req: &Vec<u32>| req.len() as u64;
//! assert_eq!(per_item.cost(&vec![1, 2, 3]), 3);
//! ```

/// Where a rate limiter reads a request's real cost once its response is ready
/// ([`RateLimitLayer::cost_after`](crate::RateLimitLayer::cost_after)): the response's [`FinalCost`] extension
/// (set by the handler), or a response header holding a whole number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostAfter {
    /// The [`FinalCost`] extension of the response.
    Extension,
    /// A response header (its name, any case) holding the cost as a whole number.
    Header(std::borrow::Cow<'static, str>),
    /// The response body, as it streams: a body meter further out (`tollgate_http::stream`) counts it and the
    /// limiter debits, settles and, at its budget, cuts as [`Streamed`](crate::stream_cost::Streamed) says (see
    /// [`stream_cost`](crate::stream_cost)). The cost charged up front is the reservation.
    Streamed(crate::stream_cost::Streamed),
}

/// A response extension stating the request's real cost, known only once it was served (LLM tokens, bytes,
/// rows): read by a limiter with [`CostAfter::Extension`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FinalCost(pub u64);

/// Computes the cost of a request in tokens.
///
/// A cost of 0 inspects the quota without consuming it; a cost above the policy's burst is rejected for good
/// (`Outcome::CostExceedsCapacity`).
pub trait Cost<Req>: Send + Sync + 'static {
    /// The request's cost.
    fn cost(&self, req: &Req) -> u64;
}

/// The same cost for every request: this many tokens (a limiter's default is 1).
impl<Req> Cost<Req> for u64 {
    fn cost(&self, _: &Req) -> u64 {
        *self
    }
}

/// A cost computed by a closure.
impl<Req, F> Cost<Req> for F
where
    F: Fn(&Req) -> u64 + Send + Sync + 'static,
{
    fn cost(&self, req: &Req) -> u64 {
        self(req)
    }
}
