//! A relay that lies about the address it bound, or refuses the declaration: the client reports
//! it as a security warning, keeps the connection, and its `DeclareAddress` is provably the first
//! frame after authentication — before the outbox flush.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use base64::Engine as _;
use courier_client::client::{Client, SendInput};
use courier_client::config::parse_protocol_config;
use courier_client::event::ClientEvent;
use courier_proto::{verify_declaration, Address, ClientFrame, RelayFrame};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message as WsMessage;

const CHALLENGE: [u8; 32] = [9; 32];

/// Anyone is `alice`, on a relay that routes by address, with a known challenge.
fn authenticated() -> RelayFrame {
    RelayFrame::Authenticated {
        user_id: "alice".into(),
        username: "alice".into(),
        capabilities: vec!["address_routing_v1".into()],
        address_challenge: Some(base64::engine::general_purpose::STANDARD.encode(CHALLENGE)),
        rate_limit: None,
        mailbox: None,
    }
}

/// How the fake relay answers a valid declaration.
#[derive(Clone, Copy)]
enum Answer {
    BindAnotherAddress,
    Refuse,
}

/// Accepts one connection; authenticates anyone as `alice` with `address_routing_v1` once told
/// to (so the client can queue a message first); answers the declaration as told; returns the
/// frames read after `Authenticate`, in order, once it has seen a `SendMessage`.
async fn fake_relay(
    answer: Answer,
) -> (
    String,
    oneshot::Sender<()>,
    oneshot::Receiver<Vec<ClientFrame>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let (frames_tx, frames_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let _authenticate = ws.next().await.unwrap().unwrap();
        go_rx.await.unwrap();
        ws.send(WsMessage::text(authenticated().encode()))
            .await
            .unwrap();
        let mut frames = Vec::new();
        while let Some(Ok(msg)) = ws.next().await {
            let WsMessage::Text(text) = msg else { continue };
            let frame = ClientFrame::decode(text.as_str()).unwrap();
            if let ClientFrame::DeclareAddress {
                address,
                public_key,
                signature,
            } = &frame
            {
                let bound = verify_declaration("alice", &CHALLENGE, address, public_key, signature)
                    .expect("the client's proof verifies");
                let reply = match answer {
                    Answer::BindAnotherAddress => RelayFrame::AddressDeclared {
                        address: Address::from_hash([0xab; 20]).to_string(),
                    },
                    Answer::Refuse => RelayFrame::AddressError {
                        reason: "bad_signature".into(),
                    },
                };
                assert_eq!(bound.to_string(), *address);
                ws.send(WsMessage::text(reply.encode())).await.unwrap();
            }
            let is_send = matches!(frame, ClientFrame::SendMessage { .. });
            frames.push(frame);
            if is_send {
                let _ = frames_tx.send(frames);
                break;
            }
        }
        // Keep the socket open until the client goes away.
        while ws.next().await.is_some() {}
    });
    (url, go_tx, frames_rx)
}

fn start_client(dir: &std::path::Path, url: &str) -> (Client, mpsc::Receiver<ClientEvent>) {
    let config = parse_protocol_config(&json!({
        "appId": "hostile",
        "encryption": { "enabled": false },
        "storage": { "path": dir.join("alice.db") },
        "transports": { "internet": { "url": url, "authToken": courier_relay::issue_token(b"a hostile relay never checks this secret", "alice", 60).unwrap() } },
    }))
    .unwrap();
    support::start(&config)
}

