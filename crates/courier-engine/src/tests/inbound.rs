//! Inbound: processing before acknowledging, dedup across restarts, ACK attribution.

use std::collections::BTreeMap;

use courier_proto::{ContentType, Message, Priority};

use super::*;

fn from_bob(id: &str) -> Message {
    Message {
        id: id.to_owned(),
        sender: BOB.to_owned(),
        recipient: ALICE.to_owned(),
        app_id: "chat".to_owned(),
        priority: Priority::Medium,
        ttl: 10,
        hop_count: 2,
        timestamp: 5,
        lamport_clock: 100,
        content_type: ContentType::Text,
        content: "hi alice".to_owned(),
        metadata: BTreeMap::new(),
        requires_ack: true,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    }
}

fn over_relay(stamped: &str, seq: u64) -> InboundOrigin {
    InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: stamped.to_owned(),
        sender_account: None,
        seq: Some(seq),
        sealed_by: None,
    }
}

/// A device with its relay carrier up, and the durability hook when `hooked`.
fn connected(hooked: bool) -> Sim {
    let mut config = Config::new("chat");
    if hooked {
        config.durability_hook = Some(crate::config::HookConfig::default());
    }
    let mut sim = Sim::new(config);
    sim.carrier_up();
    sim
}

/// What one inbound call produced, reduced to its kinds, in the runtime's order.
fn shape(sim: &Sim, mark: usize) -> Vec<&'static str> {
    sim.log[mark..]
        .iter()
        .map(|(_, out)| match out {
            Out::Store(StoreOp::MarkProcessed(_)) => "mark_processed",
            Out::Store(_) => "store",
            Out::Event(Event::MessageReceived { .. }) => "message_received",
            Out::Event(Event::Diagnostic { .. }) => "diagnostic",
            Out::Event(_) => "event",
            Out::Transmit(Transmit {
                kind: TransmitKind::DeliveryAck { .. },
                ..
            }) => "ack",
            Out::Transmit(Transmit {
                kind: TransmitKind::ReleaseFrame { .. },
                ..
            }) => "release",
            Out::Transmit(_) => "frame",
        })
        .collect()
}

fn sent_ack(sim: &Sim, mark: usize) -> Option<&Message> {
    sim.log[mark..].iter().find_map(|(_, out)| match out {
        Out::Transmit(Transmit {
            kind: TransmitKind::DeliveryAck { message },
            carrier: Carrier::Relay,
            ..
        }) => Some(message),
        _ => None,
    })
}

#[test]
fn a_new_message_is_processed_then_acknowledged() {
    let mut sim = Sim::with_defaults();
    sim.now = 1000;
    let mark = sim.mark();
    sim.inbound(from_bob("b1"), over_relay(BOB, 7));
    assert_eq!(
        shape(&sim, mark),
        ["mark_processed", "message_received", "ack", "release"]
    );

    let (
        _,
        Out::Event(Event::MessageReceived {
            message,
            chat,
            sender,
            transport,
            encrypted: false,
        }),
    ) = &sim.log[mark + 1]
    else {
        panic!("not a message_received")
    };
    assert_eq!(
        (
            message.id.as_str(),
            chat.as_str(),
            sender.as_str(),
            transport.as_str()
        ),
        ("b1", BOB, BOB, "internet")
    );
    assert_eq!(sim.processed[0].key.message_id, "b1");
    assert_eq!(sim.processed[0].at, 1000);

    let ack = sent_ack(&sim, mark).unwrap();
    assert_eq!(
        ack.id,
        courier_proto::ack_id(BOB, "b1"),
        "a UUID, like every wire id"
    );
    assert!(courier_proto::is_wire_id(&ack.id));
    assert_eq!((ack.sender.as_str(), ack.recipient.as_str()), (ALICE, BOB));
    assert_eq!(ack.ack_for(), Some("b1"));
    assert_eq!(ack.metadata["ack_hop_count"], "2");
    assert_eq!(ack.metadata["ack_transport"], "internet");
    assert!(!ack.requires_ack);
    assert!(matches!(
        sim.log.last(),
        Some((
            _,
            Out::Transmit(Transmit {
                kind: TransmitKind::ReleaseFrame { seq: 7 },
                ..
            })
        ))
    ));

    // Our clock moves past what we have seen.
    sim.carrier_up();
    sim.send(BOB);
    assert_eq!(sim.outbox_frames_since(mark)[0].1.lamport_clock, 101);
}

