//! Servers that send garbage or lie, over real TCP: the layer stays bounded (waits cut to its longest delay, no
//! busy loop, no panic) and otherwise sends as if no field were there.
//!
//! Time bounds are one-sided where the machine's load could move them: a wait is asserted at least what the
//! server asked (load only makes it longer), and "bounded" as finishing within a limit a hundred times the
//! expected wait.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use support::{Scripted, get, paced, respond};
use tokio::time::{Instant, timeout};
use tollgate_client::{OnMaxWait, PaceLayer, WaitedTooLong};

/// Far more than any wait here should take: a test that ends by it failed, it did not pass slowly.
const BOUND: Duration = Duration::from_secs(20);

/// Counts how often a future is polled: a busy loop shows as thousands of polls.
struct Polls<F> {
    fut: Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: Future> Future for Polls<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.fut.as_mut().poll(cx)
    }
}

/// `n` concurrent GETs of `url` through one paced client; their answers and the polls of all their futures.
async fn concurrently(layer: &PaceLayer, url: &str, n: usize) -> (Vec<support::Answer>, usize) {
    let polls = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (mut client, url, polls) = (paced(layer), url.to_owned(), polls.clone());
        tasks.spawn(async move {
            let fut = Box::pin(async move { get(&mut client, &url).await.expect("an answer") });
            Polls { fut, polls }.await
        });
    }
    let mut answers = Vec::new();
    while let Some(answer) = timeout(BOUND, tasks.join_next()).await.expect("bounded") {
        answers.push(answer.expect("no panic"));
    }
    (answers, polls.load(Ordering::Relaxed))
}

/// Garbage in every field is ignored as a whole: after the first answer, nothing waits.
#[tokio::test]
async fn garbage_fields_are_as_if_absent() {
    let server = Scripted::start(|_| {
        respond(
            200,
            &[
                ("ratelimit-policy", ";;;q=%"),
                ("ratelimit", "garbage, \"x\";r=-3;t=1"),
                ("x-ratelimit-remaining", "lots"),
                ("retry-after", "whenever"),
            ],
        )
    })
    .await;
    let layer = PaceLayer::new();
    let mut first = paced(&layer);
    get(&mut first, &server.url()).await.unwrap();
    let (answers, polls) = concurrently(&layer, &server.url(), 16).await;
    assert!(
        answers
            .iter()
            .all(|a| a.status == 200 && a.waited.is_zero())
    );
    assert!(polls <= 16 * 8, "{polls} polls for 16 requests");
}

