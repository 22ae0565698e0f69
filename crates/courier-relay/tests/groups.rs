//! Groups (`docs/protocol.md#group-frames`; conformance item 45 of
//! `docs/protocol.md#presence-rate-and-sessions`): registration and its admin rules, the broadcast
//! journaled once per member, the settled report and the report held for a sender that left,
//! re-broadcasts that journal nothing twice (also across a restart), the member limit and the
//! rate limit.

mod common;

use std::time::Duration;

use common::*;
use courier_proto::{ClientFrame, IdentityKey, RelayFrame};
use serde_json::json;

const GROUP: &str = "g1";

fn key(n: u8) -> IdentityKey {
    IdentityKey::from_seed([n; 32])
}

fn address(n: u8) -> String {
    key(n).address().to_string()
}

/// An opted-in connection that starts its drain at once (its first frame is `AckUpTo{0}`,
/// which releases nothing), whatever the drain grace; returns it with every frame up to and
/// including DrainComplete.
async fn started(relay: &TestRelay, account: &str) -> (Client, Vec<RelayFrame>) {
    let mut c = relay.client().await;
    c.authenticate(account, true).await;
    c.ack_up_to(0).await;
    let drained = c
        .frames_through(|f| matches!(f, RelayFrame::DrainComplete { .. }))
        .await;
    (c, drained)
}

/// The answer to a registration frame (or its refusal).
async fn answer(c: &mut Client) -> RelayFrame {
    c.next_where(|f| {
        matches!(
            f,
            RelayFrame::GroupCreated { .. }
                | RelayFrame::GroupMemberAdded { .. }
                | RelayFrame::GroupMemberRemoved { .. }
                | RelayFrame::GroupError { .. }
                | RelayFrame::Error { .. }
                | RelayFrame::RateLimited { .. }
        )
    })
    .await
}

/// Sends a registration frame and returns its answer.
async fn ask(c: &mut Client, frame: ClientFrame) -> RelayFrame {
    c.send(&frame).await;
    answer(c).await
}

fn creating(group: &str, name: &str) -> ClientFrame {
    let (group_id, name) = (group.into(), name.into());
    ClientFrame::CreateGroup { group_id, name }
}

fn adding(group: &str, member: &str) -> ClientFrame {
    let (group_id, username) = (group.into(), member.into());
    ClientFrame::AddGroupMember { group_id, username }
}

fn removing(group: &str, member: &str) -> ClientFrame {
    let (group_id, username) = (group.into(), member.into());
    ClientFrame::RemoveGroupMember { group_id, username }
}

fn leaving(group: &str) -> ClientFrame {
    let group_id = group.into();
    ClientFrame::LeaveGroup { group_id }
}

/// Creates GROUP as `admin` and adds `members`, each answered as it should be.
async fn group_of(admin: &mut Client, admin_id: &str, members: &[&str]) {
    assert_eq!(
        ask(admin, creating(GROUP, "Friends")).await,
        RelayFrame::GroupCreated {
            group_id: GROUP.into(),
            name: "Friends".into()
        }
    );
    for member in members {
        assert_eq!(
            ask(admin, adding(GROUP, member)).await,
            added(member, admin_id)
        );
    }
}

fn added(member: &str, by: &str) -> RelayFrame {
    RelayFrame::GroupMemberAdded {
        group_id: GROUP.into(),
        user_id: member.into(),
        added_by: by.into(),
    }
}

fn removed(member: &str, by: &str) -> RelayFrame {
    RelayFrame::GroupMemberRemoved {
        group_id: GROUP.into(),
        user_id: member.into(),
        removed_by: by.into(),
    }
}

fn refused(reason: &str, group: &str, message_id: Option<&str>) -> RelayFrame {
    RelayFrame::GroupError {
        reason: reason.into(),
        group_id: Some(group.into()),
        message_id: message_id.map(str::to_owned),
    }
}

fn group_message(group: &str, id: &str, content: &str) -> ClientFrame {
    ClientFrame::SendGroupMessage {
        group_id: group.into(),
        content: content.into(),
        message_id: id.into(),
        reply_to_msg: None,
        forward_info: None,
    }
}

