//! Group sends (`docs/delivery.md#group-sends`): path choice, the report and its backstop,
//! re-broadcasts and downgrades, the persisted tracker across restarts, the outbox bound, large
//! groups paced by the carrier, and group messages received.

use std::collections::BTreeMap;

use courier_proto::message::{META_GROUP_COPY, META_GROUP_ID, META_GROUP_MESSAGE};
use courier_proto::{group_copy_id, wire_id, ContentType, Message, Priority};

use super::*;
use crate::io::{GroupPath, GroupReport, GroupSendRequest};

const GROUP: &str = "g1";

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("member-{i:04}")).collect()
}

/// The sealed group message as the runtime hands it over.
fn sealed(id: &str) -> Message {
    let mut metadata = BTreeMap::new();
    metadata.insert(META_GROUP_ID.to_owned(), GROUP.to_owned());
    metadata.insert(META_GROUP_MESSAGE.to_owned(), wire_id(id));
    Message {
        id: wire_id(id),
        sender: ALICE.to_owned(),
        recipient: GROUP.to_owned(),
        app_id: "chat".to_owned(),
        priority: Priority::Medium,
        ttl: 10,
        hop_count: 0,
        timestamp: 0,
        lamport_clock: 0,
        content_type: ContentType::Text,
        content: format!("__MLS_GROUP__ciphertext-of-{id}"),
        metadata,
        requires_ack: false,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    }
}

impl Sim {
    fn group_send(&mut self, id: &str, roster: &[String], broadcast: bool) {
        self.input(Input::GroupSend(Box::new(GroupSendRequest {
            id: id.to_owned(),
            group_id: GROUP.to_owned(),
            members: roster.to_vec(),
            message: sealed(id),
            broadcast,
        })));
    }

    fn group_ready(&mut self) {
        self.input(Input::GroupRelay {
            group_id: GROUP.to_owned(),
            ready: true,
        });
    }

    fn report(&mut self, id: &str, delivered: &[&str], pushed: &[&str], missed: &[&str]) {
        let names = |list: &[&str]| list.iter().map(|m| (*m).to_owned()).collect::<Vec<_>>();
        self.input(Input::GroupReport(GroupReport {
            group_id: GROUP.to_owned(),
            message_id: wire_id(id),
            delivered: names(delivered),
            pushed: names(pushed),
            missed: missed
                .iter()
                .map(|m| ((*m).to_owned(), "offline_no_mailbox".to_owned()))
                .collect(),
        }));
    }

    /// Copies of group message `id` put on a carrier since `mark`, by member.
    fn copies_since(&self, mark: usize, id: &str) -> BTreeMap<String, usize> {
        let mut copies = BTreeMap::new();
        for (_, message) in self.outbox_frames_since(mark) {
            if message.metadata.get(META_GROUP_MESSAGE) == Some(&wire_id(id)) {
                assert_eq!(message.id, group_copy_id(&wire_id(id), &message.recipient));
                assert_eq!(
                    message.content,
                    sealed(id).content,
                    "the copy carries the content"
                );
                assert!(message.requires_ack);
                *copies.entry(message.recipient.clone()).or_default() += 1;
            }
        }
        copies
    }

    fn member_state(&self, id: &str, member: &str) -> MemberState {
        self.group_rows[id].members[member]
    }

    fn all_members(&self, id: &str, state: MemberState) -> bool {
        self.group_rows[id].members.values().all(|s| *s == state)
    }
}

fn ready_sim() -> Sim {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.group_ready();
    sim
}

#[test]
fn without_a_ready_relay_every_member_gets_a_copy_with_the_whole_ladder() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let roster = members(5);
    let mark = sim.mark();
    sim.group_send("gm1", &roster, true);
    sim.advance(SEC);
    assert!(sim.broadcasts.is_empty(), "the group is not registered");
    let copies = sim.copies_since(mark, "gm1");
    assert_eq!(copies.len(), 5);
    assert!(copies.values().all(|n| *n == 1));
    assert!(sim.all_members("gm1", MemberState::Delivered));
    assert!(sim.groups_done.contains("gm1"));
    assert_eq!(sim.engine.stats().group_sends, 0);
    // The app sees the group message, never its copies.
    assert!(sim.events().all(|(_, e)| !matches!(
        e,
        Event::MessageSent { .. } | Event::MessageDelivered { .. }
    )));
    assert!(sim.events().any(|(_, e)| matches!(
        e,
        Event::GroupMessageSent {
            path: "fanout",
            members: 5,
            ..
        }
    )));
}

