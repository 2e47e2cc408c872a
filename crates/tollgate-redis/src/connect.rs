//! What a connection needs before it is made: TLS material (a private CA, a client certificate), credentials
//! (from the URL, the builder, an environment variable or a file), and, after a failed attempt, whether the
//! failure is a configuration error (stop start-up) or an outage (the limiter's failure policy rides it out).

use std::path::PathBuf;

#[cfg(feature = "tls")]
use redis::TlsCertificates;
use redis::{ErrorKind, IntoConnectionInfo, ServerErrorKind};

use crate::BuildError;

/// PEM bytes given directly, or a file read when the store is built.
#[cfg(feature = "tls")]
#[derive(Debug, Clone)]
pub(crate) enum Pem {
    Bytes(Vec<u8>),
    File(PathBuf),
}

#[cfg(feature = "tls")]
impl Pem {
    fn read(&self, what: &'static str) -> Result<Vec<u8>, BuildError> {
        match self {
            Self::Bytes(b) => Ok(b.clone()),
            Self::File(path) => std::fs::read(path).map_err(|source| BuildError::ReadFile {
                what,
                path: path.clone(),
                source,
            }),
        }
    }
}

/// Where the password comes from. `Debug` never prints it.
#[derive(Clone)]
pub(crate) enum Secret {
    Value(String),
    Env(String),
    File(PathBuf),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Value(_) => f.write_str("Value(<redacted>)"),
            Self::Env(var) => f.debug_tuple("Env").field(var).finish(),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

impl Secret {
    /// The password; a file's trailing newline (as `echo` writes it) is not part of it.
    fn resolve(&self) -> Result<String, BuildError> {
        match self {
            Self::Value(v) => Ok(v.clone()),
            Self::Env(var) => std::env::var(var).map_err(|_| BuildError::MissingEnv(var.clone())),
            Self::File(path) => std::fs::read_to_string(path)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
                .map_err(|source| BuildError::ReadFile {
                    what: "password file",
                    path: path.clone(),
                    source,
                }),
        }
    }
}

/// TLS material and credentials as configured on the builder.
#[derive(Debug, Clone, Default)]
pub(crate) struct Security {
    #[cfg(feature = "tls")]
    pub(crate) ca: Option<Pem>,
    #[cfg(feature = "tls")]
    pub(crate) client_cert: Option<(Pem, Pem)>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Secret>,
}

/// [`Security`] with every file read and every variable looked up.
#[derive(Clone, Default)]
pub(crate) struct Resolved {
    #[cfg(feature = "tls")]
    pub(crate) certificates: Option<TlsCertificates>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl Security {
    /// Whether a CA or a client certificate is configured.
    #[cfg(feature = "deadpool-redis")]
    pub(crate) fn has_tls_material(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.ca.is_some() || self.client_cert.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    pub(crate) fn resolve(&self) -> Result<Resolved, BuildError> {
        Ok(Resolved {
            #[cfg(feature = "tls")]
            certificates: self.certificates()?,
            username: self.username.clone(),
            password: self.password.as_ref().map(Secret::resolve).transpose()?,
        })
    }

    #[cfg(feature = "tls")]
    fn certificates(&self) -> Result<Option<TlsCertificates>, BuildError> {
        let root_cert = self.ca.as_ref().map(|p| p.read("CA file")).transpose()?;
        let client_tls = match &self.client_cert {
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: cert.read("client certificate file")?,
                client_key: key.read("client key file")?,
            }),
            None => None,
        };
        Ok(
            (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }
}

/// Makes sure rustls has a crypto provider: ours (ring) unless the application installed one.
pub(crate) fn install_crypto_provider() {
    #[cfg(feature = "tls")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may win the race; either way one provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Whether a URL asks for TLS.
pub(crate) fn is_tls(url: &str) -> bool {
    url.trim_start()
        .to_ascii_lowercase()
        .starts_with("rediss://")
}

/// A client for one server: the URL's own credentials unless the builder set others, and the TLS material.
pub(crate) fn client(url: &str, security: &Resolved) -> Result<redis::Client, BuildError> {
    let info = connection_info(url, security)?;
    #[cfg(not(feature = "tls"))]
    if is_tls(url) {
        return Err(BuildError::InvalidSetting(
            "a rediss:// URL needs TLS: build tollgate-redis with its feature `tls` (tollgate: `redis-tls`)",
        ));
    }
    #[cfg(feature = "tls")]
    match &security.certificates {
        Some(certs) => {
            if !is_tls(url) {
                return Err(BuildError::InvalidSetting(
                    "a CA or client certificate needs a rediss:// URL",
                ));
            }
            redis::Client::build_with_tls(info, certs.clone()).map_err(invalid_tls_material)
        }
        None => redis::Client::open(info).map_err(|e| BuildError::InvalidUrl(e.to_string())),
    }
    #[cfg(not(feature = "tls"))]
    redis::Client::open(info).map_err(|e| BuildError::InvalidUrl(e.to_string()))
}

/// `url` parsed, with the builder's credentials applied over the URL's.
pub(crate) fn connection_info(
    url: &str,
    security: &Resolved,
) -> Result<redis::ConnectionInfo, BuildError> {
    let info = url
        .into_connection_info()
        .map_err(|e| BuildError::InvalidUrl(format!("{url:?}: {e}")))?;
    let mut redis = info.redis_settings().clone();
    if let Some(user) = &security.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &security.password {
        redis = redis.set_password(password);
    }
    Ok(info.set_redis_settings(redis))
}

/// A PEM that does not parse (or a key that does not fit its certificate) is a configuration error.
#[cfg(feature = "tls")]
pub(crate) fn invalid_tls_material(e: redis::RedisError) -> BuildError {
    BuildError::Tls(format!("unusable TLS certificate or key: {e}"))
}

/// The rustls error somewhere in `e`'s chain. redis-rs keeps it as an `Arc<dyn Error>` around an `io::Error`, and
/// both hide their inner error from `source()`, so each is unwrapped by hand.
#[cfg(feature = "tls")]
fn rustls_error(e: &redis::RedisError) -> Option<rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(mut err) = next {
        if let Some(shared) = err.downcast_ref::<Shared>() {
            err = &**shared;
        }
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls.clone());
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
        {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls.clone());
            }
            next = inner.source();
            continue;
        }
        next = err.source();
    }
    None
}

