//! Two clients over `wss://` to a real relay whose certificate comes from a CA made in the test:
//! trusted through `transports.internet.tls.caCertificates`, refused without it.

mod support;

use std::sync::mpsc;

use courier_client::client::{Client, SendInput};
use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_engine::Event;
use courier_relay::{RelayConfig, Storage, TlsConfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::json;

const SECRET: &[u8] = b"tls-test-secret, padded to 32 bytes or more";

struct TestCa {
    ca_pem: String,
    tls: TlsConfig,
}

fn test_ca() -> TestCa {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    TestCa {
        ca_pem: ca.pem(),
        tls: TlsConfig {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        },
    }
}

struct Peer {
    client: Client,
    events: mpsc::Receiver<ClientEvent>,
}

impl Peer {
    fn start(name: &str, dir: &std::path::Path, url: &str, ca_pem: Option<&str>) -> Self {
        let mut internet = json!({
            "url": url,
            "authToken": courier_relay::issue_token(SECRET, name, 3600).unwrap(),
        });
        if let Some(pem) = ca_pem {
            internet["tls"] = json!({ "caCertificates": pem });
        }
        let config = parse_protocol_config(&json!({
            "appId": "tls",
            "encryption": { "enabled": false },
            "storage": { "path": dir.join(format!("{name}.db")) },
            "transports": { "internet": internet },
        }))
        .unwrap();
        let (client, events) = support::start(&config);
        Self { client, events }
    }

    /// Waits (with a deadline) for an event matching `pred`.
    async fn wait_for(&self, what: &str, pred: impl Fn(&ClientEvent) -> bool) -> ClientEvent {
        support::wait_for(&self.events, what, pred).await
    }
}

async fn tls_relay(dir: &std::path::Path, ca: &TestCa) -> courier_relay::RelayHandle {
    let mut config = RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        Storage::Path(dir.join("relay.db")),
        SECRET.to_vec(),
    );
    config.tls = Some(ca.tls.clone());
    courier_relay::start(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_trusting_a_private_ca_deliver_over_wss() {
    let dir = tempfile::tempdir().unwrap();
    let ca = test_ca();
    let relay = tls_relay(dir.path(), &ca).await;
    assert!(relay.url().starts_with("wss://localhost:"));

    let bob = Peer::start("bob", dir.path(), &relay.url(), Some(&ca.ca_pem));
    let alice = Peer::start("alice", dir.path(), &relay.url(), Some(&ca.ca_pem));
    let connected = |e: &ClientEvent| {
        matches!(
            e,
            ClientEvent::RelayStatusChanged {
                connected: true,
                ..
            }
        )
    };
    alice.wait_for("alice connected", connected).await;
    bob.wait_for("bob connected", connected).await;

    let id = alice
        .client
        .send(SendInput {
            recipient: "bob".into(),
            content: "over tls".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let received = bob
        .wait_for("the message", |e| matches!(e.engine(), Some(Event::MessageReceived { message, .. }) if message.id == id))
        .await;
    let Some(Event::MessageReceived { message, .. }) = received.engine().cloned() else {
        unreachable!()
    };
    assert_eq!(message.content, "over tls");
    alice
        .wait_for("delivery", |e| matches!(e.engine(), Some(Event::MessageDelivered { message_id, .. }) if *message_id == id))
        .await;

    alice.client.stop().await;
    bob.client.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_certificate_from_an_untrusted_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = test_ca();
    let relay = tls_relay(dir.path(), &ca).await;

    let alice = Peer::start("alice", dir.path(), &relay.url(), None);
    let failure = alice
        .wait_for("a connect failure", |e| matches!(e, ClientEvent::Diagnostic { message, .. } if message.contains("connect failed")))
        .await;
    let ClientEvent::Diagnostic { message, .. } = failure else {
        unreachable!()
    };
    assert!(
        message.to_lowercase().contains("certificate"),
        "unexpected failure: {message}"
    );
    assert_eq!(relay.stats().connections, 0);
    alice.client.stop().await;
    relay.stop().await;
}