#[test]
fn the_sender_is_never_its_own_member_and_an_empty_roster_is_done_at_once() {
    let mut sim = ready_sim();
    sim.group_send("gm1", &[ALICE.to_owned()], true);
    assert!(sim.broadcasts.is_empty());
    assert!(sim.group_rows["gm1"].members.is_empty());
    assert!(sim.groups_done.contains("gm1"));
}

#[test]
fn a_report_settles_the_reached_and_backstops_the_missed_and_the_unknown() {
    let mut sim = ready_sim();
    let roster = members(5);
    sim.group_send("gm1", &roster, true);
    assert_eq!(sim.broadcasts.len(), 1);
    assert!(sim.rows.is_empty(), "no copy before the report");
    let mark = sim.mark();
    // member-4 is in the roster but unknown to the relay: the report does not name it.
    sim.report(
        "gm1",
        &["member-0000", "member-0001"],
        &["member-0002"],
        &["member-0003"],
    );
    sim.advance(SEC);
    let copies = sim.copies_since(mark, "gm1");
    assert_eq!(
        copies.keys().cloned().collect::<Vec<_>>(),
        vec!["member-0003".to_owned(), "member-0004".to_owned()]
    );
    assert_eq!(
        sim.member_state("gm1", "member-0000"),
        MemberState::Delivered
    );
    assert_eq!(sim.member_state("gm1", "member-0002"), MemberState::Stored);
    assert_eq!(
        sim.member_state("gm1", "member-0003"),
        MemberState::Delivered
    );
    assert_eq!(
        sim.member_state("gm1", "member-0004"),
        MemberState::Delivered
    );
    let report = sim
        .events()
        .find_map(|(_, e)| match e {
            Event::GroupMessageDeliveryReport {
                missed_reissued, ..
            } => Some(missed_reissued.clone()),
            _ => None,
        })
        .expect("the report is surfaced");
    assert_eq!(report, vec!["member-0003", "member-0004"]);
    assert!(sim.groups_done.contains("gm1"));
}

#[test]
fn a_report_that_never_comes_is_broadcast_twice_more_then_downgraded() {
    let mut sim = ready_sim();
    let roster = members(4);
    let mark = sim.mark();
    sim.group_send("gm1", &roster, true);
    sim.advance(59 * SEC);
    assert_eq!(sim.broadcasts.len(), 1);
    sim.advance(SEC);
    assert_eq!(sim.broadcasts.len(), 2, "second send at 60 s");
    sim.advance(60 * SEC);
    assert_eq!(sim.broadcasts.len(), 3, "third send at 120 s");
    assert!(sim
        .broadcasts
        .iter()
        .all(|(_, _, message)| message.id == wire_id("gm1")));
    assert!(sim.copies_since(mark, "gm1").is_empty());
    sim.advance(61 * SEC);
    assert_eq!(sim.broadcasts.len(), 3, "never a fourth");
    let copies = sim.copies_since(mark, "gm1");
    assert_eq!(copies.len(), 4, "downgraded: a copy each");
    assert!(copies.values().all(|n| *n == 1));
    assert!(sim.all_members("gm1", MemberState::Delivered));
    // A report that comes after the downgrade is ignored.
    sim.report("gm1", &["member-0000"], &[], &[]);
    assert!(!sim
        .events()
        .any(|(_, e)| matches!(e, Event::GroupMessageDeliveryReport { .. })));
}

