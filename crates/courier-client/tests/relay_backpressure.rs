//! The relay carrier reads while it writes (`docs/protocol.md#transport`): a relay that stops
//! reading until the client has read what it is writing is not waited on for good.

mod support;

use std::time::Duration;

use courier_client::client::{Client, SendInput};
use courier_client::config::parse_protocol_config;
use courier_proto::{ClientFrame, RateLimitInfo, RelayFrame};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::TcpSocket;
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// The client's outgoing bytes, and the relay's, are each several times what the kernel buffers
/// between them hold on loopback, so neither side can finish writing unless the other reads.
const SENDS: usize = 40;
const SEND_BYTES: usize = 200 * 1024;
const DELIVERIES: usize = 2000;
const DELIVERY_BYTES: usize = 4 * 1024;

fn authenticated() -> RelayFrame {
    RelayFrame::Authenticated {
        user_id: "alice".into(),
        username: "alice".into(),
        capabilities: Vec::new(),
        address_challenge: None,
        rate_limit: Some(RateLimitInfo {
            burst: 1_000_000,
            per_sec: 1_000_000,
        }),
        mailbox: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_reads_only_once_its_own_burst_is_read_gets_both_ways_through() {
    let dir = tempfile::tempdir().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    // Small buffers on the relay's side, inherited by the accepted connection.
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    socket.set_send_buffer_size(16 * 1024).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let config = parse_protocol_config(&json!({
        "appId": "backpressure",
        "encryption": { "enabled": false },
        "storage": { "path": dir.path().join("alice.db") },
        "transports": { "internet": { "url": url, "authToken": courier_relay::issue_token(b"a hostile relay never checks this secret", "alice", 60).unwrap() } },
    }))
    .unwrap();
    let (client, _events) = support::start(&config);
    // Queued before the connection, so they go out the moment it is up.
    queue_sends(&client).await;

    let relay = async {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let _authenticate = ws.next().await.unwrap().unwrap();
        ws.send(WsMessage::text(authenticated().encode()))
            .await
            .unwrap();
        // All of this before reading a single frame of the client's.
        for i in 0..DELIVERIES {
            let frame = RelayFrame::MessageReceived {
                seq: None,
                sender: "bob".into(),
                sender_account: None,
                content: "x".repeat(DELIVERY_BYTES),
                message_id: format!("d{i}"),
                timestamp: 1,
                reply_to_msg: None,
            };
            ws.feed(WsMessage::text(frame.encode())).await.unwrap();
        }
        ws.flush().await.unwrap();
        let mut sends = 0;
        while sends < SENDS {
            let Some(Ok(WsMessage::Text(text))) = ws.next().await else {
                panic!("the client's connection ended after {sends} sends");
            };
            if let Ok(ClientFrame::SendMessage { .. }) = ClientFrame::decode(text.as_str()) {
                sends += 1;
            }
        }
        ws
    };
    let ws = tokio::time::timeout(Duration::from_secs(60), relay)
        .await
        .expect("both bursts got through");
    client.stop().await;
    drop(ws);
}

async fn queue_sends(client: &Client) {
    for i in 0..SENDS {
        client
            .send(SendInput {
                recipient: "bob".into(),
                content: format!("{i} {}", "c".repeat(SEND_BYTES)),
                ..Default::default()
            })
            .await
            .unwrap();
    }
}
