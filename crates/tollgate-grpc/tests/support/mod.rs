//! Real gRPC servers for the tests: tonic on a free loopback port, the services from `proto/`, and a guard that
//! stands for a concurrency permit living in a response body.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tower_layer::Layer;
use tower_service::Service;

pub mod helloworld {
    include!("../../proto/helloworld.rs");
}

pub mod countdown {
    include!("../../proto/countdown.rs");
}

use countdown::countdown_server::{Countdown, CountdownServer};
use countdown::{CountReply, CountRequest};
use helloworld::greeter_server::{Greeter, GreeterServer};
use helloworld::{HelloReply, HelloRequest};

pub struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        Ok(Response::new(HelloReply {
            message: format!("Hello {}!", req.into_inner().name),
        }))
    }
}

/// Streams `from` down to 0, one message per permit the test adds to `go`: the test decides when a stream ends.
pub struct Counter {
    pub go: Arc<Semaphore>,
}

#[tonic::async_trait]
impl Countdown for Counter {
    type CountStream = ReceiverStream<Result<CountReply, Status>>;

    async fn count(
        &self,
        req: Request<CountRequest>,
    ) -> Result<Response<Self::CountStream>, Status> {
        let from = req.into_inner().from;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let go = self.go.clone();
        tokio::spawn(async move {
            for value in (0..=from).rev() {
                let Ok(permit) = go.acquire().await else {
                    return;
                };
                permit.forget();
                if tx.send(Ok(CountReply { value })).await.is_err() {
                    return; // the client went away
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn ping(&self, req: Request<CountRequest>) -> Result<Response<CountReply>, Status> {
        Ok(Response::new(CountReply {
            value: req.into_inner().from,
        }))
    }
}

/// A server behind `layer` serving Greeter and Countdown; returns its address and the Countdown's step gate.
pub async fn serve<L>(layer: L) -> (SocketAddr, Arc<Semaphore>)
where
    L: Layer<tonic::service::Routes> + Clone + Send + Sync + 'static,
    L::Service: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Future: Send + 'static,
    <L::Service as Service<http::Request<tonic::body::Body>>>::Error:
        Into<tollgate_tower::BoxError> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("the bound address");
    let go = Arc::new(Semaphore::new(0));
    let router = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(GreeterServer::new(Hello))
        .add_service(CountdownServer::new(Counter { go: go.clone() }));
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("the test server failed");
    });
    (addr, go)
}

pub async fn greeter(
    addr: SocketAddr,
) -> helloworld::greeter_client::GreeterClient<tonic::transport::Channel> {
    helloworld::greeter_client::GreeterClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the server")
}

pub async fn countdown(
    addr: SocketAddr,
) -> countdown::countdown_client::CountdownClient<tonic::transport::Channel> {
    countdown::countdown_client::CountdownClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

pub fn hello(name: &str) -> Request<HelloRequest> {
    Request::new(HelloRequest {
        name: name.to_owned(),
    })
}

pub fn with_api_key<T>(mut req: Request<T>, key: &str) -> Request<T> {
    req.metadata_mut()
        .insert("x-api-key", key.parse().expect("an ASCII key"));
    req
}

/// The text of a metadata entry, or a panic naming it.
pub fn meta<'a>(md: &'a tonic::metadata::MetadataMap, name: &str) -> &'a str {
    md.get(name)
        .unwrap_or_else(|| panic!("no {name} metadata in {md:?}"))
        .to_str()
        .expect("ASCII metadata")
}

/// Waits (bounded) until `done` holds: for effects that happen on the server after the client has its answer.
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Counts the guards alive: a stand-in for a concurrency permit, which a limiter keeps in the response body so
/// it lives until the body (the stream) is finished or dropped.
#[derive(Clone, Default)]
pub struct GuardLayer {
    pub alive: Arc<AtomicUsize>,
}

impl GuardLayer {
    pub fn alive(&self) -> usize {
        self.alive.load(Ordering::SeqCst)
    }
}

impl<S> Layer<S> for GuardLayer {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded {
            inner,
            alive: self.alive.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    alive: Arc<AtomicUsize>,
}

pub struct Guard(Arc<AtomicUsize>);

impl Guard {
    fn new(alive: &Arc<AtomicUsize>) -> Self {
        alive.fetch_add(1, Ordering::SeqCst);
        Self(alive.clone())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<S, Req, B> Service<Req> for Guarded<S>
where
    S: Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
{
    type Response = http::Response<GuardedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let guard = Guard::new(&self.alive);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let response = fut.await?;
            Ok(response.map(|body| GuardedBody {
                body,
                _guard: guard,
            }))
        })
    }
}

pub struct GuardedBody<B> {
    body: B,
    _guard: Guard,
}

impl<B: http_body::Body + Unpin> http_body::Body for GuardedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