async fn scenario(answer: Answer) -> (Vec<ClientFrame>, (String, &'static str), String) {
    let dir = tempfile::tempdir().unwrap();
    let (url, go, frames) = fake_relay(answer).await;
    let (client, events) = start_client(dir.path(), &url);
    // Queued before the relay even answers Authenticate: it must still go after the declaration.
    client
        .send(SendInput {
            recipient: "bob".into(),
            content: "queued".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    go.send(()).unwrap();
    let frames = tokio::time::timeout(Duration::from_secs(10), frames)
        .await
        .unwrap()
        .unwrap();
    let found = support::wait_for(&events, "a security warning", |e| {
        support::warning(e).is_some()
    })
    .await;
    support::wait_for(
        &events,
        "the answer forwarded verbatim",
        |e| matches!(e, ClientEvent::RelayServerMessage { json } if json.contains("Address")),
    )
    .await;
    let own = client.local_address().to_owned();
    client.stop().await;
    let (peer, code, _) = support::warning(&found).unwrap();
    (frames, (peer, code), own)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_binding_another_address_is_reported_and_the_connection_keeps_working() {
    let (frames, (peer, code), own) = scenario(Answer::BindAnotherAddress).await;
    assert!(
        matches!(frames[0], ClientFrame::DeclareAddress { ref address, .. } if *address == own)
    );
    assert!(matches!(
        frames.last(),
        Some(ClientFrame::SendMessage { .. })
    ));
    assert_eq!(code, "RELAY_ADDRESS_BINDING_MISMATCH");
    assert_eq!(peer, Address::from_hash([0xab; 20]).to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_declaration_is_reported_and_the_connection_keeps_working() {
    let (frames, (peer, code), own) = scenario(Answer::Refuse).await;
    assert!(matches!(frames[0], ClientFrame::DeclareAddress { .. }));
    assert!(matches!(
        frames.last(),
        Some(ClientFrame::SendMessage { .. })
    ));
    assert_eq!(code, "RELAY_ADDRESS_DECLARATION_REFUSED");
    assert_eq!(peer, own);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_declaration_is_written_at_once_with_nothing_else_to_send() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (client, _events) = start_client(dir.path(), &url);
    let (tcp, _) = listener.accept().await.unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    let _authenticate = ws.next().await.unwrap().unwrap();
    ws.send(WsMessage::text(authenticated().encode()))
        .await
        .unwrap();
    // Nothing is queued and the relay says nothing more: the declaration must not wait for
    // some later wake-up (the next keepalive is 10 s away).
    let first = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("the declaration was not written at once")
        .unwrap()
        .unwrap();
    let WsMessage::Text(text) = first else {
        panic!("unexpected {first:?}")
    };
    assert!(matches!(
        ClientFrame::decode(text.as_str()).unwrap(),
        ClientFrame::DeclareAddress { .. }
    ));
    client.stop().await;
}

/// A relay without `address_routing_v1`, or whose challenge is absent or not 32 bytes of base64,
/// gets no declaration: a diagnostic names why, and the connection works in account-name space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_declaration_is_made_when_the_relay_cannot_take_one_and_a_diagnostic_says_why() {
    let no_capability = |mut a: RelayFrame| {
        if let RelayFrame::Authenticated { capabilities, .. } = &mut a {
            capabilities.clear();
        }
        a
    };
    let challenge = |value: Option<&str>| {
        let value = value.map(str::to_owned);
        move |mut a: RelayFrame| {
            if let RelayFrame::Authenticated {
                address_challenge, ..
            } = &mut a
            {
                *address_challenge = value.clone();
            }
            a
        }
    };
    type Edit = Box<dyn Fn(RelayFrame) -> RelayFrame>;
    let cases: [(&str, Edit); 3] = [
        ("capability_absent", Box::new(no_capability)),
        ("challenge_absent", Box::new(challenge(None))),
        ("challenge_malformed", Box::new(challenge(Some("c2hvcnQ=")))),
    ];
    for (reason, authenticated_as) in cases {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        // The skip is an `info` diagnostic: an older relay is not an attack.
        let config = parse_protocol_config(&json!({
            "appId": "hostile",
            "encryption": { "enabled": false },
            "storage": { "path": dir.path().join("alice.db") },
            "transports": { "internet": { "url": url, "authToken": courier_relay::issue_token(b"a hostile relay never checks this secret", "alice", 60).unwrap() } },
            "logLevel": "info",
        }))
        .unwrap();
        let (client, events) = support::start(&config);
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let _authenticate = ws.next().await.unwrap().unwrap();
        let id = client
            .send(SendInput {
                recipient: "bob".into(),
                content: "in account space".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        ws.send(WsMessage::text(authenticated_as(authenticated()).encode()))
            .await
            .unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("the outbox is flushed")
            .unwrap()
            .unwrap();
        let WsMessage::Text(text) = first else {
            panic!("unexpected {first:?}")
        };
        assert!(
            matches!(ClientFrame::decode(text.as_str()).unwrap(), ClientFrame::SendMessage { ref message_id, .. } if *message_id == id),
            "{reason}: the first frame is the flushed message, not a declaration: {text}"
        );
        support::wait_for(&events, reason, |e| {
            matches!(e, ClientEvent::Diagnostic { message, .. } if message == &format!("address declaration skipped: {reason}"))
        })
        .await;
        client.stop().await;
    }
}
