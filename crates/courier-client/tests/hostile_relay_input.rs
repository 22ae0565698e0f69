//! The client under a hostile relay: oversized and invalid messages, deeply nested JSON, wrong
//! field types, unknown frames, forged seqs and delivery ACKs, answers for ids it never sent, and
//! floods. The client never panics, keeps its outbox, reports what it drops (diagnostics,
//! `internet_server_message`, close codes of `docs/protocol.md#close-codes`), and delivers the
//! message it holds once the relay turns honest.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use courier_client::client::{Client, SendInput};
use courier_client::config::{parse_protocol_config, ProtocolConfig};
use courier_client::event::ClientEvent;
use courier_client::store::MessageStatus;
use courier_engine::{DiagnosticLevel, Event};
use courier_proto::limits::MAX_FRAME_BYTES;
use courier_proto::{ClientFrame, Disposition, MailboxInfo, Message, RateLimitInfo, RelayFrame};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;

/// Every wait is bounded by this (reconnects back off 1 s and more).
const DEADLINE: Duration = Duration::from_secs(10);

/// A relay played by the test: it authenticates anyone as `alice` and then does what the test
/// says.
struct FakeRelay {
    listener: TcpListener,
    url: String,
}

impl FakeRelay {
    async fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        Self { listener, url }
    }

    /// The client's next connection, authenticated with a mailbox (so frames carry seqs), past
    /// the empty drain.
    async fn accept(&self) -> Link {
        self.accept_with(RateLimitInfo {
            burst: 2000,
            per_sec: 1000,
        })
        .await
    }

    async fn accept_with(&self, rate_limit: RateLimitInfo) -> Link {
        let (tcp, _) = tokio::time::timeout(DEADLINE, self.listener.accept())
            .await
            .expect("the client connects")
            .unwrap();
        // Lets the test send frames past the client's 1 MiB limit.
        let config = WebSocketConfig::default().max_message_size(None);
        let ws = tokio_tungstenite::accept_async_with_config(tcp, Some(config))
            .await
            .unwrap();
        let mut link = Link { ws };
        assert!(matches!(
            link.next_frame().await,
            ClientFrame::Authenticate { .. }
        ));
        link.send(&RelayFrame::Authenticated {
            user_id: "alice".into(),
            username: "alice".into(),
            capabilities: vec!["mailbox_v1".into()],
            address_challenge: None,
            rate_limit: Some(rate_limit),
            mailbox: Some(MailboxInfo {
                max_messages: 10_000,
                max_bytes: 67_108_864,
                ttl_ms: 604_800_000,
            }),
        })
        .await;
        // Without a declaration the client's first frame is the release of nothing, which
        // starts the drain.
        assert_eq!(link.next_frame().await, ClientFrame::AckUpTo { seq: 0 });
        link.send(&RelayFrame::DrainComplete { count: 0 }).await;
        link
    }
}

struct Link {
    ws: WebSocketStream<TcpStream>,
}

impl Link {
    async fn send(&mut self, frame: &RelayFrame) {
        self.send_text(frame.encode()).await;
    }

    async fn send_text(&mut self, text: impl Into<String>) {
        self.ws.send(WsMessage::text(text.into())).await.unwrap();
    }

    /// A frame the client may close the connection on before it has read all of it: the
    /// write may fail, which is the client doing its job.
    async fn send_doomed(&mut self, text: String) {
        let _ = self.ws.send(WsMessage::text(text)).await;
    }

    async fn send_json(&mut self, value: Value) {
        self.send_text(value.to_string()).await;
    }

    /// Bytes straight onto the socket, past tungstenite's checks.
    async fn send_raw(&mut self, bytes: &[u8]) {
        self.ws.get_mut().write_all(bytes).await.unwrap();
    }

    async fn message(&mut self) -> Option<WsMessage> {
        tokio::time::timeout(DEADLINE, self.ws.next())
            .await
            .expect("the client writes in time")
            .and_then(Result::ok)
    }

    /// The client's next frame (Pings and Pongs skipped).
    async fn next_frame(&mut self) -> ClientFrame {
        loop {
            match self.message().await {
                Some(WsMessage::Text(text)) => return ClientFrame::decode(text.as_str()).unwrap(),
                Some(WsMessage::Ping(_) | WsMessage::Pong(_)) => continue,
                other => panic!("expected a frame, got {other:?}"),
            }
        }
    }

