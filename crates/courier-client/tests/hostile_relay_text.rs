//! Text a hostile relay or peer controls reaches the application's diagnostics and events cut
//! to a bounded size and stripped of control characters (`docs/protocol.md#quoting-peer-text`).

mod support;

use std::time::Duration;

use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_engine::Event;
use courier_proto::quote::MAX_QUOTED_BYTES;
use courier_proto::{ClientFrame, RelayFrame};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;

const DEADLINE: Duration = Duration::from_secs(10);

/// Hostile text: forged log lines, a terminal escape, a bidi override, and almost a megabyte.
fn hostile() -> String {
    format!(
        "no\n2026-01-01 ERROR forged\r\u{1b}[2J\u{202E}{}",
        "x".repeat(900 * 1024)
    )
}

fn quoted_safely(text: &str) -> bool {
    // The surrounding sentence adds its own words; the peer's part is what must stay small.
    text.len() < MAX_QUOTED_BYTES + 200 && !text.chars().any(|c| c.is_control() || c == '\u{202E}')
}

async fn accept(listener: &TcpListener) -> WebSocketStream<tokio::net::TcpStream> {
    let (tcp, _) = tokio::time::timeout(DEADLINE, listener.accept())
        .await
        .expect("the client connects")
        .unwrap();
    let config = WebSocketConfig::default().max_message_size(None);
    let mut ws = tokio_tungstenite::accept_async_with_config(tcp, Some(config))
        .await
        .unwrap();
    let first = ws.next().await.unwrap().unwrap();
    let frame = ClientFrame::decode(first.to_text().unwrap()).unwrap();
    assert!(matches!(frame, ClientFrame::Authenticate { .. }));
    ws
}

async fn send(ws: &mut WebSocketStream<tokio::net::TcpStream>, frame: &RelayFrame) {
    ws.send(WsMessage::text(frame.encode())).await.unwrap();
}

fn client_of(
    listener: &TcpListener,
    dir: &tempfile::TempDir,
) -> courier_client::config::ProtocolConfig {
    let url = format!("ws://{}", listener.local_addr().unwrap());
    parse_protocol_config(&json!({
        "appId": "hostile",
        "encryption": { "enabled": false },
        "storage": { "path": dir.path().join("alice.db") },
        "transports": { "internet": { "url": url, "authToken": "token" } },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refusing_the_token_with_a_megabyte_of_forged_lines_is_quoted_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (client, events) = support::start(&client_of(&listener, &dir));
    let mut ws = accept(&listener).await;
    send(&mut ws, &RelayFrame::AuthError { reason: hostile() }).await;

    let refused = support::wait_for(&events, "the refusal's diagnostic", |e| {
        matches!(e, ClientEvent::Diagnostic { message, .. } if message.contains("relay refused the token"))
    })
    .await;
    let ClientEvent::Diagnostic { message, .. } = &refused else {
        unreachable!()
    };
    assert!(
        quoted_safely(message),
        "{} bytes: {message:?}",
        message.len()
    );
    let failed = support::wait_for(&events, "auth_failed", |e| {
        matches!(e, ClientEvent::AuthFailed { .. })
    })
    .await;
    let ClientEvent::AuthFailed { reason, .. } = &failed else {
        unreachable!()
    };
    assert!(
        reason.starts_with("no2026-01-01 ERROR forged"),
        "{reason:?}"
    );
    assert!(quoted_safely(reason), "{} bytes", reason.len());
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_message_with_a_megabyte_of_forged_lines_in_a_field_is_dropped_quoted_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (client, events) = support::start(&client_of(&listener, &dir));
    let mut ws = accept(&listener).await;
    send(
        &mut ws,
        &RelayFrame::Authenticated {
            user_id: "alice".into(),
            username: "alice".into(),
            capabilities: vec![],
            address_challenge: None,
            rate_limit: None,
            mailbox: None,
        },
    )
    .await;
    // serde quotes an unknown enum value in its error: the peer chooses that text.
    let content = json!({
        "id": "in1", "sender": "bob", "recipient": "alice", "app_id": "hostile",
        "priority": hostile(), "ttl": 8, "hop_count": 0, "timestamp": 1, "lamport_clock": 1,
        "content_type": "text", "content": "hi", "metadata": {},
        "requires_ack": true, "reply_to_msg": null,
    })
    .to_string();
    send(
        &mut ws,
        &RelayFrame::MessageReceived {
            seq: None,
            sender: "bob".into(),
            sender_account: Some("bob".into()),
            content,
            message_id: "relay-1".into(),
            timestamp: 1,
            reply_to_msg: None,
        },
    )
    .await;
    let dropped = support::wait_for(&events, "the drop's diagnostic", |e| {
        let message = match e {
            ClientEvent::Diagnostic { message, .. } => message,
            ClientEvent::Engine(e) => match &**e {
                Event::Diagnostic { message, .. } => message,
                _ => return false,
            },
            _ => return false,
        };
        message.contains("dropped inbound frame from bob")
    })
    .await;
    let message = match &dropped {
        ClientEvent::Diagnostic { message, .. } => message.clone(),
        ClientEvent::Engine(e) => match &**e {
            Event::Diagnostic { message, .. } => message.clone(),
            _ => unreachable!(),
        },
        _ => unreachable!(),
    };
    assert!(
        quoted_safely(&message),
        "{} bytes: {message:?}",
        message.len()
    );
    client.stop().await;
}
