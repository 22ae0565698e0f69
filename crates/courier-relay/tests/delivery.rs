//! Sending, the journal, the mailbox and the drain (`docs/protocol.md#sending`,
//! `docs/protocol.md#inbound-delivery`, `docs/protocol.md#mailbox-and-drain`,
//! `docs/protocol.md#session-displacement`; conformance in `docs/protocol.md#sending-conformance`,
//! `docs/protocol.md#journal-release-and-drain` and `docs/protocol.md#presence-rate-and-sessions`).

mod common;

use std::time::Duration;

use common::*;
use courier_proto::{ClientFrame, RelayFrame};
use serde_json::json;

/// A realistic content: a serialized Message with quotes, escapes and non-ASCII text.
const CONTENT: &str = r#"{"id":"m1","sender":"off1x","content":"h\u00e9llo \"w\u00f6rld\"\n","priority":"high","metadata":{}}"#;

async fn presence(c: &mut Client, who: &str) -> RelayFrame {
    c.send(&ClientFrame::CheckPresence {
        username: who.into(),
    })
    .await;
    c.next_where(|f| matches!(f, RelayFrame::PresenceStatus { .. }))
        .await
}

fn seqs(frames: &[Received]) -> Vec<u64> {
    frames.iter().map(|f| f.seq.expect("seq")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_send_is_journaled_and_delivered_byte_identical() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let mut bob = relay.online("bob").await;
    let answer = alice.send_and_answer("bob", "m1", CONTENT).await;
    assert_sent(&answer, "m1", "bob", "live");
    let got = bob.received().await;
    assert_eq!(got.seq, Some(1));
    assert_eq!(got.sender, "alice");
    assert_eq!(got.sender_account.as_deref(), Some("alice"));
    assert_eq!(got.message_id, "m1");
    assert_eq!(got.content, CONTENT);
    let RelayFrame::MessageSent { timestamp, .. } = answer else {
        unreachable!()
    };
    assert_eq!(got.timestamp, timestamp, "both carry the acceptance time");
    assert_eq!(relay.stored_frames().await, 1, "kept until acked");
    bob.ack(1).await;
    bob.sync().await;
    assert_eq!(relay.stored_frames().await, 0);
}

/// `reply_to_msg` is journaled with the frame and reaches the recipient as sent: from the
/// mailbox, live, after a relay restart, and `null` when the sender gave none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_to_msg_reaches_the_recipient_as_sent() {
    let mut relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    let replying = |message_id: &str, reply_to: Option<&str>| ClientFrame::SendMessage {
        recipient: "bob".into(),
        content: CONTENT.into(),
        message_id: message_id.into(),
        reply_to_msg: reply_to.map(Into::into),
    };
    alice.send(&replying("m1", Some("m0"))).await;
    assert_sent(&alice.answer().await, "m1", "bob", "stored");
    alice.send(&replying("m2", None)).await;
    assert_sent(&alice.answer().await, "m2", "bob", "stored");

    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, _) = bob.drain().await;
    let links: Vec<_> = frames.iter().map(|f| f.reply_to_msg.as_deref()).collect();
    assert_eq!(links, [Some("m0"), None]);

    alice.send(&replying("m3", Some("m1"))).await;
    assert_sent(&alice.answer().await, "m3", "bob", "live");
    let live = bob.received().await;
    assert_eq!(
        (live.message_id.as_str(), live.reply_to_msg.as_deref()),
        ("m3", Some("m1"))
    );

    // Unreleased frames come back after a restart with their links.
    relay.restart_with(|_| {}).await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, _) = bob.drain().await;
    let links: Vec<_> = frames
        .iter()
        .map(|f| (f.message_id.as_str(), f.reply_to_msg.as_deref()))
        .collect();
    assert_eq!(
        links,
        [("m1", Some("m0")), ("m2", None), ("m3", Some("m1"))]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_recipient_gets_stored_frames_in_its_drain() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    for i in 1..=3 {
        let id = format!("m{i}");
        assert_sent(
            &alice.send_and_answer("bob", &id, &format!("c{i}")).await,
            &id,
            "bob",
            "stored",
        );
    }
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 3);
    assert_eq!(seqs(&frames), vec![1, 2, 3]);
    assert_eq!(
        frames
            .iter()
            .map(|f| f.content.as_str())
            .collect::<Vec<_>>(),
        vec!["c1", "c2", "c3"]
    );
    // After DrainComplete, new frames arrive live.
    assert_sent(
        &alice.send_and_answer("bob", "m4", "c4").await,
        "m4",
        "bob",
        "live",
    );
    assert_eq!(bob.received().await.seq, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_frame_starts_the_drain_before_the_grace_period() {
    let relay = TestRelay::start_with(|c| c.timings.drain_grace = Duration::from_secs(60)).await;
    relay.register("bob").await;
    let mut alice = relay.client().await;
    alice.authenticate("alice", true).await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "stored",
    );
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    bob.sync().await;
    let (frames, count) = bob.drain().await;
    assert_eq!((seqs(&frames), count), (vec![1], 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_racing_the_drain_keep_seq_order_and_one_drain_complete() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    for i in 1..=20 {
        alice.send_message("bob", &format!("m{i}"), "x").await;
    }
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    for i in 21..=40 {
        alice.send_message("bob", &format!("m{i}"), "x").await;
    }
    for _ in 0..40 {
        alice
            .next_where(|f| matches!(f, RelayFrame::MessageSent { .. }))
            .await;
    }
    let mut seen = Vec::new();
    let mut drain_complete_at = None;
    while seen.len() < 40 {
        match bob.next_frame().await {
            RelayFrame::MessageReceived { seq, .. } => seen.push(seq.expect("seq")),
            RelayFrame::DrainComplete { count } => {
                assert!(drain_complete_at.is_none(), "exactly one DrainComplete");
                assert_eq!(
                    count,
                    seen.len() as u64,
                    "the count is what the drain wrote"
                );
                drain_complete_at = Some(seen.len());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, (1..=40).collect::<Vec<_>>());
    if drain_complete_at.is_none() {
        assert_eq!(bob.drain_complete().await, 40);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_recipients_are_unreachable() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let answer = alice.send_and_answer("nobody", "m1", "x").await;
    assert_unreachable(&answer, "m1", "nobody", "unknown_recipient");
    let address = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";
    let answer = alice.send_and_answer(address, "m2", "x").await;
    assert_unreachable(&answer, "m2", address, "unknown_recipient");
    assert_eq!(relay.stored_frames().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_frames_are_redelivered_in_order_and_acked_ones_never() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    for i in 1..=5 {
        alice.send_and_answer("bob", &format!("m{i}"), "x").await;
    }
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, _) = bob.drain().await;
    assert_eq!(seqs(&frames), vec![1, 2, 3, 4, 5]);
    bob.ack(2).await; // one frame
    bob.ack(4).await;
    bob.ack(99).await; // unknown: ignored, unanswered
    bob.sync().await;
    bob.close().await;

    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!((seqs(&frames), count), (vec![1, 3, 5], 3));
    bob.ack_up_to(3).await; // releases 1 and 3, not 5
    bob.sync().await;
    bob.close().await;

    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!((seqs(&frames), count), (vec![5], 1));
    // AckUpTo past the highest written frame is clamped to it.
    bob.ack_up_to(1_000).await;
    bob.sync().await;
    assert_eq!(relay.stored_frames().await, 0);
    bob.close().await;
    alice.send_and_answer("bob", "m6", "x").await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, _) = bob.drain().await;
    assert_eq!(seqs(&frames), vec![6]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_up_to_only_releases_written_frames() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    alice.send_and_answer("bob", "m1", "x").await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, _) = bob.drain().await;
    assert_eq!(seqs(&frames), vec![1]);
    bob.close().await;
    alice.send_and_answer("bob", "m2", "x").await;
    // A new connection that has been written nothing yet acks everything: nothing released.
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    bob.ack_up_to(10).await;
    let (frames, _) = bob.drain().await;
    assert_eq!(seqs(&frames), vec![1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_unacked_message_is_stored_once() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "stored",
    );
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "stored",
    );
    assert_eq!(relay.stored_frames().await, 1);
    // Another sender may use the same id: the key includes the stamped sender.
    let mut carol = relay.online("carol").await;
    assert_sent(
        &carol.send_and_answer("bob", "m1", "y").await,
        "m1",
        "bob",
        "stored",
    );
    assert_eq!(relay.stored_frames().await, 2);

    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 2);
    assert_eq!(frames[0].sender, "alice");
    assert_eq!(frames[1].sender, "carol");
    // Re-sent while bob is connected and has not acked: answered live, not written again.
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "live",
    );
    bob.sync().await;
    assert_eq!(relay.stored_frames().await, 2);
    // Once acked, the same id is a new message again.
    bob.ack_up_to(2).await;
    bob.sync().await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "live",
    );
    assert_eq!(bob.received().await.seq, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_mailbox_refuses_and_stores_nothing() {
    let relay = TestRelay::start_with(|c| {
        c.mailbox = Some(courier_relay::MailboxLimits {
            max_messages: 2,
            // Two of alice's rows of 76 bytes besides their content, and 10 bytes of content.
            max_bytes: 2 * 76 + 10,
            ttl_ms: 60_000,
            // One sender may fill these mailboxes: the limits of the whole mailbox are tested.
            sender_share_percent: 100,
            ..Default::default()
        })
    })
    .await;
    relay.register("bob").await;
    relay.register("carol").await;
    let mut alice = relay.online("alice").await;
    // Count limit.
    assert_sent(
        &alice.send_and_answer("bob", "m1", "a").await,
        "m1",
        "bob",
        "stored",
    );
    assert_sent(
        &alice.send_and_answer("bob", "m2", "b").await,
        "m2",
        "bob",
        "stored",
    );
    assert_unreachable(
        &alice.send_and_answer("bob", "m3", "c").await,
        "m3",
        "bob",
        "mailbox_full",
    );
    // Byte limit: whole rows, of which 76 bytes here are not content.
    assert_sent(
        &alice.send_and_answer("carol", "m1", "123456").await,
        "m1",
        "carol",
        "stored",
    );
    assert_unreachable(
        &alice.send_and_answer("carol", "m2", "12345").await,
        "m2",
        "carol",
        "mailbox_full",
    );
    assert_sent(
        &alice.send_and_answer("carol", "m3", "1234").await,
        "m3",
        "carol",
        "stored",
    );
    assert_eq!(relay.stored_frames().await, 4);

    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!((seqs(&frames), count), (vec![1, 2], 2));
    // Acking frees room.
    bob.ack_up_to(2).await;
    bob.sync().await;
    assert_sent(
        &alice.send_and_answer("bob", "m3", "c").await,
        "m3",
        "bob",
        "live",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_frames_are_purged_undelivered() {
    let relay = TestRelay::start_with(|c| {
        c.mailbox = Some(courier_relay::MailboxLimits {
            ttl_ms: 200,
            ..Default::default()
        });
        c.timings.purge_interval = Duration::from_millis(50);
    })
    .await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "stored",
    );
    relay
        .wait_stats("the purge", |s| s.stored_frames == 0)
        .await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!((frames.len(), count), (0, 0));
    // The mailbox counters were released too: the seq goes on, the space is back.
    assert_sent(
        &alice.send_and_answer("bob", "m2", "y").await,
        "m2",
        "bob",
        "live",
    );
    assert_eq!(bob.received().await.seq, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_no_frame_and_seq_never_goes_back() {
    let mut relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    alice.send_and_answer("bob", "m1", "x").await;
    alice.send_and_answer("bob", "m2", "x").await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, _) = bob.drain().await;
    assert_eq!(seqs(&frames), vec![1, 2]);
    bob.ack(1).await;
    bob.sync().await;

    // Stopping closes live connections with 1001, and closes the database (WAL folded in).
    relay.stop().await;
    let wal = relay.db_path().with_extension("db-wal");
    assert!(
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "WAL left behind"
    );
    relay.run(relay.config()).await;
    let (_, ending) = bob.frames_until_end().await;
    assert_eq!(ending, Ending::Close(1001));
    let (_, ending) = alice.frames_until_end().await;
    assert_eq!(ending, Ending::Close(1001));

    assert_eq!(relay.stats().await.accounts, 2);
    assert_eq!(relay.stored_frames().await, 1);
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer("bob", "m3", "x").await,
        "m3",
        "bob",
        "stored",
    );
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!((seqs(&frames), count), (vec![2, 3], 2));
    bob.ack_up_to(3).await;
    bob.sync().await;
    bob.close().await;
    alice.close().await;

    // Even with the journal empty, a restart does not reuse seqs.
    relay.restart_with(|_| {}).await;
    assert_eq!(relay.stored_frames().await, 0);
    let mut alice = relay.online("alice").await;
    alice.send_and_answer("bob", "m4", "x").await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, _) = bob.drain().await;
    assert_eq!(seqs(&frames), vec![4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_opt_in_frames_carry_no_seq_and_are_released_once_written() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "stored").await,
        "m1",
        "bob",
        "stored",
    );
    let mut bob = relay.client().await;
    bob.authenticate("bob", false).await;
    let got = bob.received().await;
    assert_eq!((got.seq, got.message_id.as_str()), (None, "m1"));
    assert_sent(
        &alice.send_and_answer("bob", "m2", "live").await,
        "m2",
        "bob",
        "live",
    );
    // The next frame is the live one: no DrainComplete in between.
    let next = bob.next_frame().await;
    assert_eq!(Received::from(next).message_id, "m2");
    relay
        .wait_stats("release on write", |s| s.stored_frames == 0)
        .await;
    bob.close().await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    assert_eq!(
        bob.drain_complete().await,
        0,
        "written frames are not redelivered"
    );
}

/// Only an opted-in connection is held for the drain grace
/// (`docs/protocol.md#connections-without-the-opt-in`). A client written to the published contract,
/// which sends nothing after Authenticate, gets its frames at once: with a grace far longer than
/// any wait of the tests, a frame arriving at all shows it was not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_the_opt_in_is_never_held_for_the_grace() {
    let relay = TestRelay::start_with(|c| c.timings.drain_grace = Duration::from_secs(120)).await;
    relay.register("bob").await;
    let mut alice = relay.client().await;
    alice.authenticate("alice", true).await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "kept").await,
        "m1",
        "bob",
        "stored",
    );
    let mut bob = RawClient::connect(relay.handle().local_addr()).await;
    bob.authenticate_published("bob").await;
    let stored = Received::from(bob.next_relay_frame().await);
    assert_eq!((stored.seq, stored.message_id.as_str()), (None, "m1"));
    assert_sent(
        &alice.send_and_answer("bob", "m2", "now").await,
        "m2",
        "bob",
        "live",
    );
    let live = Received::from(bob.next_relay_frame().await);
    assert_eq!((live.seq, live.message_id.as_str()), (None, "m2"));
}

