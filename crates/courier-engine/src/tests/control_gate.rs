//! Signature-gated control frames on the way in: only a fresh, valid signature by the identity
//! the carrier vouches for gets through; everything else is dropped, never ACKed end to end,
//! the relay hop still released, and reported once per (peer, code).

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
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
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
            Out::Event(Event::Diagnostic { .. }) => "diagnostic".into(),
            Out::Transmit(Transmit {
                kind: TransmitKind::DeliveryAck { .. },
                ..
            }) => "ack".into(),
            Out::Transmit(Transmit {
                kind: TransmitKind::ReleaseFrame { .. },
                ..
            }) => "hop_ack".into(),
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
        ["diagnostic", "warning UNSIGNED_CONTROL_REJECTED", "hop_ack"]
    );
    assert_eq!(
        inbound(&mut sim, control(&key, "c2", None), relayed(&address, 2)),
        ["diagnostic", "hop_ack"],
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
            "hop_ack"
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
        ["diagnostic", "warning CONTROL_SIGNATURE_STALE", "hop_ack"]
    );
    assert_eq!(
        inbound(
            &mut sim,
            control(&key, "c1", Some(now + 2 * DAY)),
            relayed(&address, 2)
        ),
        ["diagnostic", "hop_ack"]
    );
    // The refused copies left no dedup mark: a valid one is acknowledged (and never handed to
    // the application — no control verb is consumed yet).
    assert_eq!(
        inbound(
            &mut sim,
            control(&key, "c1", Some(now)),
            relayed(&address, 3)
        ),
        ["mark_processed", "diagnostic", "ack", "hop_ack"]
    );
    // A resend of the accepted frame is only re-ACKed.
    assert_eq!(
        inbound(
            &mut sim,
            control(&key, "c1", Some(now)),
            relayed(&address, 4)
        ),
        ["ack", "hop_ack"]
    );
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
        ["diagnostic", "warning CONTROL_SIGNATURE_INVALID", "hop_ack"]
    );
}
