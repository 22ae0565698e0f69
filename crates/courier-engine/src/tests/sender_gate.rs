//! Who sent it, on the way in: over the relay or a gateway a message must claim the identity the
//! carrier authenticated, and a signature-gated control frame also needs a fresh, valid signature
//! by that identity; everything else is dropped before dedup, never ACKed end to end, its relay
//! frame still released, and reported once per (peer, code).

use std::collections::BTreeMap;

use courier_proto::{sign_control, ContentType, IdentityKey, Message, Priority};

use super::*;

const DAY: Millis = 24 * 3600 * 1000;

fn control(key: &IdentityKey, id: &str, signed_at: Option<Millis>) -> Message {
    let mut m = Message {
        id: id.to_owned(),
        sender: key.address().to_string(),
        recipient: ALICE.to_owned(),
        app_id: "chat".to_owned(),
        priority: Priority::Medium,
        ttl: 10,
        hop_count: 0,
        timestamp: 5,
        lamport_clock: 1,
        content_type: ContentType::Text,
        content: "__CONN_REQ__{}".to_owned(),
        metadata: BTreeMap::new(),
        requires_ack: true,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    };
    if let Some(at) = signed_at {
        sign_control(&mut m, key, at);
    }
    m
}

fn relayed(stamped: &str, seq: u64) -> InboundOrigin {
    InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: stamped.to_owned(),
        sender_account: None,
        seq: Some(seq),
        sealed_by: None,
    }
}

/// The outputs of one inbound call, by kind; security warnings by code.
fn outputs(sim: &Sim, mark: usize) -> Vec<String> {
    sim.log[mark..]
        .iter()
        .map(|(_, out)| match out {
            Out::Event(Event::SecurityWarning { reason_code, .. }) => {
                format!("warning {reason_code}")
            }
            Out::Event(Event::MessageReceived { .. }) => "message_received".into(),
            Out::Store(StoreOp::MarkProcessed(_)) => "mark_processed".into(),
            Out::Store(StoreOp::MarkControl(_)) => "mark_control".into(),
            Out::Event(Event::Diagnostic { .. }) => "diagnostic".into(),
            Out::Transmit(Transmit {
                kind: TransmitKind::DeliveryAck { .. },
                ..
            }) => "ack".into(),
            Out::Transmit(Transmit {
                kind: TransmitKind::ReleaseFrame { .. },
                ..
            }) => "release".into(),
            other => format!("{other:?}"),
        })
        .collect()
}

fn inbound(sim: &mut Sim, message: Message, origin: InboundOrigin) -> Vec<String> {
    let mark = sim.mark();
    sim.inbound(message, origin);
    outputs(sim, mark)
}

#[test]
fn an_unsigned_control_frame_is_dropped_and_reported_once_per_peer() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let key = IdentityKey::from_seed([1; 32]);
    let address = key.address().to_string();
    assert_eq!(
        inbound(&mut sim, control(&key, "c1", None), relayed(&address, 1)),
        ["diagnostic", "warning UNSIGNED_CONTROL_REJECTED", "release"]
    );
    assert_eq!(
        inbound(&mut sim, control(&key, "c2", None), relayed(&address, 2)),
        ["diagnostic", "release"],
        "the same (peer, code) is reported once"
    );
}

#[test]
fn a_control_frame_from_another_connection_than_its_signer_is_refused() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let key = IdentityKey::from_seed([2; 32]);
    let now = sim.now;
    assert_eq!(
        inbound(&mut sim, control(&key, "c1", Some(now)), relayed(BOB, 1)),
        [
            "diagnostic",
            "warning TRANSPORT_IDENTITY_MISMATCH",
            "release"
        ]
    );
}

#[test]
fn stale_and_future_signatures_are_refused_and_a_good_copy_still_enters() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.advance(60 * DAY);
    let key = IdentityKey::from_seed([3; 32]);
    let address = key.address().to_string();
    let now = sim.now;
    assert_eq!(
        inbound(
            &mut sim,
            control(&key, "c1", Some(now - 31 * DAY)),
            relayed(&address, 1)
        ),
        ["diagnostic", "warning CONTROL_SIGNATURE_STALE", "release"]
    );
    assert_eq!(
        inbound(
            &mut sim,
            control(&key, "c1", Some(now + 2 * DAY)),
            relayed(&address, 2)
        ),
        ["diagnostic", "release"]
    );
    // The refused copies left no dedup mark: a valid one is acknowledged and handed to the
    // runtime (never to the application).
    assert_eq!(
        inbound(
            &mut sim,
            control(&key, "c1", Some(now)),
            relayed(&address, 3)
        ),
        ["mark_control", "ack", "release"]
    );
    let handed = sim
        .engine
        .poll_control()
        .expect("the runtime gets the verified frame");
    assert_eq!(handed.id, "c1");
    // A resend of the accepted frame is only re-ACKed, and not handed over again.
    assert_eq!(
        inbound(
            &mut sim,
            control(&key, "c1", Some(now)),
            relayed(&address, 4)
        ),
        ["ack", "release"]
    );
    assert!(sim.engine.poll_control().is_none());
}

