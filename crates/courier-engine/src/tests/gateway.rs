//! The gateway carrier: an addressed carrier like the relay (reconnect flush, live and
//! unreachable answers, ACKs back the way they came), second to the relay when both are up, and
//! the way a parked message is offered to a mesh the relay cannot reach.

use super::*;

fn delivered_over(sim: &Sim, id: &str) -> Option<String> {
    match sim.terminal(id) {
        Some((_, Event::MessageDelivered { transport, .. })) => Some(transport),
        _ => None,
    }
}

#[test]
fn a_gateway_alone_carries_the_attempt_and_the_ack_comes_back_over_it() {
    let mut sim = Sim::with_defaults();
    sim.gateway_up();
    let mark = sim.mark();
    let id = sim.send(BOB);
    assert_eq!(sim.frames_of(mark, &id), [(Carrier::Gateway, None)]);
    sim.advance(SEC);
    assert_eq!(sim.sent_over(&id), ["gateway"]);
    assert_eq!(delivered_over(&sim, &id).as_deref(), Some("gateway"));
    assert_eq!(sim.engine.stats().carriers_up, 1);
}

#[test]
fn the_relay_carries_the_attempts_when_both_are_up() {
    let mut sim = Sim::with_defaults();
    sim.gateway_up();
    sim.carrier_up();
    let mark = sim.mark();
    let id = sim.send(BOB);
    assert_eq!(
        sim.frames_of(mark, &id),
        [(Carrier::Relay, None)],
        "a message that is not parked is not offered over the gateway"
    );
    sim.advance(SEC);
    assert_eq!(delivered_over(&sim, &id).as_deref(), Some("internet"));
    assert!(sim.gateway_offers.is_empty());
    assert_eq!(sim.engine.stats().carriers_up, 2);
}

#[test]
fn a_gateway_coming_up_is_a_reconnect_flush() {
    let mut sim = Sim::with_defaults();
    let id = sim.send(BOB);
    assert!(matches!(
        sim.events_of(&id).last(),
        Some((
            _,
            Event::MessageDeferred {
                next_retry_at: None,
                ..
            }
        ))
    ));
    sim.advance(MIN);
    assert!(sim.sends(&id).is_empty(), "nothing to carry it");
    assert_eq!(sim.gateway_up(), 1, "the queued message goes at once");
    sim.advance(SEC);
    assert_eq!(delivered_over(&sim, &id).as_deref(), Some("gateway"));
}

#[test]
fn the_gateway_takes_over_when_the_relay_drops() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.gateway_up();
    sim.net.write = false;
    let id = sim.send(BOB);
    assert_eq!(sim.unwritten.len(), 1, "handed to the relay, not written");
    sim.carrier_down();
    assert!(
        matches!(
            sim.events_of(&id).last(),
            Some((
                _,
                Event::MessageDeferred {
                    next_retry_at: Some(_),
                    ..
                }
            ))
        ),
        "a route is left, so the retry has a time"
    );
    let mark = sim.mark();
    sim.advance(2 * SEC);
    assert_eq!(sim.frames_of(mark, &id), [(Carrier::Gateway, None)]);
    assert_eq!(delivered_over(&sim, &id).as_deref(), Some("gateway"));
}

#[test]
fn a_gateway_verdict_parks_and_probes_over_the_gateway() {
    let mut sim = Sim::with_defaults();
    sim.gateway = Net::relay(UNREACHABLE);
    sim.gateway_up();
    let id = sim.send(BOB);
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    assert!(sim.events_of(&id).any(|(_, e)| matches!(
        e,
        Event::MessageUndeliverable { reason, .. } if reason == "recipient unreachable"
    )));
    assert!(
        sim.gateway_offers.is_empty(),
        "the gateway is the route here"
    );
    // Bob attaches to the gateway: the next probe reaches him.
    sim.gateway = Net::honest();
    sim.advance(10 * MIN);
    assert_eq!(delivered_over(&sim, &id).as_deref(), Some("gateway"));
    assert!(sim.sends(&id).len() >= 2, "the probe went over the gateway");
}

