//! The relay under hostile clients: oversized and deeply nested input, wrong field types,
//! unknown frames, forged acks, floods and connections that never authenticate. Every case ends
//! in the documented answer or close code (`docs/protocol.md#transport`,
//! `docs/protocol.md#authentication`, `docs/protocol.md#frame-release`,
//! `docs/protocol.md#rate-limiting`), the relay keeps serving honest clients, and a message stored
//! before the attack is delivered after it.

mod common;

use std::time::Duration;

use common::*;
use courier_proto::limits::MAX_FRAME_BYTES;
use courier_proto::{ClientFrame, RelayFrame};
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// Stores a message for the offline account `wendy` before an attack.
async fn queue_witness(relay: &TestRelay) {
    relay.register("wendy").await;
    let mut walter = relay.online("walter").await;
    assert_sent(
        &walter.send_and_answer("wendy", "witness", "kept").await,
        "witness",
        "wendy",
        "stored",
    );
    walter.close().await;
}

/// After the attack, `wendy`'s drain holds the witness and nothing else.
async fn assert_witness_delivered(relay: &TestRelay) {
    let mut wendy = relay.client().await;
    wendy.authenticate("wendy", true).await;
    let (frames, count) = wendy.drain().await;
    assert_eq!(count, 1, "{frames:?}");
    let witness = &frames[0];
    assert_eq!(
        (
            witness.message_id.as_str(),
            witness.content.as_str(),
            witness.sender.as_str()
        ),
        ("witness", "kept", "walter")
    );
    wendy.close().await;
}

fn invalid(frame_type: &str) -> RelayFrame {
    RelayFrame::error("invalid_frame", Some(frame_type))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_close_with_1009_however_they_arrive() {
    let relay = TestRelay::start().await;
    queue_witness(&relay).await;
    let addr = relay.handle().local_addr();
    let over = MAX_FRAME_BYTES as u64 + 1;

    // Before authentication, by the frame header alone: one byte over, a multi-MB SendMessage,
    // and a length no memory could hold. Nothing of the payload has to arrive.
    for announced in [over, 3 * 1024 * 1024, 1 << 62] {
        let mut raw = RawClient::connect(addr).await;
        raw.announce_frame(0x1, announced).await;
        assert_eq!(raw.close_code().await, Some(1009), "{announced} bytes");
    }

    // After authentication, fragments each under the limit that add up to more.
    let mut raw = RawClient::connect(addr).await;
    raw.authenticate("mallory").await;
    let piece = vec![b'x'; 512 * 1024];
    raw.send_fragment(false, 0x1, &piece).await;
    raw.send_fragment(false, 0x0, &piece).await;
    raw.send_fragment(true, 0x0, &piece).await;
    assert_eq!(raw.close_code().await, Some(1009));

    // The same after authentication in one announced frame.
    let mut raw = RawClient::connect(addr).await;
    raw.authenticate("mallory").await;
    raw.announce_frame(0x1, 3 * 1024 * 1024).await;
    assert_eq!(raw.close_code().await, Some(1009));

    relay
        .wait_stats("the attacker's connections to end", |s| s.connections == 0)
        .await;
    assert_eq!(relay.stored_frames().await, 1);
    assert_witness_delivered(&relay).await;
}

/// After a 1009 the relay reads the rest of the refused message out so the client hears the
/// code, but only so much: a peer that keeps writing is cut off long before the close linger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_out_after_a_refusal_is_bounded_in_bytes() {
    let relay = TestRelay::start_with(|c| c.timings.close_linger = Duration::from_secs(600)).await;
    let mut raw = RawClient::connect(relay.handle().local_addr()).await;
    raw.authenticate("mallory").await;
    raw.announce_frame(0x1, 1 << 40).await;
    let chunk = vec![b'x'; 64 * 1024];
    let cut_off =
        within(async { while raw.write_fragment(false, 0x0, &chunk).await.is_ok() {} }).await;
    assert!(cut_off.is_some(), "the relay read on without a bound");
    relay
        .wait_stats("the flooding connection to end", |s| s.connections == 0)
        .await;
}

