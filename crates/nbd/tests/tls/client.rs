//! A client session for the TLS tests, shared by `protocol.rs` and the
//! unit tests of `src/tls.rs` (each includes this file with `#[path]`).

use rustls::pki_types::pem::PemObject;
use std::sync::Arc;

/// A CA and a server certificate for localhost (see the README there).
pub fn tls_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls")
}

/// A client session for localhost that trusts the CA in tests/tls.
pub fn tls_client() -> rustls::ClientConnection {
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        rustls::pki_types::CertificateDer::pem_file_iter(tls_dir().join("ca-cert.pem")).unwrap()
    {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap()
}