/// The count bound of inbound dedup is no bound on replays of a control frame: an observed
/// frame stays refused while its signature is fresh, however many messages came in since and
/// across a restart (`docs/delivery.md#control-frames`).
#[test]
fn a_flood_of_distinct_messages_cannot_make_room_to_replay_a_control_frame() {
    let mut config = Config::new("chat");
    config.dedup_max_entries = 3;
    let mut sim = Sim::new(config);
    sim.carrier_up();
    let key = IdentityKey::from_seed([5; 32]);
    let address = key.address().to_string();
    let signed_at = sim.now;
    let frame = control(&key, "c1", Some(signed_at));
    assert_eq!(
        inbound(&mut sim, frame.clone(), relayed(&address, 1)),
        ["mark_control", "ack", "release"]
    );
    assert!(sim.engine.poll_control().is_some());
    for i in 0..10 {
        let id = format!("flood-{i}");
        inbound(&mut sim, message_from(BOB, &id), relayed(BOB, 2 + i));
    }
    assert!(
        sim.processed.len() > 3,
        "the flood went past the count bound"
    );
    assert_eq!(
        inbound(&mut sim, frame.clone(), relayed(&address, 20)),
        ["ack", "release"],
        "the replay is only re-acknowledged"
    );
    assert!(
        sim.engine.poll_control().is_none(),
        "and not handed to the runtime again"
    );
    // Past the data retention too, still inside the signature's freshness window, and after a
    // restart.
    sim.advance(29 * DAY);
    sim.restart();
    sim.carrier_up();
    assert_eq!(
        inbound(&mut sim, frame, relayed(&address, 21)),
        ["ack", "release"]
    );
    assert!(sim.engine.poll_control().is_none());
}

#[test]
fn a_tampered_control_frame_is_refused_as_invalid() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let key = IdentityKey::from_seed([4; 32]);
    let address = key.address().to_string();
    let now = sim.now;
    let mut m = control(&key, "c1", Some(now));
    m.content = "__CONN_REQ__{\"x\":1}".into();
    assert_eq!(
        inbound(&mut sim, m, relayed(&address, 1)),
        ["diagnostic", "warning CONTROL_SIGNATURE_INVALID", "release"]
    );
}

const MALLORY: &str = "mallory";

fn relayed_for(stamped: &str, account: &str, seq: u64) -> InboundOrigin {
    InboundOrigin {
        sender_account: Some(account.to_owned()),
        ..relayed(stamped, seq)
    }
}

/// The (peer, code) of every security warning so far.
fn warnings(sim: &Sim) -> Vec<(String, &'static str)> {
    sim.log
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Event(Event::SecurityWarning {
                peer_id,
                reason_code,
                ..
            }) => Some((peer_id.clone(), *reason_code)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_relayed_message_claiming_another_sender_is_dropped_and_its_sender_reported_once() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    assert_eq!(
        inbound(
            &mut sim,
            message_from(BOB, "x1"),
            relayed_for(MALLORY, MALLORY, 1)
        ),
        [
            "diagnostic",
            "warning TRANSPORT_IDENTITY_MISMATCH",
            "release"
        ],
        "not delivered, not recorded, not acknowledged"
    );
    assert_eq!(
        inbound(
            &mut sim,
            message_from(CAROL, "x2"),
            relayed_for(MALLORY, MALLORY, 2)
        ),
        ["diagnostic", "release"]
    );
    assert_eq!(
        warnings(&sim),
        [(MALLORY.to_owned(), "TRANSPORT_IDENTITY_MISMATCH")],
        "the warning names who sent it, once"
    );
    assert!(sim.received.is_empty());
}

#[test]
fn a_forged_copy_of_a_future_id_does_not_swallow_the_real_message() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    inbound(
        &mut sim,
        message_from(BOB, "next"),
        relayed_for(MALLORY, MALLORY, 1),
    );
    assert_eq!(
        inbound(&mut sim, message_from(BOB, "next"), relayed(BOB, 2)),
        ["mark_processed", "message_received", "ack", "release"],
        "Bob's own message is new: delivered and acknowledged"
    );
    assert_eq!(
        sim.received.keys().collect::<Vec<_>>(),
        [&(BOB.to_owned(), "next".to_owned())]
    );
}

#[test]
fn a_gateway_vouches_only_for_the_device_it_attached() {
    let mut sim = Sim::with_defaults();
    sim.gateway_up();
    let via = |stamped: &str| InboundOrigin {
        carrier: Carrier::Gateway,
        stamped_sender: stamped.to_owned(),
        sender_account: None,
        seq: None,
        sealed_by: None,
    };
    assert_eq!(
        inbound(&mut sim, message_from(BOB, "g1"), via(MALLORY)),
        ["diagnostic", "warning TRANSPORT_IDENTITY_MISMATCH"]
    );
    assert_eq!(
        inbound(&mut sim, message_from(BOB, "g1"), via(BOB)),
        ["mark_processed", "message_received", "ack"]
    );
}

#[test]
fn the_senders_account_vouches_for_its_messages_too() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    // Bob's connection declared its address; a message naming his account is still his.
    assert_eq!(
        inbound(
            &mut sim,
            message_from("bob-account", "a1"),
            relayed_for(BOB, "bob-account", 1)
        ),
        ["mark_processed", "message_received", "ack", "release"]
    );
}

#[test]
fn over_an_app_carrier_the_claim_is_not_checked_against_the_peer_id() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    let carried = InboundOrigin {
        carrier: Carrier::Local(BLE.to_owned()),
        stamped_sender: CAROL.to_owned(),
        sender_account: None,
        seq: None,
        sealed_by: None,
    };
    // Carol hands over Bob's message (a carried copy for this device): delivered as Bob's.
    assert_eq!(
        inbound(&mut sim, message_from(BOB, "m1"), carried),
        ["mark_processed", "message_received", "ack"]
    );
}
