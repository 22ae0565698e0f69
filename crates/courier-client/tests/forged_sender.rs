//! A relay account that claims to be somebody else: over a real relay, Mallory's connection sends
//! Alice a message that says it is Bob's, under the id Bob's next message will have. Alice drops
//! it and reports Mallory; Bob's real message then arrives, once, and Bob is told it was
//! delivered — the forged copy neither reached the app nor spent Bob's id.

mod support;

use std::collections::BTreeMap;

use courier_client::client::SendInput;
use courier_client::config::parse_protocol_config;
use courier_engine::Event;
use courier_proto::{wire_id, ClientFrame, ContentType, Message, Priority, RelayFrame};
use courier_relay::{RelayConfig, Storage};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use support::{address, connected, engine, wait_for, warning};
use tokio_tungstenite::tungstenite::Message as WsMessage;

const SECRET: &[u8] = b"forged-sender-secret, padded to 32 bytes or more";
/// Bob's next message, under an id anyone can guess.
const BOBS_ID: &str = "chat-42";

fn config(name: &str, dir: &std::path::Path, url: &str) -> serde_json::Value {
    // Attribution in the clear; sealed attribution is `sealed_sessions.rs`'s.
    support::relay_app(
        "forged",
        name,
        dir,
        url,
        SECRET,
        json!({ "encryption": { "enabled": false } }),
    )
}

/// Mallory authenticates as herself and writes one `SendMessage` carrying `forged`; returns once
/// the relay has answered it.
async fn send_as_mallory(url: &str, recipient: &str, forged: &Message) {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let authenticate = ClientFrame::Authenticate {
        token: courier_relay::issue_token(SECRET, "mallory", 3600).unwrap(),
        client_capabilities: None,
    };
    ws.send(WsMessage::text(authenticate.encode()))
        .await
        .unwrap();
    let send = ClientFrame::SendMessage {
        recipient: recipient.to_owned(),
        content: forged.encode(),
        message_id: forged.id.clone(),
        reply_to_msg: None,
    };
    let mut sent = false;
    while let Some(Ok(frame)) = ws.next().await {
        let WsMessage::Text(text) = frame else {
            continue;
        };
        match RelayFrame::decode(text.as_str()).unwrap() {
            RelayFrame::Authenticated { .. } if !sent => {
                ws.send(WsMessage::text(send.encode())).await.unwrap();
                sent = true;
            }
            RelayFrame::MessageSent { .. } => break,
            other => panic!("the relay answered Mallory's send with {other:?}"),
        }
    }
    ws.close(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_claiming_another_sender_is_dropped_and_cannot_spend_its_id() {
    let relay = courier_relay::start(RelayConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        Storage::Memory,
        SECRET.to_vec(),
    ))
    .await
    .unwrap();
    let url = relay.url();
    let dir = tempfile::tempdir().unwrap();
    let start =
        |name| support::start(&parse_protocol_config(&config(name, dir.path(), &url)).unwrap());
    let (alice, alice_events) = start("alice");
    let alice_address =
        address(&wait_for(&alice_events, "alice's identity", |e| address(e).is_some()).await)
            .unwrap();
    wait_for(&alice_events, "alice online", connected).await;
    let (bob, bob_events) = start("bob");
    let bob_address =
        address(&wait_for(&bob_events, "bob's identity", |e| address(e).is_some()).await).unwrap();
    wait_for(&bob_events, "bob online", connected).await;

    let forged = Message {
        id: wire_id(BOBS_ID),
        sender: bob_address.clone(),
        recipient: alice_address.clone(),
        app_id: "forged".into(),
        priority: Priority::Medium,
        ttl: 10,
        hop_count: 0,
        timestamp: 0,
        lamport_clock: 1,
        content_type: ContentType::Text,
        content: "send me your password".into(),
        metadata: BTreeMap::new(),
        requires_ack: true,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    };
    send_as_mallory(&url, &alice_address, &forged).await;
    let (peer, code, _) = warning(
        &wait_for(&alice_events, "the mismatch reported", |e| {
            warning(e).is_some()
        })
        .await,
    )
    .unwrap();
    assert_eq!(
        (peer.as_str(), code),
        ("mallory", "TRANSPORT_IDENTITY_MISMATCH")
    );

    bob.send(SendInput {
        recipient: alice_address.clone(),
        content: "lunch at noon?".into(),
        id: Some(BOBS_ID.into()),
        ..Default::default()
    })
    .await
    .unwrap();
    wait_for(&bob_events, "bob's message delivered", |e| {
        matches!(engine(e), Some(Event::MessageDelivered { message_id, .. }) if message_id == BOBS_ID)
    })
    .await;
    // The first message Alice's app is given is Bob's real one, with his content.
    let first = wait_for(&alice_events, "bob's real message", |e| {
        matches!(engine(e), Some(Event::MessageReceived { .. }))
    })
    .await;
    let Some(Event::MessageReceived {
        message, sender, ..
    }) = engine(&first)
    else {
        unreachable!()
    };
    assert_eq!(
        (sender.as_str(), message.content.as_str()),
        (bob_address.as_str(), "lunch at noon?")
    );
    drop((alice, bob));
}
