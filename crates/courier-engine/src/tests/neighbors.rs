//! App carriers: carrier choice, the flush when a neighbor appears
//! (`docs/delivery.md#flush-batches`), links lost mid-send.

use super::*;

#[test]
fn carrier_choice_prefers_a_direct_link_to_the_recipient() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.local_up(BLE);
    sim.discover(BOB, BLE);
    let mark = sim.mark();
    let to_bob = sim.send(BOB);
    let to_carol = sim.send(CAROL);
    assert_eq!(
        sim.frames_of(mark, &to_bob),
        [(Carrier::Local(BLE.into()), Some(BOB.to_owned()))]
    );
    assert_eq!(
        sim.frames_of(mark, &to_carol),
        [(Carrier::Relay, None)],
        "a local carrier reaches only its neighbors"
    );
    sim.advance(SEC);
    assert!(matches!(
        sim.terminal(&to_bob),
        Some((_, Event::MessageDelivered { ref transport, .. })) if transport == BLE
    ));
    assert!(matches!(
        sim.terminal(&to_carol),
        Some((_, Event::MessageDelivered { ref transport, .. })) if transport == "internet"
    ));
}

#[test]
fn without_relay_or_link_the_send_is_deferred_until_a_neighbor_appears() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
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
    assert_eq!(
        sim.engine.next_deadline(),
        Some(7 * DAY),
        "nothing to wake for"
    );
    sim.advance(MIN);
    assert_eq!(sim.discover(BOB, BLE), 1, "the peer discovery flush");
    sim.advance(SEC);
    assert_eq!(sim.sent_over(&id), [BLE]);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn the_discovery_flush_sends_a_batch_and_leaves_the_rest_due() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    let ids: Vec<String> = (0..45).map(|_| sim.send(BOB)).collect();
    let other = sim.send(CAROL);
    assert_eq!(sim.engine.stats().parked, 46);
    sim.carrier_down();
    sim.local_up(BLE);
    sim.advance(MIN);

    assert_eq!(sim.discover(BOB, BLE), 20, "batch limit");
    assert_eq!(sim.engine.park_counter(BOB), 0, "an edge for bob");
    assert!(
        sim.engine.next_deadline().is_some_and(|d| d <= sim.now),
        "the rest is due at once over the link, though the relay is down"
    );
    assert_eq!(sim.timeout(), 20);
    assert_eq!(sim.timeout(), 5);
    assert_eq!(
        sim.timeout(),
        0,
        "carol is not reachable: her message waits"
    );
    sim.advance(SEC);
    for id in &ids {
        assert_eq!(sim.sent_over(id).last().map(String::as_str), Some(BLE));
        assert!(matches!(
            sim.terminal(id),
            Some((_, Event::MessageDelivered { .. }))
        ));
    }
    assert_eq!(sim.status(&other), Some(EntryState::Parked));
}

#[test]
fn the_discovery_flush_pulls_retries_forward_keeping_their_counts() {
    let mut config = Config::new("chat");
    // The link's failure is reported by the test, not by the send deadline.
    config.app_send_timeout_ms = HOUR;
    let mut sim = Sim::new(config);
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(25 * SEC); // ACK timeouts at 10 s and 21 s: retry 1 is due at 23 s... then in flight
    sim.advance(10 * SEC); // timeout at 33 s: retry 2 due at 37 s
    assert_eq!(sim.status(&id), Some(EntryState::Queued));
    let attempts = sim.rows[&id].ack_attempts;
    assert_eq!(attempts, 3);
    sim.local_up(BLE);
    sim.local.ack_after = None;
    assert_eq!(sim.discover(BOB, BLE), 1, "sent now, not at its retry time");
    assert!(matches!(
        sim.events_of(&id).last(),
        Some((_, Event::MessageSent { attempt, transport, .. })) if *attempt == attempts + 1 && transport == BLE
    ));
    // A failed send on the link is re-enqueued with its attempt count.
    sim.local.write = false;
    sim.advance(MIN);
    let index = sim
        .unwritten
        .iter()
        .position(|(i, _, _)| *i == id)
        .expect("handed to the link");
    sim.fail_unwritten(index, "ble write failed");
    assert!(matches!(
        sim.events_of(&id).last(),
        Some((_, Event::MessageDeferred { reason, .. })) if reason == "ble write failed"
    ));
    assert!(sim.rows[&id].ack_attempts > attempts);
    assert_eq!(sim.failures(), 0);
}

