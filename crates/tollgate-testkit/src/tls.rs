//! Certificates for private TLS servers, generated in the test with `rcgen`: a CA, a server certificate (for
//! `localhost` and `127.0.0.1`, or for the names a test wants), and a client certificate for mutual TLS. Each set
//! is written to a directory as PEM files that `redis-server`, `redis-cli` and the store read.
//!
//! ```no_run
//! use tollgate_testkit::tls::TlsFiles;
//!
//! let dir = std::env::temp_dir().join("certs");
//! let files = TlsFiles::generate(&dir, &TlsFiles::LOCAL_NAMES, false);
//! assert!(files.ca.exists());
//! ```

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// PEM files of one CA, one server certificate it signed and one client certificate it signed.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA certificate (what a client trusts).
    pub ca: PathBuf,
    /// The server certificate.
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// A client certificate (for `tls-auth-clients yes`).
    pub client_cert: PathBuf,
    /// The client's private key.
    pub client_key: PathBuf,
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("a CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).expect("a self-signed CA");
    (params, key, cert.pem())
}

fn leaf(
    names: &[&str],
    issuer: &Issuer<'_, KeyPair>,
    purposes: Vec<ExtendedKeyUsagePurpose>,
    expired: bool,
) -> (String, String) {
    let key = KeyPair::generate().expect("a leaf key");
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .expect("leaf parameters");
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().copied().unwrap_or("client"),
    );
    params.extended_key_usages = purposes;
    if expired {
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    let cert = params.signed_by(&key, issuer).expect("a signed leaf");
    (cert.pem(), key.serialize_pem())
}

impl TlsFiles {
    /// The names a local server's certificate carries by default.
    pub const LOCAL_NAMES: [&'static str; 2] = ["localhost", "127.0.0.1"];

    /// Generates a fresh CA, a server certificate for `server_names` (already expired when `expired`) and a
    /// client certificate, written to `dir`.
    ///
    /// # Panics
    /// When `dir` cannot be written.
    #[must_use]
    pub fn generate(dir: &Path, server_names: &[&str], expired: bool) -> Self {
        std::fs::create_dir_all(dir).expect("a directory for certificates");
        let (params, key, ca_pem) = ca("tollgate test CA");
        let issuer = Issuer::new(params, key);
        // A server is also a client: of its primary (replication) and of its peers (the Cluster bus).
        let (server_cert, server_key) = leaf(
            server_names,
            &issuer,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            expired,
        );
        let (client_cert, client_key) = leaf(
            &["tollgate-client"],
            &issuer,
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            false,
        );
        let files = Self {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        };
        write(&files.ca, &ca_pem);
        write(&files.server_cert, &server_cert);
        write(&files.server_key, &server_key);
        write(&files.client_cert, &client_cert);
        write(&files.client_key, &client_key);
        files
    }

    /// A CA that signed nothing the servers present: trusting only it must fail.
    ///
    /// # Panics
    /// When `path` cannot be written.
    #[must_use]
    pub fn unrelated_ca(path: &Path) -> PathBuf {
        let (_, _, pem) = ca("an unrelated CA");
        write(path, &pem);
        path.to_owned()
    }
}
