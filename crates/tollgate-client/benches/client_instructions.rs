//! The pacing layer's own cost on a request that does not wait, in instructions per request counted by valgrind,
//! beside a bare hyper-util client (the `axum_instructions` method, client side).
//!
//! `cargo bench -p tollgate-client --bench client_instructions [-- --requests 4000]` (needs `valgrind`): for each
//! variant this binary runs itself under `valgrind --tool=callgrind`; the child serves a minimal hyper server on a
//! loopback port and sends it `N` requests one after another through a hyper-util client (one thread, one
//! keep-alive connection). Only those `N` requests are counted (`--toggle-collect`), client and server alike, so
//! "added" — a variant's instructions per request less its peer's — is what the layer costs a request: the scope
//! lookup, the budget's lock, the response read (its fields parsed when the server sends them), the body wrapper.
//! The server's answers never make the client wait (`r` far above the requests sent).

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response};
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tollgate_client::PaceLayer;
use tower::{Service, ServiceExt as _};

struct Variant {
    name: &'static str,
    paced: bool,
    fields: bool,
    peer: usize,
}

const VARIANTS: [Variant; 4] = [
    Variant {
        name: "bare client, no fields",
        paced: false,
        fields: false,
        peer: 0,
    },
    Variant {
        name: "paced, no fields",
        paced: true,
        fields: false,
        peer: 0,
    },
    Variant {
        name: "bare client, RateLimit fields",
        paced: false,
        fields: true,
        peer: 2,
    },
    Variant {
        name: "paced, RateLimit fields",
        paced: true,
        fields: true,
        peer: 2,
    },
];

/// A server answering 200 to everything, with RateLimit fields that never make a client wait, or none.
async fn serve(fields: bool) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_: Request<Incoming>| async move {
                    let mut response = Response::builder().status(200);
                    if fields {
                        response = response
                            .header("ratelimit-policy", r#""api";q=1000000000;w=1"#)
                            .header("ratelimit", r#""api";r=999999999;t=1"#);
                    }
                    Ok::<_, Infallible>(
                        response.body(Full::new(Bytes::from_static(b"ok"))).unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// `requests` GETs one after another through `client`.
async fn send<S, B>(client: &mut S, url: &http::Uri, requests: u64)
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: hyper::body::Body,
    B::Error: std::fmt::Debug,
{
    for _ in 0..requests {
        let request = Request::get(url.clone()).body(Empty::new()).unwrap();
        let response = client.ready().await.unwrap().call(request).await.unwrap();
        response.into_body().collect().await.unwrap();
    }
}

/// The only code callgrind counts: `requests` requests, once the connection, the scope and its budget exist.
#[inline(never)]
fn measured_requests(runtime: &tokio::runtime::Runtime, run: impl Future<Output = ()>) {
    runtime.block_on(run);
}

fn child(v: usize, requests: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let variant = &VARIANTS[v];
    let addr = runtime.block_on(serve(variant.fields));
    let url: http::Uri = format!("http://{addr}/").parse().unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    if variant.paced {
        let mut paced = tower::Layer::layer(&PaceLayer::new(), client);
        runtime.block_on(send(&mut paced, &url, 1_000));
        measured_requests(&runtime, send(&mut paced, &url, requests));
    } else {
        let mut bare = client;
        runtime.block_on(send(&mut bare, &url, 1_000));
        measured_requests(&runtime, send(&mut bare, &url, requests));
    }
}

fn count(v: usize, requests: u64) -> Result<f64, String> {
    let args = ["--child".to_owned(), v.to_string(), requests.to_string()];
    let total = tollgate_testkit::callgrind::instructions("*measured_requests*", &args)?;
    Ok(total as f64 / requests as f64)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, v, n] = args.as_slice()
        && flag == "--child"
    {
        child(v.parse().expect("a variant"), n.parse().expect("a count"));
        return;
    }
    let mut requests: u64 = 4_000;
    let mut rest = args.iter().filter(|a| *a != "--bench");
    while let Some(flag) = rest.next() {
        match (flag.as_str(), rest.next().map(|v| v.parse())) {
            ("--requests", Some(Ok(n))) if n > 0 => requests = n,
            _ => {
                eprintln!("usage: client_instructions [--requests N]");
                std::process::exit(2);
            }
        }
    }
    println!(
        "instructions per HTTP request (callgrind; hyper-util client + hyper server, one thread, one keep-alive \
         connection, {requests} requests per variant)"
    );
    let counts: Vec<f64> = (0..VARIANTS.len())
        .map(|v| {
            count(v, requests).unwrap_or_else(|e| {
                eprintln!("client_instructions: {e}");
                std::process::exit(2)
            })
        })
        .collect();
    println!(
        "{:<32} {:>12} {:>12} {:>8}",
        "variant", "instr/req", "added", "ratio"
    );
    for (v, variant) in VARIANTS.iter().enumerate() {
        let peer = counts[variant.peer];
        println!(
            "{:<32} {:>12.0} {:>+12.0} {:>7.3}x  (vs {})",
            variant.name,
            counts[v],
            counts[v] - peer,
            counts[v] / peer,
            VARIANTS[variant.peer].name
        );
    }
}