    /// The client's next `SendMessage`, as (message id, end-to-end message); releases before it
    /// are skipped.
    async fn next_send(&mut self) -> (String, Message) {
        loop {
            if let ClientFrame::SendMessage {
                message_id,
                content,
                ..
            } = self.next_frame().await
            {
                return (message_id, Message::decode(&content).unwrap());
            }
        }
    }

    /// Reads until the client's Close and returns its code.
    async fn close_code(&mut self) -> Option<u16> {
        loop {
            match self.message().await {
                Some(WsMessage::Close(frame)) => return frame.map(|f| u16::from(f.code)),
                Some(_) => continue,
                None => return None,
            }
        }
    }

    /// Every seq the client released by the time it has released `until` (Acks and AckUpTos
    /// read on the way); panics on any other frame.
    async fn releases_until(&mut self, until: u64) -> Vec<ClientFrame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next_frame().await;
            let done = match frame {
                ClientFrame::Ack { seq } => seq == until,
                ClientFrame::AckUpTo { seq } => seq >= until,
                ref other => panic!("expected a release, got {other:?}"),
            };
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }

    /// Plays an honest relay for the send `id`: written live, then acknowledged by `bob`.
    async fn deliver(&mut self, id: &str, message: &Message, seq: u64) {
        self.send(&RelayFrame::MessageSent {
            message_id: id.into(),
            recipient: "bob".into(),
            timestamp: 1,
            disposition: Some(Disposition::Live),
        })
        .await;
        let ack = message.ack(format!("ack-{id}"), 2, "internet");
        self.send(&received(seq, "bob", &ack.encode())).await;
    }
}

fn received(seq: u64, sender: &str, content: &str) -> RelayFrame {
    RelayFrame::MessageReceived {
        seq: Some(seq),
        sender: sender.into(),
        sender_account: Some(sender.into()),
        content: content.into(),
        message_id: format!("relay-{seq}"),
        timestamp: 1,
        reply_to_msg: None,
    }
}

/// An end-to-end message from `sender` to this device.
fn message_from(sender: &str, id: &str, content: &str, requires_ack: bool) -> String {
    json!({
        "id": id, "sender": sender, "recipient": "alice", "app_id": "hostile",
        "priority": "medium", "ttl": 8, "hop_count": 0, "timestamp": 1, "lamport_clock": 1,
        "content_type": "text", "content": content, "metadata": {},
        "requires_ack": requires_ack, "reply_to_msg": null,
    })
    .to_string()
}

/// Every event the client emitted so far, kept for later questions.
struct Events {
    rx: mpsc::Receiver<ClientEvent>,
    seen: Vec<ClientEvent>,
}

impl Events {
    /// The first event from the current position matching `pred`, within the deadline.
    async fn wait(&mut self, what: &str, pred: impl Fn(&ClientEvent) -> bool) -> ClientEvent {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            match self.rx.try_recv() {
                Ok(e) => {
                    self.seen.push(e.clone());
                    if pred(&e) {
                        return e;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "timed out waiting for {what}"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(mpsc::TryRecvError::Disconnected) => panic!("events ended before {what}"),
            }
        }
    }

    /// The inbound message `id` reached the app.
    async fn wait_received(&mut self, id: &str) {
        self.wait("a message_received", |e| {
            received_message(e).is_some_and(|m| m.id == id)
        })
        .await;
    }

    fn count(&self, pred: impl Fn(&ClientEvent) -> bool) -> usize {
        self.seen.iter().filter(|e| pred(e)).count()
    }
}

fn warn_diagnostic(e: &ClientEvent, containing: &str) -> bool {
    let message = match e {
        ClientEvent::Diagnostic {
            level: DiagnosticLevel::Warn,
            message,
            ..
        } => message,
        ClientEvent::Engine(e) => match &**e {
            Event::Diagnostic {
                level: DiagnosticLevel::Warn,
                message,
            } => message,
            _ => return false,
        },
        _ => return false,
    };
    message.contains(containing)
}

fn diagnostic_len(e: &ClientEvent) -> usize {
    match e {
        ClientEvent::Diagnostic { message, .. } => message.len(),
        _ => 0,
    }
}

fn delivered(e: &ClientEvent, id: &str) -> bool {
    matches!(e.engine(), Some(Event::MessageDelivered { message_id, .. }) if message_id == id)
}

fn received_message(e: &ClientEvent) -> Option<&Message> {
    match e.engine()? {
        Event::MessageReceived { message, .. } => Some(message),
        _ => None,
    }
}

fn server_message(e: &ClientEvent) -> Option<&str> {
    match e {
        ClientEvent::RelayServerMessage { json } => Some(json),
        _ => None,
    }
}

/// A client of `relay` with one message to `bob` in its outbox.
struct Alice {
    client: Client,
    events: Events,
    _dir: tempfile::TempDir,
}

/// A client of `relay` storing in `dir`.
fn config(relay: &FakeRelay, dir: &tempfile::TempDir) -> ProtocolConfig {
    parse_protocol_config(&json!({
        "appId": "hostile",
        "encryption": { "enabled": false },
        "storage": { "path": dir.path().join("alice.db") },
        "transports": { "internet": { "url": relay.url, "authToken": "token" } },
    }))
    .unwrap()
}

impl Alice {
    fn start(relay: &FakeRelay) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (client, rx) = support::start(&config(relay, &dir));
        Self {
            client,
            events: Events {
                rx,
                seen: Vec::new(),
            },
            _dir: dir,
        }
    }