#[test]
fn a_neighbor_lost_mid_send_goes_over_the_relay() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.local_up(BLE);
    sim.discover(BOB, BLE);
    sim.local.write = false;
    let id = sim.send(BOB);
    assert_eq!(sim.unwritten.len(), 1, "handed to the link, not written");
    sim.lose(BOB, BLE);
    assert!(matches!(
        sim.events_of(&id).last(),
        Some((_, Event::MessageDeferred { reason, retry_count: 0, next_retry_at: Some(at), .. }))
            if reason == "neighbor lost" && *at == SEC
    ));
    sim.advance(2 * SEC);
    assert_eq!(sim.sent_over(&id), ["internet"]);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { ref transport, .. })) if transport == "internet"
    ));
}

#[test]
fn losing_one_neighbor_fails_only_the_sends_handed_to_it() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.discover(BOB, BLE);
    sim.discover(CAROL, BLE);
    sim.local.write = false;
    let to_bob = sim.send(BOB);
    let to_carol = sim.send(CAROL);
    sim.lose(BOB, BLE);
    assert_eq!(sim.status(&to_bob), Some(EntryState::Queued));
    assert_eq!(
        sim.status(&to_carol),
        Some(EntryState::InFlight),
        "Carol's link holds: her send is still on it"
    );
}

#[test]
fn unregistering_a_carrier_loses_its_links() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.discover(BOB, BLE);
    sim.local.write = false;
    let id = sim.send(BOB);
    sim.local_down(BLE);
    assert_eq!(sim.status(&id), Some(EntryState::Queued));
    assert_eq!(
        sim.engine.next_deadline(),
        Some(7 * DAY),
        "no route left: it waits for an edge"
    );
    sim.carrier_up();
    sim.advance(SEC);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { ref transport, .. })) if transport == "internet"
    ));
}

#[test]
fn a_neighbor_on_an_unregistered_carrier_is_ignored() {
    let mut sim = Sim::with_defaults();
    sim.links.insert("wifi".into(), BTreeSet::new());
    sim.engine.handle(
        Input::NeighborDiscovered {
            peer: BOB.to_owned(),
            carrier: "wifi".to_owned(),
        },
        0,
    );
    sim.links.clear();
    let id = sim.send(BOB);
    assert!(sim.outbox_frames_since(0).is_empty());
    assert_eq!(sim.status(&id), Some(EntryState::Queued));
}

#[test]
fn a_write_on_a_direct_link_takes_a_parked_message_onto_the_ladder() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.local_up(BLE);
    sim.local.ack_after = None; // bob's device is there but never answers
    sim.discover(BOB, BLE);
    assert_eq!(sim.status(&id), Some(EntryState::InFlight));
    sim.advance(HOUR);
    // The edge cleared the verdict: bob is reachable, so the ladder decides.
    assert!(matches!(
        sim.terminal(&id),
        Some((
            _,
            Event::MessageFailed {
                reason: crate::FailReason::MaxRetriesExceeded,
                ..
            }
        ))
    ));
    assert!(sim.sent_over(&id)[1..].iter().all(|t| t == BLE));
}