#[test]
fn a_redelivery_is_acknowledged_again_but_not_dispatched() {
    let mut sim = Sim::with_defaults();
    sim.inbound(from_bob("b1"), over_relay(BOB, 7));
    let mark = sim.mark();
    sim.inbound(from_bob("b1"), over_relay(BOB, 8));
    assert_eq!(shape(&sim, mark), ["ack", "release"]);
    assert_eq!(
        sent_ack(&sim, mark).unwrap().id,
        courier_proto::ack_id(BOB, "b1"),
        "the same ACK id, so the relay keeps one copy"
    );
}

#[test]
fn dedup_survives_a_restart() {
    let mut sim = Sim::with_defaults();
    sim.inbound(from_bob("b1"), over_relay(BOB, 7));
    sim.advance(DAY);
    sim.restart();
    let mark = sim.mark();
    sim.inbound(from_bob("b1"), over_relay(BOB, 7));
    assert_eq!(shape(&sim, mark), ["ack", "release"]);

    // Past the retention (28 days at the defaults) it is a new message again.
    sim.advance(28 * DAY);
    sim.restart();
    let mark = sim.mark();
    sim.inbound(from_bob("b1"), over_relay(BOB, 9));
    assert_eq!(
        shape(&sim, mark)[..2],
        ["mark_processed", "message_received"]
    );
}

#[test]
fn no_ack_unless_asked_and_no_hop_ack_without_a_seq() {
    let mut sim = Sim::with_defaults();
    let mut message = from_bob("b1");
    message.requires_ack = false;
    let mark = sim.mark();
    sim.inbound(message, over_relay(BOB, 3));
    assert_eq!(
        shape(&sim, mark),
        ["mark_processed", "message_received", "release"]
    );

    sim.local_up(BLE);
    sim.discover(BOB, BLE);
    let mark = sim.mark();
    let origin = InboundOrigin {
        carrier: Carrier::Local(BLE.into()),
        stamped_sender: BOB.into(),
        sender_account: None,
        seq: None,
        sealed_by: None,
    };
    sim.inbound(from_bob("b2"), origin);
    assert_eq!(
        shape(&sim, mark),
        ["mark_processed", "message_received", "ack"]
    );
    assert!(
        matches!(&sim.log[mark + 2].1, Out::Transmit(Transmit { carrier: Carrier::Local(name), peer: Some(peer), .. }) if name == BLE && peer == BOB),
        "the ACK goes back on that carrier, to that peer"
    );
}

#[test]
fn only_the_recipient_settles_a_message() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    let genuine = |sim: &Sim| {
        sim.log
            .iter()
            .rev()
            .find_map(|(_, o)| match o {
                Out::Transmit(Transmit {
                    kind: TransmitKind::Outbox { message, .. },
                    ..
                }) => Some(message.ack("x-ack".into(), 0, "internet")),
                _ => None,
            })
            .unwrap()
    };

    // Mallory saw the frame and answers for it on her own connection.
    let mark = sim.mark();
    sim.inbound(genuine(&sim), over_relay("mallory", 1));
    assert_eq!(shape(&sim, mark), ["diagnostic", "release"]);
    // Bob's connection carries an ACK that claims to come from somebody else.
    let mut forged = genuine(&sim);
    forged.sender = "mallory".into();
    sim.inbound(forged, over_relay(BOB, 2));
    // An ACK for an id we do not hold.
    let mut unknown = genuine(&sim);
    unknown.metadata.insert("ack_for".into(), "nope".into());
    sim.inbound(unknown, over_relay(BOB, 3));
    assert_eq!(sim.terminal(&id), None);
    assert_eq!(sim.status(&id), Some(EntryState::InFlight));

    // Bob, stamped by address with his account alongside: that is the recipient.
    sim.acked_by_recipient.insert(id.clone());
    let origin = InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn".into(),
        sender_account: Some(BOB.into()),
        seq: Some(4),
        sealed_by: None,
    };
    let mut ack = genuine(&sim);
    ack.metadata.insert("ack_hop_count".into(), "3".into());
    sim.inbound(ack, origin);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { hop_count: 3, .. }))
    ));
}

