//! Serving: the rate limit service and `grpc.health.v1.Health` on one listener, a graceful shutdown (the listener
//! closes, health turns `NOT_SERVING`, requests in flight are answered), and the configuration directory reloaded
//! without a restart.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tollgate_core::Store;

use crate::config::{ConfigDir, RateLimitConfig};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::service::RateLimitService;

/// Serves `service` and health on `listener` until `shutdown` completes, then answers the requests in flight and
/// returns.
///
/// # Errors
/// When the listener fails.
pub async fn serve<S: Store>(
    listener: TcpListener,
    service: RateLimitService<S>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RateLimitService<S>>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let stopping = async move {
        shutdown.await;
        health
            .set_not_serving::<RateLimitServiceServer<RateLimitService<S>>>()
            .await;
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        tracing::info!("shutting down: answering the requests in flight");
    };
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, stopping)
        .await
}

/// Watches a configuration directory: every `interval`, and whenever `poke` yields (a SIGHUP), the files are read
/// again; if anything changed they are loaded and swapped in whole. A set that does not load keeps the one before
/// and says why (logged at ERROR, counted in `tollgate_rls_config_loads_total{result="error"}`), once per change.
#[derive(Debug)]
pub struct Reloader {
    dir: ConfigDir,
    config: Arc<ArcSwap<RateLimitConfig>>,
    last: crate::config::dir::Snapshot,
}

impl Reloader {
    /// Loads `dir` once: the configuration to serve, and the reloader that keeps it current.
    ///
    /// # Errors
    /// When the directory cannot be read or a file is not a valid configuration.
    pub fn load(dir: ConfigDir) -> Result<Self, crate::config::DirError> {
        let last = dir.read()?;
        let loaded = dir.load_snapshot(&last);
        crate::metrics::config_load(loaded.is_ok());
        let config = Arc::new(ArcSwap::from_pointee(loaded?));
        Ok(Self { dir, config, last })
    }

    /// The configuration being served, which [`run`](Self::run) swaps.
    #[must_use]
    pub fn config(&self) -> Arc<ArcSwap<RateLimitConfig>> {
        Arc::clone(&self.config)
    }

    /// Reads the directory again and applies a change. Returns whether a new set was loaded.
    pub fn reload(&mut self) -> bool {
        let snapshot = match self.dir.read() {
            Ok(snapshot) => snapshot,
            Err(e) => {
                tracing::error!(error = %e, "configuration not reloaded, the loaded one stays");
                return false;
            }
        };
        if snapshot == self.last {
            return false;
        }
        let loaded = self.dir.load_snapshot(&snapshot);
        self.last = snapshot;
        crate::metrics::config_load(loaded.is_ok());
        match loaded {
            Ok(config) => {
                tracing::info!(
                    domains = config.domains().len(),
                    files = config.files(),
                    "configuration reloaded"
                );
                self.config.store(Arc::new(config));
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "configuration not reloaded, the loaded one stays");
                false
            }
        }
    }

    /// Reloads every `interval` and on every `poke`, forever.
    pub async fn run<P, F>(mut self, interval: Duration, mut poke: P)
    where
        P: FnMut() -> F,
        F: Future<Output = ()>,
    {
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = poke() => {}
            }
            self.reload();
        }
    }
}
