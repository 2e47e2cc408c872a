//! The Cluster client builder with the store's TLS material and credentials.

use crate::BuildError;
use crate::connect::{self, Resolved};

/// A Cluster client builder with the store's TLS material and credentials.
pub(crate) fn builder(
    nodes: &[String],
    security: &Resolved,
) -> Result<redis::cluster::ClusterClientBuilder, BuildError> {
    let infos = nodes
        .iter()
        .map(|n| connect::connection_info(n, security))
        .collect::<Result<Vec<_>, _>>()?;
    #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
    let mut builder = redis::cluster::ClusterClient::builder(infos);
    #[cfg(feature = "tls")]
    if let Some(certs) = &security.certificates {
        if !nodes.iter().all(|n| connect::is_tls(n)) {
            return Err(BuildError::InvalidSetting(
                "a CA or client certificate needs rediss:// node URLs",
            ));
        }
        builder = builder.certs(certs.clone());
    }
    Ok(builder)
}
