//! The ordinary life of a message: sent, deferred, flushed, evicted, waiting for a slot.

use courier_proto::{ContentType, Priority};

use super::*;
use crate::{FailReason, Stats};

#[test]
fn immediate_delivery() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let id = sim.send(BOB);

    // The Put (committed before the promise resolves) comes before the frame goes out.
    let put = sim
        .log
        .iter()
        .position(|(_, o)| matches!(o, Out::Store(StoreOp::Put(r)) if r.message.id == id));
    let frame = sim
        .log
        .iter()
        .position(|(_, o)| matches!(o, Out::Transmit(_)));
    assert!(put.unwrap() < frame.unwrap());
    let (_, message) = sim.outbox_frames_since(0)[0];
    assert_eq!(
        (message.sender.as_str(), message.recipient.as_str()),
        (ALICE, BOB)
    );
    assert_eq!(
        (
            message.app_id.as_str(),
            message.requires_ack,
            message.hop_count
        ),
        ("chat", true, 0)
    );

    assert_eq!(sim.sends(&id), [0]);
    assert!(matches!(
        sim.events_of(&id).next(),
        Some((0, Event::MessageSent { attempt: 1, transport, priority: Priority::Medium, .. })) if transport == "internet"
    ));
    assert_eq!(sim.status(&id), Some(EntryState::InFlight));

    sim.advance(100);
    let (at, delivered) = sim.terminal(&id).expect("delivered");
    assert_eq!(at, 100);
    assert!(
        matches!(delivered, Event::MessageDelivered { latency_ms: 100, hop_count: 0, ref transport, .. } if transport == "internet")
    );
    assert!(sim.log.iter().any(|(_, o)| matches!(o,
        Out::Store(StoreOp::Settle { id: settled, settlement: Settlement::Delivered, .. }) if *settled == id)));
    assert_eq!(sim.status(&id), None);
    assert!(sim.rows.is_empty());
    assert_eq!(sim.engine.next_deadline(), None, "an empty engine sleeps");
}

#[test]
fn deferred_then_delivered_by_the_reconnect_flush_in_batches() {
    let mut sim = Sim::with_defaults();
    let ids: Vec<String> = (0..45).map(|_| sim.send(BOB)).collect();
    for id in &ids {
        assert!(matches!(
            sim.events_of(id).next(),
            Some((
                _,
                Event::MessageDeferred {
                    retry_count: 0,
                    next_retry_at: None,
                    ..
                }
            ))
        ));
    }
    // Nothing to do but wait for lifetimes: no polling while no carrier is up.
    assert_eq!(sim.engine.next_deadline(), Some(7 * DAY));

    sim.advance(5 * SEC);
    assert_eq!(sim.carrier_up(), 20, "one flush batch");
    assert!(
        sim.engine.next_deadline().is_some_and(|d| d <= sim.now),
        "the rest is due at once"
    );
    assert_eq!(sim.timeout(), 20);
    assert_eq!(sim.timeout(), 5);
    assert_eq!(sim.timeout(), 0);

    sim.advance(SEC);
    for id in &ids {
        assert!(
            matches!(sim.terminal(id), Some((_, Event::MessageDelivered { .. }))),
            "{id}"
        );
        assert_eq!(sim.sends(id).len(), 1);
    }
}

#[test]
fn idempotent_ids() {
    let mut sim = Sim::with_defaults();
    let id = sim.send_with(BOB, Priority::High, ContentType::Text, Some("order-42"));
    assert_eq!(id, "order-42");
    let puts = sim.mark();
    let again = sim.submit(request(BOB, Priority::Low, ContentType::Text, "order-42"));
    assert!(!again, "a duplicate takes no entry");
    assert_eq!(sim.mark(), puts, "a duplicate changes nothing");
}

#[test]
fn an_id_already_delivered_is_a_no_op_in_the_same_input_and_after() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let mut req = request(BOB, Priority::High, ContentType::Text, "order-7");
    req.settled = Some(Settlement::Delivered);
    let mark = sim.mark();
    assert!(!sim.submit(req));
    assert_eq!(sim.mark(), mark, "no store op, event or transmit");
    assert_eq!(sim.status("order-7"), None);
    assert_eq!(sim.engine.next_deadline(), None, "no timer either");
    // Nothing turns up later: past every ACK timeout, retry and lifetime of a live entry.
    sim.advance(sim.config.absolute_lifetime_ms());
    assert_eq!(sim.mark(), mark, "nothing later either");
}

/// The repeat comes in the step whose ACK delivered the id: storage cannot say so yet (the step
/// has not committed), so the runtime passes `settled: None`; the engine remembers.
#[test]
fn an_id_delivered_earlier_in_the_same_step_is_a_no_op() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send_with(BOB, Priority::High, ContentType::Text, Some("order-8"));
    sim.acked_by_recipient.insert(id.clone());
    sim.ack(&id);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
    let mark = sim.mark();
    assert!(!sim.submit(request(BOB, Priority::High, ContentType::Text, "order-8")));
    assert_eq!(sim.mark(), mark, "no store op, event or transmit");
}

