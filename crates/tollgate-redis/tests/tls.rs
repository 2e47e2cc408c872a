//! TLS against private TLS-only servers (`--port 0 --tls-port …`) with certificates generated in the test: a
//! private CA, mutual TLS, a Cluster over TLS, and each way a TLS set-up can be wrong, which start-up reports as
//! its own typed error. An unreachable server at start-up is an outage, not an error.

mod common;

use std::time::{Duration, Instant};

use tollgate_core::{Outcome, Store};
use tollgate_redis::{BuildError, RedisStore};
use tollgate_testkit::redis::{RedisCluster, RedisServer};
use tollgate_testkit::tls::TlsFiles;

/// Generous: these tests need a healthy server, not a fast one.
const TIMEOUT: Duration = Duration::from_secs(5);

fn builder(server: &RedisServer, url: &str) -> tollgate_redis::RedisStoreBuilder {
    let files = server.tls().expect("a TLS server");
    RedisStore::builder(url)
        .namespace(tollgate_testkit::redis::unique_prefix("tls"))
        .timeout(TIMEOUT)
        .tls_ca_file(&files.ca)
}

async fn three_then_limited(store: &RedisStore) {
    let policy = common::hourly_bucket(3);
    for remaining in [2, 1, 0] {
        let d = store.check("k", &policy, 1).await.unwrap();
        assert_eq!((d.outcome, d.remaining), (Outcome::Allowed, remaining));
    }
    assert_eq!(
        store.check("k", &policy, 1).await.unwrap().outcome,
        Outcome::Limited
    );
}

#[tokio::test]
async fn a_tls_only_server_with_a_private_ca_decides() {
    let server = RedisServer::start_tls(false);
    assert!(server.url().starts_with("rediss://"));
    let store = builder(&server, &server.url()).build().await.unwrap();
    three_then_limited(&store).await;
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let server = RedisServer::start_tls(true);
    let files = server.tls().unwrap().clone();
    let store = builder(&server, &server.url())
        .tls_client_cert_files(&files.client_cert, &files.client_key)
        .build()
        .await
        .unwrap();
    three_then_limited(&store).await;
    // The same CA but no client certificate: the server refuses the handshake, a configuration error.
    let err = builder(&server, &server.url()).build().await.unwrap_err();
    assert!(matches!(err, BuildError::Tls(_)), "{err:?}");
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_untrusted() {
    let server = RedisServer::start_tls(false);
    let dir = std::env::temp_dir().join(tollgate_testkit::redis::unique_prefix("other-ca"));
    std::fs::create_dir_all(&dir).unwrap();
    let other = TlsFiles::unrelated_ca(&dir.join("ca.pem"));
    let err = builder(&server, &server.url())
        .tls_ca_file(&other)
        .build()
        .await
        .unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        matches!(err, BuildError::CertificateUntrusted(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("not trusted"), "{err}");
    // The system's roots do not know the test CA either.
    let err = RedisStore::builder(server.url())
        .timeout(TIMEOUT)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, BuildError::CertificateUntrusted(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_expired_certificate_is_its_own_error() {
    let server = RedisServer::start_tls_for(&TlsFiles::LOCAL_NAMES, true, false, &[]);
    let err = builder(&server, &server.url()).build().await.unwrap_err();
    assert!(matches!(err, BuildError::CertificateExpired(_)), "{err:?}");
    assert!(err.to_string().contains("expired"), "{err}");
}

#[tokio::test]
async fn a_certificate_for_another_host_is_its_own_error() {
    let server = RedisServer::start_tls_for(&["redis.elsewhere.example"], false, false, &[]);
    let err = builder(&server, &server.url()).build().await.unwrap_err();
    assert!(
        matches!(err, BuildError::CertificateHostMismatch(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_plaintext_url_against_a_tls_port_says_to_use_rediss() {
    let server = RedisServer::start_tls(false);
    let err = RedisStore::builder(server.plain_url())
        .timeout(TIMEOUT)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::TlsRequired(_)), "{err:?}");
    assert!(err.to_string().contains("rediss://"), "{err}");
}

#[tokio::test]
async fn a_tls_url_against_a_plaintext_port_is_a_tls_error() {
    let server = RedisServer::start();
    let url = server.url().replacen("redis://", "rediss://", 1);
    let err = RedisStore::builder(url)
        .timeout(TIMEOUT)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Tls(_)), "{err:?}");
}

#[tokio::test]
async fn a_ca_without_rediss_is_a_setting_error() {
    let server = RedisServer::start_tls(false);
    let err = builder(&server, &server.plain_url())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::InvalidSetting(_)), "{err:?}");
    let err = RedisStore::builder(server.url())
        .tls_ca_file("/nonexistent/ca.pem")
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::ReadFile { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
}

#[tokio::test]
async fn an_unreachable_server_at_start_up_is_an_outage_and_the_store_connects_when_it_comes_up() {
    let mut server = RedisServer::start_tls(false);
    server.kill();
    let store = builder(&server, &server.url())
        .circuit_breaker(3, Duration::from_millis(100))
        .build()
        .await
        .expect("an outage is not a configuration error");
    let policy = common::hourly_bucket(3);
    assert!(store.check("k", &policy, 1).await.is_err());
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let decision = loop {
        match store.check("k", &policy, 1).await {
            Ok(d) => break d,
            Err(e) => assert!(Instant::now() < deadline, "no reconnect: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (decision.outcome, decision.remaining),
        (Outcome::Allowed, 2)
    );
}

#[tokio::test]
async fn a_cluster_over_tls_decides() {
    let cluster = RedisCluster::start_tls(3);
    let ca = cluster.node(0).tls().unwrap().ca.clone();
    let urls = cluster.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")));
    let store = RedisStore::cluster_builder(urls)
        .namespace(tollgate_testkit::redis::unique_prefix("tls-cluster"))
        .timeout(TIMEOUT)
        .tls_ca_file(ca)
        .build()
        .await
        .unwrap();
    let policy = common::hourly_bucket(2);
    // Keys spread over the slots of every node.
    for i in 0..30 {
        let key = format!("client-{i}");
        assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
        assert!(store.check(&key, &policy, 1).await.unwrap().is_allowed());
        assert!(!store.check(&key, &policy, 1).await.unwrap().is_allowed());
    }
}
