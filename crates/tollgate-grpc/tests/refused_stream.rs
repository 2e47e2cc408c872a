//! A refused call's stream ends as the client ends it: the server reads the message it did not need instead of
//! resetting the stream under a client still sending it (which a client can see as a broken pipe instead of the
//! status). Driven frame by frame with a raw HTTP/2 client over TCP, so the order is fixed: the refusal arrives
//! before the client has sent its message.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::serve;
use tollgate_core::{MemoryStore, Policy, Quota};
use tollgate_grpc::GrpcLimitLayer;
use tollgate_tower::RateLimitLayer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `helloworld.HelloRequest { name: "ann" }` as one gRPC message: not compressed, 5 bytes long.
const MESSAGE: &[u8] = &[0, 0, 0, 0, 5, 0x0a, 3, b'a', b'n', b'n'];

fn call(uri: &str) -> http::Request<()> {
    http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a valid request")
}

#[tokio::test]
async fn a_refused_call_is_read_to_its_end_not_reset() -> TestResult {
    // One call an hour: the first is admitted, every later one refused.
    let policy = Policy::token_bucket(Quota::per_hour(1)?);
    let layer = GrpcLimitLayer::new(RateLimitLayer::new(
        "one-an-hour",
        policy,
        Arc::new(MemoryStore::new()),
        "everyone",
    ));
    let (addr, _) = serve(layer).await;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (client, connection) = h2::client::handshake(tcp).await?;
    tokio::spawn(connection);
    let mut client = client.ready().await?;
    let uri = format!("http://{addr}/helloworld.Greeter/SayHello");
    let within = Duration::from_secs(10);

    // The admitted call spends the hour's one request; its reply is read to its end.
    let (response, mut send) = client.send_request(call(&uri), false)?;
    send.send_data(Bytes::from_static(MESSAGE), true)?;
    let mut body = tokio::time::timeout(within, response).await??.into_body();
    while body.data().await.transpose()?.is_some() {}

    // The refused call: headers sent, no message yet. The limiter decides on the headers alone.
    client = client.ready().await?;
    let (response, mut send) = client.send_request(call(&uri), false)?;
    let response = tokio::time::timeout(within, response).await??;
    // Trailers-only: grpc-status 8 (RESOURCE_EXHAUSTED) in the headers.
    assert_eq!(response.headers()["grpc-status"], "8");
    assert!(response.body().is_end_stream());
    // Now the client sends its message and ends its side (a stream already reset refuses it).
    if let Err(e) = send.send_data(Bytes::from_static(MESSAGE), true) {
        panic!("the refused stream was reset before the client could end it: {e}");
    }

    // One more call on the connection: the server handles frames in order, so any reset of the refused stream
    // would have reached the client before this call's answer.
    client = client.ready().await?;
    let (after, mut send_after) = client.send_request(call(&uri), false)?;
    send_after.send_data(Bytes::from_static(MESSAGE), true)?;
    let after = tokio::time::timeout(within, after).await??;
    assert_eq!(after.headers()["grpc-status"], "8");
    let reset = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match send.poll_reset(cx) {
            std::task::Poll::Ready(reason) => Some(reason),
            std::task::Poll::Pending => None,
        })
    })
    .await;
    assert!(
        reset.is_none(),
        "the refused stream was reset ({reset:?}) instead of read to its end"
    );
    Ok(())
}