#[test]
fn an_id_that_failed_is_accepted_again() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let mut req = request(BOB, Priority::High, ContentType::Text, "order-8");
    req.settled = Some(Settlement::Failed(FailReason::MaxRetriesExceeded));
    let mark = sim.mark();
    assert!(sim.submit(req), "a failed id takes a new entry");
    assert_eq!(
        sim.outbox_frames_since(mark).len(),
        1,
        "and is sent at once"
    );
    sim.advance(SEC);
    assert!(matches!(
        sim.terminal("order-8"),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn the_501st_message_evicts_the_oldest() {
    let mut sim = Sim::with_defaults();
    let first = sim.send(BOB);
    let media = sim.send_with(BOB, Priority::Medium, ContentType::FileChunk, None);
    for _ in 0..499 {
        sim.send(BOB);
    }
    assert_eq!(sim.failures(), 0);
    let newest = sim.send(BOB);
    assert!(matches!(
        sim.terminal(&first),
        Some((
            _,
            Event::MessageFailed {
                reason: FailReason::OutboxCapacityExceeded,
                retry_count: 0,
                ..
            }
        ))
    ));
    assert_eq!(sim.failures(), 1);
    assert_eq!(sim.status(&newest), Some(EntryState::Queued));
    assert_eq!(
        sim.status(&media),
        Some(EntryState::Queued),
        "media has its own bound"
    );
    let Stats {
        outbox_regular,
        outbox_media,
        ..
    } = sim.engine.stats();
    assert_eq!((outbox_regular, outbox_media), (500, 1));

    for _ in 0..100 {
        sim.send_with(BOB, Priority::Medium, ContentType::FileChunk, None);
    }
    assert!(matches!(
        sim.terminal(&media),
        Some((
            _,
            Event::MessageFailed {
                reason: FailReason::OutboxCapacityExceeded,
                ..
            }
        ))
    ));
    assert_eq!(sim.engine.stats().outbox_media, 100);
    assert_eq!(sim.engine.stats().outbox_regular, 500);
}

#[test]
fn in_flight_cap_holds_back_sends_until_slots_free() {
    let mut config = Config::new("chat");
    config.max_pending_acks = 3;
    let mut sim = Sim::new(config);
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let ids: Vec<String> = (0..10).map(|_| sim.send(BOB)).collect();
    assert_eq!(sim.outbox_frames_since(0).len(), 3);
    assert_eq!(sim.engine.stats().pending_acks, 3);
    for id in &ids[3..] {
        assert!(matches!(
            sim.events_of(id).next(),
            Some((_, Event::MessageDeferred { reason, next_retry_at: None, .. })) if reason == "in-flight limit reached"
        ));
    }
    // Waiting for a slot is not a timer: the next wake-up is the first ACK timeout.
    assert_eq!(sim.engine.next_deadline(), Some(10 * SEC));

    let mark = sim.mark();
    sim.ack(&ids[0]);
    assert_eq!(
        sim.outbox_frames_since(mark).len(),
        1,
        "the freed slot is used at once"
    );
    assert_eq!(sim.timeout(), 0, "one slot, one send");

    sim.net = Net::honest();
    sim.ack(&ids[1]);
    sim.ack(&ids[2]);
    sim.advance(MIN);
    for id in &ids {
        assert!(
            matches!(sim.terminal(id), Some((_, Event::MessageDelivered { .. }))),
            "{id}"
        );
    }
}

#[test]
fn equal_retry_times_go_by_priority() {
    let mut config = Config::new("chat");
    config.flush_batch = 2;
    let mut sim = Sim::new(config);
    let low = sim.send_with(BOB, Priority::Low, ContentType::Text, None);
    let critical = sim.send_with(BOB, Priority::Critical, ContentType::Text, None);
    let medium = sim.send_with(BOB, Priority::Medium, ContentType::Text, None);
    let high = sim.send_with(BOB, Priority::High, ContentType::Text, None);

    let mark = sim.mark();
    sim.carrier_up();
    sim.advance(0);
    let order: Vec<String> = sim
        .outbox_frames_since(mark)
        .iter()
        .map(|(_, m)| sim.app_id(&m.id))
        .collect();
    assert_eq!(order, [critical, high, medium, low]);
}

#[test]
fn earlier_retry_times_go_first_whatever_the_priority() {
    let mut sim = Sim::with_defaults();
    sim.net.write = false;
    sim.carrier_up();
    let critical = sim.send_with(BOB, Priority::Critical, ContentType::Text, None);
    sim.fail_unwritten(0, "socket error"); // retry 0 at 1 s
    sim.advance(SEC);
    sim.fail_unwritten(0, "socket error"); // retry 1 at 1 s + 2 s
    sim.advance(SEC / 2);
    let low = sim.send_with(BOB, Priority::Low, ContentType::Text, None);
    sim.fail_unwritten(0, "socket error"); // retry 0 at 1.5 s + 1 s

    sim.net.write = true;
    let mark = sim.mark();
    sim.advance(10 * SEC);
    let order: Vec<(Millis, String)> = sim
        .outbox_frames_since(mark)
        .iter()
        .map(|(at, m)| (*at, sim.app_id(&m.id)))
        .collect();
    assert_eq!(order, [(2500, low), (3 * SEC, critical)]);
}

#[test]
fn failed_sends_back_off_without_limit_and_spend_no_budget() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::refusing();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(2 * HOUR);

    let deferred: Vec<(Millis, u32, Option<Millis>)> = sim
        .events_of(&id)
        .filter_map(|(at, e)| match e {
            Event::MessageDeferred {
                retry_count,
                next_retry_at,
                reason,
                ..
            } => {
                assert_eq!(reason, "relay refused the message");
                Some((at, *retry_count, *next_retry_at))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        deferred[..3],
        [
            (0, 0, Some(SEC)),
            (SEC, 1, Some(3 * SEC)),
            (3 * SEC, 2, Some(7 * SEC))
        ]
    );
    assert!(deferred.len() > 25, "still trying after two hours");
    assert_eq!(sim.failures(), 0);
    assert!(sim
        .events_of(&id)
        .all(|(_, e)| !matches!(e, Event::MessageRetrying { .. })));

    // The recipient comes back: the ladder starts at attempt 1, nothing was spent.
    sim.net = Net::honest();
    sim.advance(6 * MIN);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
    assert!(sim
        .events_of(&id)
        .all(|(_, e)| !matches!(e, Event::MessageSent { attempt, .. } if *attempt != 1)));
}

#[test]
fn a_frame_the_carrier_never_wrote_is_a_failed_send_when_it_goes_down() {
    let mut sim = Sim::with_defaults();
    sim.net.write = false;
    sim.carrier_up();
    let id = sim.send(BOB);
    let stale = sim.unwritten[0].clone();
    sim.advance(SEC);
    sim.carrier_down();
    assert!(matches!(
        sim.events_of(&id).last(),
        Some((_, Event::MessageDeferred { retry_count: 0, next_retry_at: None, reason, .. })) if reason == "carrier unavailable"
    ));
    assert_eq!(sim.status(&id), Some(EntryState::Queued));

    // A late report about the dead attempt is ignored.
    sim.input(Input::Written {
        id: courier_proto::wire_id(&stale.0),
        send_seq: stale.1,
    });
    assert_eq!(sim.status(&id), Some(EntryState::Queued));

    sim.net = Net::honest();
    sim.advance(MIN);
    assert!(sim.sends(&id).is_empty(), "no carrier, no send");
    sim.carrier_up();
    sim.advance(SEC);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn stats_count_what_waits_and_what_is_in_flight() {
    let mut sim = Sim::with_defaults();
    for _ in 0..3 {
        sim.send(BOB);
    }
    let s = sim.engine.stats();
    assert_eq!(
        (s.outbox_regular, s.retry_queue, s.pending_acks, s.parked),
        (3, 3, 0, 0),
        "no carrier: all three wait in the retry queue"
    );
    sim.carrier_up();
    let s = sim.engine.stats();
    assert_eq!(
        (s.retry_queue, s.pending_acks),
        (0, 3),
        "the flush sent them"
    );
    sim.advance(SEC);
    let s = sim.engine.stats();
    assert_eq!((s.outbox_regular, s.pending_acks), (0, 0), "delivered");
}

#[test]
fn an_app_id_equal_to_another_messages_wire_id_is_that_message() {
    // The wire id of "chat-1" is a UUID; an app that sends under that UUID sends the same
    // message, not a second one (`docs/delivery.md#repeated-ids`).
    let mut sim = Sim::with_defaults();
    let id = sim.send_with(BOB, Priority::Medium, ContentType::Text, Some("chat-1"));
    let as_wire = courier_proto::wire_id(&id);
    assert!(!sim.submit(request(BOB, Priority::Medium, ContentType::Text, &as_wire)));
    // Rows left so by an older build: restore keeps the first.
    let mut twin = sim.rows[&id].clone();
    twin.message.id = as_wire.clone();
    twin.created_at += 1;
    sim.rows.insert(as_wire.clone(), twin);
    sim.checks = false; // the twin row is what the store holds and restore refuses
    sim.restart();
    assert_eq!(sim.engine.stats().outbox_regular, 1);
    assert_eq!(sim.status(&id), Some(EntryState::Queued));
    assert_eq!(sim.status(&as_wire), None);
}

#[test]
fn a_relay_answer_resets_the_transport_backoff() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::refusing();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(10 * SEC);
    assert!(sim.rows[&id].transport_retries > 0);
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.advance(MIN);
    assert_eq!(
        sim.rows[&id].transport_retries, 0,
        "the relay processed a frame: the transport works again"
    );
}
