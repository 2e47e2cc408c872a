//! The budget of one Redis call, measured on Redis rather than on this process's scheduler.
//!
//! A busy machine (every core saturated, a worker blocked for a while) delays the task that reads Redis's reply
//! and the timer that cuts the call off alike. Cut off the moment the timer fires, such a call fails though Redis
//! answered in time: the reply sits in the socket, or in the connection's reader, unread. Two rules keep that from
//! being a timeout: a reply the connection can hand over when the budget runs out is taken, and the time the timer
//! itself fired late (the process was not running, so neither was the reader) is given back once, up to the budget
//! again. A Redis that does not answer is still cut off at the budget when the process runs on time.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// How late a timer may fire and still be on time: tokio's timers tick in milliseconds, and a worker woken a few
/// milliseconds late is normal. Later than this, the process was not running: the lateness is the scheduler's.
const ON_TIME: Duration = Duration::from_millis(5);

/// Runs `call` for at most `budget` of Redis's time; `None` if it was cut off.
pub(crate) fn within<F: Future>(budget: Duration, call: F) -> Within<F> {
    Within {
        call,
        sleep: tokio::time::sleep(budget),
        budget,
        state: State::Running { given_back: false },
    }
}

pin_project_lite::pin_project! {
    /// The future of [`within`]: as small as a `tokio::time::Timeout` on the hot path (a decision's future is
    /// moved into a box per request), the last look's state boxed on the rare path where the budget ran out.
    pub(crate) struct Within<F> {
        #[pin]
        call: F,
        #[pin]
        sleep: Sleep,
        budget: Duration,
        state: State,
    }
}

enum State {
    /// Waiting for the reply or the deadline; `given_back`: the scheduler's lateness was given back already.
    Running { given_back: bool },
    /// The deadline passed `late` after it was due: one turn of the runtime (its I/O driver polled, the tasks it
    /// woke run, the connection's reader among them) before the call is looked at again.
    LastLook {
        turn: Pin<Box<dyn Future<Output = ()> + Send>>,
        late: Duration,
        given_back: bool,
    },
}

impl<F: Future> Future for Within<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            // A reply the connection holds is taken, deadline or not.
            if let Poll::Ready(out) = this.call.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            match this.state {
                State::Running { given_back } => {
                    if this.sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let late = Instant::now().saturating_duration_since(this.sleep.deadline());
                    *this.state = State::LastLook {
                        turn: Box::pin(tokio::task::yield_now()),
                        late,
                        given_back: *given_back,
                    };
                }
                State::LastLook {
                    turn,
                    late,
                    given_back,
                } => {
                    if turn.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The call was looked at after the turn (above) and is still waiting.
                    if *given_back || *late <= ON_TIME {
                        return Poll::Ready(None);
                    }
                    let again = Instant::now() + (*late).min(*this.budget);
                    this.sleep.as_mut().reset(again);
                    *this.state = State::Running { given_back: true };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_is_cut_off_at_the_budget() {
        let started = Instant::now();
        let out = within(Duration::from_millis(250), std::future::pending::<()>()).await;
        assert_eq!(out, None);
        assert_eq!(started.elapsed(), Duration::from_millis(250));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_within_its_budget_answers() {
        let call = async {
            tokio::time::sleep(Duration::from_millis(249)).await;
            7
        };
        assert_eq!(within(Duration::from_millis(250), call).await, Some(7));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn time_the_process_did_not_run_is_given_back_once() {
        // The worker is blocked for 120 ms (a busy machine) while a 30 ms reply is due: the timer fires 70 ms late,
        // the reply has been "sent" by then, and the call gets the lateness back instead of failing.
        let budget = Duration::from_millis(50);
        let reply = tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(30)).await;
        });
        let call = async {
            let _ = reply.await;
            // The reader runs after the block: answering takes it one more turn.
            tokio::time::sleep(Duration::from_millis(10)).await;
            "answered"
        };
        let blocker = tokio::spawn(async {
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_millis(120));
        });
        assert_eq!(within(budget, call).await, Some("answered"));
        blocker.await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_hung_call_after_a_late_timer_is_still_cut_off() {
        let budget = Duration::from_millis(50);
        let blocker = tokio::spawn(async {
            std::thread::sleep(Duration::from_millis(120));
        });
        let started = std::time::Instant::now();
        assert_eq!(within(budget, std::future::pending::<()>()).await, None);
        // Cut off after the block, the lateness (≤ the budget) given back once: never waits on for ever.
        assert!(started.elapsed() < Duration::from_secs(2));
        blocker.await.unwrap();
    }
}
