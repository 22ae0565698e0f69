//! `wss://` with a certificate from a test CA.

mod common;

use std::sync::Arc;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_tungstenite::Connector;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_authenticate_over_wss() {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();

    let relay = TestRelay::start_with(|c| {
        c.tls = Some(courier_relay::TlsConfig {
            cert_pem: server_cert.pem(),
            key_pem: server_key.serialize_pem(),
        })
    })
    .await;
    let port = relay.handle().port();
    assert_eq!(relay.url, format!("wss://localhost:{port}"));

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
        .unwrap();
    let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connect = |config: Arc<rustls::ClientConfig>| {
        let url = relay.url.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            tokio_tungstenite::client_async_tls_with_config(
                url,
                tcp,
                None,
                Some(Connector::Rustls(config)),
            )
            .await
        }
    };

    let (ws, _) = within(connect(Arc::new(client_config)))
        .await
        .unwrap()
        .expect("wss handshake");
    let mut alice = Client::from_ws(ws);
    alice.authenticate("alice", true).await;
    assert_eq!(alice.drain_complete().await, 0);
    assert_sent(
        &alice.send_and_answer("alice", "m1", "to myself").await,
        "m1",
        "alice",
        "live",
    );
    assert_eq!(alice.received().await.content, "to myself");

    // A client that does not trust the CA cannot connect.
    let untrusting = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let refused = within(connect(Arc::new(untrusting))).await.unwrap();
    assert!(refused.is_err());
}

#[tokio::test]
async fn unusable_pem_is_a_tls_error() {
    let mut config = courier_relay::RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        courier_relay::Storage::Memory,
        SECRET.to_vec(),
    );
    config.tls = Some(courier_relay::TlsConfig {
        cert_pem: "not a pem".into(),
        key_pem: "nor this".into(),
    });
    match courier_relay::start(config).await {
        Err(courier_relay::RelayError::Tls(message)) => {
            assert!(message.contains("no certificate"), "{message}")
        }
        Err(other) => panic!("expected a TLS error, got {other}"),
        Ok(_) => panic!("expected a TLS error"),
    }
}