/// `r` far above the policy's `q` is cut to `q`: no more than `q` requests in the statement's second.
#[tokio::test]
async fn remaining_above_the_policy_is_cut_to_it() {
    let server = Scripted::start(|_| {
        respond(
            200,
            &[
                ("ratelimit-policy", r#""api";q=2;w=1"#),
                ("ratelimit", r#""api";r=1000000;t=1"#),
            ],
        )
    })
    .await;
    let layer = PaceLayer::new();
    let (answers, _) = concurrently(&layer, &server.url(), 8).await;
    assert_eq!(answers.len(), 8);
    let arrivals = server.arrivals();
    // The first request learns; its answer allows 2 more within the second; the rest wait for the probe after it.
    let first = arrivals[0];
    let early = arrivals
        .iter()
        .filter(|&&at| at < first + Duration::from_millis(900))
        .count();
    assert!(early <= 3, "{early} requests within 900 ms: {arrivals:?}");
}

/// `r=0;t=0` forever is no horizon at all: the layer sends as if no field were there, without spinning.
#[tokio::test]
async fn t_zero_forever_does_not_spin() {
    let server = Scripted::start(|_| {
        respond(
            200,
            &[
                ("ratelimit-policy", r#""api";q=1;w=1"#),
                ("ratelimit", r#""api";r=0;t=0"#),
            ],
        )
    })
    .await;
    let layer = PaceLayer::new();
    let started = Instant::now();
    let (answers, polls) = concurrently(&layer, &server.url(), 16).await;
    assert_eq!(answers.len(), 16);
    assert!(polls <= 16 * 8, "{polls} polls for 16 requests");
    assert!(started.elapsed() < BOUND);
}

/// After a 429, the scope waits; a negative `Retry-After` is no delay at all, so the default retry applies.
#[tokio::test]
async fn a_negative_retry_after_falls_back_to_the_default_retry() {
    let server = Scripted::start(|n| {
        if n == 0 {
            respond(429, &[("retry-after", "-5")])
        } else {
            respond(200, &[])
        }
    })
    .await;
    let layer = PaceLayer::new().default_retry(Duration::from_millis(300));
    let mut client = paced(&layer);
    assert_eq!(get(&mut client, &server.url()).await.unwrap().status, 429);
    let next = timeout(BOUND, get(&mut client, &server.url()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.status, 200);
    assert!(
        next.waited >= Duration::from_millis(300),
        "{:?}",
        next.waited
    );
}

/// An enormous `Retry-After` (seconds, or a date centuries ahead) holds the scope for the longest delay only.
#[tokio::test]
async fn an_enormous_retry_after_is_cut_to_the_longest_delay() {
    for retry in ["99999999999", "Fri, 31 Dec 9999 23:59:59 GMT"] {
        let server = Scripted::start(move |n| {
            if n == 0 {
                respond(429, &[("retry-after", retry)])
            } else {
                respond(200, &[])
            }
        })
        .await;
        let layer = PaceLayer::new().max_delay(Duration::from_millis(200));
        let mut client = paced(&layer);
        assert_eq!(get(&mut client, &server.url()).await.unwrap().status, 429);
        let next = timeout(BOUND, get(&mut client, &server.url()))
            .await
            .expect("bounded by the longest delay")
            .unwrap();
        assert_eq!(next.status, 200, "{retry}");
        assert!(
            next.waited >= Duration::from_millis(190),
            "{retry}: {:?}",
            next.waited
        );
    }
}

/// A server whose clock is 30 years behind: its `Retry-After` date is read against its own `Date`, so the wait is
/// the second it meant, neither nothing nor decades; an `X-RateLimit-Reset` in the past (no `Date`) is ignored.
#[tokio::test]
async fn a_clock_in_the_past_is_read_against_its_date() {
    let server = Scripted::start(|n| match n {
        0 => respond(
            429,
            &[
                ("date", "Tue, 15 Nov 1994 08:12:31 GMT"),
                ("retry-after", "Tue, 15 Nov 1994 08:12:32 GMT"),
            ],
        ),
        _ => respond(
            200,
            &[
                ("x-ratelimit-limit", "1"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1100000000"),
            ],
        ),
    })
    .await;
    let layer = PaceLayer::new();
    let mut client = paced(&layer);
    assert_eq!(get(&mut client, &server.url()).await.unwrap().status, 429);
    let next = timeout(BOUND, get(&mut client, &server.url()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.status, 200);
    assert!(next.waited >= Duration::from_secs(1), "{:?}", next.waited);
    // The reset in 2004 is no horizon: nothing waits for it.
    let (answers, _) = concurrently(&layer, &server.url(), 4).await;
    assert!(answers.iter().all(|a| a.waited.is_zero()), "{answers:?}");
}

/// A spent budget and a short longest wait: a typed error, or the request sent anyway, as the user chose.
#[tokio::test]
async fn the_longest_wait_fails_or_sends_as_chosen() {
    let server = Scripted::start(|_| respond(200, &[("ratelimit", r#""api";r=0;t=60"#)])).await;
    for (choice, sent) in [(OnMaxWait::Fail, false), (OnMaxWait::Send, true)] {
        let layer = PaceLayer::new()
            .max_wait(Duration::from_millis(100))
            .on_max_wait(choice);
        let mut client = paced(&layer);
        get(&mut client, &server.url()).await.unwrap();
        let before = server.arrivals().len();
        let result = timeout(BOUND, get(&mut client, &server.url()))
            .await
            .unwrap();
        match result {
            Ok(answer) => {
                assert!(sent, "{choice:?}");
                assert!(answer.waited >= Duration::from_millis(100));
            }
            Err(e) => {
                assert!(!sent, "{choice:?}");
                let e = e.downcast::<WaitedTooLong>().expect("typed");
                assert!(e.waited >= Duration::from_millis(100));
            }
        }
        assert_eq!(server.arrivals().len(), before + usize::from(sent));
    }
}

/// A refused request is answered, never retried by the layer: the server sees it once.
#[tokio::test]
async fn a_refusal_is_never_retried_by_the_layer() {
    let server = Scripted::start(|_| respond(429, &[("retry-after", "1")])).await;
    let layer = PaceLayer::new();
    let mut client = paced(&layer);
    assert_eq!(get(&mut client, &server.url()).await.unwrap().status, 429);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(server.arrivals().len(), 1);
}
