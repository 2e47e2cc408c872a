//! A TCP proxy that delays every reply: a Redis some milliseconds away (another zone, another region) on this
//! machine, or one that stalls for a while and then answers again.
//!
//! What the client sends goes through at once; what the server sends back is held for the proxy's delay (each
//! chunk from the instant it arrived, so pipelined replies keep their spacing) and, during a stall, until the stall
//! ends. The delay can be changed while connections are open.
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate_testkit::proxy::LatencyProxy;
//!
//! let proxy = LatencyProxy::start("127.0.0.1:6379", Duration::from_millis(20));
//! let url = proxy.url(); // redis://127.0.0.1:PORT, every reply 20 ms late
//! proxy.stall(Duration::from_secs(1)); // nothing comes back for a second
//! # drop(url);
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A running proxy; it stops accepting when dropped (open connections end with their peers).
#[derive(Debug)]
pub struct LatencyProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// The delay of every reply, in microseconds.
    delay_micros: AtomicU64,
    /// Microseconds since `epoch` until which nothing is sent back (0: no stall).
    stalled_until: AtomicU64,
    epoch: Instant,
    stopped: AtomicBool,
}

impl Shared {
    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }
}

impl LatencyProxy {
    /// A proxy on a free loopback port to `upstream` (`host:port`), delaying each reply by `delay`.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    #[must_use]
    pub fn start(upstream: &str, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared {
            delay_micros: AtomicU64::new(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX)),
            stalled_until: AtomicU64::new(0),
            epoch: Instant::now(),
            stopped: AtomicBool::new(false),
        });
        let upstream = upstream.to_owned();
        let accepting = Arc::clone(&shared);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                pipe(client, server, Arc::clone(&accepting));
            }
        });
        Self { addr, shared }
    }

    /// The proxy's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` and the proxy's address.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sets the delay of every reply from now on.
    pub fn set_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.delay_micros.store(micros, Ordering::Relaxed);
    }

    /// Sends nothing back for `length` from now (replies that arrive meanwhile are held, then sent in order).
    pub fn stall(&self, length: Duration) {
        let until = self.shared.micros(Instant::now() + length);
        self.shared.stalled_until.store(until, Ordering::Relaxed);
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Forwards `client` to `server` at once and `server` back to `client` late.
fn pipe(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(mut client_in), Ok(mut server_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    thread::spawn(move || {
        let _ = std::io::copy(&mut client_in, &mut server_out);
        let _ = server_out.shutdown(Shutdown::Write);
    });
    let (chunks, late) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut server_in = server;
    thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        loop {
            match server_in.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if chunks.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut client_out = client;
    thread::spawn(move || {
        for (arrived, chunk) in late {
            let delay = Duration::from_micros(shared.delay_micros.load(Ordering::Relaxed));
            let mut due = arrived + delay;
            let stalled = shared.stalled_until.load(Ordering::Relaxed);
            if stalled > 0 {
                due = due.max(shared.epoch + Duration::from_micros(stalled));
            }
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            if client_out.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = client_out.shutdown(Shutdown::Write);
    });
}
