//! The Lamport clock against peers that claim absurd clocks.

use std::collections::BTreeMap;

use courier_proto::{ContentType, Message, Priority};

use super::*;
use crate::engine::{MAX_LAMPORT, MAX_LAMPORT_JUMP};

fn from_bob(id: &str, lamport_clock: u64) -> Message {
    Message {
        id: id.to_owned(),
        sender: BOB.to_owned(),
        recipient: ALICE.to_owned(),
        app_id: "chat".to_owned(),
        priority: Priority::Medium,
        ttl: 10,
        hop_count: 1,
        timestamp: 5,
        lamport_clock,
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

fn origin(seq: u64) -> InboundOrigin {
    InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: BOB.to_owned(),
        sender_account: None,
        seq: Some(seq),
        sealed_by: None,
    }
}

/// The clock our next send carries.
fn next_clock(sim: &mut Sim) -> u64 {
    let mark = sim.mark();
    sim.send(BOB);
    sim.outbox_frames_since(mark)[0].1.lamport_clock
}

#[test]
fn a_peer_claiming_the_maximum_clock_cannot_pin_ours() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.inbound(from_bob("b1", u64::MAX), origin(1));
    let first = next_clock(&mut sim);
    assert_eq!(
        first,
        MAX_LAMPORT_JUMP + 1,
        "one message moves it by a bounded step"
    );

    // Repeating the claim moves it step by step, never to the ceiling at once: our clock keeps
    // counting, so our own sends stay ordered.
    sim.inbound(from_bob("b2", u64::MAX), origin(2));
    let second = next_clock(&mut sim);
    assert_eq!(second, first + MAX_LAMPORT_JUMP + 1);
    assert!(second < MAX_LAMPORT);
}

#[test]
fn an_ordinary_clock_ahead_of_ours_is_followed_exactly() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.inbound(from_bob("b1", 1_000_000), origin(1));
    assert_eq!(next_clock(&mut sim), 1_000_001);
}