#[test]
fn a_copy_carried_for_another_recipient_is_neither_delivered_nor_acknowledged() {
    for hook in [false, true] {
        let mut config = Config::new("chat");
        if hook {
            config.durability_hook = Some(crate::HookConfig::default());
        }
        let mut sim = Sim::new(config);
        sim.local_up(BLE);
        sim.discover(BOB, BLE);
        let over_ble = InboundOrigin {
            carrier: Carrier::Local(BLE.into()),
            stamped_sender: BOB.into(),
            sender_account: None,
            seq: None,
            sealed_by: None,
        };
        // Named by address, a copy for someone else is recognised at once; named by account,
        // once a relay has said which account is ours.
        let mut carried = message_from(BOB, "for-k1");
        carried.recipient = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn".to_owned();
        let mark = sim.mark();
        sim.inbound(carried, over_ble.clone());
        sim.engine
            .handle(Input::AccountName(ALICE.to_owned()), sim.now);
        let mut carried = message_from(BOB, "for-carol");
        carried.recipient = CAROL.to_owned();
        sim.inbound(carried, over_ble.clone());
        let delivered_or_acked = sim.log[mark..].iter().any(|(_, out)| {
            matches!(
                out,
                Out::Event(Event::MessageReceived { .. })
                    | Out::Store(StoreOp::MarkProcessed(_) | StoreOp::BufferInbound(_))
                    | Out::Transmit(Transmit {
                        kind: TransmitKind::DeliveryAck { .. },
                        ..
                    })
            )
        });
        assert!(
            !delivered_or_acked,
            "a copy bob only carries for someone else reached alice's application (hook: {hook})"
        );
        assert_eq!(sim.poll_hook(), None);

        let mark = sim.mark();
        sim.inbound(message_from(BOB, "for-alice"), over_ble);
        if hook {
            sim.hook_commits_all();
        }
        let acked = sim.log[mark..].iter().any(|(_, out)| {
            matches!(
                out,
                Out::Transmit(Transmit {
                    kind: TransmitKind::DeliveryAck { .. },
                    ..
                })
            )
        });
        assert!(
            acked,
            "bob's own message to alice is still delivered and ACKed"
        );
    }
}

#[test]
fn a_message_named_to_an_account_is_ours_until_a_relay_names_our_account() {
    let over_ble = InboundOrigin {
        carrier: Carrier::Local(BLE.into()),
        stamped_sender: BOB.into(),
        sender_account: None,
        seq: None,
        sealed_by: None,
    };
    let received = |sim: &Sim, mark: usize| {
        sim.log[mark..]
            .iter()
            .any(|(_, out)| matches!(out, Out::Event(Event::MessageReceived { .. })))
    };
    let mut sim = Sim::new(Config::new("chat"));
    sim.local_up(BLE);
    sim.discover(BOB, BLE);
    // An app names its local peers as it likes: before any relay session, "alice-phone" may be us.
    let mut named = message_from(BOB, "m1");
    named.recipient = "alice-phone".to_owned();
    let mark = sim.mark();
    sim.inbound(named.clone(), over_ble.clone());
    assert!(received(&sim, mark));

    sim.engine
        .handle(Input::AccountName("alice-phone".to_owned()), sim.now);
    named.id = "m2".into();
    let mark = sim.mark();
    sim.inbound(named, over_ble);
    assert!(received(&sim, mark), "our own account name");
}

#[test]
fn an_app_carrier_send_that_never_reports_fails_at_its_deadline_and_goes_again() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.local.write = false;
    sim.discover(BOB, BLE);
    let id = sim.send(BOB);
    assert_eq!(sim.unwritten.len(), 1, "handed to the app carrier");
    assert_eq!(sim.engine.next_deadline(), Some(sim.now + 15 * SEC));
    sim.advance(15 * SEC - 1);
    assert_eq!(sim.status(&id), Some(EntryState::InFlight));
    sim.advance(1);
    assert!(sim.events_of(&id).any(|(_, e)| matches!(
        e,
        Event::MessageDeferred { reason, .. } if reason == "app carrier send timed out"
    )));
    // A late report of the dead attempt is stale; the retry is a new attempt.
    let stale = sim.unwritten.remove(0);
    sim.input(Input::Written {
        id: courier_proto::wire_id(&stale.0),
        send_seq: stale.1,
    });
    assert_ne!(sim.status(&id), Some(EntryState::InFlight));
    sim.local.write = true;
    sim.advance(2 * SEC);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn relay_sends_have_no_engine_deadline() {
    let mut sim = Sim::with_defaults();
    sim.net.write = false;
    sim.carrier_up();
    let id = sim.send(BOB);
    assert_eq!(sim.unwritten.len(), 1);
    assert_eq!(
        sim.engine.next_deadline(),
        None,
        "the relay carrier bounds its own writes and answers"
    );
    sim.advance(HOUR);
    assert_eq!(sim.status(&id), Some(EntryState::InFlight));
}