#[test]
fn a_relay_disconnect_or_a_refusal_downgrades_at_once() {
    let mut sim = ready_sim();
    let roster = members(3);
    sim.group_send("gm1", &roster, true);
    sim.group_send("gm2", &roster, true);
    sim.input(Input::GroupRefused {
        message_id: wire_id("gm1"),
        reason: "not_member".to_owned(),
    });
    assert!(matches!(sim.group_rows["gm1"].path, GroupPath::FanOut));
    assert!(matches!(
        sim.group_rows["gm2"].path,
        GroupPath::Broadcast { .. }
    ));
    sim.carrier_down();
    assert!(matches!(sim.group_rows["gm2"].path, GroupPath::FanOut));
    // The next connection must register the group again before a broadcast.
    let mark = sim.mark();
    sim.carrier_up();
    sim.advance(SEC);
    assert_eq!(sim.copies_since(mark, "gm2").len(), 3);
    sim.group_send("gm3", &roster, true);
    assert_eq!(
        sim.broadcasts.len(),
        2,
        "gm3 fans out: the group is not ready"
    );
    sim.advance(SEC);
    for id in ["gm1", "gm2", "gm3"] {
        assert!(sim.all_members(id, MemberState::Delivered), "{id}");
    }
}

#[test]
fn a_restart_inside_the_report_window_still_backstops_every_member() {
    let mut sim = ready_sim();
    let roster = members(4);
    sim.group_send("gm1", &roster, true);
    assert_eq!(sim.broadcasts.len(), 1);
    sim.advance(10 * SEC);
    sim.restart();
    let mark = sim.mark();
    sim.carrier_up();
    sim.advance(SEC);
    let copies = sim.copies_since(mark, "gm1");
    assert_eq!(
        copies.len(),
        4,
        "every member gets its copy after the restart"
    );
    assert!(sim.all_members("gm1", MemberState::Delivered));
    assert!(sim.groups_done.contains("gm1"));
}

#[test]
fn copies_in_flight_survive_a_restart_with_their_content() {
    let mut sim = ready_sim();
    sim.net = Net::silent_peer();
    let roster = members(3);
    sim.group_send("gm1", &roster, true);
    sim.report("gm1", &["member-0000"], &[], &[]);
    sim.advance(SEC);
    assert_eq!(sim.rows.len(), 2, "two copies in the outbox");
    assert!(
        sim.rows.values().all(|row| row.message.content.is_empty()),
        "a copy's row holds no second copy of the content"
    );
    sim.restart();
    sim.net = Net::honest();
    let mark = sim.mark();
    sim.carrier_up();
    sim.advance(SEC);
    let copies = sim.copies_since(mark, "gm1");
    assert_eq!(copies.len(), 2);
    assert!(sim.all_members("gm1", MemberState::Delivered));
    assert!(sim.rows.is_empty());
}

#[test]
fn at_most_64_reports_wait_and_the_oldest_downgrades() {
    let mut sim = ready_sim();
    sim.net = Net::silent_peer();
    let roster = members(2);
    for i in 0..65 {
        sim.group_send(&format!("gm{i}"), &roster, true);
    }
    assert_eq!(sim.broadcasts.len(), 65);
    assert!(matches!(sim.group_rows["gm0"].path, GroupPath::FanOut));
    for i in 1..65 {
        assert!(matches!(
            sim.group_rows[&format!("gm{i}")].path,
            GroupPath::Broadcast { .. }
        ));
    }
}

#[test]
fn a_group_message_counts_once_against_the_outbox_bound() {
    let mut config = Config::new("chat");
    config.outbox_max_entries = 10;
    let mut sim = Sim::new(config);
    let mut dms = Vec::new();
    for _ in 0..9 {
        dms.push(sim.send(BOB));
    }
    sim.advance(SEC);
    // A 200-member group message: one entry against the bound, no DM evicted.
    sim.group_send("big", &members(200), false);
    assert_eq!(sim.failures(), 0);
    assert_eq!(sim.rows.len(), 9 + 200);
    // The bound is reached: the next DM evicts the oldest entry, a DM.
    sim.send(BOB);
    assert_eq!(sim.terminal_count(&dms[0]), 1);
    assert_eq!(sim.group_rows["big"].members.len(), 200);
    assert!(sim.all_members("big", MemberState::Pending));
    // Now the group message is the oldest but for eight DMs: evict those, then it goes whole.
    for _ in 0..9 {
        sim.send(BOB);
    }
    assert!(sim.all_members("big", MemberState::Failed));
    assert!(sim.groups_done.contains("big"));
    assert_eq!(sim.engine.stats().group_sends, 0);
}