/// `depth` nested arrays: `[[[…]]]`.
fn nested_arrays(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_and_huge_json_is_answered_and_changes_nothing() {
    let relay = TestRelay::start().await;
    queue_witness(&relay).await;

    // As the first frame, 5 000 levels deep (within the size allowed before authentication):
    // refused like any non-Authenticate frame.
    assert_eq!(
        relay.refused(&nested_arrays(5_000)).await,
        ("not_authenticated".into(), Ending::Close(4001))
    );

    let mut c = relay.online("mallory").await;
    // 10 000 levels alone, inside an otherwise valid SendMessage, and as nested objects:
    // beyond what the relay parses, so malformed (15 of them still leave the connection open).
    let deep_objects = format!(
        r#"{{"type":"CheckPresence","username":"wendy","n":{}1{}}}"#,
        r#"{"n":"#.repeat(10_000),
        "}".repeat(10_000)
    );
    let deep_send = format!(
        r#"{{"type":"SendMessage","recipient":"wendy","content":"x","message_id":"deep","extra":{}}}"#,
        nested_arrays(10_000)
    );
    for text in [nested_arrays(10_000), deep_objects, deep_send] {
        c.send_text(text).await;
        assert_eq!(c.next_frame().await, RelayFrame::error("malformed", None));
    }

    // Just under the frame limit: a huge unknown field is ignored, 50 000 keys too.
    let pad = "p".repeat(MAX_FRAME_BYTES - 200);
    c.send_json(json!({"type": "CheckPresence", "username": "wendy", "pad": pad}))
        .await;
    assert!(matches!(
        c.next_frame().await,
        RelayFrame::PresenceStatus { user_id, online: false, .. } if user_id == "wendy"
    ));
    let mut many_keys = serde_json::Map::new();
    many_keys.insert("type".into(), json!("CheckPresence"));
    many_keys.insert("username".into(), json!("wendy"));
    for i in 0..50_000 {
        many_keys.insert(format!("k{i}"), json!(i));
    }
    let many_keys = Value::Object(many_keys).to_string();
    assert!(many_keys.len() < MAX_FRAME_BYTES);
    c.send_text(many_keys).await;
    assert!(matches!(
        c.next_frame().await,
        RelayFrame::PresenceStatus { user_id, .. } if user_id == "wendy"
    ));

    // Huge values in fields with a size rule are invalid, and the answer stays small: an
    // oversized message_id is not echoed, an unknown type is echoed cut to 128 bytes.
    let huge = "h".repeat(MAX_FRAME_BYTES - 200);
    c.send_json(
        json!({"type": "SendMessage", "recipient": "wendy", "content": "x", "message_id": huge}),
    )
    .await;
    assert_eq!(c.next_frame().await, invalid("SendMessage"));
    c.send_json(json!({"type": "CheckPresence", "username": huge}))
        .await;
    assert_eq!(c.next_frame().await, invalid("CheckPresence"));
    c.send_json(json!({"type": "WatchPresence", "users": vec!["wendy"; 50_000]}))
        .await;
    assert_eq!(c.next_frame().await, invalid("WatchPresence"));
    c.send_json(json!({"type": huge})).await;
    assert_eq!(
        c.next_frame().await,
        RelayFrame::error("unknown_type", Some(&"h".repeat(128)))
    );
    assert_eq!(relay.stats().await.watches, 0);

    c.sync().await;
    c.close().await;
    assert_eq!(relay.stored_frames().await, 1);
    assert_witness_delivered(&relay).await;
}

/// Values of the wrong type for a field whose right type is `kind`.
fn wrong_values(kind: &str) -> Vec<Value> {
    let mut values = match kind {
        "string" | "optional string" => vec![
            json!(7),
            json!(-1.5),
            json!(true),
            json!({}),
            json!(["wendy"]),
        ],
        "seq" => vec![
            json!("1"),
            json!(-1),
            json!(1.5),
            json!(1e300),
            // 2^64: one past u64.
            serde_json::from_str("18446744073709551616").unwrap(),
            json!(true),
            json!({}),
            json!([1]),
        ],
        "strings" | "optional strings" => vec![
            json!("wendy"),
            json!([7]),
            json!(["wendy", null]),
            json!([["wendy"]]),
            json!({"0": "wendy"}),
        ],
        other => panic!("no wrong values for {other}"),
    };
    // `null` is an absent optional field, and a missing required one.
    if !kind.starts_with("optional") {
        values.push(Value::Null);
    }
    values
}

/// A client frame type, a valid body, and each field with the kind of value it takes.
type Shape = (&'static str, Value, Vec<(&'static str, &'static str)>);

/// Every client frame type.
fn frame_shapes() -> Vec<Shape> {
    vec![
        (
            "Authenticate",
            json!({"token": token("mallory"), "client_capabilities": ["mailbox_v1"]}),
            vec![
                ("token", "string"),
                ("client_capabilities", "optional strings"),
            ],
        ),
        (
            "DeclareAddress",
            json!({"address": "off1x", "public_key": "k", "signature": "s"}),
            vec![
                ("address", "string"),
                ("public_key", "string"),
                ("signature", "string"),
            ],
        ),
        (
            "SendMessage",
            json!({"recipient": "wendy", "content": "x", "message_id": "m", "reply_to_msg": "r"}),
            vec![
                ("recipient", "string"),
                ("content", "string"),
                ("message_id", "string"),
                ("reply_to_msg", "optional string"),
            ],
        ),
        ("Ack", json!({"seq": 1}), vec![("seq", "seq")]),
        ("AckUpTo", json!({"seq": 1}), vec![("seq", "seq")]),
        (
            "CheckPresence",
            json!({"username": "wendy"}),
            vec![("username", "string")],
        ),
        (
            "WatchPresence",
            json!({"users": ["wendy"]}),
            vec![("users", "strings")],
        ),
        (
            "UnwatchPresence",
            json!({"users": ["wendy"]}),
            vec![("users", "strings")],
        ),
        (
            "CreateGroup",
            json!({"group_id": "g", "name": "G"}),
            vec![("group_id", "string"), ("name", "string")],
        ),
        (
            "AddGroupMember",
            json!({"group_id": "g", "username": "wendy"}),
            vec![("group_id", "string"), ("username", "string")],
        ),
        (
            "RemoveGroupMember",
            json!({"group_id": "g", "username": "wendy"}),
            vec![("group_id", "string"), ("username", "string")],
        ),
        (
            "LeaveGroup",
            json!({"group_id": "g"}),
            vec![("group_id", "string")],
        ),
        (
            "SendGroupMessage",
            json!({"group_id": "g", "content": "x", "message_id": "m", "reply_to_msg": "r"}),
            vec![
                ("group_id", "string"),
                ("content", "string"),
                ("message_id", "string"),
                ("reply_to_msg", "optional string"),
            ],
        ),
    ]
}

/// Every way to get one field of `body` wrong: each wrong value, and (when required) absent.
fn mistyped(body: &Value, field: &str, kind: &str) -> Vec<Value> {
    let mut bodies: Vec<Value> = wrong_values(kind)
        .into_iter()
        .map(|wrong| {
            let mut b = body.clone();
            b[field] = wrong;
            b
        })
        .collect();
    if !kind.starts_with("optional") {
        let mut b = body.clone();
        b.as_object_mut().unwrap().remove(field);
        bodies.push(b);
    }
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mistyped_or_missing_field_is_invalid_frame_and_changes_nothing() {
    let relay = TestRelay::start().await;
    queue_witness(&relay).await;
    let shapes = frame_shapes();

    // A mistyped Authenticate as the first frame is a refused token.
    let (_, auth_body, auth_fields) = &shapes[0];
    for (field, kind) in auth_fields {
        for body in mistyped(auth_body, field, kind) {
            let mut frame = body.clone();
            frame["type"] = json!("Authenticate");
            assert_eq!(
                relay.refused(&frame.to_string()).await,
                ("invalid_token".into(), Ending::Close(4001)),
                "{frame}"
            );
        }
    }
    assert_eq!(relay.stats().await.accounts, 2, "walter and wendy only");

    // After authentication every one is answered invalid_frame, and the connection stays.
    let mut c = relay.online("mallory").await;
    let mut sent = 0;
    for (frame_type, body, fields) in &shapes {
        for (field, kind) in fields {
            for body in mistyped(body, field, kind) {
                let mut frame = body.clone();
                frame["type"] = json!(frame_type);
                c.send_json(frame.clone()).await;
                assert_eq!(c.next_frame().await, invalid(frame_type), "{frame}");
                sent += 1;
            }
        }
    }
    assert!(sent > 100, "{sent} frames");
    // The valid bodies still work afterwards (this one is answered, not refused).
    c.send_json(json!({"type": "CheckPresence", "username": "wendy"}))
        .await;
    assert!(matches!(
        c.next_frame().await,
        RelayFrame::PresenceStatus { .. }
    ));
    c.close().await;

    let stats = relay.stats().await;
    assert_eq!((stats.stored_frames, stats.watches), (1, 0));
    assert_witness_delivered(&relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_types_are_answered_and_never_close_the_connection() {
    let relay = TestRelay::start().await;
    queue_witness(&relay).await;
    let mut c = relay.online("mallory").await;
    // Relay-to-client frame names, near-misses of client frames, odd strings: all unknown. Far
    // more of them than the 16 malformed frames that would close the connection.
    let mut types: Vec<String> = RelayFrame::TYPES.iter().map(|t| t.to_string()).collect();
    types.extend(
        [
            "",
            " ",
            "sendmessage",
            "SendMessage ",
            "Ack\u{0}",
            "Ack\n",
            "Déclare",
            "🦀",
            "\u{202e}kcA",
        ]
        .map(str::to_owned),
    );
    for i in 0..200 {
        types.push(format!("Teleport{i}"));
    }
    for frame_type in &types {
        c.send_json(json!({"type": frame_type, "seq": 1, "recipient": "wendy", "message_id": "m", "content": "x"}))
            .await;
        // Echoed quoted: cut, and stripped of control and bidi characters.
        let echoed = courier_proto::quote::quoted(frame_type);
        assert_eq!(
            c.next_frame().await,
            RelayFrame::error("unknown_type", Some(&echoed)),
            "{frame_type:?}"
        );
    }
    c.sync().await;
    c.close().await;
    assert_eq!(relay.stored_frames().await, 1);
    assert_witness_delivered(&relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_release_only_what_this_connection_was_written() {
    let relay = TestRelay::start().await;
    queue_witness(&relay).await;
    relay.register("alice").await;
    relay.register("bob").await;
    let mut carol = relay.online("carol").await;
    // alice (offline) holds seqs 1–3 of her journal, bob 1–2 of his.
    for i in 1..=3 {
        let id = format!("a{i}");
        assert_sent(
            &carol.send_and_answer("alice", &id, "for alice").await,
            &id,
            "alice",
            "stored",
        );
    }
    for i in 1..=2 {
        let id = format!("b{i}");
        assert_sent(
            &carol.send_and_answer("bob", &id, "for bob").await,
            &id,
            "bob",
            "stored",
        );
    }

    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (drained, count) = bob.drain().await;
    assert_eq!(count, 2);
    assert_eq!(
        drained.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![Some(1), Some(2)]
    );
    // Seqs bob was never written (alice's 3, nobody's 1000, 0, the largest u64), out of
    // order and twice over: ignored, never answered. AckUpTo past everything releases bob's
    // own written frames only.
    for seq in [3, 1000, 0, u64::MAX] {
        bob.ack(seq).await;
    }
    bob.ack(2).await;
    bob.ack(2).await;
    bob.ack_up_to(u64::MAX).await;
    bob.ack(1).await;
    assert_eq!(bob.until_synced().await, vec![]);
    assert_eq!(
        relay.stored_frames().await,
        1 + 3,
        "the witness and alice's three"
    );

    // An ack for a seq bob will only get later does not release it in advance.
    bob.ack(3).await;
    bob.ack_up_to(4).await;
    bob.sync().await;
    assert_sent(
        &carol.send_and_answer("bob", "b3", "late").await,
        "b3",
        "bob",
        "live",
    );
    let late = bob.received().await;
    assert_eq!((late.seq, late.message_id.as_str()), (Some(3), "b3"));
    bob.close().await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (redelivered, count) = bob.drain().await;
    assert_eq!(count, 1);
    assert_eq!(redelivered[0].message_id, "b3");
    bob.ack(3).await;
    bob.close().await;

    // alice gets all of hers, in order.
    let mut alice = relay.client().await;
    alice.authenticate("alice", true).await;
    let (frames, count) = alice.drain().await;
    assert_eq!(count, 3);
    assert_eq!(
        frames
            .iter()
            .map(|r| (r.seq, r.message_id.as_str()))
            .collect::<Vec<_>>(),
        vec![(Some(1), "a1"), (Some(2), "a2"), (Some(3), "a3")]
    );
    alice.close().await;
    carol.close().await;
    assert_witness_delivered(&relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_past_the_rate_limit_is_dropped_frame_by_frame_and_others_are_served() {
    const FLOOD: usize = 5_000;
    let relay = TestRelay::start_with(|c| {
        c.rate_limit = courier_relay::RateLimit {
            burst: 20,
            per_sec: 10,
        };
    })
    .await;
    queue_witness(&relay).await;
    relay.register("victim").await;
    let mut mallory = relay.online("mallory").await;
    // Written in one go, without reading a single answer.
    for i in 0..FLOOD {
        let frame = ClientFrame::SendMessage {
            recipient: "victim".into(),
            content: "spam".into(),
            message_id: format!("s{i}"),
            reply_to_msg: None,
        };
        mallory
            .ws
            .feed(Message::text(frame.encode()))
            .await
            .unwrap();
    }
    mallory.ws.flush().await.unwrap();

    // Meanwhile honest clients authenticate and exchange messages.
    honest_exchange(&relay.url).await;

    // Exactly one answer per flood frame, in order: accepted, or dropped with its id.
    let mut accepted = Vec::new();
    for i in 0..FLOOD {
        let id = format!("s{i}");
        match mallory.next_frame().await {
            RelayFrame::MessageSent { message_id, .. } => {
                assert_eq!(message_id, id);
                accepted.push(id);
            }
            RelayFrame::RateLimited {
                retry_after_ms,
                frame_type,
                message_id,
                seq,
            } => {
                assert!(retry_after_ms >= 1);
                assert_eq!(
                    (frame_type.as_str(), message_id.as_deref(), seq),
                    ("SendMessage", Some(id.as_str()), None)
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        accepted.len() >= 20 && accepted.len() < FLOOD / 2,
        "{} accepted",
        accepted.len()
    );
    // The connection is still up: after the advertised wait a frame goes through.
    loop {
        mallory
            .send(&ClientFrame::CheckPresence {
                username: "sync".into(),
            })
            .await;
        match mallory.next_frame().await {
            RelayFrame::PresenceStatus { .. } => break,
            RelayFrame::RateLimited { retry_after_ms, .. } => {
                tokio::time::sleep(Duration::from_millis(retry_after_ms)).await
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    mallory.close().await;

    // Exactly the accepted frames were stored for the victim, in order.
    let mut victim = relay.client().await;
    victim.authenticate("victim", true).await;
    let (frames, count) = victim.drain().await;
    assert_eq!(count as usize, accepted.len());
    assert_eq!(
        frames
            .iter()
            .map(|r| r.message_id.clone())
            .collect::<Vec<_>>(),
        accepted
    );
    victim.close().await;
    assert_witness_delivered(&relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_floods_and_never_reads_is_dropped_and_others_are_served() {
    let relay = TestRelay::start_with(|c| {
        c.timings.ping_interval = Duration::from_millis(200);
        c.timings.dead_after = Duration::from_secs(2);
    })
    .await;
    queue_witness(&relay).await;
    let addr = relay.handle().local_addr();
    let mut raw = RawClient::connect_with_receive_window(addr, 4096).await;
    raw.authenticate("mallory").await;
    // From here on it never reads: 64 KiB messages to itself fill the way toward it, then
    // small frames whose answers have nowhere to go follow, until the relay gives up on it.
    let flood = tokio::spawn(async move {
        let content = "x".repeat(64 * 1024);
        for i in 0u64.. {
            let frame = if i < 100 {
                ClientFrame::SendMessage {
                    recipient: "mallory".into(),
                    content: content.clone(),
                    message_id: format!("self{i}"),
                    reply_to_msg: None,
                }
            } else {
                ClientFrame::CheckPresence {
                    username: "wendy".into(),
                }
            };
            let written = raw
                .write_fragment(true, 0x1, frame.encode().as_bytes())
                .await;
            if written.is_err() {
                return i;
            }
        }
        unreachable!()
    });

    // Honest clients are served meanwhile.
    honest_exchange(&relay.url).await;

    // Filling the buffers toward it takes a few seconds in a debug build; then the keepalive
    // rule ends the connection.
    let written = tokio::time::timeout(DEADLINE * 3, flood)
        .await
        .expect("the relay drops a connection it cannot write to")
        .unwrap();
    assert!(written > 100, "{written} frames written");
    relay
        .wait_stats("mallory's connection to end", |s| s.connections == 0)
        .await;
    assert_witness_delivered(&relay).await;
}

/// What a connection that never authenticates does until the relay ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loiterer {
    /// TCP only, not a byte sent.
    Tcp,
    /// Half an HTTP upgrade request.
    PartialUpgrade,
    /// Upgraded, then silent.
    WebSocket,
    /// Upgraded, pinging as if that kept it alive (the relay may answer with a Pong, or not if
    /// its deadline passed first).
    Pinging,
    /// Upgraded, in the middle of a frame that never ends.
    PartialFrame,
}

impl Loiterer {
    const ALL: [Loiterer; 5] = [
        Loiterer::Tcp,
        Loiterer::PartialUpgrade,
        Loiterer::WebSocket,
        Loiterer::Pinging,
        Loiterer::PartialFrame,
    ];

    fn upgrades(self) -> bool {
        !matches!(self, Loiterer::Tcp | Loiterer::PartialUpgrade)
    }
}

const PING: &[u8] = b"still here";

/// A connection in the state `kind` describes, once the relay has accepted it.
enum Loitering {
    Tcp(tokio::net::TcpStream),
    Ws(RawClient),
}

async fn loiter(addr: std::net::SocketAddr, kind: Loiterer) -> Loitering {
    use tokio::io::AsyncWriteExt;
    if !kind.upgrades() {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        if kind == Loiterer::PartialUpgrade {
            tcp.write_all(b"GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\n")
                .await
                .unwrap();
        }
        return Loitering::Tcp(tcp);
    }
    let mut raw = RawClient::connect(addr).await;
    match kind {
        Loiterer::Pinging => raw.send_frame(0x9, PING).await,
        Loiterer::PartialFrame => {
            raw.announce_frame(0x1, 100).await;
        }
        _ => {}
    }
    Loitering::Ws(raw)
}

/// Waits for the relay to end the connection and checks how: a socket that never completed
/// the upgrade is just closed; an upgraded one gets `AuthError{auth_timeout}` and close 4001.
async fn ended_by_the_relay(loitering: Loitering, limit: Duration) {
    use tokio::io::AsyncReadExt;
    match loitering {
        Loitering::Tcp(mut tcp) => {
            let mut rest = Vec::new();
            let read = tokio::time::timeout(limit, tcp.read_to_end(&mut rest))
                .await
                .expect("the relay closes a socket that never upgrades");
            assert!(read.is_ok() && rest.is_empty(), "{read:?}: {rest:?}");
        }
        Loitering::Ws(mut raw) => {
            let mut frames = raw.frames_until_closed(limit).await;
            if frames.first() == Some(&(0xA, PING.to_vec())) {
                frames.remove(0);
            }
            assert_eq!(frames.len(), 2, "{frames:?}");
            let (opcode, text) = &frames[0];
            assert_eq!(*opcode, 0x1);
            assert_eq!(
                RelayFrame::decode(std::str::from_utf8(text).unwrap()).unwrap(),
                RelayFrame::AuthError {
                    reason: "auth_timeout".into()
                }
            );
            let (opcode, close) = &frames[1];
            assert_eq!(*opcode, 0x8);
            assert_eq!(u16::from_be_bytes([close[0], close[1]]), 4001);
        }
    }
}

/// Sockets this process holds open whose local or remote port is `port` (the listener
/// included): both ends of every connection to an in-process relay, and nothing of the tests
/// running beside this one.
fn open_sockets_on(port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let port = format!(":{port:04X}");
    std::fs::read_to_string("/proc/self/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            (columns[1].ends_with(&port) || columns[2].ends_with(&port))
                && inodes.contains(columns[9])
        })
        .count()
}

/// Honest traffic while the relay holds the loiterers: both authenticate and a message is
/// delivered live.
async fn honest_exchange(url: &str) {
    let mut alice = Client::connect(url).await;
    alice.authenticate("alice", true).await;
    alice.drain_complete().await;
    let mut bob = Client::connect(url).await;
    bob.authenticate("bob", true).await;
    bob.drain_complete().await;
    assert_sent(
        &alice.send_and_answer("bob", "h1", "hello").await,
        "h1",
        "bob",
        "live",
    );
    assert_eq!(bob.received().await.content, "hello");
    alice.close().await;
    bob.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_authenticate_end_at_the_auth_deadline() {
    const EACH: usize = 400;
    let relay =
        TestRelay::start_with(|c| c.timings.auth_timeout = Duration::from_millis(1000)).await;
    queue_witness(&relay).await;
    let addr = relay.handle().local_addr();
    let baseline = open_sockets_on(addr.port());
    assert_eq!(baseline, 1, "the listener");

    let mut held = tokio::task::JoinSet::new();
    for kind in Loiterer::ALL {
        for _ in 0..EACH {
            held.spawn(async move {
                let loitering = loiter(addr, kind).await;
                ended_by_the_relay(loitering, DEADLINE).await;
            });
        }
    }
    // Only authenticated connections count as connections.
    honest_exchange(&relay.url).await;
    let mut ended = 0;
    while let Some(result) = within(held.join_next())
        .await
        .expect("every loiterer ends in time")
    {
        result.unwrap();
        ended += 1;
    }
    assert_eq!(ended, EACH * Loiterer::ALL.len());
    relay
        .wait_stats("the honest clients to leave", |s| s.connections == 0)
        .await;
    // Both ends of every socket are closed again.
    let released = within(async {
        while open_sockets_on(addr.port()) > baseline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        released.is_some(),
        "{} sockets open, {baseline} before",
        open_sockets_on(addr.port())
    );
    assert_eq!(relay.stats().await.accounts, 4, "walter, wendy, alice, bob");
    assert_witness_delivered(&relay).await;
}

/// Raises this process's open-file limit to at least `needed` (the relay child inherits it),
/// within the hard limit, through util-linux `prlimit`.
fn ensure_open_file_limit(needed: u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("the open-file limit");
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (soft, hard) = (numbers[0], numbers[1]);
    if soft >= needed {
        return;
    }
    assert!(
        hard >= needed,
        "{needed} open files are needed; the hard limit is {hard}"
    );
    let raised = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg(format!("--nofile={hard}:{hard}"))
        .status()
        .expect("prlimit runs");
    assert!(raised.success(), "prlimit failed: {raised:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_that_never_authenticate_are_all_released() {
    const CONNECTIONS: usize = 10_000;
    const BATCH: usize = 500;
    // Our ends of the sockets, the relay's in its own process, and room for the other tests
    // of this binary running beside this one.
    ensure_open_file_limit(CONNECTIONS as u64 + 5_000);
    // The relay binary with its real 10 s auth deadline, in its own process: the 10 000 sockets
    // on each side would not fit one process's descriptor limit together.
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, SECRET).unwrap();
    let relay = RelayProcess::spawn(&dir.path().join("relay.db"), &secret);
    let addr: std::net::SocketAddr = relay.url.trim_start_matches("ws://").parse().unwrap();
    honest_exchange(&relay.url).await;
    let baseline_fds = relay.open_fds();
    let baseline_kib = relay.resident_kib();

    // Half of them raw TCP, half upgraded, opened in batches so the listen backlog keeps up.
    let mut held = Vec::with_capacity(CONNECTIONS);
    for batch in 0..CONNECTIONS / BATCH {
        let kind = if batch % 2 == 0 {
            Loiterer::Tcp
        } else {
            Loiterer::WebSocket
        };
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..BATCH {
            opening.spawn(loiter(addr, kind));
        }
        while let Some(loitering) = within(opening.join_next())
            .await
            .expect("the relay accepts in time")
        {
            held.push(loitering.unwrap());
        }
    }
    let held_fds = relay.open_fds();
    let held_kib = relay.resident_kib();
    // The relay keeps serving while it holds them.
    honest_exchange(&relay.url).await;

    // Every one of them is ended by the relay, by its deadline (plus the close linger).
    let limit = Duration::from_secs(10) + DEADLINE * 2;
    let mut ending = tokio::task::JoinSet::new();
    for loitering in held {
        ending.spawn(ended_by_the_relay(loitering, limit));
    }
    while let Some(result) = ending.join_next().await {
        result.unwrap();
    }
    let released = within(async {
        while relay.open_fds() > baseline_fds {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let after_kib = relay.resident_kib();
    eprintln!(
        "relay fds: {baseline_fds} before, {held_fds} holding {CONNECTIONS}, {} after; \
         resident KiB: {baseline_kib} before, {held_kib} holding, {after_kib} after",
        relay.open_fds()
    );
    assert!(
        released.is_some(),
        "the relay's descriptors return to baseline"
    );
    // About 11 KiB each in a debug build; 128 KiB read buffers or a TLS-sized task per
    // connection would be several times that.
    assert!(
        held_kib - baseline_kib < CONNECTIONS as u64 * 24,
        "{} KiB per connection that never authenticates",
        (held_kib - baseline_kib) / CONNECTIONS as u64
    );
    honest_exchange(&relay.url).await;
}

/// Sends `content` to `recipient` and answers the detail of an unreachable verdict, or
/// `None` when the frame was accepted.
async fn unreachable_detail(c: &mut Client, recipient: &str, id: &str) -> Option<String> {
    match c.send_and_answer(recipient, id, "x").await {
        RelayFrame::DeliveryError { reason, .. } => Some(reason),
        RelayFrame::MessageSent { .. } => None,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_cannot_hold_unbounded_address_bindings() {
    let relay = TestRelay::start_with(|c| c.addresses.max_per_account = 2).await;
    let keys: Vec<_> = (1..=3u8)
        .map(|n| courier_proto::IdentityKey::from_seed([n; 32]))
        .collect();
    for key in &keys {
        relay.online_declared("mallory", key).await.close().await;
        relay
            .wait_stats("mallory's disconnect", |s| s.connections == 0)
            .await;
    }
    let mut bob = relay.online("bob").await;
    let oldest = keys[0].address().to_string();
    assert_eq!(
        unreachable_detail(&mut bob, &oldest, "m1").await.as_deref(),
        Some("recipient_unreachable: unknown_recipient"),
        "the least recently declared binding was dropped"
    );
    for (i, key) in keys[1..].iter().enumerate() {
        let address = key.address().to_string();
        assert_eq!(
            unreachable_detail(&mut bob, &address, &format!("k{i}")).await,
            None
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_binding_not_declared_again_expires() {
    let relay = TestRelay::start_with(|c| {
        c.addresses.ttl_ms = 300;
        c.timings.purge_interval = Duration::from_millis(50);
    })
    .await;
    let key = courier_proto::IdentityKey::from_seed([9; 32]);
    let address = key.address().to_string();
    relay.online_declared("mallory", &key).await.close().await;
    let mut bob = relay.online("bob").await;
    let mut attempt = 0;
    let expired = within(async {
        loop {
            attempt += 1;
            if unreachable_detail(&mut bob, &address, &format!("m{attempt}"))
                .await
                .is_some()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(expired.is_some(), "the binding never expired");
    // Presence forgets it as well.
    bob.send(&ClientFrame::CheckPresence {
        username: address.clone(),
    })
    .await;
    let status = bob
        .next_where(|f| matches!(f, RelayFrame::PresenceStatus { .. }))
        .await;
    assert_eq!(
        status,
        RelayFrame::PresenceStatus {
            user_id: address,
            online: false,
            last_seen: None
        }
    );
}

/// A peer that has not authenticated cannot make the relay buffer or parse a large frame: its
/// first frame is capped far below the 1 MiB allowed afterwards, whatever its type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_peer_cannot_make_the_relay_buffer_a_large_frame() {
    let relay = TestRelay::start().await;
    queue_witness(&relay).await;
    let padded_token = json!({"type": "Authenticate", "token": "x".repeat(20 * 1024)}).to_string();
    let big_send = json!({
        "type": "SendMessage", "recipient": "wendy", "content": "x".repeat(200 * 1024),
        "message_id": "big",
    })
    .to_string();
    for (what, first) in [
        ("a padded Authenticate", padded_token),
        ("a large SendMessage", big_send),
    ] {
        let mut c = relay.client().await;
        c.send_text(first).await;
        let (frames, ending) = c.frames_until_end().await;
        assert_eq!((frames, ending), (vec![], Ending::Close(1009)), "{what}");
    }
    // In fragments, each small, that add up to more.
    let mut raw = RawClient::connect(relay.handle().local_addr()).await;
    let piece = vec![b'x'; 8 * 1024];
    raw.send_fragment(false, 0x1, &piece).await;
    for _ in 0..8 {
        if raw.write_fragment(false, 0x0, &piece).await.is_err() {
            break;
        }
    }
    assert_eq!(raw.close_code().await, Some(1009));
    honest_exchange(&relay.url).await;
    assert_witness_delivered(&relay).await;
}

/// A slow peer gets one deadline from accept to authenticated, not one for the handshake and a
/// fresh one after it: upgrading just before the first runs out buys no time to authenticate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upgrade_does_not_buy_a_second_authentication_deadline() {
    const AUTH_TIMEOUT: Duration = Duration::from_millis(2000);
    let relay = TestRelay::start_with(|c| c.timings.auth_timeout = AUTH_TIMEOUT).await;
    let tcp = tokio::net::TcpStream::connect(relay.handle().local_addr())
        .await
        .unwrap();
    // The attacker's own pacing: most of the deadline before the upgrade, then the rest of it
    // and more before Authenticate, which a second deadline counted from the upgrade would allow.
    tokio::time::sleep(AUTH_TIMEOUT * 6 / 10).await;
    let (ws, _) = tokio_tungstenite::client_async(
        relay.url.clone(),
        tokio_tungstenite::MaybeTlsStream::Plain(tcp),
    )
    .await
    .expect("upgraded within the deadline");
    let mut c = Client::from_ws(ws);
    tokio::time::sleep(AUTH_TIMEOUT * 6 / 10).await;
    let _ =
        c.ws.send(Message::text(
            json!({"type": "Authenticate", "token": token("mallory")}).to_string(),
        ))
        .await;
    let (frames, ending) = c.frames_until_end().await;
    assert_eq!(
        frames,
        vec![RelayFrame::AuthError {
            reason: "auth_timeout".into()
        }]
    );
    assert_eq!(ending, Ending::Close(4001));
}

/// One address cannot hold more than its cap of connections that never authenticate; each
/// that authenticates or ends makes room for another, and other clients are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_cannot_hold_more_than_its_cap_of_unauthenticated_connections() {
    let relay = TestRelay::start_with(|c| {
        c.auth.limit_loopback = true;
        c.auth.max_unauthenticated_per_source = 3;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(relay.client().await);
    }
    let refused = within(tokio_tungstenite::connect_async(relay.url.as_str()))
        .await
        .expect("answered in time");
    assert!(refused.is_err(), "a fourth is closed at accept");
    // One of the three authenticates: its place is free again.
    let mut first = held.remove(0);
    first.authenticate("alice", true).await;
    let mut fourth = relay.client().await;
    fourth.authenticate("bob", true).await;
    assert_eq!(fourth.drain_complete().await, 0);
}