async fn broadcast(c: &mut Client, id: &str, content: &str) {
    c.send(&group_message(GROUP, id, content)).await;
}

/// A GroupMessageSent, its lists sorted.
#[derive(Debug, PartialEq, Eq)]
struct Report {
    delivered: Vec<String>,
    pushed: Vec<String>,
    missed: Vec<(String, String)>,
    timestamp: u64,
}

fn report_of(frame: RelayFrame) -> Report {
    let RelayFrame::GroupMessageSent {
        group_id,
        delivered,
        pushed,
        missed,
        timestamp,
        ..
    } = frame
    else {
        panic!("expected GroupMessageSent, got {frame:?}");
    };
    assert_eq!(group_id, GROUP);
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let mut missed: Vec<(String, String)> =
        missed.into_iter().map(|m| (m.username, m.reason)).collect();
    missed.sort();
    Report {
        delivered: sorted(delivered),
        pushed: sorted(pushed),
        missed,
        timestamp,
    }
}

fn is_report(frame: &RelayFrame, id: &str) -> bool {
    matches!(frame, RelayFrame::GroupMessageSent { message_id, .. } if message_id == id)
}

/// The report on `id`, waited for.
async fn report(c: &mut Client, id: &str) -> Report {
    report_of(c.next_where(|f| is_report(f, id)).await)
}

/// A broadcast from `c`, refused because `c` is no member.
async fn assert_not_member(c: &mut Client, id: &str) {
    c.send(&group_message(GROUP, id, "hi")).await;
    assert_eq!(answer(c).await, refused("not_member", GROUP, Some(id)));
}

/// A broadcast from the group's only member.
async fn assert_reports_nobody(c: &mut Client, id: &str) {
    broadcast(c, id, "hi").await;
    assert_eq!(lists(&report(c, id).await), (vec![], vec![], vec![]));
}

/// (delivered, pushed, missed) in a form a test can spell.
fn lists(report: &Report) -> (Vec<&str>, Vec<&str>, Vec<(&str, &str)>) {
    (
        report.delivered.iter().map(String::as_str).collect(),
        report.pushed.iter().map(String::as_str).collect(),
        report
            .missed
            .iter()
            .map(|(m, r)| (m.as_str(), r.as_str()))
            .collect(),
    )
}

/// A GroupMessageReceived, flattened.
#[derive(Debug, Clone, PartialEq)]
struct Copy {
    seq: Option<u64>,
    group_id: String,
    sender: String,
    content: String,
    message_id: String,
    timestamp: u64,
    reply_to_msg: Option<String>,
    forward_info: Option<serde_json::Value>,
}

fn copies(frames: &[RelayFrame]) -> Vec<Copy> {
    frames
        .iter()
        .filter_map(|f| match f.clone() {
            RelayFrame::GroupMessageReceived {
                group_id,
                sender,
                content,
                message_id,
                timestamp,
                seq,
                reply_to_msg,
                forward_info,
            } => Some(Copy {
                seq,
                group_id,
                sender,
                content,
                message_id,
                timestamp,
                reply_to_msg,
                forward_info,
            }),
            _ => None,
        })
        .collect()
}

async fn copy(c: &mut Client) -> Copy {
    let frame = c
        .next_where(|f| matches!(f, RelayFrame::GroupMessageReceived { .. }))
        .await;
    copies(&[frame]).remove(0)
}

// Conformance: CreateGroup is idempotent for its creator and `group_exists` for anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_group_is_idempotent_for_its_creator_and_taken_for_anyone_else() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let mut bob = relay.online("bob").await;
    let created = |name: &str| RelayFrame::GroupCreated {
        group_id: GROUP.into(),
        name: name.into(),
    };
    assert_eq!(
        ask(&mut alice, creating(GROUP, "Friends")).await,
        created("Friends")
    );
    assert_eq!(
        ask(&mut alice, creating(GROUP, "Friends")).await,
        created("Friends")
    );
    assert_eq!(
        ask(&mut bob, creating(GROUP, "Mine")).await,
        refused("group_exists", GROUP, None)
    );
    // Its creator may rename it; bob's attempt made him neither admin nor member.
    assert_eq!(
        ask(&mut alice, creating(GROUP, "Family")).await,
        created("Family")
    );
    assert_eq!(
        ask(&mut bob, adding(GROUP, "bob")).await,
        refused("not_admin", GROUP, None)
    );
    assert_not_member(&mut bob, "m1").await;
    // The creator is a member: its broadcast to a group of one reports nobody.
    assert_reports_nobody(&mut alice, "m2").await;
    // An identifier over 256 bytes is no group id.
    assert_eq!(
        ask(&mut alice, creating(&"g".repeat(257), "x")).await,
        RelayFrame::error("invalid_frame", Some("CreateGroup"))
    );
}

