//! tower's retry layer around the pacing layer, against `axum_server` over TCP: the layer itself answers a 429
//! (it never retries); with `RetryLayer` outside it, the retry waits out `Retry-After` in the pacing layer and is
//! admitted.

mod support;

use std::future::{Ready, ready};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use hyper::body::Bytes;
use support::{bare, get, paced};
use tollgate_client::{BoxError, PaceLayer};
use tollgate_testkit::examples::ExampleServer;
use tower::retry::{Policy, RetryLayer};

#[derive(Clone)]
struct RetryRefusals {
    left: u32,
}

impl<B> Policy<Request<Empty<Bytes>>, Response<B>, BoxError> for RetryRefusals {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<Empty<Bytes>>,
        result: &mut Result<Response<B>, BoxError>,
    ) -> Option<Self::Future> {
        let refused = matches!(result, Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS);
        (refused && self.left > 0).then(|| {
            self.left -= 1;
            ready(())
        })
    }

    fn clone_request(&mut self, request: &Request<Empty<Bytes>>) -> Option<Request<Empty<Bytes>>> {
        let mut copy = Request::new(Empty::new());
        *copy.uri_mut() = request.uri().clone();
        Some(copy)
    }
}

/// Spends the paced client's statement and then the bucket behind its back, so its next request is refused.
async fn provoke(
    server: &ExampleServer,
    client: &mut tollgate_client::Pace<support::Bare>,
) -> String {
    let url = format!("http://{}/", server.addr());
    assert_eq!(get(client, &url).await.unwrap().status, 200);
    while get(&mut bare(), &url).await.unwrap().status == 200 {}
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_answers_a_refusal_and_a_retry_layer_waits_it_out() {
    // One token per 1.5 s: `Retry-After: 2`.
    let server = ExampleServer::start("axum_server", &["--limit", "2", "--period", "3s"]);
    let layer = PaceLayer::new();
    let mut client = paced(&layer);
    let url = provoke(&server, &mut client).await;
    // The client's own statement said r=1: it sends, and the answer is the server's 429, not retried.
    assert_eq!(get(&mut client, &url).await.unwrap().status, 429);

    let server = ExampleServer::start("axum_server", &["--limit", "2", "--period", "3s"]);
    let mut client = paced(&PaceLayer::new());
    let url = provoke(&server, &mut client).await;
    let mut retrying = tower::Layer::layer(&RetryLayer::new(RetryRefusals { left: 3 }), client);
    let started = Instant::now();
    let answer = get(&mut retrying, &url).await.unwrap();
    assert_eq!(answer.status, 200);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