/// A failed connection or start-up call: a configuration error to report (`Some`), or an outage (`None`).
pub(crate) fn config_error(e: &redis::RedisError) -> Option<BuildError> {
    #[cfg(feature = "tls")]
    if let Some(tls) = tls_error(e) {
        return Some(tls);
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed => return Some(BuildError::Auth(e.to_string())),
        ErrorKind::Server(ServerErrorKind::NoPerm) => {
            return Some(BuildError::NoPermission(e.to_string()));
        }
        ErrorKind::InvalidClientConfig => return Some(BuildError::InvalidUrl(e.to_string())),
        _ => {}
    }
    match e.code() {
        Some("WRONGPASS" | "NOAUTH") => return Some(BuildError::Auth(e.to_string())),
        Some("NOPERM") => return Some(BuildError::NoPermission(e.to_string())),
        _ => {}
    }
    let text = e.to_string();
    // A script that calls a command the user may not run fails with a plain ERR saying so (Redis 7).
    if text.contains("NOPERM")
        || text.contains("no permissions")
        || text.contains("can't run this command")
        || text.contains("No permissions to access")
    {
        return Some(BuildError::NoPermission(text));
    }
    if text.contains("WRONGPASS") || text.contains("NOAUTH") {
        return Some(BuildError::Auth(text));
    }
    None
}

/// A certificate or handshake failure in `e`: always a configuration error.
#[cfg(feature = "tls")]
fn tls_error(e: &redis::RedisError) -> Option<BuildError> {
    use rustls::CertificateError as C;
    let tls = rustls_error(e)?;
    Some(match tls {
        rustls::Error::InvalidCertificate(
            C::UnknownIssuer | C::BadSignature | C::UnhandledCriticalExtension,
        ) => BuildError::CertificateUntrusted(tls.to_string()),
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            BuildError::CertificateExpired(tls.to_string())
        }
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => BuildError::CertificateHostMismatch(tls.to_string()),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            BuildError::Tls(format!(
                "the server does not speak TLS ({tls}): use a redis:// URL, or the server's TLS port"
            ))
        }
        other => BuildError::Tls(other.to_string()),
    })
}

/// Whether a plaintext attempt ended as it does against a TLS port: the connection accepted, then dropped.
pub(crate) fn dropped_after_accept(e: &redis::RedisError) -> bool {
    !e.is_connection_refusal() && (e.is_connection_dropped() || is_eof(e))
}

/// Asks `host:port` a plaintext `PING` over a bare socket: `Some(true)` when it answers in RESP (`+` or `-`: a
/// plaintext Redis), `Some(false)` when it closes or answers something else (a TLS port sends an alert or
/// closes), `None` without an answer either way.
pub(crate) async fn speaks_resp(host: &str, port: u16, limit: std::time::Duration) -> Option<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut socket = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        socket.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0_u8; 1];
        match socket.read(&mut first).await {
            Ok(0) | Err(_) => Some(false),
            Ok(_) => Some(matches!(first[0], b'+' | b'-')),
        }
    };
    tokio::time::timeout(limit, probe).await.ok().flatten()
}

fn is_eof(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("unexpected end of file")
        || text.contains("unexpected eof")
        || text.contains("connection reset")
        || text.contains("broken pipe")
}
