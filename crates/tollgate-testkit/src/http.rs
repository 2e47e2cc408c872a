//! One HTTP/1.1 exchange over a fresh TCP connection, as a client on the network sees the example servers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// What a server answered: the status, the headers (names in lower case) and the body.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The header fields, names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
}

impl Reply {
    /// The first value of header `name` (lower case).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The remaining (`r=`) of the `RateLimit` header field, if there is one.
    #[must_use]
    pub fn remaining(&self) -> Option<u64> {
        self.header("ratelimit")?
            .split(';')
            .find_map(|p| p.trim().strip_prefix("r="))?
            .trim()
            .parse()
            .ok()
    }
}

/// `GET path` with `headers` over a new connection (`connection: close`), read to its end.
///
/// # Panics
/// If the server cannot be reached, does not answer within 20 s, or answers without a status line.
#[must_use]
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    exchange(addr, "GET", path, headers, "")
}

/// `POST path` with `headers` and `body` (its `content-length` added) over a new connection, read to its end (a
/// chunked body as it came, framing included).
///
/// # Panics
/// As [`get`].
#[must_use]
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let length = body.len().to_string();
    let mut all = headers.to_vec();
    all.push(("content-length", &length));
    exchange(addr, "POST", path, &all, body)
}

fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("a read timeout");
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: example\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}