#[test]
fn a_relay_answer_in_the_message_plane_is_dropped_and_released() {
    let mut sim = Sim::with_defaults();
    let mut answer = from_bob("b1");
    answer.content = "__GROUP_INFO__{}".into();
    let mark = sim.mark();
    sim.inbound(answer, over_relay(BOB, 7));
    assert_eq!(
        shape(&sim, mark),
        ["diagnostic", "release"],
        "no ACK, no dispatch"
    );
    assert!(
        sim.processed.is_empty(),
        "not recorded: a good copy may still come"
    );
}

#[test]
fn every_priority_is_acknowledged_with_and_without_the_hook() {
    for hooked in [false, true] {
        let mut sim = connected(hooked);
        for (n, priority) in [
            Priority::Critical,
            Priority::High,
            Priority::Medium,
            Priority::Low,
        ]
        .into_iter()
        .enumerate()
        {
            let id = format!("{priority:?}");
            let mark = sim.mark();
            sim.inbound(
                Message {
                    priority,
                    ..from_bob(&id)
                },
                over_relay(BOB, n as u64 + 1),
            );
            if hooked {
                sim.poll_hook().expect("a batch");
                sim.hook_result(true);
            }
            assert_eq!(
                sent_ack(&sim, mark).and_then(Message::ack_for),
                Some(id.as_str()),
                "{priority:?} (hook: {hooked})"
            );
        }
    }
}

/// A malformed reply link, `rich` or `forwarded_from` is dropped alone, with a `Warn`; the message
/// is delivered (and, with the hook, buffered and handed over) without it, and acknowledged
/// (`docs/protocol.md#rich-messages`).
#[test]
fn a_malformed_rich_part_is_dropped_and_the_message_delivered() {
    let malformed = |id: &str| Message {
        reply_to_msg: Some("a/b".into()),
        rich: Some(serde_json::json!({"mentions": ["carol"], "extras": {"k": 1}})),
        forwarded_from: Some(serde_json::json!({"message_id": "m0"})),
        ..from_bob(id)
    };
    for hooked in [false, true] {
        let mut sim = connected(hooked);
        let mark = sim.mark();
        sim.inbound(malformed("b1"), over_relay(BOB, 1));
        let delivered = if hooked {
            sim.poll_hook().expect("a batch");
            let [handed] = &sim.hook_result(true)[..] else {
                panic!("one message in the batch")
            };
            handed.message.clone()
        } else {
            sim.log[mark..]
                .iter()
                .find_map(|(_, out)| match out {
                    Out::Event(Event::MessageReceived { message, .. }) => Some(message.clone()),
                    _ => None,
                })
                .expect("delivered")
        };
        let warnings: Vec<&str> = sim.log[mark..]
            .iter()
            .filter_map(|(_, out)| match out {
                Out::Event(Event::Diagnostic {
                    level: crate::DiagnosticLevel::Warn,
                    message,
                }) => Some(message.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(warnings.len(), 2, "hook {hooked}: {warnings:?}");
        assert!(warnings[0].contains("reply_to_msg"), "{warnings:?}");
        assert!(warnings[1].contains("forwarded_from"), "{warnings:?}");
        assert_eq!(delivered.reply_to_msg, None);
        assert_eq!(delivered.forwarded_from, None);
        assert_eq!(
            delivered.rich,
            Some(serde_json::json!({"mentions": ["carol"], "extras": {"k": 1}})),
            "the well-formed part stays"
        );
        assert_eq!(delivered.content, "hi alice");
        assert_eq!(
            sent_ack(&sim, mark).and_then(Message::ack_for),
            Some("b1"),
            "hook {hooked}"
        );
    }
}