// Conformance: AddGroupMember and RemoveGroupMember by anyone but the admin get `not_admin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_admin_adds_and_removes_members() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let mut bob = relay.online("bob").await;
    group_of(&mut alice, "alice", &["bob"]).await;
    assert_eq!(
        ask(&mut bob, adding(GROUP, "carol")).await,
        refused("not_admin", GROUP, None)
    );
    assert_eq!(
        ask(&mut bob, removing(GROUP, "alice")).await,
        refused("not_admin", GROUP, None)
    );
    assert_eq!(
        ask(&mut alice, adding("nope", "carol")).await,
        refused("group_not_found", "nope", None)
    );
    assert_eq!(
        ask(&mut alice, removing("nope", "carol")).await,
        refused("group_not_found", "nope", None)
    );
    // Adding a member again and removing a non-member succeed and change nothing.
    assert_eq!(
        ask(&mut alice, adding(GROUP, "bob")).await,
        added("bob", "alice")
    );
    assert_eq!(
        ask(&mut alice, removing(GROUP, "dave")).await,
        removed("dave", "alice")
    );
    // Identifiers that name nothing are refused; oversized ones are invalid frames.
    for bad in ["a/b", "..", &address(3).to_ascii_uppercase(), "off1xyz"] {
        assert_eq!(
            ask(&mut alice, adding(GROUP, bad)).await,
            refused("invalid_member", GROUP, None),
            "{bad}"
        );
    }
    assert_eq!(
        ask(&mut alice, adding(GROUP, &"b".repeat(257))).await,
        RelayFrame::error("invalid_frame", Some("AddGroupMember"))
    );
    // Removal takes effect: bob is no member any more.
    assert_eq!(
        ask(&mut alice, removing(GROUP, "bob")).await,
        removed("bob", "alice")
    );
    assert_not_member(&mut bob, "m1").await;
}

// Conformance: a non-member's SendGroupMessage gets `not_member` and fans out nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_member_s_broadcast_is_refused_and_fans_out_nothing() {
    let relay = TestRelay::start().await;
    relay.register("carol").await;
    let mut alice = relay.online("alice").await;
    let mut bob = relay.online("bob").await;
    let mut mallory = relay.online("mallory").await;
    group_of(&mut alice, "alice", &["bob", "carol"]).await;
    mallory.send(&group_message(GROUP, "m1", "spam")).await;
    assert_eq!(
        answer(&mut mallory).await,
        refused("not_member", GROUP, Some("m1"))
    );
    mallory.send(&group_message("nope", "m2", "spam")).await;
    assert_eq!(
        answer(&mut mallory).await,
        refused("group_not_found", "nope", Some("m2"))
    );
    assert!(mallory.until_synced().await.is_empty(), "no report either");
    assert!(copies(&bob.until_synced().await).is_empty());
    assert!(copies(&alice.until_synced().await).is_empty());
    assert_eq!(relay.stored_frames().await, 0, "nothing stored for carol");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_leaves_in_its_own_name_and_then_is_no_member() {
    let relay = TestRelay::start().await;
    let mut alice = relay.online("alice").await;
    let mut bob = relay.online("bob").await;
    group_of(&mut alice, "alice", &["bob"]).await;
    assert_eq!(ask(&mut bob, leaving(GROUP)).await, removed("bob", "bob"));
    assert_eq!(
        ask(&mut bob, leaving(GROUP)).await,
        refused("not_member", GROUP, None)
    );
    assert_eq!(
        ask(&mut bob, leaving("nope")).await,
        refused("group_not_found", "nope", None)
    );
    assert_not_member(&mut bob, "m1").await;
    assert_reports_nobody(&mut alice, "m2").await;
    assert!(copies(&bob.until_synced().await).is_empty());
}

