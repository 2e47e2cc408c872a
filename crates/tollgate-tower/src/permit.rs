//! Permits: what an admitted request holds until its response is finished.
//!
//! A concurrency slot or a worker's in-flight slot is a guard whose `Drop` gives it back. The layers put it in a
//! [`Permit`] and hand it to the response through [`HoldPermit`]: for `http::Response`, the permit moves into the
//! body ([`PermitBody`]), so it lives until the body is done or dropped (client disconnect,
//! cancellation, a panicking handler: every path drops it). A failed call drops its permit at once.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use tollgate_tower::{HoldPermit, Permit};
//!
//! struct Flag(Arc<AtomicBool>);
//! impl Drop for Flag {
//!     fn drop(&mut self) { self.0.store(true, Ordering::SeqCst); }
//! }
//!
//! let released = Arc::new(AtomicBool::new(false));
//! let response = http::Response::new("body").hold(Some(Permit::new(Flag(released.clone()))));
//! assert!(!released.load(Ordering::SeqCst), "held while the body lives");
//! drop(response);
//! assert!(released.load(Ordering::SeqCst));
//! ```

use std::any::Any;
use std::fmt;

use crate::limit::adaptive::{AdaptivePermit, Outcome as Ended};
use crate::{PermitBody, Verdict, VerdictSink};

/// A type-erased guard: dropping the permit gives back whatever it holds.
///
/// A concurrency limiter's permit also carries the limiter's [`Verdict`] (the slots left), for the response that
/// holds it to carry into its [`Verdicts`](crate::Verdicts): [`take_verdict`](Self::take_verdict).
pub struct Permit {
    _guard: Box<dyn Any + Send + Sync>,
    verdict: Option<Box<Verdict>>,
}

impl Permit {
    /// Wraps a guard whose `Drop` releases the capacity it holds.
    pub fn new<G: Any + Send + Sync>(guard: G) -> Self {
        Self {
            _guard: Box::new(guard),
            verdict: None,
        }
    }

    /// This permit, carrying the verdict of the limiter that granted it.
    pub(crate) fn with_verdict(mut self, verdict: Verdict) -> Self {
        self.verdict = Some(Box::new(verdict));
        self
    }

    /// The verdict of the limiter that granted this permit, once (the concurrency limiter's: how many more
    /// requests may start). A [`HoldPermit`] implementation moves it into its response for the adapters that
    /// render rate-limit fields; `http::Response`'s does.
    pub fn take_verdict(&mut self) -> Option<Verdict> {
        self.verdict.take().map(|v| *v)
    }

    /// The guard, if it is a `G` (the adaptive limiter marks its slot with how the request ended).
    pub(crate) fn guard_mut<G: Any>(&mut self) -> Option<&mut G> {
        self._guard.downcast_mut()
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Permit")
    }
}

/// A response that can keep a [`Permit`] alive until it is finished.
///
/// Implemented for `http::Response` (the body holds it); implement it for your own response type to use the
/// layers of this crate elsewhere (e.g. keep the permit inside a stream).
pub trait HoldPermit: Sized {
    /// The response type holding the permit.
    type Held;

    /// Attaches `permit` (none when the limiter is off, in shadow mode over its limit, or failed open).
    fn hold(self, permit: Option<Permit>) -> Self::Held;
}

impl<B> HoldPermit for http::Response<B> {
    type Held = http::Response<PermitBody<B>>;

    /// Moves the permit's verdict ([`Permit::take_verdict`]) into the response's [`Verdicts`](crate::Verdicts),
    /// and the permit into the body.
    fn hold(mut self, mut permit: Option<Permit>) -> Self::Held {
        if let Some(verdict) = permit.as_mut().and_then(Permit::take_verdict) {
            self.verdicts_mut().push(verdict);
        }
        self.map(|body| PermitBody::new(body, permit))
    }
}

/// The `Answer` of the slot limiters, the shedders and the adaptive limiter: an admitted
/// response holds its [`Permit`] (through [`HoldPermit`]) until it is finished; errors pass on, and a failed call's
/// permit is dropped at once. An adaptive limiter's permit also learns how the request ended: a response is a
/// latency sample (taken when the body is done), an error of the inner service an overload signal; a request
/// cancelled before either (its future dropped) gives its slot back without a sample.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Hold;

impl crate::limit::Grants for Hold {
    type Grant = Permit;
}

impl<Req, T: HoldPermit> crate::limit::Answer<Req, T> for Hold {
    type Output = Result<T::Held, crate::BoxError>;

    #[inline]
    fn amend_ok(&self, _: &mut T, grant: Option<Permit>) -> Option<Permit> {
        grant
    }

    #[inline]
    fn finish_ok(&self, response: T, mut grant: Option<Permit>) -> Self::Output {
        ended(&mut grant, Ended::Responded);
        Ok(response.hold(grant))
    }

    fn respond(
        &self,
        result: Result<T, crate::BoxError>,
        mut grant: Option<Permit>,
    ) -> Self::Output {
        match result {
            Ok(response) => {
                ended(&mut grant, Ended::Responded);
                Ok(response.hold(grant))
            }
            Err(mut err) => {
                ended(&mut grant, Ended::Dropped);
                // Rejected further in after this limiter admitted the request: its verdict travels with the
                // rejection, as a rate limiter's does, for the adapter that answers it.
                if let (Some(verdict), Some(rejection)) = (
                    grant.as_mut().and_then(Permit::take_verdict),
                    err.downcast_mut::<crate::Rejection>(),
                ) {
                    rejection.push_admitted(verdict);
                }
                Err(err)
            }
        }
    }
}

/// Marks how the request behind `permit` ended, if it holds an adaptive limiter's slot (the one permit that
/// learns from it).
#[inline]
fn ended(permit: &mut Option<Permit>, how: Ended) {
    if let Some(slot) = permit
        .as_mut()
        .and_then(|p| p.guard_mut::<AdaptivePermit>())
    {
        slot.outcome = how;
    }
}
