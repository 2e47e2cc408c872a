//! The paced client with retries: tower's retry layer around `tollgate::client`'s pacing layer.
//!
//! ```text
//! cargo run --example axum_server -- --limit 2 --period 3s &
//! cargo run --example paced_client_retry -- http://127.0.0.1:3000/ 6
//! ```
//!
//! The pacing layer never retries a request itself. Put tower's `RetryLayer` outside it and each retry goes
//! through the pacing again: after a 429 the scope is closed until the server's `Retry-After` (plus jitter), so the
//! retry waits exactly that long — the retry policy needs no backoff of its own, and retries by many callers leave
//! in the order they were queued, at the server's pace. Here a 429 is retried up to 3 times; other answers are
//! final. Another client spending the same quota is what makes a paced client see a 429 at all: this example
//! sends a few requests past the pacing (`--no-pacing` style) first to provoke one.

#![forbid(unsafe_code)]

use std::future::{Ready, ready};
use std::time::Instant;

use clap::Parser;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::client::{BoxError, PaceLayer};
use tower::retry::{Policy, RetryLayer};
use tower::{Service, ServiceBuilder, ServiceExt as _};

#[path = "common/cli.rs"]
mod cli;

/// Sends requests through tower's retry layer around the pacing layer, provoking a 429 on the way.
#[derive(Debug, Parser)]
#[command(name = "paced_client_retry")]
struct Args {
    /// The server.
    #[arg(default_value = "http://127.0.0.1:3000/", value_parser = cli::absolute_url)]
    url: http::Uri,
    /// Requests to send through the pacing.
    #[arg(default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,
}

/// Retries a 429 up to `left` more times, at once: the pacing layer underneath does the waiting.
#[derive(Clone)]
struct RetryRefusals {
    left: u32,
}

impl<B> Policy<Request<Empty<Bytes>>, Response<B>, BoxError> for RetryRefusals {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _request: &mut Request<Empty<Bytes>>,
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
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.headers_mut() = request.headers().clone();
        Some(copy)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let Args { url, count } = cli::parse();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut paced = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryRefusals { left: 3 }))
        .layer(PaceLayer::new())
        .service(client.clone());
    let started = Instant::now();
    for i in 0..count {
        if i == 1 {
            // Someone else spends the quota: the next paced request is refused, then retried after Retry-After.
            for _ in 0..3 {
                let request = Request::get(url.clone()).body(Empty::new())?;
                let _ = client.request(request).await?.into_body().collect().await;
            }
        }
        let request = Request::get(url.clone()).body(Empty::new())?;
        let response = paced.ready().await?.call(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        println!(
            "{:>6.2}s  request {i}: {status}",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
