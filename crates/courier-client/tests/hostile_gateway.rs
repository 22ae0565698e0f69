//! The gateway carrier against a gateway that misbehaves (`docs/protocol.md#gateway-client`), over
//! real TCP on 127.0.0.1: a refusal or a binding to another address is a security warning and a
//! close, a challenge that is not 32 bytes or an attach that stalls is a close, and nothing is
//! submitted or taken as inbound before the gateway bound this device's own address. Every
//! reconnect attaches again from `Identify`. The attach deadline and the reconnect backoff are
//! shortened for the tests; every wait is for an event or a line, under a deadline.

mod support;

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use courier_client::carrier::backoff::Backoff;
use courier_client::carrier::gateway::GatewayClientTimings;
use courier_client::client::{Client, SendInput};
use courier_client::config::{parse_protocol_config, ProtocolConfig};
use courier_client::event::ClientEvent;
use courier_client::store::MessageStatus;
use courier_engine::Event;
use courier_proto::{verify_gateway_declaration, IdentityKey, Message};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;

const DEADLINE: Duration = Duration::from_secs(5);
/// What the client is told to wait for a Challenge and for the answer to its declaration.
const ATTACH_DEADLINE: Duration = Duration::from_millis(400);

fn bob() -> IdentityKey {
    IdentityKey::from_seed([42; 32])
}

fn config(address: &str) -> ProtocolConfig {
    let mut config = parse_protocol_config(&json!({
        "appId": "hostile",
        "encryption": { "enabled": false },
        "storage": { "memory": true },
        "transports": { "gateway": { "address": address } },
    }))
    .unwrap();
    config.gateway.as_mut().unwrap().timings = GatewayClientTimings {
        attach_deadline: ATTACH_DEADLINE,
        backoff: Backoff {
            min: Duration::from_millis(20),
            max: Duration::from_millis(100),
        },
        ..GatewayClientTimings::default()
    };
    config
}

struct FakeGateway {
    listener: TcpListener,
    address: String,
}

impl FakeGateway {
    async fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        Self { listener, address }
    }

    /// The client's next connection.
    async fn accept(&self) -> Peer {
        let (tcp, _) = tokio::time::timeout(DEADLINE, self.listener.accept())
            .await
            .expect("the client connects within the deadline")
            .unwrap();
        let (read, write) = tcp.into_split();
        Peer {
            reader: BufReader::new(read),
            write,
        }
    }
}

/// The gateway's end of one connection.
struct Peer {
    reader: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

/// A challenge no earlier connection of the test process got.
fn fresh_challenge() -> [u8; 32] {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::array::from_fn(|i| n ^ i as u8)
}

impl Peer {
    async fn send_raw(&mut self, bytes: &[u8]) {
        self.write.write_all(bytes).await.unwrap();
    }

    async fn send(&mut self, frame: Value) {
        let mut line = frame.to_string().into_bytes();
        line.push(b'\n');
        self.send_raw(&line).await;
    }

    /// The client's next line, which must come within the deadline.
    async fn recv(&mut self) -> Value {
        let mut line = String::new();
        let n = tokio::time::timeout(DEADLINE, self.reader.read_line(&mut line))
            .await
            .expect("a line within the deadline")
            .unwrap();
        assert!(n > 0, "the client closed the connection");
        serde_json::from_str(&line).expect("one JSON object per line")
    }

    /// The client closes within the deadline, having written nothing more.
    async fn expect_closed(&mut self) {
        let mut line = String::new();
        match tokio::time::timeout(DEADLINE, self.reader.read_line(&mut line))
            .await
            .expect("closed within the deadline")
        {
            Ok(0) | Err(_) => {}
            Ok(_) => panic!("expected the connection to close, got {line:?}"),
        }
    }

    /// Reads `Identify` (the first line of every attach) and answers with a fresh challenge.
    async fn challenge(&mut self, own: &str) -> [u8; 32] {
        assert_eq!(
            self.recv().await,
            json!({"type": "Identify", "device_id": own, "protocol_version": 1})
        );
        let challenge = fresh_challenge();
        self.send(json!({"type": "Challenge", "challenge": STANDARD.encode(challenge), "protocol_version": 1}))
            .await;
        challenge
    }

