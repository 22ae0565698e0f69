//! Transport rules, rate limiting and the mailbox-less mode (`docs/protocol.md#transport`,
//! `docs/protocol.md#rate-limiting`, `docs/protocol.md#mailbox-limits`; conformance in
//! `docs/protocol.md#transport-and-authentication`, `docs/protocol.md#sending-conformance` and
//! `docs/protocol.md#presence-rate-and-sessions`).

mod common;

use std::time::Duration;

use common::*;
use courier_proto::{ClientFrame, RelayFrame};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_are_answered_and_the_16th_closes_with_4002() {
    let relay = TestRelay::start().await;
    let mut c = relay.online("alice").await;
    let samples = ["not json", "[1]", "42", r#"{"no":"type"}"#, r#"{"type":7}"#];
    for i in 0..15 {
        if i % 3 == 0 {
            c.ws.send(Message::binary(vec![0u8, 1])).await.unwrap();
        } else {
            c.send_text(samples[i % samples.len()]).await;
        }
        assert_eq!(
            c.next_frame().await,
            RelayFrame::error("malformed", None),
            "malformed #{}",
            i + 1
        );
    }
    // Still open after 15, and other frames still work.
    c.sync().await;
    c.send_text("{").await;
    let (frames, ending) = c.frames_until_end().await;
    assert_eq!(frames, vec![RelayFrame::error("malformed", None)]);
    assert_eq!(ending, Ending::Close(4002));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_invalid_frames_are_answered_and_the_connection_stays() {
    let relay = TestRelay::start().await;
    let mut c = relay.online("alice").await;
    c.send_json(json!({"type": "Teleport", "to": "mars"})).await;
    assert_eq!(
        c.next_frame().await,
        RelayFrame::error("unknown_type", Some("Teleport"))
    );
    c.send_json(json!({"type": "Ack", "seq": "seven"})).await;
    assert_eq!(
        c.next_frame().await,
        RelayFrame::error("invalid_frame", Some("Ack"))
    );
    c.send_json(json!({"type": "SendMessage", "recipient": "bob", "content": "x"}))
        .await;
    assert_eq!(
        c.next_frame().await,
        RelayFrame::error("invalid_frame", Some("SendMessage"))
    );
    // Oversized identifier fields are invalid, not unreachable.
    c.send_message(&"b".repeat(257), "m1", "x").await;
    match c.next_frame().await {
        RelayFrame::Error {
            code,
            frame_type,
            message_id,
            ..
        } => {
            assert_eq!(code, "invalid_frame");
            assert_eq!(frame_type.as_deref(), Some("SendMessage"));
            assert_eq!(message_id.as_deref(), Some("m1"));
        }
        other => panic!("{other:?}"),
    }
    c.sync().await;
}

/// The relay refuses the message as soon as its header announces more than 1 MiB, while the
/// client is still writing it: the 1009 must reach the client all the same, never a reset that
/// destroys it. Repeated, because a reset only destroys it when it wins a race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_1_mib_closes_with_1009() {
    // The relay reads out until the client closes; a linger this long cannot cut that short
    // however slowly the client writes, and costs nothing when it does not.
    // 200 logins of one account: over its default login limit, which is not under test here.
    let relay = TestRelay::start_with(|c| {
        c.timings.close_linger = Duration::from_secs(60);
        c.auth.attempts_per_account = courier_relay::AttemptLimit {
            burst: 1000,
            per_minute: 1000,
        };
    })
    .await;
    let big = format!(
        r#"{{"type":"SendMessage","recipient":"alice","message_id":"m","content":"{}"}}"#,
        "x".repeat(1_048_576)
    );
    let addr = relay.handle().local_addr();
    for round in 0..200 {
        // Authenticated, and as the first frame (where the relay still waits for Authenticate).
        let mut authenticated = Client::connect_with_send_buffer(addr, 65536).await;
        authenticated.authenticate("alice", false).await;
        let mut first = Client::connect_with_send_buffer(addr, 65536).await;
        for c in [&mut authenticated, &mut first] {
            c.send_text(big.clone()).await;
            let (frames, ending) = c.frames_until_end().await;
            assert!(frames.is_empty(), "round {round}: {frames:?}");
            assert_eq!(ending, Ending::Close(1009), "round {round}");
        }
    }
    assert_eq!(relay.stored_frames().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_that_would_not_fit_when_delivered_is_refused() {
    let relay = TestRelay::start().await;
    let mut c = relay.online("alice").await;
    // Just under 1 MiB as sent, but MessageReceived adds seq, sender, sender_account and
    // timestamp, which push it over.
    let envelope = ClientFrame::SendMessage {
        recipient: "alice".into(),
        content: String::new(),
        message_id: "m".into(),
        reply_to_msg: None,
    };
    let content = "x".repeat(1_048_576 - envelope.encode().len() - 10);
    let answer = c.send_and_answer("alice", "m", &content).await;
    assert_eq!(
        answer,
        RelayFrame::Error {
            code: "invalid_frame".into(),
            frame_type: Some("SendMessage".into()),
            message_id: Some("m".into()),
            detail: None
        }
    );
    assert_eq!(relay.stored_frames().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_closes_with_1007() {
    let relay = TestRelay::start().await;
    let mut raw = RawClient::connect(relay.handle().local_addr()).await;
    raw.authenticate("alice").await;
    raw.send_frame(0x1, &[b'{', 0xff, 0xfe, b'}']).await;
    assert_eq!(raw.close_code().await, Some(1007));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_pings_is_dropped() {
    const PING_INTERVAL: Duration = Duration::from_millis(50);
    const DEAD_AFTER: Duration = Duration::from_secs(2);
    let relay = TestRelay::start_with(|c| {
        c.timings.ping_interval = PING_INTERVAL;
        c.timings.dead_after = DEAD_AFTER;
    })
    .await;
    // This client never answers a Ping.
    let mut raw = RawClient::connect(relay.handle().local_addr()).await;
    raw.authenticate("alice").await;
    let mut pings = 0;
    let mut close = None;
    while let Some((opcode, payload)) = raw.read_frame().await {
        match opcode {
            0x9 => pings += 1,
            0x8 => close = Some(u16::from_be_bytes([payload[0], payload[1]])),
            _ => {}
        }
    }
    assert!(pings >= 1, "the relay pings");
    assert_eq!(close, Some(4008));
    relay
        .wait_stats("the dead connection to go", |s| s.connections == 0)
        .await;

    // A client that answers Pings (tokio-tungstenite does, while reading) stays connected: it
    // is still there after longer than the silence that ends a connection, counted in the
    // relay's own Pings, which come at least PING_INTERVAL apart.
    let mut c = relay.online("bob").await;
    let pings_needed = DEAD_AFTER.as_millis() / PING_INTERVAL.as_millis() + 2;
    let mut pings = 0;
    while pings < pings_needed {
        match within(c.ws.next())
            .await
            .expect("a Ping within the deadline")
        {
            Some(Ok(Message::Ping(_))) => pings += 1,
            other => panic!("only Pings expected, got {other:?}"),
        }
    }
    c.sync().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_burst_frames_are_rate_limited_and_dropped() {
    let relay = TestRelay::start_with(|c| {
        c.rate_limit = courier_relay::RateLimit {
            burst: 3,
            per_sec: 1,
        };
    })
    .await;
    relay.register("bob").await;
    let mut c = relay.client().await;
    let RelayFrame::Authenticated { rate_limit, .. } = c.authenticate("alice", true).await else {
        unreachable!()
    };
    assert_eq!(rate_limit.map(|r| (r.burst, r.per_sec)), Some((3, 1)));
    // The connection's first DeclareAddress costs nothing, even refused.
    c.send_json(
        json!({"type": "DeclareAddress", "address": "off1x", "public_key": "k", "signature": "s"}),
    )
    .await;
    let answer = c
        .next_where(|f| matches!(f, RelayFrame::AddressError { .. }))
        .await;
    assert_eq!(
        answer,
        RelayFrame::AddressError {
            reason: "malformed".into()
        }
    );
    for seq in 1..=3 {
        c.send(&ClientFrame::Ack { seq }).await;
    }
    c.send_message("bob", "m1", "x").await;
    c.send(&ClientFrame::Ack { seq: 9 }).await;
    let limited = c
        .next_where(|f| matches!(f, RelayFrame::RateLimited { .. }))
        .await;
    let RelayFrame::RateLimited {
        retry_after_ms,
        frame_type,
        message_id,
        seq,
    } = limited
    else {
        unreachable!()
    };
    assert!(retry_after_ms >= 1);
    assert_eq!(
        (frame_type.as_str(), message_id.as_deref(), seq),
        ("SendMessage", Some("m1"), None)
    );
    let limited = c
        .next_where(|f| matches!(f, RelayFrame::RateLimited { .. }))
        .await;
    let RelayFrame::RateLimited {
        retry_after_ms,
        frame_type,
        seq,
        ..
    } = limited
    else {
        unreachable!()
    };
    assert_eq!((frame_type.as_str(), seq), ("Ack", Some(9)));

    // After the advertised wait a token is back; the dropped frame was never processed.
    tokio::time::sleep(Duration::from_millis(retry_after_ms)).await;
    assert_sent(
        &c.send_and_answer("bob", "m2", "y").await,
        "m2",
        "bob",
        "stored",
    );
    c.close().await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 1);
    assert_eq!(frames[0].message_id, "m2");
}

/// Rate limit whose bucket refills so slowly that no test outlasts one token.
fn slow_bucket(c: &mut courier_relay::RelayConfig) {
    c.rate_limit = courier_relay::RateLimit {
        burst: 3,
        per_sec: 1,
    };
}

/// The RateLimited answer to the frame just sent, whatever came before it.
async fn rate_limited(c: &mut Client) -> (String, u64) {
    match c
        .next_where(|f| matches!(f, RelayFrame::RateLimited { .. }))
        .await
    {
        RelayFrame::RateLimited {
            frame_type,
            retry_after_ms,
            ..
        } => (frame_type, retry_after_ms),
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_does_not_refill_the_rate_bucket() {
    let relay = TestRelay::start_with(slow_bucket).await;
    let mut c = relay.online("alice").await;
    // One frame worth far more than the burst puts alice's bucket tens of seconds in debt.
    let users: Vec<String> = (0..60).map(|i| format!("u{i}")).collect();
    c.send(&ClientFrame::WatchPresence { users }).await;
    c.close().await;
    relay
        .wait_stats("alice's disconnect", |s| s.connections == 0)
        .await;

    // A new connection of the same account finds the bucket as the last one left it.
    let mut c = relay.online("alice").await;
    c.send(&ClientFrame::Ack { seq: 1 }).await;
    let (frame_type, retry_after_ms) = rate_limited(&mut c).await;
    assert_eq!(frame_type, "Ack");
    assert!(retry_after_ms > 10_000, "{retry_after_ms}");
    // Another account's bucket is its own.
    let mut bob = relay.online("bob").await;
    bob.sync().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watch_presence_frame_cannot_look_up_thousands_of_identifiers_for_one_token() {
    let relay = TestRelay::start_with(slow_bucket).await;
    let mut c = relay.online("alice").await;
    let users: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
    c.send(&ClientFrame::WatchPresence {
        users: users.clone(),
    })
    .await;
    // Admitted (a token was there) and served in full...
    for _ in &users {
        c.next_where(|f| matches!(f, RelayFrame::PresenceStatus { .. }))
            .await;
    }
    // ...but paid for per identifier: nothing is left for the next frame.
    c.send(&ClientFrame::CheckPresence {
        username: "bob".into(),
    })
    .await;
    assert_eq!(rate_limited(&mut c).await.0, "CheckPresence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_declarations_cannot_make_the_relay_verify_signatures_for_free() {
    let relay = TestRelay::start_with(slow_bucket).await;
    let mut c = relay.online("alice").await;
    let declaration =
        json!({"type": "DeclareAddress", "address": "off1x", "public_key": "k", "signature": "s"});
    c.send_json(declaration.clone()).await;
    assert_eq!(
        c.next_where(|f| matches!(f, RelayFrame::AddressError { .. }))
            .await,
        RelayFrame::AddressError {
            reason: "malformed".into()
        }
    );
    // Every later one takes a token, answered or refused as invalid alike.
    c.send_json(declaration).await;
    assert_eq!(
        c.next_where(|f| matches!(f, RelayFrame::AddressError { .. }))
            .await,
        RelayFrame::AddressError {
            reason: "already_declared".into()
        }
    );
    c.send_json(json!({"type": "DeclareAddress"})).await;
    c.next_where(|f| matches!(f, RelayFrame::Error { .. }))
        .await;
    c.send(&ClientFrame::Ack { seq: 1 }).await;
    c.send_json(
        json!({"type": "DeclareAddress", "address": "off1y", "public_key": "k", "signature": "s"}),
    )
    .await;
    assert_eq!(rate_limited(&mut c).await.0, "DeclareAddress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_mailbox_nothing_is_journaled() {
    let relay = TestRelay::start_with(|c| c.mailbox = None).await;
    let mut bob = relay.client().await;
    let RelayFrame::Authenticated {
        capabilities,
        mailbox,
        ..
    } = bob.authenticate("bob", true).await
    else {
        unreachable!()
    };
    // Address routing, presence watching, the key-package directory and groups do not depend
    // on the mailbox.
    assert_eq!(
        capabilities,
        vec![
            "address_routing_v1".to_owned(),
            "presence_watch_v1".to_owned(),
            "key_directory_v1".to_owned(),
            "group_delivery_v3".to_owned()
        ]
    );
    assert_eq!(mailbox, None);

    let mut alice = relay.client().await;
    alice.authenticate("alice", true).await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "hello").await,
        "m1",
        "bob",
        "live",
    );
    // Live at once: no seq and no DrainComplete, even for an opted-in client.
    let got = Received::from(bob.next_frame().await);
    assert_eq!(
        (got.seq, got.content.as_str(), got.sender.as_str()),
        (None, "hello", "alice")
    );
    assert_eq!(relay.stored_frames().await, 0);

    bob.close().await;
    relay
        .wait_stats("bob's disconnect", |s| s.connections == 1)
        .await;
    let answer = alice.send_and_answer("bob", "m2", "x").await;
    assert_unreachable(&answer, "m2", "bob", "offline_no_mailbox");
    let answer = alice.send_and_answer("nobody", "m3", "x").await;
    assert_unreachable(&answer, "m3", "nobody", "unknown_recipient");

    // Nothing was kept for bob: the first message he gets is one sent after he is back.
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    assert_sent(
        &alice.send_and_answer("bob", "m4", "now").await,
        "m4",
        "bob",
        "live",
    );
    assert_eq!(bob.received().await.message_id, "m4");
}

/// Sends `count` messages of about 200 KB from `sender` to `recipient`, one at a time, and
/// returns the answers' dispositions or details; each answer must come within the client's
/// deadline.
async fn flood_unread(sender: &mut Client, recipient: &str, count: usize) -> Vec<String> {
    let content = "x".repeat(200_000);
    let mut answers = Vec::with_capacity(count);
    for i in 0..count {
        let answer = sender
            .send_and_answer(recipient, &format!("flood{i}"), &content)
            .await;
        answers.push(match answer {
            RelayFrame::MessageSent { disposition, .. } => format!("{disposition:?}"),
            RelayFrame::DeliveryError { reason, .. } => reason,
            other => panic!("unexpected answer {other:?}"),
        });
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipient_that_never_reads_cannot_stall_its_senders_nor_pin_memory_without_a_mailbox() {
    // The rate lifted: 20 MB within a second is past what one account may send by default.
    let relay = TestRelay::start_with(|c| {
        c.mailbox = None;
        c.rate_limit.burst = 1_000_000;
    })
    .await;
    let addr = relay.handle().local_addr();
    let mut bob = RawClient::connect_with_receive_window(addr, 4096).await;
    bob.authenticate_published("bob").await;
    let mut alice = relay.client().await;
    alice.authenticate("alice", false).await;
    // 20 MB for a recipient that never reads: past its queue's 8 MiB every send is refused at
    // once, never waited for.
    let answers = flood_unread(&mut alice, "bob", 100).await;
    let refused = "recipient_unreachable: offline_no_mailbox";
    let first_refused = answers
        .iter()
        .position(|a| a == refused)
        .unwrap_or_else(|| panic!("the queue took all of {answers:?}"));
    assert!(
        answers[first_refused..].iter().all(|a| a == refused),
        "{answers:?}"
    );
    // Alice's connection is not held up: other frames are answered as before.
    alice.sync().await;
    drop(bob);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipient_that_answers_pings_but_never_reads_is_dropped_once_its_writes_stall() {
    let relay = TestRelay::start_with(|c| {
        c.mailbox = None;
        c.timings.ping_interval = Duration::from_millis(200);
        // Under the test's deadline, so that Pongs are what keeps bob's connection open.
        c.timings.dead_after = Duration::from_secs(3);
        c.timings.write_stall = Duration::from_millis(500);
        // The flood is 20 MB within a second: past what one account may send by default.
        c.rate_limit.burst = 1_000_000;
    })
    .await;
    let addr = relay.handle().local_addr();
    let mut bob = RawClient::connect_with_receive_window(addr, 4096).await;
    bob.authenticate_published("bob").await;
    // Never silent, so keepalive alone never ends it: unsolicited Pongs until the relay is gone.
    let pongs = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            if bob.write_fragment(true, 0xA, b"alive").await.is_err() {
                return;
            }
        }
    });
    let mut alice = relay.client().await;
    alice.authenticate("alice", false).await;
    flood_unread(&mut alice, "bob", 100).await;
    relay
        .wait_stats("bob's stalled connection to end", |s| s.connections == 1)
        .await;
    alice
        .send(&ClientFrame::CheckPresence {
            username: "bob".into(),
        })
        .await;
    let status = alice
        .next_where(|f| matches!(f, RelayFrame::PresenceStatus { user_id, .. } if user_id == "bob"))
        .await;
    assert!(
        matches!(status, RelayFrame::PresenceStatus { online: false, .. }),
        "{status:?}"
    );
    pongs.abort();
}
