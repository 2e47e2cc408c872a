//! The Sentinel client with the store's TLS material and credentials, and the watcher that follows a Sentinel
//! failover.
//!
//! A new pooled connection asks the Sentinels for the primary of the master name (redis-rs checks the answer with
//! `ROLE`, so a replica is never handed out). Existing connections are replaced when their server answers
//! `READONLY` (a demoted primary keeps its clients), when their socket fails (a killed primary), and when any
//! Sentinel announces `+switch-master`: the watcher bumps the pool's generation and older connections are not
//! reused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
#[cfg(feature = "tls")]
use redis::TlsMode;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo};

use crate::BuildError;
use crate::backend::Watcher;
use crate::connect::{self, Resolved};

/// Parses `host:port` or a `redis://` / `rediss://` URL; a bare address uses TLS when certificates are given.
fn address(spec: &str, tls: bool) -> Result<ConnectionAddr, BuildError> {
    let spec = spec.trim();
    if spec.contains("://") {
        let info = spec
            .into_connection_info()
            .map_err(|e| BuildError::InvalidUrl(format!("Sentinel {spec:?}: {e}")))?;
        return Ok(info.addr().clone());
    }
    let (host, port) = spec
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .filter(|(h, _)| !h.is_empty())
        .ok_or_else(|| BuildError::InvalidUrl(format!("Sentinel {spec:?}: expected host:port")))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok(if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    })
}

/// A Sentinel client for `master` and whether it uses TLS.
pub(crate) fn client(
    sentinels: &[String],
    master: &str,
    security: &Resolved,
) -> Result<(SentinelClient, bool), BuildError> {
    if sentinels.is_empty() {
        return Err(BuildError::InvalidSetting("give at least one Sentinel"));
    }
    if master.is_empty() {
        return Err(BuildError::InvalidSetting("give the Sentinel master name"));
    }
    #[cfg(feature = "tls")]
    let certs = security.certificates.is_some();
    #[cfg(not(feature = "tls"))]
    let certs = false;
    let addrs = sentinels
        .iter()
        .map(|s| address(s, certs || connect::is_tls(s)))
        .collect::<Result<Vec<_>, _>>()?;
    let tls = addrs
        .iter()
        .any(|a| matches!(a, ConnectionAddr::TcpTls { .. }));
    #[cfg(not(feature = "tls"))]
    if tls {
        return Err(BuildError::InvalidSetting(
            "Sentinels over TLS need tollgate-redis's feature `tls` (tollgate: `redis-tls`)",
        ));
    }
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
        .map_err(|e| BuildError::InvalidUrl(e.to_string()))?;
    #[cfg(feature = "tls")]
    if tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
    }
    #[cfg(feature = "tls")]
    if let Some(certs) = &security.certificates {
        builder = builder
            .set_client_to_redis_certificates(certs.clone())
            .set_client_to_sentinel_certificates(certs.clone());
    }
    if let Some(user) = &security.username {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = &security.password {
        builder = builder.set_client_to_redis_password(password);
    }
    #[cfg(feature = "tls")]
    let client = builder.build().map_err(connect::invalid_tls_material)?;
    #[cfg(not(feature = "tls"))]
    let client = builder
        .build()
        .map_err(|e| BuildError::InvalidUrl(e.to_string()))?;
    Ok((client, tls))
}

/// Subscribes to `+switch-master` on the Sentinels (one at a time, the next when one fails) and bumps
/// `generation` on each announcement.
pub(crate) fn watch(
    sentinels: &[String],
    tls: bool,
    security: &Resolved,
    generation: &Arc<AtomicU64>,
) -> Result<Watcher, BuildError> {
    let mut clients = Vec::new();
    for spec in sentinels {
        let addr = address(spec, tls)?;
        let info = addr
            .into_connection_info()
            .map_err(|e| BuildError::InvalidUrl(e.to_string()))?;
        #[cfg(feature = "tls")]
        let client = match &security.certificates {
            Some(certs) => redis::Client::build_with_tls(info, certs.clone())
                .map_err(connect::invalid_tls_material)?,
            None => redis::Client::open(info).map_err(|e| BuildError::InvalidUrl(e.to_string()))?,
        };
        #[cfg(not(feature = "tls"))]
        let client = {
            let _ = security;
            redis::Client::open(info).map_err(|e| BuildError::InvalidUrl(e.to_string()))?
        };
        clients.push(client);
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            "no tokio runtime: Sentinel's +switch-master is not watched (READONLY still is)"
        );
        return Ok(Watcher(None));
    };
    let generation = Arc::downgrade(generation);
    Ok(Watcher(Some(runtime.spawn(follow(clients, generation)))))
}

async fn follow(clients: Vec<redis::Client>, generation: Weak<AtomicU64>) {
    loop {
        for client in &clients {
            let Ok(mut pubsub) = client.get_async_pubsub().await else {
                continue;
            };
            if pubsub.subscribe("+switch-master").await.is_err() {
                continue;
            }
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                let Some(generation) = generation.upgrade() else {
                    return;
                };
                generation.fetch_add(1, Ordering::Relaxed);
                // Logged once the pool has moved on: a call that starts after this line gets a new connection.
                let what: String = message.get_payload().unwrap_or_default();
                tracing::info!(switch = %what, "Sentinel announced a new primary: reconnecting");
            }
        }
        if generation.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
