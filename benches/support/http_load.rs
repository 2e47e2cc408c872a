//! A tiny HTTP/1.1 load generator and server for the axum benches: keep-alive connections, one request in flight
//! each, no allocation per request on the client side (it must stay cheaper than the servers it measures).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Serves `app` on a fresh loopback port (with the peer address, which every limiter keys on) from a task.
pub(crate) async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("a local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    addr
}

/// One keep-alive connection sending `GET /` while `more()` says so; counts 200 responses in `done` (anything
/// else is fatal).
pub(crate) async fn connection(
    addr: SocketAddr,
    more: impl Fn() -> bool,
    done: &AtomicU64,
) -> Result<(), String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let request = b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n";
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    // Every response to the same request has the same shape: once one is parsed, the next is recognised by its
    // status line and its blank line at the same place, and parsed again only when they are not there (the client
    // must not spend more on a response with many header fields than a client that knew the server would).
    let mut expected: Option<(usize, usize)> = None;
    while more() {
        stream.write_all(request).await.map_err(|e| e.to_string())?;
        let (head_len, body_len) = loop {
            if let Some((head_len, body_len)) = expected
                && buf.len() >= head_len
                && buf.starts_with(b"HTTP/1.1 200 ")
                && buf[..head_len].ends_with(b"\r\n\r\n")
            {
                break (head_len, body_len);
            }
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end]).map_err(|e| e.to_string())?;
                if !head.starts_with("HTTP/1.1 200") {
                    return Err(format!("unexpected response: {head}"));
                }
                let len = content_length(head).ok_or("no content-length")?;
                expected = Some((end + 4, len));
                break (end + 4, len);
            }
            let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        while buf.len() < head_len + body_len {
            let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        buf.drain(..head_len + body_len);
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// The `content-length` of a response head, without allocating.
fn content_length(head: &str) -> Option<usize> {
    head.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}