    /// Reads `DeclareAddress`, whose proof must verify over this connection's challenge.
    async fn declaration(&mut self, own: &str, challenge: &[u8; 32]) {
        let frame = self.recv().await;
        assert_eq!(frame["type"], "DeclareAddress", "{frame}");
        let field = |name: &str| frame[name].as_str().unwrap().to_owned();
        let bound = verify_gateway_declaration(
            own,
            challenge,
            &field("address"),
            &field("public_key"),
            &field("signature"),
        )
        .expect("the proof verifies over this connection's challenge");
        assert_eq!(bound.to_string(), own);
    }

    async fn attach(&mut self, own: &str) {
        let challenge = self.challenge(own).await;
        self.declaration(own, &challenge).await;
        self.send(json!({"type": "AddressDeclared", "address": own}))
            .await;
    }
}

fn to_bob(content: &str) -> SendInput {
    SendInput {
        recipient: bob().address().to_string(),
        content: content.into(),
        ..Default::default()
    }
}

/// Everything the client emitted until it stopped (stopping dispatches every pending event).
async fn stop(client: Client, events: mpsc::Receiver<ClientEvent>) -> Vec<ClientEvent> {
    client.stop().await;
    events.try_iter().collect()
}

fn attached(e: &ClientEvent) -> bool {
    matches!(e, ClientEvent::GatewayStatusChanged { attached: true, .. })
}

fn warnings(events: &[ClientEvent]) -> Vec<(String, &'static str, String)> {
    events.iter().filter_map(support::warning).collect()
}

fn sent_anything(events: &[ClientEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e.engine(), Some(Event::MessageSent { .. })))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_declaration_is_reported_once_and_the_carrier_never_comes_up() {
    let gateway = FakeGateway::bind().await;
    let (client, events) = support::start(&config(&gateway.address));
    let own = client.local_address().to_owned();
    let queued = client.send(to_bob("waiting")).await.unwrap();
    // Refused twice: each connection closes after the answer, and each reconnect attaches anew.
    for _ in 0..2 {
        let mut peer = gateway.accept().await;
        let challenge = peer.challenge(&own).await;
        peer.declaration(&own, &challenge).await;
        peer.send(json!({"type": "AddressError", "reason": "\u{1b}[31mcall +1-555-0100 now"}))
            .await;
        // Nothing but Identify and DeclareAddress was written: no SendMessage, ever.
        peer.expect_closed().await;
    }
    let third = gateway.accept().await;
    assert_eq!(client.stats().carriers_up, 0);
    assert_eq!(client.status(queued).await.unwrap(), MessageStatus::Queued);
    drop(third);
    let events = stop(client, events).await;
    let warned = warnings(&events);
    assert_eq!(warned.len(), 1, "reported once, not on every reconnect");
    let (peer, code, reason) = &warned[0];
    assert_eq!(
        (peer.as_str(), *code),
        (own.as_str(), "GATEWAY_ADDRESS_DECLARATION_REFUSED")
    );
    assert!(
        !reason.contains("555"),
        "the gateway's text reached the event: {reason}"
    );
    assert!(!events.iter().any(attached));
    assert!(!sent_anything(&events));
    assert!(events.iter().any(|e| matches!(
        e,
        ClientEvent::GatewayStatusChanged {
            connected: true,
            attached: false
        }
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_to_another_address_is_reported_and_closed() {
    let gateway = FakeGateway::bind().await;
    let (client, events) = support::start(&config(&gateway.address));
    let own = client.local_address().to_owned();
    client.send(to_bob("waiting")).await.unwrap();
    let other = bob().address().to_string();
    let mut peer = gateway.accept().await;
    let challenge = peer.challenge(&own).await;
    peer.declaration(&own, &challenge).await;
    peer.send(json!({"type": "AddressDeclared", "address": other}))
        .await;
    peer.expect_closed().await;
    // The next attach starts from Identify again; this time the "address" is free text.
    let mut again = gateway.accept().await;
    let challenge = again.challenge(&own).await;
    again.declaration(&own, &challenge).await;
    again
        .send(json!({"type": "AddressDeclared", "address": "call +1-555-0100"}))
        .await;
    again.expect_closed().await;
    let mut third = gateway.accept().await;
    let _ = third.challenge(&own).await;
    assert_eq!(client.stats().carriers_up, 0);
    let events = stop(client, events).await;
    let warned: Vec<(String, &str)> = warnings(&events)
        .into_iter()
        .map(|(peer, code, _)| (peer, code))
        .collect();
    assert_eq!(
        warned,
        [
            (other, "GATEWAY_ADDRESS_BINDING_MISMATCH"),
            (String::new(), "GATEWAY_ADDRESS_BINDING_MISMATCH")
        ],
        "the bound address as the peer, and no peer where it is not an address"
    );
    assert!(!events.iter().any(attached));
    assert!(!sent_anything(&events));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenge_that_is_not_32_bytes_closes_before_any_declaration() {
    let gateway = FakeGateway::bind().await;
    let (client, events) = support::start(&config(&gateway.address));
    let own = client.local_address().to_owned();
    for challenge in [
        json!(STANDARD.encode([7u8; 31])),
        json!(STANDARD.encode([7u8; 33])),
        json!("not base64 at all"),
        json!(32),
        Value::Null,
    ] {
        let mut peer = gateway.accept().await;
        assert_eq!(peer.recv().await["device_id"], json!(own));
        peer.send(json!({"type": "Challenge", "challenge": challenge, "protocol_version": 1}))
            .await;
        peer.expect_closed().await;
    }
    let events = stop(client, events).await;
    assert!(!events.iter().any(attached));
    assert!(warnings(&events).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_that_stalls_is_closed_at_the_deadline() {
    let gateway = FakeGateway::bind().await;
    let (client, events) = support::start(&config(&gateway.address));
    let own = client.local_address().to_owned();

    // No Challenge: lines that are not one do not count, nor keep the attach alive.
    let mut silent = gateway.accept().await;
    assert_eq!(silent.recv().await["type"], "Identify");
    silent.send(json!({"type": "Ping"})).await;
    silent.expect_closed().await;
    support::wait_for(&events, "the reason", |e| {
        matches!(e, ClientEvent::Diagnostic { message, .. } if message.contains("no Challenge within"))
    })
    .await;

    // A Challenge, then no answer to the declaration.
    let mut mute = gateway.accept().await;
    let challenge = mute.challenge(&own).await;
    mute.declaration(&own, &challenge).await;
    mute.expect_closed().await;
    support::wait_for(&events, "the reason", |e| {
        matches!(e, ClientEvent::Diagnostic { message, .. } if message.contains("no answer to DeclareAddress"))
    })
    .await;

    let events = stop(client, events).await;
    assert!(!events.iter().any(attached));
}

/// A message from bob to the client, as the gateway would deliver it.
fn from_bob(own: &str, id: &str) -> Value {
    let message = Message {
        id: id.to_owned(),
        sender: bob().address().to_string(),
        recipient: own.to_owned(),
        app_id: "hostile".to_owned(),
        priority: courier_proto::Priority::Medium,
        ttl: 10,
        hop_count: 0,
        timestamp: 1,
        lamport_clock: 1,
        content_type: courier_proto::ContentType::Text,
        content: format!("hello {id}"),
        metadata: Default::default(),
        requires_ack: true,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    };
    received(&message)
}

fn received(message: &Message) -> Value {
    json!({
        "type": "MessageReceived",
        "sender": message.sender,
        "content": message.encode(),
        "message_id": message.id,
        "timestamp": 1,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_submitted_or_received_before_the_gateway_binds_our_address() {
    let gateway = FakeGateway::bind().await;
    let (client, events) = support::start(&config(&gateway.address));
    let own = client.local_address().to_owned();
    let bob_address = bob().address().to_string();
    let queued = client
        .send(to_bob("queued before the attach"))
        .await
        .unwrap();

    let mut peer = gateway.accept().await;
    assert_eq!(peer.recv().await["type"], "Identify");
    // Before the binding: junk, an unknown type, and a message for us, none of which counts.
    peer.send_raw(b"not json\n\n").await;
    peer.send(json!({"type": "Hello"})).await;
    peer.send(from_bob(&own, "too-early")).await;
    let challenge = fresh_challenge();
    peer.send(json!({"type": "Challenge", "challenge": STANDARD.encode(challenge), "protocol_version": 7}))
        .await;
    // The very next line is the declaration: the queued message did not go before it.
    peer.declaration(&own, &challenge).await;
    peer.send(from_bob(&own, "still-too-early")).await;
    assert_eq!(client.stats().carriers_up, 0);
    assert_eq!(
        client.status(queued.clone()).await.unwrap(),
        MessageStatus::Queued
    );

    peer.send(json!({"type": "AddressDeclared", "address": own}))
        .await;
    let send = peer.recv().await;
    assert_eq!(send["type"], "SendMessage", "{send}");
    assert_eq!(send["message_id"], json!(queued));
    assert_eq!(send["recipient"], json!(bob_address));
    peer.send(json!({"type": "MessageSent", "message_id": queued, "recipient": bob_address, "timestamp": 2, "disposition": "live"}))
        .await;

    // Bound: a message for us is taken in and acknowledged end to end over the gateway.
    peer.send(from_bob(&own, "in-time")).await;
    let ack = peer.recv().await;
    assert_eq!(ack["type"], "SendMessage", "{ack}");
    assert_eq!(ack["recipient"], json!(bob_address));
    let ack = Message::decode(ack["content"].as_str().unwrap()).unwrap();
    assert_eq!(ack.ack_for(), Some("in-time"));
    support::wait_for(&events, "the message", |e| {
        matches!(e.engine(), Some(Event::MessageReceived { message, transport, .. }) if message.id == "in-time" && transport == "gateway")
    })
    .await;

    // Bob's ACK of the queued message settles it.
    let frame = Message::decode(send["content"].as_str().unwrap()).unwrap();
    let bobs_ack = frame.ack("ack-queued".into(), 3, "gateway");
    peer.send(received(&bobs_ack)).await;
    support::wait_for(&events, "the delivery", |e| {
        matches!(e.engine(), Some(Event::MessageDelivered { message_id, transport, .. }) if *message_id == queued && transport == "gateway")
    })
    .await;

    let events = stop(client, events).await;
    let early = events.iter().any(|e| {
        matches!(e.engine(), Some(Event::MessageReceived { message, .. }) if message.id.contains("early"))
    });
    assert!(
        !early,
        "a message arrived over an unbound session was taken in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reconnect_attaches_again_from_identify() {
    let gateway = FakeGateway::bind().await;
    let (client, events) = support::start(&config(&gateway.address));
    let own = client.local_address().to_owned();
    let mut first = gateway.accept().await;
    first.attach(&own).await;
    support::wait_for(&events, "the first attach", attached).await;
    drop(first);
    support::wait_for(&events, "the loss", |e| {
        matches!(
            e,
            ClientEvent::GatewayStatusChanged {
                connected: false,
                attached: false
            }
        )
    })
    .await;

    let mut second = gateway.accept().await;
    // Identify again, a new challenge, a new proof.
    second.attach(&own).await;
    support::wait_for(&events, "the second attach", attached).await;
    let id = client.send(to_bob("after the reconnect")).await.unwrap();
    let send = second.recv().await;
    assert_eq!(send["type"], "SendMessage");
    assert_eq!(send["message_id"], json!(id));
    stop(client, events).await;
}

/// A gateway that floods the bound session with messages while the app is slow to take them:
/// the carrier reads no faster than the driver takes its lines, so what the client holds is
/// bounded by its two intake windows and the sockets' own buffers, however long the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_messages_is_read_no_faster_than_the_app_takes_it() {
    // Large lines, so the sockets' buffers hold few of them and the bound is tight.
    const FLOOD: u64 = 6_000;
    const CHUNK: u64 = 100;
    let gateway = FakeGateway::bind().await;
    let written = Arc::new(AtomicU64::new(0));
    let taken = Arc::new(AtomicU64::new(0));
    let widest_gap = Arc::new(AtomicU64::new(0));
    let (tx, events) = mpsc::channel();
    let app = {
        let (written, taken, widest_gap) = (written.clone(), taken.clone(), widest_gap.clone());
        support::Events(move |e: ClientEvent| {
            let flood = matches!(e.engine(), Some(Event::MessageReceived { message, .. }) if message.id.starts_with("flood-"));
            if flood {
                let taken = taken.fetch_add(1, Ordering::SeqCst) + 1;
                let gap = written.load(Ordering::SeqCst).saturating_sub(taken);
                widest_gap.fetch_max(gap, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            } else {
                let _ = tx.send(e);
            }
        })
    };
    let client = Client::start(
        &config(&gateway.address),
        app,
        &tokio::runtime::Handle::current(),
    )
    .unwrap();
    let own = client.local_address().to_owned();
    let mut peer = gateway.accept().await;
    peer.attach(&own).await;
    support::wait_for(&events, "the attach", attached).await;

    // The client's ACKs are read and dropped, as a gateway that reads would.
    let Peer { reader, mut write } = peer;
    let drain = tokio::spawn(async move {
        let mut lines = reader.lines();
        while let Ok(Some(_)) = lines.next_line().await {}
    });
    // Encoded once: the gateway must write much faster than the app takes.
    let mut message =
        Message::decode(from_bob(&own, "flood")["content"].as_str().unwrap()).unwrap();
    message.id = "flood-XXXXXXXX".into();
    message.content = "p".repeat(8 * 1024);
    let template = received(&message).to_string();
    let mut next = 0;
    while next < FLOOD {
        let mut chunk = String::new();
        for i in next..next + CHUNK {
            chunk.push_str(&template.replace("flood-XXXXXXXX", &format!("flood-{i:08}")));
            chunk.push('\n');
        }
        write.write_all(chunk.as_bytes()).await.unwrap();
        next += CHUNK;
        written.store(next, Ordering::SeqCst);
    }
    let all_taken = tokio::time::timeout(Duration::from_secs(120), async {
        while taken.load(Ordering::SeqCst) < FLOOD {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        all_taken.is_ok(),
        "every message of the flood reaches the app"
    );
    // Written but not taken = the client's two intake windows (4 MiB each: ~500 of these
    // lines), one driver step, and the sockets' buffers (a few MiB on loopback); read without
    // limit it would be most of the flood.
    let widest_gap = widest_gap.load(Ordering::SeqCst);
    assert!(
        widest_gap <= FLOOD / 2,
        "the client held {widest_gap} lines it had read but the app had not taken"
    );
    client.stop().await;
    drain.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_gateway_link_is_kept_alive_with_pings() {
    let gateway = FakeGateway::bind().await;
    let mut config = config(&gateway.address);
    config.gateway.as_mut().unwrap().timings.keepalive = Duration::from_millis(100);
    let (client, events) = support::start(&config);
    let own = client.local_address().to_owned();
    let mut peer = gateway.accept().await;
    peer.attach(&own).await;
    // Nothing to send: the link still writes a line every keepalive interval, so a gateway's
    // idle timeout never closes it.
    for _ in 0..3 {
        assert_eq!(peer.recv().await, json!({"type": "Ping"}));
    }
    stop(client, events).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_refused_before_the_challenge_is_reported_and_closed() {
    let gateway = FakeGateway::bind().await;
    let mut config = config(&gateway.address);
    config.gateway.as_mut().unwrap().token =
        Some(courier_client::config::GatewayToken::new("the-token"));
    let (client, events) = support::start(&config);
    let own = client.local_address().to_owned();
    let mut peer = gateway.accept().await;
    assert_eq!(
        peer.recv().await,
        json!({"type": "Identify", "device_id": own, "protocol_version": 1, "token": "the-token"})
    );
    peer.send(json!({"type": "AddressError", "reason": "bad_token"}))
        .await;
    peer.expect_closed().await;
    let _next = gateway.accept().await;
    let events = stop(client, events).await;
    let warned: Vec<(String, &str)> = warnings(&events)
        .into_iter()
        .map(|(peer, code, _)| (peer, code))
        .collect();
    assert_eq!(warned, vec![(own, "GATEWAY_ADDRESS_DECLARATION_REFUSED")]);
    assert!(!events.iter().any(attached));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_send_fails_at_once_instead_of_waiting_out_the_answer_deadline() {
    let gateway = FakeGateway::bind().await;
    let (client, events) = support::start(&config(&gateway.address));
    let own = client.local_address().to_owned();
    let mut peer = gateway.accept().await;
    peer.attach(&own).await;
    support::wait_for(&events, "attached", attached).await;
    let id = client.send(to_bob("too fast")).await.unwrap();
    let send = peer.recv().await;
    assert_eq!(send["message_id"], json!(id));
    peer.send(json!({"type": "RateLimited", "retry_after_ms": 10, "frame_type": "SendMessage", "message_id": id}))
        .await;
    // Deferred within the test's deadline, well before the 15 s answer deadline would fail it.
    support::wait_for(&events, "the send deferred", |e| {
        matches!(e.engine(), Some(Event::MessageDeferred { message_id, .. }) if *message_id == id)
    })
    .await;
    stop(client, events).await;
}
