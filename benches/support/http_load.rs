//! A tiny HTTP/1.1 load generator and server for the axum benches: keep-alive connections, one request in flight
//! each, no allocation per request on the client side (it must stay cheaper than the servers it measures).

use std::net::SocketAddr;

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

/// One keep-alive connection sending `GET /`, one request in flight.
pub(crate) struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
    chunk: Box<[u8; 4096]>,
    // Every response to the same request has the same shape: once one is parsed, the next is recognised by its
    // status line and its blank line at the same place, and parsed again only when they are not there (the
    // client must not spend more on a response with many header fields than a client that knew the server would).
    expected: Option<(usize, usize)>,
}

impl Client {
    /// Connects to `addr`.
    pub(crate) async fn connect(addr: SocketAddr) -> Result<Self, String> {
        let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(4096),
            chunk: Box::new([0; 4096]),
            expected: None,
        })
    }

    /// Sends one request and reads its response, which must be a 200.
    pub(crate) async fn request(&mut self) -> Result<(), String> {
        const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n";
        self.stream
            .write_all(REQUEST)
            .await
            .map_err(|e| e.to_string())?;
        let (head_len, body_len) = loop {
            if let Some((head_len, body_len)) = self.expected
                && self.buf.len() >= head_len
                && self.buf.starts_with(b"HTTP/1.1 200 ")
                && self.buf[..head_len].ends_with(b"\r\n\r\n")
            {
                break (head_len, body_len);
            }
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end]).map_err(|e| e.to_string())?;
                if !head.starts_with("HTTP/1.1 200") {
                    return Err(format!("unexpected response: {head}"));
                }
                let len = content_length(head).ok_or("no content-length")?;
                self.expected = Some((end + 4, len));
                break (end + 4, len);
            }
            self.read().await?;
        };
        while self.buf.len() < head_len + body_len {
            self.read().await?;
        }
        self.buf.drain(..head_len + body_len);
        Ok(())
    }

    async fn read(&mut self) -> Result<(), String> {
        let n = self
            .stream
            .read(&mut self.chunk[..])
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".to_owned());
        }
        self.buf.extend_from_slice(&self.chunk[..n]);
        Ok(())
    }
}

/// The `content-length` of a response head, without allocating.
fn content_length(head: &str) -> Option<usize> {
    head.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}
