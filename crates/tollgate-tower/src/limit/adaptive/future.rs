//! How an admitted request's response teaches the limit: the [`Answer`](crate::limit::Answer) the adaptive
//! limiter gives the one response future every limiter returns.

use super::limiter::{AdaptivePermit, Outcome};
use crate::limit::{Answer, Grants};
use crate::{BoxError, HoldPermit, Permit};

/// The adaptive limiter's [`Answer`]: as [`Hold`](crate::permit::Hold), the response holds its permit until it is
/// finished, and the permit learns how the request ended — a response is a latency sample (taken when the body
/// is done), an error of the inner service an overload signal; a request cancelled before either (its future
/// dropped) gives its slot back without a sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct LearnFromResponse;

impl Grants for LearnFromResponse {
    type Grant = Permit;
}

/// Marks how the request behind `permit` ended, if it holds an adaptive slot.
fn ended(permit: &mut Option<Permit>, outcome: Outcome) {
    if let Some(slot) = permit
        .as_mut()
        .and_then(|p| p.guard_mut::<AdaptivePermit>())
    {
        slot.outcome = outcome;
    }
}

impl<Req, T: HoldPermit> Answer<Req, T> for LearnFromResponse {
    type Output = Result<T::Held, BoxError>;

    #[inline(always)]
    fn amend_ok(&self, _: &mut T, grant: Option<Permit>) -> Option<Permit> {
        grant
    }

    fn finish_ok(&self, response: T, mut grant: Option<Permit>) -> Self::Output {
        ended(&mut grant, Outcome::Responded);
        Ok(response.hold(grant))
    }

    fn respond(&self, result: Result<T, BoxError>, mut grant: Option<Permit>) -> Self::Output {
        match result {
            Ok(response) => <Self as Answer<Req, T>>::finish_ok(self, response, grant),
            Err(err) => {
                ended(&mut grant, Outcome::Dropped);
                Err(err)
            }
        }
    }
}