// Conformance: connected members get GroupMessageReceived with `seq`, offline ones are stored,
// and the report names the identifiers members were registered under, never the sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_is_delivered_live_stored_offline_and_reported_by_registered_identifier() {
    let relay = TestRelay::start().await;
    relay.register("carol").await;
    relay.online_declared("dave", &key(4)).await.close().await;
    let mut alice = relay.online_declared("alice", &key(1)).await;
    let mut bob = relay.online_declared("bob", &key(2)).await;
    let mut erin = relay.online("erin").await;
    // The creator is registered under its bound address; members under what the admin names.
    let (bob_addr, dave_addr, nobody_addr) = (address(2), address(4), address(9));
    group_of(
        &mut alice,
        &address(1),
        &[
            &bob_addr,
            "carol",
            &dave_addr,
            "erin",
            "nobody",
            &nobody_addr,
        ],
    )
    .await;
    alice
        .send(&ClientFrame::SendGroupMessage {
            group_id: GROUP.into(),
            content: "h\u{e9}llo \"group\"".into(),
            message_id: "m1".into(),
            reply_to_msg: Some("m0".into()),
            forward_info: Some(json!({"from": "someone", "n": 1})),
        })
        .await;
    let report = report(&mut alice, "m1").await;
    let mut delivered = vec!["erin", bob_addr.as_str()];
    delivered.sort();
    let mut pushed = vec!["carol", dave_addr.as_str()];
    pushed.sort();
    let mut missed = vec![
        ("nobody", "unknown_member"),
        (nobody_addr.as_str(), "unknown_member"),
    ];
    missed.sort();
    assert_eq!(lists(&report), (delivered, pushed, missed));

    let expected = |seq: u64| Copy {
        seq: Some(seq),
        group_id: GROUP.into(),
        sender: address(1),
        content: "h\u{e9}llo \"group\"".into(),
        message_id: "m1".into(),
        timestamp: report.timestamp,
        reply_to_msg: Some("m0".into()),
        forward_info: Some(json!({"from": "someone", "n": 1})),
    };
    // Each account's seq space is its own: a copy's seq is the account's next, not 1 for all
    // (a relay node's seqs leave gaps, docs/cluster.md#seq).
    let (to_bob, to_erin) = (copy(&mut bob).await, copy(&mut erin).await);
    let (bob_seq, erin_seq) = (to_bob.seq.expect("a seq"), to_erin.seq.expect("a seq"));
    assert_eq!(to_bob, expected(bob_seq));
    assert_eq!(to_erin, expected(erin_seq));
    assert!(
        copies(&alice.until_synced().await).is_empty(),
        "not to itself"
    );
    assert_eq!(
        relay.stored_frames().await,
        4,
        "one copy per member account"
    );

    // Offline members drain it on their next connection, in their seq space.
    for account in ["carol", "dave"] {
        let (_c, drained) = started(&relay, account).await;
        let drained_copies = copies(&drained);
        let seq = drained_copies
            .first()
            .and_then(|c| c.seq)
            .expect("a copy with a seq");
        assert_eq!(drained_copies, vec![expected(seq)], "{account}");
        assert_eq!(
            drained.last(),
            Some(&RelayFrame::DrainComplete { count: 1 })
        );
    }
    // A group copy is released like any journal frame.
    bob.ack(bob_seq).await;
    bob.sync().await;
    erin.ack_up_to(erin_seq).await;
    erin.sync().await;
    assert_eq!(relay.stored_frames().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_acts_for_a_member_registered_under_its_account_name() {
    let relay = TestRelay::start().await;
    let mut bob = relay.online("bob").await;
    let mut alice = relay.online_declared("alice", &key(1)).await;
    group_of(&mut bob, "bob", &["alice"]).await;
    // Declared, alice is stamped with her address, yet acts for "alice".
    broadcast(&mut alice, "m1", "hi").await;
    assert_eq!(
        lists(&report(&mut alice, "m1").await),
        (vec!["bob"], vec![], vec![])
    );
    assert_eq!(copy(&mut bob).await.sender, address(1));
    // Bob's broadcast reaches her under the name she was registered as.
    broadcast(&mut bob, "m2", "hey").await;
    assert_eq!(
        lists(&report(&mut bob, "m2").await),
        (vec!["alice"], vec![], vec![])
    );
    assert_eq!(copy(&mut alice).await.sender, "bob");
    assert_eq!(
        ask(&mut alice, leaving(GROUP)).await,
        removed("alice", "alice")
    );
}

// Conformance: a report whose sender disconnected before it settled is written to that
// account's next connection after its drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_whose_sender_left_is_written_after_its_next_connection_s_drain() {
    // Carol's drain waits for her first frame: until then her copy is queued, not written,
    // and the report cannot settle.
    let relay = TestRelay::start_with(|c| c.timings.drain_grace = Duration::from_secs(600)).await;
    relay.register("carol").await;
    let mut carol = relay.client().await;
    carol.authenticate("carol", true).await;
    let (mut alice, _) = started(&relay, "alice").await;
    group_of(&mut alice, "alice", &["carol"]).await;
    broadcast(&mut alice, "m1", "hi").await;
    alice.sync().await;
    alice.close().await;
    relay
        .wait_stats("alice's connection to end", |s| s.connections == 1)
        .await;
    // A frame for alice's drain, so the report has a drain to follow.
    let (mut bob, _) = started(&relay, "bob").await;
    assert_sent(
        &bob.send_and_answer("alice", "d1", "while away").await,
        "d1",
        "alice",
        "stored",
    );
    // Carol's drain writes her copy: the report settles with alice gone.
    carol.ack_up_to(0).await;
    let drained = carol
        .frames_through(|f| matches!(f, RelayFrame::DrainComplete { .. }))
        .await;
    assert_eq!(copies(&drained).len(), 1);

    let mut alice = relay.client().await;
    alice.authenticate("alice", true).await;
    alice.ack_up_to(0).await;
    let frames = alice.frames_through(|f| is_report(f, "m1")).await;
    assert!(
        matches!(
            &frames[..],
            [
                RelayFrame::MessageReceived { message_id, .. },
                RelayFrame::DrainComplete { count: 1 },
                RelayFrame::GroupMessageSent { .. },
            ] if message_id == "d1"
        ),
        "{frames:?}"
    );
    let report = report_of(frames.last().unwrap().clone());
    assert_eq!(lists(&report), (vec!["carol"], vec![], vec![]));
    // Written once: the next connection does not get it again.
    alice.close().await;
    let (mut alice, drained) = started(&relay, "alice").await;
    assert!(!drained.iter().any(|f| is_report(f, "m1")));
    assert!(!alice
        .until_synced()
        .await
        .iter()
        .any(|f| is_report(f, "m1")));
}