#[test]
fn a_message_the_relay_parks_is_offered_over_the_gateway_and_settled_from_there() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    sim.gateway_up();
    let mark = sim.mark();
    let id = sim.send(BOB);
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    assert_eq!(
        sim.frames_of(mark, &id),
        [(Carrier::Relay, None), (Carrier::Gateway, None)],
        "the attempt over the relay, then the offer over the gateway"
    );
    assert_eq!(sim.gateway_offers.len(), 1);
    sim.advance(SEC);
    assert_eq!(sim.sent_over(&id), ["internet"], "an offer is no attempt");
    assert_eq!(delivered_over(&sim, &id).as_deref(), Some("gateway"));
}

#[test]
fn every_probe_of_a_relay_parked_message_is_offered_over_the_gateway() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(UNREACHABLE);
    sim.gateway = Net::relay(UNREACHABLE);
    sim.carrier_up();
    sim.gateway_up();
    let id = sim.send(BOB);
    sim.advance(10 * MIN);
    let probes = sim.sends(&id).len();
    assert!(probes >= 3, "{probes} attempts");
    // One offer on the park that follows each attempt, one with each probe.
    assert_eq!(sim.gateway_offers.len(), 2 * probes - 1);
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    // Without the relay the gateway carries the probes and nothing is offered.
    let offers = sim.gateway_offers.len();
    sim.carrier_down();
    sim.advance(30 * MIN);
    assert_eq!(sim.gateway_offers.len(), offers);
    assert!(sim.sends(&id).len() > probes);
}

#[test]
fn an_inbound_message_over_the_gateway_is_acknowledged_over_it() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.gateway_up();
    let mark = sim.mark();
    let origin = InboundOrigin {
        carrier: Carrier::Gateway,
        stamped_sender: BOB.to_owned(),
        sender_account: None,
        seq: None,
        sealed_by: None,
    };
    sim.inbound(message_from(BOB, "b1"), origin);
    let transmits: Vec<&Transmit> = sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Transmit(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(transmits.len(), 1, "an end-to-end ACK and no hop release");
    assert_eq!(transmits[0].carrier, Carrier::Gateway);
    assert_eq!(transmits[0].peer, None);
    assert!(
        matches!(&transmits[0].kind, TransmitKind::DeliveryAck { message } if message.ack_for() == Some("b1"))
    );
    assert!(sim.events().any(|(_, e)| matches!(
        e,
        Event::MessageReceived { transport, .. } if transport == "gateway"
    )));
}

#[test]
fn the_gateway_is_no_local_carrier() {
    let mut sim = Sim::with_defaults();
    sim.gateway_up();
    sim.input(Input::NeighborDiscovered {
        peer: BOB.to_owned(),
        carrier: Carrier::Gateway.name().to_owned(),
    });
    assert!(!sim.engine.is_neighbor(BOB));
    assert!(sim.events().any(|(_, e)| matches!(
        e,
        Event::Diagnostic { message, .. } if message.contains("not a registered app carrier")
    )));
}

#[test]
fn a_frame_handed_to_a_gateway_that_drops_is_retried_over_the_relay() {
    let mut sim = Sim::with_defaults();
    sim.gateway_up();
    sim.gateway.write = false;
    let id = sim.send(BOB);
    assert_eq!(sim.unwritten.len(), 1);
    sim.carrier_up();
    sim.gateway_down();
    assert_eq!(sim.status(&id), Some(EntryState::Queued));
    let mark = sim.mark();
    sim.advance(2 * SEC);
    assert_eq!(sim.frames_of(mark, &id), [(Carrier::Relay, None)]);
    assert_eq!(delivered_over(&sim, &id).as_deref(), Some("internet"));
}

#[test]
fn a_report_about_a_carry_only_copy_is_not_about_the_attempt() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    sim.gateway_up();
    let id = sim.send(BOB);
    sim.advance(15 * SEC); // the probe goes over the relay, a copy over the gateway
    let (_, _, copy_seq) = sim
        .gateway_offers
        .iter()
        .rev()
        .find(|(_, m, _)| *m == id)
        .cloned()
        .expect("a copy over the gateway");
    assert_ne!(
        sim.send_seqs.get(&id),
        Some(&copy_seq),
        "the copy has its own send_seq"
    );
    let mark = sim.mark();
    sim.input(Input::SendFailed {
        id: courier_proto::wire_id(&id),
        send_seq: copy_seq,
        reason: "gateway gone".into(),
    });
    assert!(
        sim.log[mark..]
            .iter()
            .all(|(_, out)| !matches!(out, Out::Event(_))),
        "the attempt is untouched"
    );
}
