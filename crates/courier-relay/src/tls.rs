//! `wss://` termination with rustls and the ring provider.

use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use crate::{RelayError, TlsConfig};

pub fn acceptor(config: &TlsConfig) -> Result<TlsAcceptor, RelayError> {
    let certs = CertificateDer::pem_slice_iter(config.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RelayError::Tls(format!("cannot read the certificate PEM: {e}")))?;
    if certs.is_empty() {
        return Err(RelayError::Tls(
            "the certificate PEM holds no certificate".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(config.key_pem.as_bytes()).map_err(|e| match e {
        pem::Error::NoItemsFound => {
            RelayError::Tls("the private key PEM holds no private key".into())
        }
        e => RelayError::Tls(format!("cannot read the private key PEM: {e}")),
    })?;
    let server =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| RelayError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                RelayError::Tls(format!(
                    "certificate and key do not make a usable pair: {e}"
                ))
            })?;
    Ok(TlsAcceptor::from(Arc::new(server)))
}
