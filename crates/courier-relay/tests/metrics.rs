//! The monitoring listener (`docs/operating-the-relay.md#metrics`,
//! `docs/operating-the-relay.md#health-and-readiness`): a real relay with `metrics_listen`, real
//! WebSocket clients, and `/metrics` scraped while they exchange frames.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use courier_proto::RelayFrame;
use courier_relay::Storage;

async fn relay_with_metrics() -> (TestRelay, SocketAddr) {
    let relay =
        TestRelay::start_with(|c| c.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let addr = relay.handle().metrics_addr().expect("a metrics address");
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    assert_ne!(addr.port(), 0, "the ephemeral port that was bound");
    (relay, addr)
}

async fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// A counter or gauge that must be in the exposition.
fn value(exposition: &str, series: &str) -> f64 {
    metric(exposition, series).unwrap_or_else(|| panic!("no {series} in\n{exposition}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_moves_the_counters() {
    let (relay, addr) = relay_with_metrics().await;
    let before = scrape(addr).await;
    assert_eq!(
        value(&before, "courier_relay_connections_accepted_total"),
        0.0
    );
    assert_eq!(value(&before, "courier_relay_journal_frames"), 0.0);
    assert_eq!(
        metric(
            &before,
            r#"courier_relay_frames_received_total{type="SendMessage"}"#
        ),
        None,
        "no series before the first frame"
    );
    assert!(before.contains("# TYPE courier_relay_store_commit_seconds histogram"));

    // Bob exists but is offline: Alice's frames go to his mailbox.
    relay.register("bob").await;
    let mut alice = relay.online("alice").await;
    for (id, content) in [("m1", "hello"), ("m2", "again!")] {
        assert_sent(
            &alice.send_and_answer("bob", id, content).await,
            id,
            "bob",
            "stored",
        );
    }
    let stored = scrape(addr).await;
    assert_eq!(
        value(
            &stored,
            r#"courier_relay_frames_received_total{type="SendMessage"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &stored,
            r#"courier_relay_frames_received_total{type="Authenticate"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &stored,
            r#"courier_relay_frames_sent_total{type="MessageSent"}"#
        ),
        2.0
    );
    assert_eq!(value(&stored, "courier_relay_journal_frames"), 2.0);
    // Whole rows: 11 bytes of content, 24 of sender, account and id, and 64 per row.
    assert_eq!(
        value(&stored, "courier_relay_journal_bytes"),
        11.0 + 24.0 + 2.0 * 64.0
    );
    assert_eq!(
        value(&stored, "courier_relay_journal_appended_frames_total"),
        2.0
    );
    assert_eq!(
        value(&stored, "courier_relay_journal_appended_bytes_total"),
        11.0
    );
    assert_eq!(
        value(&stored, "courier_relay_connections_accepted_total"),
        2.0
    );
    assert_eq!(
        value(&stored, "courier_relay_authenticated_connections"),
        1.0
    );
    assert_eq!(value(&stored, "courier_relay_accounts"), 2.0);
    assert!(value(&stored, "courier_relay_store_commit_seconds_count") >= 2.0);

    // Bob connects: the drain writes both, and his acks empty the journal.
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    let (frames, count) = bob.drain().await;
    assert_eq!(count, 2);
    bob.ack_up_to(frames.last().unwrap().seq.unwrap()).await;
    bob.sync().await;
    assert_sent(
        &alice.send_and_answer("bob", "m3", "live").await,
        "m3",
        "bob",
        "live",
    );
    bob.received().await;
    let delivered = scrape(addr).await;
    assert_eq!(
        value(
            &delivered,
            r#"courier_relay_frames_sent_total{type="MessageReceived"}"#
        ),
        3.0
    );
    assert_eq!(
        value(
            &delivered,
            r#"courier_relay_frames_received_total{type="AckUpTo"}"#
        ),
        1.0
    );
    assert_eq!(
        value(&delivered, "courier_relay_mailbox_drained_frames_total"),
        2.0
    );
    // Alice's empty drain counts too.
    assert_eq!(value(&delivered, "courier_relay_mailbox_drains_total"), 2.0);
    assert_eq!(
        value(&delivered, "courier_relay_authenticated_connections"),
        2.0
    );
    assert_eq!(
        value(&delivered, "courier_relay_journal_appended_frames_total"),
        3.0
    );
    // m3 was offered live but is journaled until acked, like any frame with the mailbox on.
    assert_eq!(value(&delivered, "courier_relay_journal_frames"), 1.0);

    // Connections that end are counted by why; refused tokens by the AuthError reason.
    let (reason, _) = relay
        .refused(r#"{"type":"Authenticate","token":"not-a-jwt"}"#)
        .await;
    assert_eq!(reason, "invalid_token");
    bob.close().await;
    // Alice's is the one left once the others' tasks are over, by then counted as closed.
    let ended = wait_metric(addr, "courier_relay_connections", |n| n == 1.0).await;
    assert_eq!(
        value(
            &ended,
            r#"courier_relay_connections_closed_total{reason="peer_closed"}"#
        ),
        2.0,
        "both of Bob's connections"
    );
    assert_eq!(
        value(
            &ended,
            r#"courier_relay_connections_closed_total{reason="auth_failed"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &ended,
            r#"courier_relay_auth_failures_total{reason="invalid_token"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &ended,
            r#"courier_relay_frames_sent_total{type="AuthError"}"#
        ),
        1.0
    );
    assert_eq!(
        value(&ended, "courier_relay_connections_accepted_total"),
        4.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_and_rate_limits_are_counted_by_code_and_type() {
    let relay = TestRelay::start_with(|c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.rate_limit.burst = 2;
        c.rate_limit.per_sec = 1;
    })
    .await;
    let addr = relay.handle().metrics_addr().unwrap();
    let mut alice = relay.online("alice").await;
    alice.send_text("not json").await;
    assert!(
        matches!(alice.next_frame().await, RelayFrame::Error { code, .. } if code == "malformed")
    );
    alice
        .send_json(serde_json::json!({"type": "NoSuchFrame"}))
        .await;
    assert!(
        matches!(alice.next_frame().await, RelayFrame::Error { code, .. } if code == "unknown_type")
    );
    let mut limited = 0;
    for i in 0..3 {
        match alice.send_and_answer("nobody", &format!("m{i}"), "x").await {
            RelayFrame::RateLimited { .. } => limited += 1,
            answer => assert_unreachable(&answer, &format!("m{i}"), "nobody", "unknown_recipient"),
        }
    }
    // The unknown type took one of the two tokens: at most one send got through.
    assert!(limited >= 2, "a burst of 2 cannot take 4 frames");
    let counted = scrape(addr).await;
    assert_eq!(
        value(
            &counted,
            r#"courier_relay_frames_received_total{type="malformed"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &counted,
            r#"courier_relay_frames_received_total{type="unknown"}"#
        ),
        1.0,
        "a type no client may name is not a label of its own"
    );
    assert_eq!(
        value(&counted, r#"courier_relay_errors_total{code="malformed"}"#),
        1.0
    );
    assert_eq!(
        value(
            &counted,
            r#"courier_relay_rate_limited_frames_total{type="SendMessage"}"#
        ),
        f64::from(limited)
    );
    assert_eq!(
        value(
            &counted,
            r#"courier_relay_delivery_errors_total{reason="unknown_recipient"}"#
        ),
        f64::from(3 - limited)
    );
    assert!(!counted.contains("NoSuchFrame"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_until_the_relay_has_stopped() {
    let mut relay = TestRelay::start_with(|c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.storage = Storage::Memory;
        // A client that never answers the relay's Close holds the stop this long: the window
        // in which the relay is stopping, and says so.
        c.timings.close_linger = Duration::from_secs(30);
    })
    .await;
    let addr = relay.handle().metrics_addr().unwrap();
    assert_eq!(http_get(addr, "/healthz").await, (200, "ok\n".to_owned()));
    assert_eq!(http_get(addr, "/readyz").await, (200, "ready\n".to_owned()));
    assert_eq!(http_get(addr, "/nowhere").await.0, 404);
    assert_eq!(http_request(addr, "POST", "/metrics").await.0, 405);

    let silent = relay.online("alice").await;
    let handle = relay.handle.take().unwrap();
    let stopping = tokio::spawn(handle.stop());
    within(async {
        while http_get(addr, "/readyz").await != (503, "stopping\n".to_owned()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("/readyz turns 503 once the relay is stopping");
    assert_eq!(http_get(addr, "/healthz").await.0, 200, "still alive");
    // The silent client goes away, and the stop completes.
    drop(silent);
    within(stopping).await.expect("the relay stops").unwrap();
}

#[tokio::test]
async fn no_metrics_address_opens_no_port() {
    let relay = TestRelay::start().await;
    assert_eq!(relay.handle().metrics_addr(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_frames_and_what_reports_say_of_members_are_counted() {
    let (relay, addr) = relay_with_metrics().await;
    relay.register("carol").await;
    let mut alice = relay.online("alice").await;
    let mut bob = relay.online("bob").await;
    alice
        .send(&courier_proto::ClientFrame::CreateGroup {
            group_id: "g".into(),
            name: "G".into(),
        })
        .await;
    for member in ["bob", "carol", "nobody"] {
        alice
            .send(&courier_proto::ClientFrame::AddGroupMember {
                group_id: "g".into(),
                username: member.into(),
            })
            .await;
    }
    alice
        .send(&courier_proto::ClientFrame::SendGroupMessage {
            group_id: "g".into(),
            content: "hi".into(),
            message_id: "m1".into(),
            reply_to_msg: None,
            forward_info: None,
        })
        .await;
    alice
        .next_where(|f| matches!(f, RelayFrame::GroupMessageSent { .. }))
        .await;
    bob.next_where(|f| matches!(f, RelayFrame::GroupMessageReceived { .. }))
        .await;
    let counted = scrape(addr).await;
    for (series, expected) in [
        (
            r#"courier_relay_frames_received_total{type="AddGroupMember"}"#,
            3.0,
        ),
        (
            r#"courier_relay_frames_received_total{type="SendGroupMessage"}"#,
            1.0,
        ),
        (
            r#"courier_relay_frames_sent_total{type="GroupMessageSent"}"#,
            1.0,
        ),
        (
            r#"courier_relay_frames_sent_total{type="GroupMessageReceived"}"#,
            1.0,
        ),
        (
            r#"courier_relay_group_fanout_members_total{outcome="delivered"}"#,
            1.0,
        ),
        (
            r#"courier_relay_group_fanout_members_total{outcome="pushed"}"#,
            1.0,
        ),
        (
            r#"courier_relay_group_fanout_members_total{outcome="unknown_member"}"#,
            1.0,
        ),
        (r#"courier_relay_journal_appended_frames_total"#, 2.0),
    ] {
        assert_eq!(value(&counted, series), expected, "{series}");
    }
}
