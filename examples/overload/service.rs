//! The service under test: a fixed pool of workers with a service time, so that requests beyond the pool queue
//! and latency grows with concurrency; and the designs that protect it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use tokio::sync::Semaphore;
use tollgate::http::HttpLimitLayer;
use tollgate::http::priority::HeaderPriority;
use tollgate::slot::MemorySlotStore;
use tollgate::stack::adaptive::{AdaptiveLimitLayer, Control};
use tollgate::tower::{ConcurrencyLimitLayer, WorkerShedLayer};

/// One way of protecting the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Design {
    Unprotected,
    StaticLimit,
    WorkerShedder,
    Gradient2,
    Aimd,
}

impl Design {
    pub(crate) const ALL: [Self; 5] = [
        Self::Unprotected,
        Self::StaticLimit,
        Self::WorkerShedder,
        Self::Gradient2,
        Self::Aimd,
    ];

    /// The name in tables and JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Unprotected => "no protection",
            Self::StaticLimit => "static concurrency limit",
            Self::WorkerShedder => "worker shedder",
            Self::Gradient2 => "adaptive gradient2",
            Self::Aimd => "adaptive aimd",
        }
    }
}

/// The service's shape: `workers` requests served at once, each taking `service_time`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) workers: u64,
    pub(crate) service_time: Duration,
}

impl Shape {
    /// Requests per second the pool serves when always busy.
    pub(crate) fn capacity(&self) -> f64 {
        self.workers as f64 / self.service_time.as_secs_f64()
    }
}

/// The worker pool. A job keeps its worker for the whole service time even if its client has gone (as most
/// servers' work does): that is how an unprotected queue turns into wasted work and collapse.
#[derive(Clone)]
struct Pool {
    workers: Arc<Semaphore>,
    service_time: Duration,
    /// Set when the run of this design is over: queued jobs then leave without working.
    closed: Arc<AtomicBool>,
}

async fn work(State(pool): State<Pool>) -> &'static str {
    let job = tokio::spawn(async move {
        let Ok(_worker) = pool.workers.acquire().await else {
            return;
        };
        if !pool.closed.load(Ordering::Relaxed) {
            tokio::time::sleep(pool.service_time).await;
        }
    });
    let _ = job.await;
    "done\n"
}

/// A running server of one design.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    /// The adaptive limiter's current limit, for designs that have one.
    pub(crate) limit: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
    closed: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

/// The static limit and the worker shedder's capacity, in requests in flight: twice the pool, so that what
/// queues waits at most one more service time.
pub(crate) fn static_capacity(shape: Shape) -> u64 {
    2 * shape.workers
}

/// The adaptive limiters' settings for `shape`: Netflix's defaults, but a minimum of a quarter of the pool (the
/// default 20 would be more than this small pool serves) and, for AIMD, 1.5 × the service time as the latency
/// above which it backs off (its objective).
pub(crate) fn gradient2(shape: Shape) -> Control {
    Control::gradient2()
        .min_limit((shape.workers / 4).max(1))
        .initial_limit(shape.workers)
        .max_limit(shape.workers * 20)
}

/// See [`gradient2`].
pub(crate) fn aimd(shape: Shape) -> Control {
    Control::aimd()
        .min_limit((shape.workers / 4).max(1))
        .initial_limit(shape.workers)
        .max_limit(shape.workers * 20)
        .timeout(shape.service_time.mul_f64(1.5))
}

/// Starts `design` in front of a fresh pool of `shape` on a free loopback port.
pub(crate) async fn start(design: Design, shape: Shape) -> Result<Server, String> {
    let closed = Arc::new(AtomicBool::new(false));
    let pool = Pool {
        workers: Arc::new(Semaphore::new(shape.workers as usize)),
        service_time: shape.service_time,
        closed: closed.clone(),
    };
    let routes = Router::new().route("/work", get(work));
    let mut limit: Option<Box<dyn Fn() -> u64 + Send + Sync>> = None;
    let routes = match design {
        Design::Unprotected => routes,
        Design::StaticLimit => {
            let everyone = |_: &http::Request<axum::body::Body>, key: &mut String| {
                key.push_str("instance");
                Ok(())
            };
            let layer = ConcurrencyLimitLayer::new(
                "static",
                static_capacity(shape),
                Arc::new(MemorySlotStore::new()),
                everyone,
            )
            .map_err(|e| e.to_string())?;
            routes.layer(HttpLimitLayer::new(layer))
        }
        Design::WorkerShedder => {
            let layer = WorkerShedLayer::new(static_capacity(shape), HeaderPriority::new())
                .map_err(|e| e.to_string())?;
            routes.layer(HttpLimitLayer::new(layer))
        }
        Design::Gradient2 | Design::Aimd => {
            let layer = if design == Design::Gradient2 {
                AdaptiveLimitLayer::new(gradient2(shape), HeaderPriority::new())
            } else {
                AdaptiveLimitLayer::new(aimd(shape), HeaderPriority::new())
            }
            .map_err(|e| e.to_string())?;
            let probe = layer.clone();
            limit = Some(Box::new(move || probe.limit()));
            routes.layer(HttpLimitLayer::new(layer))
        }
    };
    let app = routes.with_state(pool);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind a loopback port: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Server {
        addr,
        limit,
        closed,
        task,
    })
}