    async fn send_to_bob(&self, content: &str) -> String {
        self.client
            .send(SendInput {
                recipient: "bob".into(),
                content: content.into(),
                ..Default::default()
            })
            .await
            .unwrap()
    }

    async fn status(&self, id: &str) -> MessageStatus {
        self.client.status(id.to_owned()).await.unwrap()
    }

    /// The message is still in the outbox, neither delivered nor failed.
    async fn assert_pending(&self, id: &str) {
        let status = self.status(id).await;
        assert!(
            matches!(status, MessageStatus::InFlight | MessageStatus::Queued),
            "{id} is {status:?}"
        );
        assert_eq!(self.events.count(|e| delivered(e, id)), 0);
    }

    async fn assert_delivered(&mut self, id: &str) {
        self.events
            .wait("message_delivered", |e| delivered(e, id))
            .await;
        assert_eq!(self.status(id).await, MessageStatus::Delivered);
    }
}

/// A client connected to a relay played by the test, with one message to `bob` written: the
/// relay, the client, the connection, and the message's id and content.
async fn scene() -> (FakeRelay, Alice, Link, String, Message) {
    let relay = FakeRelay::bind().await;
    let alice = Alice::start(&relay);
    let mut link = relay.accept().await;
    let id = alice.send_to_bob("precious").await;
    let (sent, message) = link.next_send().await;
    assert_eq!(sent, id);
    (relay, alice, link, id, message)
}

