//! Someone else logs in with this device's account token (`docs/protocol.md#session-displacement`):
//! the relay displaces the device's connection, and the device reports it as a
//! `security_warning`, not only as a lost connection.

mod support;

use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_proto::security::RELAY_SESSION_SUPERSEDED;
use courier_proto::{ClientFrame, RelayFrame};
use courier_relay::{RelayConfig, Storage};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use support::{address, connected, wait_for, warning};
use tokio_tungstenite::tungstenite::Message as WsMessage;

const SECRET: &[u8] = b"session-displacement-secret, 32 bytes or more";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_elsewhere_with_a_stolen_token_is_reported_as_a_security_warning() {
    let relay = courier_relay::start(RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        Storage::Memory,
        SECRET.to_vec(),
    ))
    .await
    .unwrap();
    let url = relay.url();
    let dir = tempfile::tempdir().unwrap();
    let config = support::relay_app("displaced", "alice", dir.path(), &url, SECRET, json!({}));
    let (_alice, events) = support::start(&parse_protocol_config(&config).unwrap());
    let own =
        address(&wait_for(&events, "alice's identity", |e| address(e).is_some()).await).unwrap();
    wait_for(&events, "alice online", connected).await;

    // The thief presents a copy of alice's token.
    let (mut thief, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let stolen = ClientFrame::Authenticate {
        token: courier_relay::issue_token(SECRET, "alice", 3600).unwrap(),
        client_capabilities: None,
    };
    thief.send(WsMessage::text(stolen.encode())).await.unwrap();
    let answer = thief.next().await.unwrap().unwrap();
    assert!(matches!(
        RelayFrame::decode(answer.to_text().unwrap()).unwrap(),
        RelayFrame::Authenticated { .. }
    ));

    wait_for(&events, "the displacement", |e| {
        matches!(e, ClientEvent::RelaySessionSuperseded { .. })
    })
    .await;
    let (peer, _, reason) = warning(
        &wait_for(&events, "the displacement reported as a warning", |e| {
            warning(e).is_some_and(|(_, code, _)| code == RELAY_SESSION_SUPERSEDED)
        })
        .await,
    )
    .unwrap();
    assert_eq!(peer, own, "the warning names this device");
    assert!(!reason.is_empty());
}
