//! A minimal keep-alive HTTP/1.1 client over one tokio `TcpStream`: the cheapest way to drive a loopback server
//! back to back, so that the client's own cost stays small beside the server's (no pool, no executor, no body
//! type; one request at a time per connection).
//!
//! It reads what axum/hyper send: a status line, headers, and a body of `Content-Length` bytes or chunked.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The largest response head accepted: a server that sends more is broken, not slow.
const MAX_HEAD: usize = 64 * 1024;

/// The largest body accepted (the Prometheus page of one server is a few tens of kB).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// One keep-alive connection.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    /// Bytes read and not yet consumed, from `start`.
    buf: Vec<u8>,
    start: usize,
}

/// One response.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The status code.
    pub(crate) status: u16,
    /// The header block (lines after the status line), kept only when asked for ([`Conn::get_full`]).
    pub(crate) head: Option<String>,
    /// The body.
    pub(crate) body: Vec<u8>,
    /// The server said `Connection: close`: the connection cannot be used again.
    pub(crate) closing: bool,
}

impl Reply {
    /// The first header named `name` (lower case), when the head was kept.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.head.as_deref()?.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then_some(value.trim())
        })
    }
}

/// A malformed response (the error kind is `InvalidData`).
fn bad(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

impl Conn {
    /// Connects to `addr`, with Nagle's algorithm off (one small request, then wait: no coalescing wanted).
    pub(crate) async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(8 * 1024),
            start: 0,
        })
    }

    /// `GET path`, the response's head dropped.
    pub(crate) async fn get(&mut self, path: &str) -> io::Result<Reply> {
        self.request(path, false).await
    }

    /// `GET path`, the response's head kept (for [`Reply::header`]).
    pub(crate) async fn get_full(&mut self, path: &str) -> io::Result<Reply> {
        self.request(path, true).await
    }

    async fn request(&mut self, path: &str, keep_head: bool) -> io::Result<Reply> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        self.stream.write_all(request.as_bytes()).await?;
        let head_len = self.fill_until_head().await?;
        let head = std::str::from_utf8(&self.buf[self.start..self.start + head_len - 4])
            .map_err(|_| bad("response head is not UTF-8"))?;
        let (status_line, rest) = head.split_once("\r\n").unwrap_or((head, ""));
        let status = parse_status(status_line)?;
        let mut length = None;
        let mut chunked = false;
        let mut closing = false;
        for line in rest.split("\r\n") {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let (key, value) = (key.trim(), value.trim());
            if key.eq_ignore_ascii_case("content-length") {
                length = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| bad(format!("Content-Length {value:?}")))?,
                );
            } else if key.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            } else if key.eq_ignore_ascii_case("connection") {
                closing = value.eq_ignore_ascii_case("close");
            }
        }
        let kept = keep_head.then(|| rest.to_owned());
        self.start += head_len;
        let body = match (chunked, length) {
            (true, _) => self.read_chunked().await?,
            (false, Some(n)) if n > MAX_BODY => return Err(bad(format!("a body of {n} bytes"))),
            (false, Some(n)) => self.take(n).await?,
            // Neither: HTTP/1.1 says the body runs to the end of the connection; hyper never does this for
            // these routes, and a harness that waited for it would hang, so it is an error.
            (false, None) if status == 204 || status == 304 => Vec::new(),
            (false, None) => return Err(bad("a response without Content-Length or chunking")),
        };
        self.compact();
        Ok(Reply {
            status,
            head: kept,
            body,
            closing,
        })
    }

    /// Reads until the buffer holds a whole head; its length with the blank line.
    async fn fill_until_head(&mut self) -> io::Result<usize> {
        loop {
            if let Some(at) = find(&self.buf[self.start..], b"\r\n\r\n") {
                return Ok(at + 4);
            }
            if self.buf.len() - self.start > MAX_HEAD {
                return Err(bad("a response head over 64 KiB"));
            }
            self.read_more().await?;
        }
    }

    /// Reads once more from the socket into the buffer; EOF is an error (a request is outstanding).
    async fn read_more(&mut self) -> io::Result<()> {
        let mut chunk = [0_u8; 8 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// The next `n` bytes.
    async fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() - self.start < n {
            self.read_more().await?;
        }
        let out = self.buf[self.start..self.start + n].to_vec();
        self.start += n;
        Ok(out)
    }

    /// The next line, without its CRLF.
    async fn line(&mut self) -> io::Result<String> {
        loop {
            if let Some(at) = find(&self.buf[self.start..], b"\r\n") {
                let line =
                    String::from_utf8_lossy(&self.buf[self.start..self.start + at]).into_owned();
                self.start += at + 2;
                return Ok(line);
            }
            if self.buf.len() - self.start > MAX_HEAD {
                return Err(bad("a chunk-size line over 64 KiB"));
            }
            self.read_more().await?;
        }
    }

    /// A chunked body, its trailers dropped.
    async fn read_chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line = self.line().await?;
            let size = line.split(';').next().unwrap_or("").trim();
            let size =
                usize::from_str_radix(size, 16).map_err(|_| bad(format!("chunk size {size:?}")))?;
            if size == 0 {
                // Trailers, up to the blank line.
                while !self.line().await?.is_empty() {}
                return Ok(body);
            }
            if body.len() + size > MAX_BODY {
                return Err(bad("a chunked body over 16 MiB"));
            }
            body.extend(self.take(size).await?);
            if !self.line().await?.is_empty() {
                return Err(bad("a chunk not followed by CRLF"));
            }
        }
    }

    /// Drops the consumed bytes, so the buffer does not grow over a long run.
    fn compact(&mut self) {
        if self.start == self.buf.len() {
            self.buf.clear();
        } else {
            self.buf.drain(..self.start);
        }
        self.start = 0;
    }
}

/// `HTTP/1.1 200 OK` → 200.
fn parse_status(line: &str) -> io::Result<u16> {
    let mut words = line.split(' ');
    match (words.next(), words.next().map(str::parse::<u16>)) {
        (Some(v), Some(Ok(code))) if v.starts_with("HTTP/1.") => Ok(code),
        _ => Err(bad(format!("status line {line:?}"))),
    }
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One GET on a fresh connection, head kept: for the few requests that are not load (health, metrics, probes).
pub(crate) async fn get_once(addr: SocketAddr, path: &str) -> io::Result<Reply> {
    Conn::connect(addr).await?.get_full(path).await
}
