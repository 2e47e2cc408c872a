//! The layer's metrics, through a Prometheus recorder (its own test binary: the recorder is process-wide): every
//! request's wait in `tollgate_client_wait_seconds`, every refusal in `tollgate_client_refused_total` by reason.

mod support;

use std::time::Duration;

use support::{Scripted, get, paced, respond};
use tollgate_client::PaceLayer;

#[tokio::test]
async fn waits_and_refusals_are_counted() {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder");
    let server = Scripted::start(|n| match n {
        0 => respond(429, &[("retry-after", "0")]),
        1 => respond(503, &[]),
        _ => respond(200, &[]),
    })
    .await;
    let layer = PaceLayer::new().default_retry(Duration::from_millis(100));
    let mut client = paced(&layer);
    for status in [429, 503, 200] {
        assert_eq!(
            get(&mut client, &server.url()).await.unwrap().status,
            status
        );
    }
    let text = handle.render();
    assert!(
        text.contains(r#"tollgate_client_refused_total{reason="http_429"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tollgate_client_refused_total{reason="http_503"} 1"#),
        "{text}"
    );
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_client_wait_seconds_count "))
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert_eq!(count, Some(3), "{text}");
}