/// Custody is said in our `disposition` and in the published `pushed`/`stored`, so a client
/// written to the published contract reads it too; a live answer says `disposition` only
/// (`docs/protocol.md#custody-announcement`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_message_sent_carries_the_published_custody_fields() {
    let relay = TestRelay::start().await;
    relay.register("bob").await;
    let mut alice = RawClient::connect(relay.handle().local_addr()).await;
    alice.authenticate_published("alice").await;
    let send = |message_id: &str| json!({"type": "SendMessage", "recipient": "bob", "content": "x", "message_id": message_id});
    alice.send_json(send("m1")).await;
    let stored = alice.next_json().await;
    assert_eq!(
        (
            &stored["type"],
            &stored["message_id"],
            &stored["disposition"],
            &stored["pushed"],
            &stored["stored"]
        ),
        (
            &json!("MessageSent"),
            &json!("m1"),
            &json!("stored"),
            &json!(true),
            &json!(true)
        ),
        "{stored}"
    );

    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    assert_eq!(bob.drain().await.1, 1);
    alice.send_json(send("m2")).await;
    let live = alice.next_json().await;
    let mut fields: Vec<&str> = live
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "disposition",
            "message_id",
            "recipient",
            "timestamp",
            "type"
        ],
        "{live}"
    );
    assert_eq!(live["disposition"], "live");
    assert_eq!(bob.received().await.message_id, "m2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_displaces_the_old_one_and_takes_its_unacked_frames() {
    let relay = TestRelay::start().await;
    let mut old = relay.online("bob").await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "live",
    );
    assert_eq!(old.received().await.seq, Some(1));

    let mut new = relay.client().await;
    new.authenticate("bob", true).await;
    let (frames, ending) = old.frames_until_end().await;
    assert_eq!(
        frames,
        vec![RelayFrame::SessionSuperseded {
            reason: "new_session".into()
        }]
    );
    assert_eq!(ending, Ending::Close(4000));
    let (frames, count) = new.drain().await;
    assert_eq!((seqs(&frames), count), (vec![1], 1));
    assert_eq!(relay.stats().await.connections, 2);
    assert_sent(
        &alice.send_and_answer("bob", "m2", "x").await,
        "m2",
        "bob",
        "live",
    );
    assert_eq!(new.received().await.seq, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_reports_online_and_last_seen() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let bob = relay.online("bob").await;
    let status = presence(&mut alice, "bob").await;
    assert_eq!(
        status,
        RelayFrame::PresenceStatus {
            user_id: "bob".into(),
            online: true,
            last_seen: None
        }
    );
    bob.close().await;
    relay
        .wait_stats("bob's disconnect", |s| s.connections == 1)
        .await;
    let RelayFrame::PresenceStatus {
        online, last_seen, ..
    } = presence(&mut alice, "bob").await
    else {
        unreachable!()
    };
    assert!(!online);
    assert!(
        last_seen.and_then(|v| v.as_u64()).is_some(),
        "last_seen after a disconnect"
    );
    let status = presence(&mut alice, "nobody").await;
    assert_eq!(
        status,
        RelayFrame::PresenceStatus {
            user_id: "nobody".into(),
            online: false,
            last_seen: None
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipient_that_falls_behind_catches_up_from_the_journal_in_order() {
    // The ~16 MB stay unacked in bob's mailbox meanwhile: alice may use all of it, and send it
    // faster than the rate limit's bytes a second.
    let relay = TestRelay::start_with(|c| {
        c.mailbox = Some(courier_relay::MailboxLimits {
            sender_share_percent: 100,
            ..Default::default()
        });
        c.rate_limit.burst = 1_000_000;
    })
    .await;
    let mut bob = relay.online("bob").await;
    let mut alice = relay.online("alice").await;
    // Bob reads nothing while ~16 MB arrive: past the in-memory queue (8 MiB) plus what the
    // loopback socket buffers take before a non-reading peer's window closes, so the writer
    // falls behind and later frames come from the journal (the lag path of mailbox.rs).
    let content = "z".repeat(100_000);
    let n = 160;
    for i in 1..=n {
        alice.send_message("bob", &format!("m{i}"), &content).await;
    }
    for _ in 0..n {
        let answer = alice
            .next_where(|f| matches!(f, RelayFrame::MessageSent { .. }))
            .await;
        let RelayFrame::MessageSent { disposition, .. } = answer else {
            unreachable!()
        };
        assert_eq!(disposition, Some(courier_proto::Disposition::Live));
    }
    let mut seen = Vec::with_capacity(n);
    while seen.len() < n {
        let got = bob.received().await;
        assert_eq!(got.content.len(), content.len());
        seen.push(got.seq.expect("seq"));
    }
    assert_eq!(
        seen,
        (1..=n as u64).collect::<Vec<_>>(),
        "every frame once, in seq order"
    );
    bob.ack_up_to(n as u64).await;
    bob.sync().await;
    assert_eq!(relay.stored_frames().await, 0);
}

/// Mailbox limits for the fairness tests: `max_messages` 10, the rest as given.
fn mailbox(
    adjust: impl FnOnce(&mut courier_relay::MailboxLimits),
) -> impl FnOnce(&mut courier_relay::RelayConfig) {
    move |c| {
        let mut limits = courier_relay::MailboxLimits {
            max_messages: 10,
            ..Default::default()
        };
        adjust(&mut limits);
        c.mailbox = Some(limits);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sender_cannot_fill_a_recipients_mailbox() {
    // 20 % of 10 frames: two per sender.
    let relay = TestRelay::start_with(mailbox(|m| m.sender_share_percent = 20)).await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    for id in ["m1", "m2"] {
        assert_sent(
            &alice.send_and_answer("bob", id, "x").await,
            id,
            "bob",
            "stored",
        );
    }
    let answer = alice.send_and_answer("bob", "m3", "x").await;
    assert_unreachable(&answer, "m3", "bob", "mailbox_full");
    // Another sender still finds room, and alice's share is hers in each mailbox.
    let mut carol = relay.online("carol").await;
    assert_sent(
        &carol.send_and_answer("bob", "c1", "x").await,
        "c1",
        "bob",
        "stored",
    );
    relay.register("dave").await;
    assert_sent(
        &alice.send_and_answer("dave", "d1", "x").await,
        "d1",
        "dave",
        "stored",
    );
    // Released frames give the share back.
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!((seqs(&frames), count), (vec![1, 2, 3], 3));
    bob.ack_up_to(3).await;
    bob.sync().await;
    bob.close().await;
    relay
        .wait_stats("bob's disconnect", |s| s.connections == 2)
        .await;
    assert_sent(
        &alice.send_and_answer("bob", "m3", "x").await,
        "m3",
        "bob",
        "stored",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_cannot_store_past_the_byte_limit_in_fields_other_than_content() {
    // Room for 300 bytes, one sender alone may use all of it.
    let relay = TestRelay::start_with(mailbox(|m| {
        m.max_bytes = 300;
        m.sender_share_percent = 100;
    }))
    .await;
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    // One byte of content, 256 of message_id and 256 of reply_to_msg: the row is what is
    // stored, and it does not fit.
    let id = "i".repeat(256);
    alice
        .send(&ClientFrame::SendMessage {
            recipient: "bob".into(),
            content: "x".into(),
            message_id: id.clone(),
            reply_to_msg: Some("r".repeat(256)),
        })
        .await;
    assert_unreachable(&alice.answer().await, &id, "bob", "mailbox_full");
    assert_eq!(relay.stored_frames().await, 0);
    // A small frame fits.
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "stored",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_mailboxes_together_cannot_grow_the_journal_past_its_byte_cap() {
    // Each of alice's one-byte frames here is a 77-byte row: two fit in the journal, not three.
    let relay = TestRelay::start_with(mailbox(|m| m.max_journal_bytes = 2 * 77 + 76)).await;
    for account in ["bob", "carol", "dave"] {
        relay.register(account).await;
    }
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "x").await,
        "m1",
        "bob",
        "stored",
    );
    assert_sent(
        &alice.send_and_answer("carol", "m1", "x").await,
        "m1",
        "carol",
        "stored",
    );
    let answer = alice.send_and_answer("dave", "m1", "x").await;
    assert_unreachable(&answer, "m1", "dave", "mailbox_full");
    // Releasing anywhere makes room for everyone.
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, _) = bob.drain().await;
    bob.ack(frames[0].seq.unwrap()).await;
    bob.sync().await;
    assert_sent(
        &alice.send_and_answer("dave", "m1", "x").await,
        "m1",
        "dave",
        "stored",
    );
}
