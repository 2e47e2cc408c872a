//! What the client tests share: a hyper client behind the layer, and a scripted server over real TCP for the
//! answers no example server gives (garbage, lies, clocks in the past).
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;
use tollgate_client::{Pace, PaceLayer, Waited};
use tower::{Service, ServiceExt as _};

pub type Bare = Client<HttpConnector, Empty<Bytes>>;

/// A plain hyper-util client.
pub fn bare() -> Bare {
    Client::builder(TokioExecutor::new()).build_http()
}

/// `layer` around a hyper-util client.
pub fn paced(layer: &PaceLayer) -> Pace<Bare> {
    tower::Layer::layer(layer, bare())
}

/// What one call saw.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub waited: Duration,
    pub body: Bytes,
}

/// `GET url` through `service`, body read to its end.
pub async fn get<S, B>(service: &mut S, url: &str) -> Result<Answer, tollgate_client::BoxError>
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>>,
    S::Error: Into<tollgate_client::BoxError>,
    B: hyper::body::Body,
    B::Error: Into<tollgate_client::BoxError>,
{
    let request = Request::get(url).body(Empty::new()).expect("a request");
    let response = service
        .ready()
        .await
        .map_err(Into::into)?
        .call(request)
        .await
        .map_err(Into::into)?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(Into::into)?.to_bytes();
    Ok(Answer {
        status: parts.status,
        waited: parts
            .extensions
            .get::<Waited>()
            .map_or(Duration::ZERO, |w| w.0),
        headers: parts.headers,
        body,
    })
}

/// A scripted server's answer to its `n`th request (from 0).
pub type Script = dyn Fn(usize) -> Response<Full<Bytes>> + Send + Sync;

/// An HTTP/1.1 server on a loopback port that answers by a script and records when each request arrived.
pub struct Scripted {
    pub addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl Scripted {
    pub async fn start(
        script: impl Fn(usize) -> Response<Full<Bytes>> + Send + Sync + 'static,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("an address");
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let log = arrivals.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (script, log) = (script.clone(), log.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                        let n = {
                            let mut log = log.lock().unwrap();
                            log.push(Instant::now());
                            log.len() - 1
                        };
                        let response = script(n);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, arrivals }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// When each request arrived, in order.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap().clone()
    }
}

/// A response with `status` and `fields`.
pub fn respond(status: u16, fields: &[(&str, &str)]) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(status);
    for (name, value) in fields {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Full::new(Bytes::from_static(b"ok")))
        .expect("a response")
}