/// The largest send buffer the kernel may give the relay's socket.
fn largest_send_buffer() -> usize {
    let wmem = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem").expect("tcp_wmem");
    wmem.split_whitespace()
        .nth(2)
        .and_then(|max| max.parse().ok())
        .expect("the third tcp_wmem figure")
}

// Conformance: a stalled member write still yields the report by the fan-out deadline, listing
// that member missed with `fanout_deadline`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_socket_takes_nothing_is_missed_at_the_fan_out_deadline() {
    // In memory: the flood below is about sockets, and its fsyncs would only slow the test. In
    // cluster mode mallory's connection may be on another node than alice's, which then asks
    // mallory's node whether it wrote the copy.
    let relay = TestRelay::start_with(|c| {
        if !cluster_mode() {
            c.storage = courier_relay::Storage::Memory;
        }
        c.timings.fanout_deadline = Duration::from_secs(1);
        // The flood stays unacked in mallory's mailbox: wendy may use all of it, and send it
        // faster than the rate limit's bytes a second.
        c.mailbox = Some(courier_relay::MailboxLimits {
            sender_share_percent: 100,
            ..Default::default()
        });
        c.rate_limit.burst = 1_000_000;
    })
    .await;
    relay.register("bob").await;
    let mut mallory =
        RawClient::connect_with_receive_window(relay.handle().local_addr(), 4096).await;
    mallory.authenticate("mallory").await;
    // From here mallory reads nothing. Frames for her ahead of the group copy, more than every
    // buffer on the way can hold, keep the copy from ever being written.
    let mut wendy = relay.online("wendy").await;
    let content = "x".repeat(900_000);
    let frames = (largest_send_buffer() + 4 * 1024 * 1024) / content.len() + 1;
    for i in 0..frames {
        let id = format!("w{i}");
        assert_sent(
            &wendy.send_and_answer("mallory", &id, &content).await,
            &id,
            "mallory",
            "live",
        );
    }
    let mut alice = relay.online("alice").await;
    group_of(&mut alice, "alice", &["bob", "mallory"]).await;
    broadcast(&mut alice, "m1", "hi").await;
    // The report is due a second after the frame was read; a loaded machine may take longer
    // to get there than the usual wait for a frame.
    alice.wait_up_to(DEADLINE * 6);
    assert_eq!(
        lists(&report(&mut alice, "m1").await),
        (vec![], vec!["bob"], vec![("mallory", "fanout_deadline")])
    );
}