/// Sends a message the client is sure to deliver, and waits for it: every frame written
/// before it has been read by then.
async fn synced(link: &mut Link, alice: &mut Alice, seq: u64, id: &str) {
    link.send(&received(
        seq,
        "bob",
        &message_from("bob", id, "sync", false),
    ))
    .await;
    alice.events.wait_received(id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_or_invalid_utf8_messages_close_1009_and_1007_and_the_outbox_survives() {
    let (relay, mut alice, mut link, id, _) = scene().await;

    // One byte over the limit: the client closes with 1009 and reconnects.
    link.send_doomed("x".repeat(MAX_FRAME_BYTES + 1)).await;
    assert_eq!(link.close_code().await, Some(1009));
    alice
        .events
        .wait("the loss reported", |e| warn_diagnostic(e, "lost: "))
        .await;
    alice.assert_pending(&id).await;

    // Invalid UTF-8 in a text message: 1007.
    let mut link = relay.accept().await;
    let (resent, _) = link.next_send().await;
    assert_eq!(resent, id, "the outbox sends it again");
    link.send_raw(&[0x81, 0x04, b'{', 0xff, 0xfe, b'}']).await;
    assert_eq!(link.close_code().await, Some(1007));
    alice.assert_pending(&id).await;

    // An honest relay at last.
    let mut link = relay.accept().await;
    let (resent, message) = link.next_send().await;
    assert_eq!(resent, id);
    link.deliver(&id, &message, 1).await;
    alice.assert_delivered(&id).await;
    alice.client.stop().await;
}

/// `depth` nested arrays: `[[[…]]]`.
fn nested_arrays(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_and_huge_json_is_dropped_with_a_diagnostic() {
    let (_relay, mut alice, mut link, id, message) = scene().await;

    // 10 000 levels deep: alone, inside a known frame, and as the content of a MessageReceived.
    link.send_text(nested_arrays(10_000)).await;
    link.send_text(format!(
        r#"{{"type":"MessageSent","message_id":"{id}","recipient":"bob","timestamp":1,"x":{}}}"#,
        nested_arrays(10_000)
    ))
    .await;
    link.send(&received(1, "bob", &nested_arrays(10_000))).await;
    // The dropped inbound frame is released all the same
    // (`docs/protocol.md#client-processing-order`).
    assert_eq!(link.releases_until(1).await.len(), 1);
    // Just under the limit, a huge unknown field is ignored and the frame processed.
    link.send_json(json!({"type": "PresenceStatus", "user_id": "bob", "online": true, "pad": "p".repeat(MAX_FRAME_BYTES - 200)}))
        .await;
    alice
        .events
        .wait("the padded presence", |e| {
            matches!(e.engine(), Some(Event::PresenceUpdated { peer_id, online: true, .. }) if peer_id == "bob")
        })
        .await;
    assert_eq!(
        alice
            .events
            .count(|e| warn_diagnostic(e, "dropped relay frame: malformed frame")),
        2
    );
    assert_eq!(
        alice
            .events
            .count(|e| warn_diagnostic(e, "dropped inbound frame from bob")),
        1
    );
    // The MessageSent buried in the deep frame answered nothing.
    alice.assert_pending(&id).await;
    link.deliver(&id, &message, 2).await;
    alice.assert_delivered(&id).await;
    alice.client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stamped_identities_that_break_the_identifier_rules_are_dropped_unquoted() {
    let (_relay, mut alice, mut link, id, message) = scene().await;
    let huge = "b".repeat(100_000);
    let valid = message_from("bob", "in1", "hi", true);
    let stamps = [
        (
            huge.as_str(),
            "bob",
            "stamped sender is longer than 256 bytes",
        ),
        (
            "bob",
            "bo\u{1}b",
            "stamped sender_account contains a control character",
        ),
        ("", "bob", "stamped sender is empty"),
    ];
    for (seq, (sender, account, _)) in (1..).zip(stamps) {
        link.send(&RelayFrame::MessageReceived {
            seq: Some(seq),
            sender: sender.into(),
            sender_account: Some(account.into()),
            content: valid.clone(),
            message_id: "in1".into(),
            timestamp: 1,
            reply_to_msg: None,
        })
        .await;
    }
    link.send_json(json!({"type": "PresenceStatus", "user_id": huge, "online": true}))
        .await;
    // Dropped frames are released all the same, and nothing else is written: no ACK for a
    // message nobody can be sure came from bob.
    assert_eq!(
        link.releases_until(3).await.last(),
        Some(&ClientFrame::AckUpTo { seq: 3 })
    );
    for (_, _, why) in stamps {
        alice
            .events
            .wait(why, |e| {
                warn_diagnostic(e, &format!("dropped inbound frame: {why}"))
            })
            .await;
    }
    alice
        .events
        .wait("the presence dropped", |e| {
            warn_diagnostic(e, "dropped relay frame: PresenceStatus user_id is longer")
        })
        .await;
    assert_eq!(alice.events.count(|e| received_message(e).is_some()), 0);
    assert_eq!(
        alice
            .events
            .count(|e| matches!(e.engine(), Some(Event::PresenceUpdated { .. }))),
        0
    );
    assert_eq!(alice.events.count(|e| diagnostic_len(e) > 1024), 0);
    link.deliver(&id, &message, 4).await;
    alice.assert_delivered(&id).await;
    alice.client.stop().await;
}

/// The frames the client acts on, each with a valid body naming the send `id`, and the fields
/// to get wrong.
fn consumed_frames(id: &str) -> Vec<(Value, Vec<&'static str>)> {
    vec![
        (
            json!({"type": "MessageSent", "message_id": id, "recipient": "bob", "timestamp": 1, "disposition": "stored"}),
            vec!["message_id", "recipient", "timestamp", "disposition"],
        ),
        (
            json!({"type": "DeliveryError", "message_id": id, "recipient": "bob", "reason": "recipient_unreachable: unknown_recipient"}),
            vec!["message_id", "recipient", "reason"],
        ),
        (
            json!({"type": "RateLimited", "retry_after_ms": 1, "frame_type": "SendMessage", "message_id": id, "seq": 1}),
            vec!["retry_after_ms", "frame_type", "message_id", "seq"],
        ),
        (
            json!({"type": "MessageReceived", "seq": 9, "sender": "bob", "sender_account": "bob",
                   "content": message_from("bob", "in1", "hi", false), "message_id": "in1", "timestamp": 1,
                   "reply_to_msg": "r"}),
            vec![
                "seq",
                "sender",
                "sender_account",
                "content",
                "message_id",
                "timestamp",
                "reply_to_msg",
            ],
        ),
        (json!({"type": "DrainComplete", "count": 0}), vec!["count"]),
        (
            json!({"type": "PresenceStatus", "user_id": "bob", "online": false}),
            vec!["user_id", "online"],
        ),
        (
            json!({"type": "SessionSuperseded", "reason": "new_session"}),
            vec!["reason"],
        ),
        (
            json!({"type": "AddressDeclared", "address": "off1x"}),
            vec!["address"],
        ),
        (
            json!({"type": "AddressError", "reason": "bad_signature"}),
            vec!["reason"],
        ),
        (
            json!({"type": "Error", "code": "internal", "frame_type": "SendMessage", "message_id": id, "detail": "d"}),
            vec!["code", "frame_type", "message_id", "detail"],
        ),
        (
            json!({"type": "Authenticated", "user_id": "mallory", "username": "mallory", "capabilities": []}),
            vec!["user_id", "username", "capabilities"],
        ),
    ]
}

/// Values no field of a relay frame takes: each field gets every one that is not of its type
/// (the decoder refuses them all, whatever the field).
fn wrong_values(current: &Value) -> Vec<Value> {
    let candidates = [
        json!("7"),
        json!(7),
        json!(-1),
        json!(1.5),
        json!(true),
        json!({"nested": [1]}),
        json!(["x", 7]),
    ];
    let same_kind = |v: &Value| {
        std::mem::discriminant(v) == std::mem::discriminant(current)
            && !(v.is_number() && current.is_number() && v.is_u64() != current.is_u64())
    };
    candidates.into_iter().filter(|v| !same_kind(v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistyped_relay_frames_are_dropped_and_settle_nothing() {
    let (_relay, mut alice, mut link, id, message) = scene().await;

    let mut sent = 0;
    for (body, fields) in consumed_frames(&id) {
        for field in fields {
            for wrong in wrong_values(&body[field]) {
                // A wrong value for an optional field is as invalid as for a required one.
                let mut frame = body.clone();
                frame[field] = wrong;
                link.send_json(frame).await;
                sent += 1;
            }
        }
    }
    // A wrong value the size of a frame: the diagnostic does not quote it whole.
    link.send_json(
        json!({"type": "MessageSent", "message_id": id, "recipient": "bob",
                          "timestamp": "t".repeat(MAX_FRAME_BYTES - 200)}),
    )
    .await;
    sent += 1;
    assert!(sent > 100, "{sent} mistyped frames");
    // A frame the client is sure to act on, after all of them: when its answer comes, every
    // mistyped frame before it was read.
    synced(&mut link, &mut alice, 1, "in-sync").await;
    assert_eq!(
        alice
            .events
            .count(|e| warn_diagnostic(e, "dropped relay frame: invalid")),
        sent,
        "one diagnostic per mistyped frame"
    );
    assert_eq!(
        alice
            .events
            .count(|e| warn_diagnostic(e, "dropped relay frame") && diagnostic_len(e) > 1024),
        0
    );
    // Nothing was taken from any of them: no answer, verdict, failure, latch or message.
    assert_eq!(alice.events.count(|e| received_message(e).is_some()), 1);
    assert_eq!(
        alice
            .events
            .count(|e| matches!(e, ClientEvent::RelaySessionSuperseded { .. })),
        0
    );
    alice.assert_pending(&id).await;
    assert_eq!(
        link.releases_until(1).await,
        vec![ClientFrame::AckUpTo { seq: 1 }],
        "the seq of a mistyped MessageReceived is never released"
    );
    link.deliver(&id, &message, 2).await;
    alice.assert_delivered(&id).await;
    alice.client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_frames_are_forwarded_verbatim_and_never_answered() {
    let (_relay, mut alice, mut link, id, message) = scene().await;

    let unknown = vec![
        json!({"type": "Teleport", "to": "mars"}).to_string(),
        // Client-to-relay frame names mean nothing coming from the relay.
        json!({"type": "SendMessage", "recipient": "alice", "content": "x", "message_id": id})
            .to_string(),
        json!({"type": "Ack", "seq": 1}).to_string(),
        json!({"type": ""}).to_string(),
        json!({"type": "🦀", "x": [1, 2, 3]}).to_string(),
        json!({"type": "T".repeat(100_000)}).to_string(),
        // Known, not consumed by the runtime: forwarded as well.
        json!({"type": "Error", "code": "bad_request"}).to_string(),
    ];
    for text in &unknown {
        link.send_text(text.clone()).await;
    }
    for text in &unknown {
        alice
            .events
            .wait("the frame forwarded verbatim", |e| {
                server_message(e) == Some(text.as_str())
            })
            .await;
    }
    // The client's next frame is the release of the next inbound frame: nothing answered the
    // unknown ones.
    link.send(&received(
        1,
        "bob",
        &message_from("bob", "in1", "hi", false),
    ))
    .await;
    assert_eq!(link.next_frame().await, ClientFrame::AckUpTo { seq: 1 });
    alice.assert_pending(&id).await;
    link.deliver(&id, &message, 2).await;
    alice.assert_delivered(&id).await;
    alice.client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_duplicate_and_out_of_order_seqs_are_processed_once_and_all_released() {
    let (_relay, mut alice, mut link, id, message) = scene().await;

    // Out of order, repeated, and at both ends of the seq range.
    let seqs = [5, 3, 5, 4, 0, u64::MAX, u64::MAX, 2];
    for seq in seqs {
        let content = message_from("bob", &format!("m{seq}"), "hi", false);
        link.send(&received(seq, "bob", &content)).await;
    }
    for seq in [5, 3, 4, 0, u64::MAX, 2] {
        alice.events.wait_received(&format!("m{seq}")).await;
    }
    // Every seq is released, and the client keeps working.
    let mut released = std::collections::BTreeSet::new();
    while !seqs.iter().all(|s| released.contains(s)) {
        match link.next_frame().await {
            ClientFrame::Ack { seq } => {
                released.insert(seq);
            }
            ClientFrame::AckUpTo { seq: up_to } => {
                released.extend(seqs.iter().copied().filter(|&s| s <= up_to));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(alice.events.count(|e| received_message(e).is_some()), 6);
    link.deliver(&id, &message, 6).await;
    alice.assert_delivered(&id).await;
    alice.client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_ack_for_a_message_to_someone_else_settles_nothing() {
    let (_relay, mut alice, mut link, id, message) = scene().await;
    link.send(&RelayFrame::MessageSent {
        message_id: id.clone(),
        recipient: "bob".into(),
        timestamp: 1,
        disposition: Some(Disposition::Live),
    })
    .await;

    let ack = message.ack(format!("ack-{id}"), 2, "internet");
    // Carried by mallory's connection, claiming bob: not bob's ACK.
    link.send(&received(1, "mallory", &ack.encode())).await;
    // Carried by bob's connection but claiming mallory: not bob's ACK either.
    let mut claims_mallory = ack.clone();
    claims_mallory.sender = "mallory".into();
    link.send(&received(2, "bob", &claims_mallory.encode()))
        .await;
    // An ACK for a message nobody sent.
    let mut unknown = ack.clone();
    unknown
        .metadata
        .insert("ack_for".into(), "never-sent".into());
    link.send(&received(3, "bob", &unknown.encode())).await;

    // All three are processed (so released) and ignored.
    assert_eq!(
        link.releases_until(3).await.last(),
        Some(&ClientFrame::AckUpTo { seq: 3 })
    );
    alice
        .events
        .wait("the misattributed ACKs reported", |e| {
            warn_diagnostic(e, "claiming mallory")
        })
        .await;
    assert_eq!(
        alice
            .events
            .count(|e| warn_diagnostic(e, &format!("ignored ACK for {id}"))),
        2
    );
    alice.assert_pending(&id).await;

    link.send(&received(4, "bob", &ack.encode())).await;
    alice.assert_delivered(&id).await;
    alice.client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_for_ids_never_sent_and_a_hostile_retry_after_change_nothing() {
    let (relay, mut alice, mut link, id, message) = scene().await;

    for frame in [
        RelayFrame::MessageSent {
            message_id: "never-sent".into(),
            recipient: "bob".into(),
            timestamp: 1,
            disposition: Some(Disposition::Stored),
        },
        RelayFrame::DeliveryError {
            message_id: Some("never-sent".into()),
            recipient: "bob".into(),
            reason: "recipient_unreachable: unknown_recipient".into(),
        },
        // The published-contract form names no id: it covers open sends to carol only.
        RelayFrame::DeliveryError {
            message_id: None,
            recipient: "carol".into(),
            reason: "recipient_unreachable: unknown_recipient".into(),
        },
        RelayFrame::Error {
            code: "internal".into(),
            frame_type: Some("SendMessage".into()),
            message_id: Some("never-sent".into()),
            detail: None,
        },
    ] {
        link.send(&frame).await;
    }
    synced(&mut link, &mut alice, 1, "in1").await;
    alice.assert_pending(&id).await;

    // A RateLimited for the send, asking for a pause longer than any clock: the send counts
    // as failed, the client does not panic, and it keeps its message for the next connection.
    link.send(&RelayFrame::RateLimited {
        retry_after_ms: u64::MAX,
        frame_type: "SendMessage".into(),
        message_id: Some(id.clone()),
        seq: None,
    })
    .await;
    alice
        .events
        .wait("the RateLimited forwarded", |e| {
            server_message(e).is_some_and(|j| j.contains("RateLimited"))
        })
        .await;
    alice.assert_pending(&id).await;
    link.ws.close(None).await.unwrap();

    let mut link = relay.accept().await;
    let (resent, _) = link.next_send().await;
    assert_eq!(resent, id);
    link.deliver(&id, &message, 1).await;
    alice.assert_delivered(&id).await;
    alice.client.stop().await;
}

/// How far the client has read, as the relay sees it: a Ping follows every frame, with the
/// frame's number, and the client answers a Ping only once it has read past that frame.
fn read_position(pong: &[u8]) -> u64 {
    u64::from_be_bytes(pong.try_into().expect("an 8-byte Ping payload comes back"))
}

/// Writes `count` frames made by `frame`, each followed by a Ping carrying its number + 1.
async fn flood(
    sink: &mut futures_util::stream::SplitSink<WebSocketStream<TcpStream>, WsMessage>,
    count: u64,
    frame: impl Fn(u64) -> String,
) {
    for i in 0..count {
        sink.feed(WsMessage::text(frame(i))).await.unwrap();
        sink.feed(WsMessage::Ping((i + 1).to_be_bytes().to_vec().into()))
            .await
            .unwrap();
        if i % 256 == 255 {
            sink.flush().await.unwrap();
        }
    }
    sink.flush().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_100_000_frames_is_read_no_faster_than_the_app_takes_it() {
    const FLOOD: u64 = 100_000;
    let relay = FakeRelay::bind().await;
    let dir = tempfile::tempdir().unwrap();
    // Frames the client has read (from the relay's side), and flood events the app has
    // taken; the app is slow, as apps are. The gap between the two is what the client holds.
    let read = Arc::new(AtomicU64::new(0));
    let taken = Arc::new(AtomicU64::new(0));
    let widest_gap = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let app = {
        let (read, taken, widest_gap) = (read.clone(), taken.clone(), widest_gap.clone());
        support::Events(move |e: ClientEvent| {
            if server_message(&e).is_some_and(|j| j.contains("\"Flood\"")) {
                let taken = taken.fetch_add(1, Ordering::SeqCst) + 1;
                let gap = read.load(Ordering::SeqCst).saturating_sub(taken);
                widest_gap.fetch_max(gap, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(20));
            } else {
                let _ = tx.send(e);
            }
        })
    };
    let client = Client::start(
        &config(&relay, &dir),
        app,
        &tokio::runtime::Handle::current(),
    )
    .unwrap();
    let mut events = Events {
        rx,
        seen: Vec::new(),
    };
    let link = relay.accept().await;
    let (mut sink, mut stream) = link.ws.split();
    let reader = {
        let read = read.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                if let WsMessage::Pong(payload) = message {
                    read.fetch_max(read_position(&payload), Ordering::SeqCst);
                    if read_position(&payload) == FLOOD {
                        return stream;
                    }
                }
            }
            panic!("the connection ended during the flood");
        })
    };
    let pad = "p".repeat(200);
    flood(&mut sink, FLOOD, |i| {
        json!({"type": "Flood", "i": i, "pad": pad}).to_string()
    })
    .await;
    let stream = tokio::time::timeout(Duration::from_secs(120), reader)
        .await
        .expect("the client reads the whole flood")
        .unwrap();
    let all_taken = tokio::time::timeout(DEADLINE, async {
        while taken.load(Ordering::SeqCst) < FLOOD {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(all_taken.is_ok(), "every flood frame reaches the app");
    // Two windows of frames on their way to the driver, and one driver step of them taken but
    // not yet dispatched: the client never held more than about a thousand frames, whatever
    // the flood.
    let widest_gap = widest_gap.load(Ordering::SeqCst);
    assert!(
        widest_gap <= 1100,
        "the client held {widest_gap} frames it had read but the app had not taken"
    );

    // Still the same connection, and it works.
    let mut link = Link {
        ws: sink.reunite(stream).unwrap(),
    };
    let id = client
        .send(SendInput {
            recipient: "bob".into(),
            content: "after the flood".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let (sent, message) = link.next_send().await;
    assert_eq!(sent, id);
    link.deliver(&id, &message, 1).await;
    events
        .wait("message_delivered", |e| delivered(e, &id))
        .await;
    client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_flood_is_read_no_faster_than_its_acks_can_be_written() {
    const FLOOD: u64 = 5_000;
    let relay = FakeRelay::bind().await;
    let mut alice = Alice::start(&relay);
    // 930 frames a second for the client: its ACKs trail the flood.
    let link = relay
        .accept_with(RateLimitInfo {
            burst: 100,
            per_sec: 1000,
        })
        .await;
    let (mut sink, mut stream) = link.ws.split();
    let reader = tokio::spawn(async move {
        let (mut read, mut acked, mut widest_gap) = (0, 0, 0);
        while acked < FLOOD {
            match stream.next().await {
                Some(Ok(WsMessage::Pong(payload))) => read = read.max(read_position(&payload)),
                Some(Ok(WsMessage::Text(text))) => {
                    if let ClientFrame::SendMessage { content, .. } =
                        ClientFrame::decode(text.as_str()).unwrap()
                    {
                        assert!(Message::decode(&content).unwrap().ack_for().is_some());
                        acked += 1;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("the connection ended during the flood: {other:?}"),
            }
            widest_gap = u64::max(widest_gap, read.saturating_sub(acked));
        }
        widest_gap
    });
    flood(&mut sink, FLOOD, |i| {
        let content = message_from("bob", &format!("f{i}"), "flood", true);
        received(i + 1, "bob", &content).encode()
    })
    .await;
    let widest_gap = tokio::time::timeout(Duration::from_secs(120), reader)
        .await
        .expect("every message is acknowledged")
        .unwrap();
    // ACKs owed stop the reading at 256, plus what is on its way through the driver (two
    // windows of frames, and one driver step of ACKs).
    assert!(
        widest_gap <= 1600,
        "the client read {widest_gap} messages ahead of the ACKs it owed"
    );
    alice.events.wait_received(&format!("f{}", FLOOD - 1)).await;
    assert_eq!(
        alice.events.count(|e| received_message(e).is_some()),
        FLOOD as usize
    );
    alice.client.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_id_the_client_writes_is_a_uuid_and_a_re_ack_repeats_its_id() {
    let relay = FakeRelay::bind().await;
    let mut alice = Alice::start(&relay);
    let mut link = relay.accept().await;

    // An app id that is no UUID travels under its name-based UUID, the same one every time.
    let sent = alice
        .client
        .send(SendInput {
            recipient: "bob".into(),
            content: "with my own id".into(),
            id: Some("order-42".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sent, "order-42", "the app keeps its own id");
    let (frame_id, message) = link.next_send().await;
    assert!(courier_proto::is_wire_id(&frame_id), "{frame_id}");
    assert_eq!(frame_id, courier_proto::wire_id("order-42"));
    assert_eq!(
        message.id, frame_id,
        "the end-to-end message carries the wire id"
    );

    // The recipient's ACK names the wire id, and settles the app's id.
    link.deliver(&frame_id, &message, 1).await;
    alice.assert_delivered("order-42").await;

    // A message delivered twice is acknowledged twice under one UUID.
    let content = message_from("bob", "bobs-note", "hello", true);
    let mut acks = Vec::new();
    for seq in [2, 3] {
        link.send(&received(seq, "bob", &content)).await;
        let (ack_frame_id, ack) = link.next_send().await;
        assert_eq!(ack.ack_for(), Some("bobs-note"));
        assert!(courier_proto::is_wire_id(&ack_frame_id), "{ack_frame_id}");
        assert_eq!(ack.id, ack_frame_id);
        acks.push(ack_frame_id);
    }
    assert_eq!(acks[0], acks[1], "a re-ACK repeats the first ACK's id");
    assert_eq!(acks[0], courier_proto::ack_id("bob", "bobs-note"));
}