#[test]
fn five_hundred_copies_written_at_the_carriers_pace_are_never_sent_twice() {
    let mut sim = Sim::with_defaults();
    sim.checks = false;
    sim.net.write = false;
    sim.carrier_up();
    let roster = members(500);
    let mark = sim.mark();
    sim.group_send("big", &roster, false);
    // The carrier writes about 9 frames a second (the client's token bucket); nothing is
    // retransmitted before it was written, since the ACK timer starts on the write.
    let mut written_at = BTreeMap::new();
    while written_at.len() < 500 {
        sim.advance(SEC);
        for _ in 0..9 {
            let Some((id, _, _)) = sim.unwritten.first().cloned() else {
                break;
            };
            assert!(written_at.insert(id, sim.now).is_none(), "written twice");
            sim.write_unwritten(0);
        }
    }
    sim.advance(10 * SEC);
    let copies = sim.copies_since(mark, "big");
    assert_eq!(copies.len(), 500);
    assert!(copies.values().all(|n| *n == 1), "a copy sent twice");
    assert!(sim
        .events()
        .all(|(_, e)| !matches!(e, Event::MessageRetrying { .. })));
    assert!(sim.all_members("big", MemberState::Delivered));
    let last = written_at.values().max().copied().unwrap();
    assert!(last >= 55 * SEC, "the tail went out paced, at {last}");
    sim.checks = true;
    sim.engine.check_invariants();
}

#[test]
fn a_five_hundred_member_broadcast_backstops_only_the_missed() {
    let mut sim = ready_sim();
    let roster = members(500);
    sim.group_send("big", &roster, true);
    let mark = sim.mark();
    let delivered: Vec<&str> = roster[..400].iter().map(String::as_str).collect();
    let pushed: Vec<&str> = roster[400..490].iter().map(String::as_str).collect();
    let missed: Vec<&str> = roster[490..495].iter().map(String::as_str).collect();
    sim.report("big", &delivered, &pushed, &missed);
    sim.advance(10 * SEC);
    let copies = sim.copies_since(mark, "big");
    assert_eq!(
        copies.len(),
        10,
        "the 5 missed and the 5 the relay did not name"
    );
    assert!(roster[490..].iter().all(|m| copies.contains_key(m)));
    assert!(sim.groups_done.contains("big"));
}

/// A group message from bob as the runtime hands it on once opened: its chat is the group.
fn opened(id: &str, copy: Option<&str>) -> Message {
    let mut message = message_from(BOB, &wire_id(id));
    message.recipient = GROUP.to_owned();
    message
        .metadata
        .insert(META_GROUP_ID.to_owned(), GROUP.to_owned());
    message.requires_ack = copy.is_some();
    if let Some(copy) = copy {
        message
            .metadata
            .insert(META_GROUP_COPY.to_owned(), copy.to_owned());
    }
    message
}

fn relay_origin(seq: u64) -> InboundOrigin {
    InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: BOB.to_owned(),
        sender_account: None,
        seq: Some(seq),
        sealed_by: None,
    }
}

