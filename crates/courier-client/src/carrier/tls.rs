//! TLS trust for `wss://` relays: the system's roots, plus the app's private CAs.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

/// Builds the client TLS configuration. `extra_pem` holds additional trust anchors (PEM).
pub fn client_config(extra_pem: Option<&str>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    // Unreadable system certificates are not fatal: a private CA may be all the app needs, and
    // a relay that cannot be verified fails the handshake loudly anyway.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(pem) = extra_pem {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("transports.internet.tls.caCertificates is not valid PEM: {e}"))?;
        if certs.is_empty() {
            return Err("transports.internet.tls.caCertificates holds no certificate".into());
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("transports.internet.tls.caCertificates: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
