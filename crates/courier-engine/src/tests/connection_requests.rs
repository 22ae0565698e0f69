//! Connection requests in the outbox (`docs/delivery.md#connection-requests`): a signed request
//! needs no session to leave, is never parked — the relay's unreachable verdict settles it at
//! once — settles by its recipient's signed ACK when no session could seal one, and is failed
//! rather than sent once its signature is too old for any receiver.

use courier_proto::{
    ack_id, sign_control, ConnectionFrame, ContentType, IdentityKey, Priority, UnreachableCause,
};

use super::*;
use crate::FailReason;

const DAY: Millis = 24 * 3600 * 1000;

fn encrypted() -> Sim {
    let mut config = Config::new("chat");
    config.encryption = true;
    let mut sim = Sim::new(config);
    sim.net = Net::silent_peer();
    sim.carrier_up();
    sim
}

/// A connection request to `recipient`, signed at `signed_at` as the runtime submits it.
fn send_request(sim: &mut Sim, recipient: &str, signed_at: Millis) -> String {
    let id = sim.mint();
    let content = ConnectionFrame::Request {
        note: Some("hi".into()),
        key_package: None,
    }
    .content();
    let mut frame = message_from(ALICE, &id);
    frame.recipient = recipient.to_owned();
    frame.content = content.clone();
    sign_control(&mut frame, &IdentityKey::from_seed([7; 32]), signed_at);
    sim.submit(SendRequest {
        content,
        metadata: frame.metadata,
        ..request(recipient, Priority::High, ContentType::Text, &id)
    });
    id
}

/// `id`'s ACK as its recipient `key` sends it when it has no session: in the clear, signed.
fn signed_ack(sim: &Sim, id: &str, key: &IdentityKey) -> Message {
    let frame = &sim.frames[id];
    let mut ack = frame.ack(ack_id(&frame.sender, &frame.id), sim.now, "internet");
    sign_control(&mut ack, key, sim.now);
    ack
}

fn relayed(stamped: &str) -> InboundOrigin {
    InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: stamped.to_owned(),
        sender_account: None,
        seq: None,
        sealed_by: None,
    }
}

#[test]
fn a_request_leaves_without_a_session_and_an_unreachable_verdict_settles_it_at_once() {
    let mut sim = encrypted();
    let bob = IdentityKey::from_seed([2; 32]).address().to_string();
    let id = send_request(&mut sim, &bob, 0);
    assert_eq!(sim.sends(&id), [0], "no pre-session wait for a request");
    assert_eq!(sim.engine.stats().pre_session, 0);
    assert!(sim.sessions_wanted.is_empty());

    sim.answer(
        &id,
        CarrierAnswer::Unreachable(UnreachableCause::OfflineNoMailbox),
    );
    assert!(matches!(
        sim.terminal(&id),
        Some((
            _,
            Event::MessageFailed {
                reason: FailReason::ConnectionRequestUndeliverable,
                ..
            }
        ))
    ));
    assert!(
        sim.events()
            .all(|(_, e)| !matches!(e, Event::MessageUndeliverable { .. })),
        "never parked, so never reported undeliverable-and-kept"
    );
    assert!(sim.engine.presence_watchlist().is_empty());
    assert_eq!(sim.terminal_count(&id), 1);
}

#[test]
fn a_clear_ack_settles_a_request_only_when_its_recipient_signed_it_for_that_request() {
    let mut sim = encrypted();
    let bob_key = IdentityKey::from_seed([2; 32]);
    let bob = bob_key.address().to_string();
    let id = send_request(&mut sim, &bob, 0);
    let other = send_request(&mut sim, &bob, 0);

    let mut unsigned = signed_ack(&sim, &id, &bob_key);
    unsigned.metadata.retain(|k, _| !k.starts_with("__ctrl"));
    sim.inbound(unsigned, relayed(&bob));
    let mallory = signed_ack(&sim, &id, &IdentityKey::from_seed([9; 32]));
    sim.inbound(mallory, relayed(&bob));
    // Bob's signed ACK of the other request, moved onto this one.
    let mut moved = signed_ack(&sim, &other, &bob_key);
    moved
        .metadata
        .insert("ack_for".into(), sim.frames[&id].id.clone());
    sim.inbound(moved, relayed(&bob));
    assert!(sim.terminal(&id).is_none(), "none of those settles");

    sim.acked_by_recipient.insert(id.clone());
    let genuine = signed_ack(&sim, &id, &bob_key);
    sim.inbound(genuine, relayed(&bob));
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
    assert!(sim.terminal(&other).is_none());
}

#[test]
fn a_control_frame_whose_signature_aged_out_fails_instead_of_going() {
    // An outbox lifetime past the signature window (the configuration warns about it).
    let mut config = Config::new("chat");
    config.encryption = true;
    config.outbox_max_lifetime_ms = 40 * DAY;
    let mut sim = Sim::new(config);
    let bob = IdentityKey::from_seed([2; 32]).address().to_string();
    let stale = send_request(&mut sim, &bob, 0);
    sim.advance(DAY);
    let fresh = send_request(&mut sim, &bob, DAY);
    // No carrier for 30 days: the first request's signature is now too old for any receiver.
    sim.advance(29 * DAY);
    sim.carrier_up();
    assert!(sim.sends(&stale).is_empty(), "never sent stale");
    assert!(matches!(
        sim.terminal(&stale),
        Some((
            _,
            Event::MessageFailed {
                reason: FailReason::ControlSignatureExpired,
                ..
            }
        ))
    ));
    assert_eq!(sim.sends(&fresh).len(), 1, "a day younger, it goes");
}