#[test]
fn a_group_message_reaches_the_app_once_across_broadcast_and_copy() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let mark = sim.mark();
    sim.inbound(opened("hello", None), relay_origin(1));
    assert!(sim
        .engine
        .knows_group_inbound(GROUP, BOB, &wire_id("hello"), sim.now));
    let copy_id = group_copy_id(&wire_id("hello"), ALICE);
    sim.inbound(opened("hello", Some(&copy_id)), relay_origin(2));
    let received: Vec<&Event> = sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Event(e @ Event::MessageReceived { .. }) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(received.len(), 1);
    let Event::MessageReceived { chat, .. } = received[0] else {
        unreachable!()
    };
    assert_eq!(chat, GROUP);
    // The copy is acknowledged by its own id, from this device, to its sender; the broadcast
    // copy asks for no ACK.
    let acks: Vec<&Message> = sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Transmit(Transmit {
                kind: TransmitKind::DeliveryAck { message },
                ..
            }) => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].ack_for(), Some(copy_id.as_str()));
    assert_eq!(acks[0].sender, ALICE);
    assert_eq!(acks[0].recipient, BOB);
    assert!(sim.journal.is_empty(), "both frames released");
}

#[test]
fn a_group_copy_a_neighbor_carries_for_another_member_is_only_carried() {
    let mut sim = Sim::with_defaults();
    sim.input(Input::AccountName(ALICE.to_owned()));
    sim.local_up(BLE);
    sim.discover(BOB, BLE);
    let mark = sim.mark();
    // Bob's copy for carol, still sealed, offered to this device while bob parks it.
    let copy_id = group_copy_id(&wire_id("hello"), CAROL);
    let mut copy = message_from(BOB, &copy_id);
    copy.recipient = CAROL.to_owned();
    copy.content = "__MLS_GROUP__ciphertext-of-hello".to_owned();
    copy.metadata
        .insert(META_GROUP_ID.to_owned(), GROUP.to_owned());
    copy.metadata
        .insert(META_GROUP_MESSAGE.to_owned(), wire_id("hello"));
    let origin = InboundOrigin {
        carrier: Carrier::Local(BLE.to_owned()),
        stamped_sender: BOB.to_owned(),
        sender_account: None,
        seq: None,
        sealed_by: None,
    };
    sim.inbound(copy, origin);
    assert!(
        sim.log[mark..].iter().all(|(_, out)| !matches!(
            out,
            Out::Event(Event::MessageReceived { .. } | Event::SecurityWarning { .. })
                | Out::Transmit(Transmit {
                    kind: TransmitKind::DeliveryAck { .. },
                    ..
                })
        )),
        "neither delivered, acknowledged, nor taken for a forged control frame"
    );
}

#[test]
fn a_copy_that_arrives_while_its_broadcast_waits_for_the_hook_is_acknowledged_at_the_commit() {
    let mut config = Config::new("chat");
    config.durability_hook = Some(crate::config::HookConfig::default());
    let mut sim = Sim::new(config);
    sim.carrier_up();
    sim.inbound(opened("hello", None), relay_origin(1));
    assert!(
        sim.poll_hook().is_some(),
        "the broadcast copy goes to the hook"
    );
    // The sender's copy for this device comes in while the broadcast is with the hook.
    let copy_id = group_copy_id(&wire_id("hello"), ALICE);
    sim.inbound(opened("hello", Some(&copy_id)), relay_origin(2));
    let mark = sim.mark();
    sim.hook_result(true);
    let acks: Vec<&Message> = sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Transmit(Transmit {
                kind: TransmitKind::DeliveryAck { message },
                ..
            }) => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(acks.len(), 1, "the copy asked for an ACK: {acks:?}");
    assert_eq!(acks[0].ack_for(), Some(copy_id.as_str()));
    assert!(sim.journal.is_empty(), "both frames released");
}

#[test]
fn a_new_session_with_a_member_does_not_send_its_copy_again() {
    let mut config = Config::new("chat");
    config.encryption = true;
    let mut sim = Sim::new(config);
    sim.carrier_up();
    let roster = members(1);
    let session = || Input::SessionReady {
        recipient: roster[0].clone(),
    };
    sim.input(session());
    let mark = sim.mark();
    sim.group_send("gm1", &roster, false);
    // The 1:1 session with the member changes: what was sealed in it goes again, but the
    // copy carries the group's ciphertext.
    sim.input(session());
    assert_eq!(sim.copies_since(mark, "gm1")[&roster[0]], 1);
}