// Conformance: a re-broadcast under the same `message_id` creates no second journal copy for any
// member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_broadcast_journals_no_second_copy_and_is_reported_afresh() {
    let relay = TestRelay::start().await;
    relay.register("carol").await;
    let mut alice = relay.online("alice").await;
    let mut bob = relay.online("bob").await;
    group_of(&mut alice, "alice", &["bob", "carol"]).await;
    for _ in 0..2 {
        broadcast(&mut alice, "m1", "hi").await;
        assert_eq!(
            lists(&report(&mut alice, "m1").await),
            (vec!["bob"], vec!["carol"], vec![])
        );
    }
    assert_eq!(relay.stored_frames().await, 2);
    let seen = copies(&bob.until_synced().await);
    assert_eq!(seen.len(), 1, "{seen:?}");
    // Released by bob, it is still not journaled again.
    bob.ack(seen[0].seq.unwrap()).await;
    bob.sync().await;
    broadcast(&mut alice, "m1", "hi").await;
    assert_eq!(
        lists(&report(&mut alice, "m1").await),
        (vec!["bob"], vec!["carol"], vec![])
    );
    assert!(copies(&bob.until_synced().await).is_empty());
    assert_eq!(relay.stored_frames().await, 1);
    let (_carol, drained) = started(&relay, "carol").await;
    assert_eq!(copies(&drained).len(), 1);
    // Another message id is another message.
    broadcast(&mut alice, "m2", "hi").await;
    report(&mut alice, "m2").await;
    assert_eq!(copy(&mut bob).await.message_id, "m2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_broadcast_after_a_restart_journals_no_second_copy() {
    let mut relay = TestRelay::start().await;
    relay.register("carol").await;
    let mut alice = relay.online("alice").await;
    group_of(&mut alice, "alice", &["carol"]).await;
    broadcast(&mut alice, "m1", "hi").await;
    assert_eq!(
        lists(&report(&mut alice, "m1").await),
        (vec![], vec!["carol"], vec![])
    );
    drop(alice);
    relay.restart_with(|_| {}).await;

    let mut alice = relay.online("alice").await;
    broadcast(&mut alice, "m1", "hi").await;
    assert_eq!(
        lists(&report(&mut alice, "m1").await),
        (vec![], vec!["carol"], vec![])
    );
    assert_eq!(relay.stored_frames().await, 1);
    let (mut carol, drained) = started(&relay, "carol").await;
    let drained = copies(&drained);
    assert_eq!(drained.len(), 1);
    carol.ack(drained[0].seq.unwrap()).await;
    carol.sync().await;
    carol.close().await;
    drop(alice);

    // Released, then the relay restarts again: the copy counts as delivered, none is stored.
    relay.restart_with(|_| {}).await;
    let mut alice = relay.online("alice").await;
    broadcast(&mut alice, "m1", "hi").await;
    assert_eq!(
        lists(&report(&mut alice, "m1").await),
        (vec!["carol"], vec![], vec![])
    );
    assert_eq!(relay.stored_frames().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_at_its_configured_size_refuses_new_members() {
    let relay = TestRelay::start_with(|c| c.max_group_members = 3).await;
    let mut alice = relay.online("alice").await;
    group_of(&mut alice, "alice", &["bob", "carol"]).await;
    assert_eq!(
        ask(&mut alice, adding(GROUP, "dave")).await,
        refused("group_full", GROUP, None)
    );
    // A member already in is no new member.
    assert_eq!(
        ask(&mut alice, adding(GROUP, "bob")).await,
        added("bob", "alice")
    );
    assert_eq!(
        ask(&mut alice, removing(GROUP, "carol")).await,
        removed("carol", "alice")
    );
    assert_eq!(
        ask(&mut alice, adding(GROUP, "dave")).await,
        added("dave", "alice")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_frames_take_rate_limit_tokens_and_limited_ones_fan_out_nothing() {
    const FLOOD: usize = 50;
    let relay = TestRelay::start_with(|c| {
        c.rate_limit = courier_relay::RateLimit {
            burst: 4,
            per_sec: 1,
        };
    })
    .await;
    let mut alice = relay.online("alice").await;
    let mut bob = relay.online("bob").await;
    group_of(&mut alice, "alice", &["bob"]).await;
    for i in 0..FLOOD {
        broadcast(&mut alice, &format!("m{i}"), "hi").await;
    }
    // Each broadcast is either dropped with its id or reported, never both.
    let mut limited = Vec::new();
    let mut reported = Vec::new();
    while limited.len() + reported.len() < FLOOD {
        match alice.next_frame().await {
            RelayFrame::RateLimited {
                retry_after_ms,
                frame_type,
                message_id,
                ..
            } => {
                assert!(retry_after_ms >= 1);
                assert_eq!(frame_type, "SendGroupMessage");
                limited.push(message_id.expect("the dropped frame's id"));
            }
            frame @ RelayFrame::GroupMessageSent { .. } => {
                let RelayFrame::GroupMessageSent { message_id, .. } = &frame else {
                    unreachable!()
                };
                reported.push(message_id.clone());
                assert_eq!(lists(&report_of(frame)), (vec!["bob"], vec![], vec![]));
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        !limited.is_empty(),
        "a burst of 4 cannot take {FLOOD} frames"
    );
    // Bob got exactly the broadcasts that were reported.
    let mut received = Vec::new();
    while received.len() < reported.len() {
        received.push(copy(&mut bob).await.message_id);
    }
    received.sort();
    reported.sort();
    assert_eq!(received, reported);
    assert!(limited.iter().all(|id| !reported.contains(id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_mailbox_connected_members_get_the_copy_and_offline_ones_are_missed() {
    let relay = TestRelay::start_with(|c| c.mailbox = None).await;
    relay.register("carol").await;
    let mut alice = relay.client().await;
    alice.authenticate("alice", true).await;
    let mut bob = relay.client().await;
    bob.authenticate("bob", true).await;
    group_of(&mut alice, "alice", &["bob", "carol", "nobody"]).await;
    broadcast(&mut alice, "m1", "hi").await;
    assert_eq!(
        lists(&report(&mut alice, "m1").await),
        (
            vec!["bob"],
            vec![],
            vec![
                ("carol", "offline_no_mailbox"),
                ("nobody", "unknown_member")
            ]
        )
    );
    let got = copy(&mut bob).await;
    assert_eq!((got.seq, got.message_id.as_str()), (None, "m1"));
    assert_eq!(relay.stored_frames().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_full_mailbox_is_missed_and_the_others_are_not() {
    let relay = TestRelay::start_with(|c| {
        c.mailbox = Some(courier_relay::MailboxLimits {
            max_messages: 1,
            ..courier_relay::MailboxLimits::default()
        });
    })
    .await;
    relay.register("carol").await;
    relay.register("dave").await;
    let mut alice = relay.online("alice").await;
    assert_sent(
        &alice.send_and_answer("carol", "d1", "fills it").await,
        "d1",
        "carol",
        "stored",
    );
    group_of(&mut alice, "alice", &["carol", "dave"]).await;
    broadcast(&mut alice, "m1", "hi").await;
    assert_eq!(
        lists(&report(&mut alice, "m1").await),
        (vec![], vec!["dave"], vec![("carol", "mailbox_full")])
    );
}
