//! Messages that arrived sealed in an end-to-end session (`docs/delivery.md#sealed-messages`):
//! the session's credential is the sender whatever carried it, with sessions required only an
//! ACK sealed by the recipient settles, and a copy that did not open is reported, released and
//! never acknowledged.

use super::*;

/// Over the relay, stamped as `stamped`, opened by the runtime as sealed by `sealer`.
fn sealed(stamped: &str, sealer: &str, seq: u64) -> InboundOrigin {
    InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: stamped.to_owned(),
        sender_account: None,
        seq: Some(seq),
        sealed_by: Some(sealer.to_owned()),
    }
}

fn in_clear(stamped: &str, seq: u64) -> InboundOrigin {
    InboundOrigin {
        sealed_by: None,
        ..sealed(stamped, stamped, seq)
    }
}

fn events_since(sim: &Sim, mark: usize) -> impl Iterator<Item = &Event> + '_ {
    sim.log[mark..].iter().filter_map(|(_, out)| match out {
        Out::Event(e) => Some(e),
        _ => None,
    })
}

fn received(sim: &Sim, mark: usize) -> Vec<(String, bool)> {
    sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Event(Event::MessageReceived {
                sender, encrypted, ..
            }) => Some((sender.clone(), *encrypted)),
            _ => None,
        })
        .collect()
}

fn count(sim: &Sim, mark: usize, what: impl Fn(&Out) -> bool) -> usize {
    sim.log[mark..].iter().filter(|(_, out)| what(out)).count()
}

fn is_ack(out: &Out) -> bool {
    matches!(
        out,
        Out::Transmit(Transmit {
            kind: TransmitKind::DeliveryAck { .. },
            ..
        })
    )
}

fn is_release(out: &Out) -> bool {
    matches!(
        out,
        Out::Transmit(Transmit {
            kind: TransmitKind::ReleaseFrame { .. },
            ..
        })
    )
}

#[test]
fn a_sealed_message_is_its_sessions_whatever_connection_carried_it() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let mark = sim.mark();
    sim.inbound(message_from(BOB, "m1"), sealed(CAROL, BOB, 1));
    assert_eq!(received(&sim, mark), [(BOB.to_owned(), true)]);
    assert_eq!(count(&sim, mark, is_ack), 1);
    assert!(sim.engine.knows_inbound(BOB, "m1", sim.now));

    let mark = sim.mark();
    sim.inbound(message_from(BOB, "m2"), in_clear(BOB, 2));
    assert_eq!(
        received(&sim, mark),
        [(BOB.to_owned(), false)],
        "a plaintext message is delivered, marked as such"
    );
}

#[test]
fn a_sealed_message_claiming_another_sender_is_dropped_and_reported() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let mark = sim.mark();
    // Bob's session, carried by Bob's own connection, claiming to be Carol's message.
    sim.inbound(message_from(CAROL, "m1"), sealed(BOB, BOB, 1));
    assert!(received(&sim, mark).is_empty());
    assert_eq!(count(&sim, mark, is_ack), 0, "never acknowledged");
    assert_eq!(
        count(&sim, mark, is_release),
        1,
        "its relay frame is released"
    );
    let warnings: Vec<_> = events_since(&sim, mark)
        .filter_map(|e| match e {
            Event::SecurityWarning {
                peer_id,
                reason_code,
                ..
            } => Some((peer_id.clone(), *reason_code)),
            _ => None,
        })
        .collect();
    assert_eq!(
        warnings,
        [(
            BOB.to_owned(),
            courier_proto::security::SENDER_ADDRESS_MISMATCH
        )]
    );
    assert!(
        !sim.engine.knows_inbound(CAROL, "m1", sim.now),
        "Carol's id is not spent: her real message still enters"
    );
}

#[test]
fn with_sessions_required_only_an_ack_sealed_by_the_recipient_settles() {
    let mut config = Config::new("chat");
    config.encryption = true;
    let mut sim = Sim::new(config);
    sim.net = Net::silent_peer();
    sim.carrier_up();
    sim.input(Input::SessionReady {
        recipient: BOB.to_owned(),
    });
    let id = sim.send(BOB);
    let ack = |sim: &Sim| sim.frames[&id].ack(format!("ack-{id}"), sim.now, "internet");

    // The relay (or anyone on the path) forges the recipient's ACK in the clear.
    let forged = ack(&sim);
    sim.inbound(forged, in_clear(BOB, 1));
    assert!(sim.terminal(&id).is_none(), "a clear ACK settles nothing");
    // Another session's ACK, claiming the recipient.
    let other = ack(&sim);
    sim.inbound(other, sealed(BOB, CAROL, 2));
    assert!(
        sim.terminal(&id).is_none(),
        "an ACK sealed by Carol settles nothing"
    );

    sim.acked_by_recipient.insert(id.clone());
    let real = ack(&sim);
    sim.inbound(real, sealed(CAROL, BOB, 3));
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn a_copy_that_does_not_open_is_reported_released_and_never_acknowledged() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    for seq in [1, 2] {
        let mark = sim.mark();
        sim.input(Input::Undecryptable {
            message_id: "m1".into(),
            sender: BOB.into(),
            origin: in_clear(BOB, seq),
            code: "UNKNOWN_SESSION",
            reason: "no session".into(),
        });
        let failed: Vec<_> = events_since(&sim, mark)
            .filter(|e| matches!(e, Event::MessageDecryptionFailed { message_id, .. } if message_id == "m1"))
            .collect();
        assert_eq!(failed.len(), 1, "reported on every attempt");
        assert_eq!(count(&sim, mark, is_ack), 0);
        assert_eq!(count(&sim, mark, is_release), 1);
    }
    assert!(!sim.engine.knows_inbound(BOB, "m1", sim.now));
    let mark = sim.mark();
    sim.inbound(message_from(BOB, "m1"), sealed(BOB, BOB, 3));
    assert_eq!(
        received(&sim, mark),
        [(BOB.to_owned(), true)],
        "the re-sealed copy enters"
    );
}

#[test]
fn a_buffered_message_is_known_before_the_hook_commits_it() {
    let mut config = Config::new("chat");
    config.durability_hook = Some(crate::config::HookConfig::default());
    let mut sim = Sim::new(config);
    sim.carrier_up();
    sim.inbound(message_from(BOB, "m1"), sealed(BOB, BOB, 1));
    assert!(sim.engine.knows_inbound(BOB, "m1", sim.now));
    let mark = sim.mark();
    assert_eq!(sim.hook_commits_all(), 1);
    assert!(sim.engine.knows_inbound(BOB, "m1", sim.now));
    assert_eq!(
        received(&sim, mark),
        [(BOB.to_owned(), true)],
        "the hook path keeps the mark"
    );
}

#[test]
fn a_discarded_frame_is_released_and_nothing_else() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let mark = sim.mark();
    sim.input(Input::Discard {
        origin: in_clear(BOB, 1),
        reason: "a repeat".into(),
    });
    assert_eq!(count(&sim, mark, is_release), 1);
    assert_eq!(count(&sim, mark, is_ack), 0);
    assert!(events_since(&sim, mark).all(|e| matches!(e, Event::Diagnostic { .. })));
}
