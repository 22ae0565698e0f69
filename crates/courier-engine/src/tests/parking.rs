//! Parking on the relay's unreachable verdict (`docs/delivery.md#parking`): the per-recipient probe
//! ladder, edges with a fresh budget, carry-forward on probes, the absolute cap, and the
//! edge-driven opt-out.

use courier_proto::{ContentType, Priority};

use super::*;
use crate::FailReason;

fn secs(times: &[Millis]) -> Vec<Millis> {
    times.iter().map(|t| t / SEC).collect()
}

fn undeliverable(sim: &Sim, id: &str) -> Vec<Millis> {
    sim.events_of(id)
        .filter(|(_, e)| matches!(e, Event::MessageUndeliverable { .. }))
        .map(|(at, _)| at)
        .collect()
}

fn parked_sim(config: Config) -> Sim {
    let mut sim = Sim::new(config);
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    sim
}

fn edge_driven() -> Config {
    let mut config = Config::new("chat");
    config.edge_driven_unreachable_dm = true;
    config
}

#[test]
fn a_verdict_parks_the_message() {
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);

    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    let stats = sim.engine.stats();
    assert_eq!(
        (stats.parked, stats.pending_acks, stats.retry_queue),
        (1, 0, 0)
    );
    assert_eq!(sim.rows[&id].state, EntryState::Parked, "the entry is kept");
    assert_eq!(sim.rows[&id].next_at, Some(15 * SEC), "probe 15 s out");
    assert_eq!(sim.engine.park_counter(BOB), 1);
    assert_eq!(sim.engine.next_deadline(), Some(15 * SEC), "no pending ACK");
    let (_, event) = sim
        .events_of(&id)
        .find(|(_, e)| matches!(e, Event::MessageUndeliverable { .. }))
        .unwrap();
    assert_eq!(
        *event,
        Event::MessageUndeliverable {
            message_id: id.clone(),
            recipient: BOB.into(),
            reason_code: courier_proto::UnreachableCause::OfflineNoMailbox,
            reason: "recipient unreachable".into(),
            file_id: None,
        }
    );
    // message_sent, then message_undeliverable: the offline recipient's sequence.
    let kinds: Vec<&str> = sim
        .events_of(&id)
        .map(|(_, e)| match e {
            Event::MessageSent { .. } => "sent",
            Event::MessageUndeliverable { .. } => "undeliverable",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["sent", "undeliverable"]);

    // However long the recipient stays away, nothing fails before the absolute cap: each
    // probe refreshes the sliding 7-day window.
    sim.advance(28 * DAY - SEC);
    assert_eq!(sim.failures(), 0);
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    assert!(sim.retries(&id).is_empty(), "parking spends no ACK budget");
    assert_eq!(sim.rows[&id].ack_attempts, 0);
    sim.advance(SEC);
    let (at, failed) = sim.terminal(&id).unwrap();
    assert_eq!(at, 28 * DAY, "the absolute cap (4 × the lifetime) ends it");
    assert!(matches!(
        failed,
        Event::MessageFailed {
            reason: FailReason::OutboxLifetimeExceeded,
            ..
        }
    ));
}

#[test]
fn each_verdict_escalates_the_probe_and_repeats_the_event() {
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);
    sim.advance(15 * SEC);
    assert_eq!(sim.engine.park_counter(BOB), 2);
    assert_eq!(
        sim.rows[&id].next_at,
        Some(45 * SEC),
        "second verdict: 30 s"
    );
    sim.advance(2 * HOUR - 15 * SEC);
    let sends = secs(&sim.sends(&id));
    assert_eq!(
        sends[..10],
        [0, 15, 45, 105, 225, 465, 945, 1545, 2145, 2745]
    );
    assert_eq!(
        undeliverable(&sim, &id),
        sim.sends(&id),
        "one message_undeliverable per verdict"
    );
    assert_eq!(sim.failures(), 0);
}

#[test]
fn the_ladder_is_per_recipient_and_probes_are_per_message() {
    let mut sim = parked_sim(Config::new("chat"));
    let first = sim.send(BOB);
    let second = sim.send(BOB);
    let third = sim.send(BOB);
    let other = sim.send(CAROL);
    let next = |id: &str| sim.rows[id].next_at;
    assert_eq!(next(&first), Some(15 * SEC));
    assert_eq!(next(&second), Some(30 * SEC));
    assert_eq!(next(&third), Some(60 * SEC));
    assert_eq!(next(&other), Some(15 * SEC), "carol has her own ladder");
    assert_eq!(sim.engine.park_counter(BOB), 3);
}

#[test]
fn presence_online_resets_the_ladder_and_redrives_with_a_fresh_budget() {
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);
    let other = sim.send(BOB);
    sim.advance(100 * SEC);
    assert!(sim.engine.park_counter(BOB) >= 4);

    // offline: state only, nothing goes.
    assert_eq!(sim.presence(BOB, false), 0);
    // bob connects.
    sim.net = Net::honest();
    assert_eq!(
        sim.presence(BOB, true),
        2,
        "both parked messages go at once"
    );
    assert_eq!(
        sim.engine.park_counter(BOB),
        0,
        "the edge resets the ladder"
    );
    assert!(matches!(
        sim.events_of(&id).filter(|(_, e)| matches!(e, Event::MessageSent { .. })).last(),
        Some((at, Event::MessageSent { attempt: 1, .. })) if at == 100 * SEC
    ));
    sim.advance(SEC);
    for id in [&id, &other] {
        assert!(matches!(
            sim.terminal(id),
            Some((_, Event::MessageDelivered { .. }))
        ));
    }
}

#[test]
fn a_repeated_online_status_is_not_an_edge() {
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);
    // bob is online per presence, but the relay still says unreachable (it raced a reconnect).
    assert_eq!(sim.presence(BOB, true), 1);
    assert_eq!(
        sim.engine.park_counter(BOB),
        1,
        "the fresh verdict parks it again"
    );
    // The verdict made the remembered status stale: the next online is news again.
    sim.net.answer = None; // this time the relay says nothing and nobody ACKs
    assert_eq!(sim.presence(BOB, true), 1);
    sim.advance(12 * SEC); // the unanswered probe re-parks at its ACK timeout
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    // The polling fallback repeats `online: true` every 20 s: no re-drive each time.
    assert_eq!(sim.presence(BOB, true), 0);
    sim.advance(8 * SEC);
    assert_eq!(sim.presence(BOB, true), 0);
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
}

#[test]
fn ack_budget_exhaustion_with_a_live_park_counter_reparks() {
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);
    // The relay now accepts the probes (its push fallback), but bob never answers.
    sim.net = Net::silent_peer();
    sim.advance(HOUR);
    assert_eq!(sim.failures(), 0, "re-parked, not failed");
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    let retries = sim.retries(&id);
    assert_eq!(retries.len(), 10, "one walk of the ladder");
    // The probe at 15 s climbs the ladder (10 retries, ~921 s); the last timeout re-parks at
    // the escalated interval (counter 2: 30 s).
    let sends = sim.sends(&id);
    let exhausted_at = 15 * SEC + 921 * SEC;
    assert_eq!(
        sends[11],
        15 * SEC + 911 * SEC,
        "the last retry of the ladder"
    );
    assert_eq!(
        sends[12],
        exhausted_at + 30 * SEC,
        "re-parked at the escalated interval"
    );
    // Carry-forward: the next probe resumes at the accumulated count, so it re-parks after
    // one ACK timeout instead of walking the ladder again.
    assert_eq!(sends[13], sends[12] + 10 * SEC + 60 * SEC);
    assert_eq!(sim.rows[&id].ack_attempts, 10);
    assert!(sim
        .events_of(&id)
        .any(|(_, e)| matches!(e, Event::MessageSent { attempt: 11, .. })));
}

#[test]
fn without_a_verdict_exhaustion_fails_as_usual() {
    // A reachability edge cleared the verdict: the ladder against a reachable peer decides.
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);
    sim.net = Net::silent_peer();
    sim.presence(BOB, true); // an edge: fresh budget, verdict gone; the relay now says "live"
    sim.advance(HOUR);
    assert!(matches!(
        sim.terminal(&id),
        Some((
            _,
            Event::MessageFailed {
                reason: FailReason::MaxRetriesExceeded,
                ..
            }
        ))
    ));
}

#[test]
fn an_edge_gives_a_probe_climbing_the_ladder_a_fresh_budget() {
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);
    sim.net = Net::silent_peer();
    // Probe at 15 s walks the ladder, re-parks at 936 s, probes again at 966 s with the
    // carried count: one ACK timeout away from re-parking.
    sim.advance(970 * SEC);
    assert_eq!(sim.status(&id), Some(EntryState::InFlight));
    assert_eq!(sim.rows[&id].ack_attempts, 10);
    sim.carrier_down();
    sim.carrier_up(); // our reconnect: an edge for everyone
    assert_eq!(
        sim.rows[&id].ack_attempts, 0,
        "a fresh budget for the episode's probe"
    );
    sim.advance(10 * MIN);
    assert_eq!(sim.failures(), 0);
    let after: Vec<u32> = sim.retries(&id)[10..].iter().map(|(n, _)| *n).collect();
    assert_eq!(after, (0..9).collect::<Vec<_>>(), "walking a fresh ladder");
}

#[test]
fn delivering_one_parked_message_redrives_its_siblings_at_once() {
    let mut sim = parked_sim(Config::new("chat"));
    let first = sim.send(BOB);
    let second = sim.send(BOB);
    let third = sim.send(BOB);
    sim.advance(10 * SEC);
    sim.net = Net::honest();
    sim.advance(5 * SEC + 100); // first's probe at 15 s is delivered at 15.1 s
    let (delivered_at, _) = sim.terminal(&first).unwrap();
    assert_eq!(delivered_at, 15 * SEC + 100);
    for id in [&second, &third] {
        assert_eq!(
            sim.sends(id).last(),
            Some(&delivered_at),
            "re-driven at once, not at its own probe time"
        );
    }
    sim.advance(SEC);
    assert!(sim.rows.is_empty());
    assert_eq!(sim.engine.park_counter(BOB), 0);
}

#[test]
fn a_third_party_ack_settles_neither_in_flight_nor_parked() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    sim.carrier_up();
    sim.net = Net::relay(UNREACHABLE);
    let parked = sim.send(BOB);
    sim.net = Net::silent_peer();
    let in_flight = sim.send(BOB);
    assert_eq!(sim.status(&parked), Some(EntryState::Parked));
    assert_eq!(sim.status(&in_flight), Some(EntryState::InFlight));
    for id in [&parked, &in_flight] {
        // carol carried the frame and knows its id; she relays an ACK "from bob".
        sim.ack_carried(id, Carrier::Local(BLE.into()), CAROL);
        // mallory, over the relay, claims to be bob in the message.
        sim.ack_carried(id, Carrier::Relay, "mallory");
    }
    assert_eq!(sim.status(&parked), Some(EntryState::Parked));
    assert_eq!(sim.status(&in_flight), Some(EntryState::InFlight));
    assert!(sim.terminal(&parked).is_none() && sim.terminal(&in_flight).is_none());
}

#[test]
fn a_parked_message_is_offered_to_neighbors_on_every_park() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    sim.discover("dave", BLE);
    let id = parked_send(&mut sim);
    let offered = |sim: &Sim| -> Vec<(Millis, String)> {
        sim.offers
            .iter()
            .filter(|(_, _, _, m)| *m == id)
            .map(|(at, _, peer, _)| (*at, peer.clone()))
            .collect()
    };
    assert_eq!(
        offered(&sim),
        [(0, CAROL.to_owned()), (0, "dave".to_owned())],
        "offered on the park"
    );
    sim.advance(15 * SEC);
    // The probe is offered with the relay attempt, and the fresh verdict's park offers again.
    assert_eq!(offered(&sim).len(), 6);
    assert_eq!(
        sim.status(&id),
        Some(EntryState::Parked),
        "a copy handed to a neighbor settles nothing"
    );
}

fn parked_send(sim: &mut Sim) -> String {
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    let id = sim.send(BOB);
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    id
}

#[test]
fn an_ack_carried_back_over_a_neighbor_settles_a_parked_message() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    let id = parked_send(&mut sim);
    // bob got carol's copy and answers over the local carrier himself.
    sim.ack_carried(&id, Carrier::Local(BLE.into()), BOB);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { ref transport, .. })) if transport == BLE
    ));
    assert_eq!(sim.engine.stats().parked, 0);
}

#[test]
fn the_absolute_cap_ends_a_probed_message() {
    let mut config = Config::new("chat");
    config.outbox_max_lifetime_ms = HOUR;
    let mut sim = parked_sim(config);
    let id = sim.send(BOB);
    sim.advance(4 * HOUR - 1);
    assert_eq!(
        sim.terminal(&id),
        None,
        "each probe refreshes the sliding window"
    );
    sim.advance(1);
    let (at, failed) = sim.terminal(&id).unwrap();
    assert_eq!(at, 4 * HOUR);
    assert!(matches!(
        failed,
        Event::MessageFailed {
            reason: FailReason::OutboxLifetimeExceeded,
            retry_count: 0,
            ..
        }
    ));
}

#[test]
fn the_reconnect_flush_of_many_parked_messages_leaves_the_rest_due() {
    let mut sim = parked_sim(Config::new("chat"));
    let ids: Vec<String> = (0..45).map(|_| sim.send(BOB)).collect();
    assert_eq!(sim.engine.stats().parked, 45);
    sim.carrier_down();
    sim.advance(MIN);
    sim.net = Net::honest();
    assert_eq!(sim.carrier_up(), 20, "one flush batch");
    assert!(
        sim.engine.next_deadline().is_some_and(|d| d <= sim.now),
        "the rest is queued and due, not stranded"
    );
    assert_eq!(sim.engine.stats().parked, 25);
    assert_eq!(sim.timeout(), 20);
    assert_eq!(sim.timeout(), 5);
    sim.advance(SEC);
    for id in &ids {
        assert!(matches!(
            sim.terminal(id),
            Some((_, Event::MessageDelivered { .. }))
        ));
    }
}

#[test]
fn restart_is_an_edge_with_a_fresh_budget() {
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);
    sim.net = Net::silent_peer();
    sim.advance(20 * MIN); // the probe walked the ladder and re-parked
    assert_eq!(sim.rows[&id].ack_attempts, 10);
    assert_eq!(sim.rows[&id].state, EntryState::Parked);
    sim.restart();
    assert_eq!(
        sim.rows[&id].ack_attempts, 0,
        "start() gives a fresh budget"
    );
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    sim.net = Net::honest();
    assert_eq!(sim.carrier_up(), 1, "re-driven on the reconnect");
    sim.advance(SEC);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn an_inbound_message_from_the_parked_peer_redrives() {
    let mut sim = parked_sim(Config::new("chat"));
    let id = sim.send(BOB);
    sim.advance(5 * SEC);
    sim.net = Net::honest();
    let hello = message_from(BOB, "b-hello");
    let origin = InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: BOB.into(),
        sender_account: None,
        seq: Some(1),
        sealed_by: None,
    };
    sim.inbound(hello, origin);
    assert_eq!(sim.sends(&id).last(), Some(&(5 * SEC)));
    sim.advance(SEC);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn a_media_chunk_is_not_parked_but_keeps_its_pending_ack() {
    let mut sim = Sim::with_defaults();
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    let id = sim.send_with(BOB, Priority::Medium, ContentType::FileChunk, None);
    assert_eq!(
        sim.status(&id),
        Some(EntryState::InFlight),
        "the pending ACK stays"
    );
    assert_eq!(undeliverable(&sim, &id).len(), 1);
    assert!(sim
        .offers
        .iter()
        .any(|(_, _, peer, m)| *m == id && peer == CAROL));
    assert_eq!(sim.engine.stats().parked, 0);
    assert_eq!(
        sim.engine.presence_watchlist(),
        [BOB],
        "a peer that just got a verdict is watched"
    );
    sim.advance(HOUR);
    assert!(
        matches!(
            sim.terminal(&id),
            Some((
                _,
                Event::MessageFailed {
                    reason: FailReason::MaxRetriesExceeded,
                    ..
                }
            ))
        ),
        "normal retry exhaustion"
    );
    assert!(
        sim.engine.presence_watchlist().is_empty(),
        "its last message settled: nothing left to watch it for"
    );
}

#[test]
fn stale_relay_answers_are_ignored() {
    let mut sim = Sim::with_defaults();
    sim.net = Net {
        answer: None,
        ..Net::silent_peer()
    };
    sim.carrier_up();
    let id = sim.send(BOB);
    let first = sim.send_seqs[&id];
    sim.advance(11 * SEC); // ACK timeout at 10 s, retry 0 at 11 s
    let second = sim.send_seqs[&id];
    assert_ne!(first, second);
    sim.answer_seq(&id, first, UNREACHABLE);
    assert_eq!(
        sim.status(&id),
        Some(EntryState::InFlight),
        "an old attempt's verdict"
    );
    assert!(undeliverable(&sim, &id).is_empty());
    sim.answer_seq(&id, second, UNREACHABLE);
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
}

#[test]
fn parked_and_custody_share_the_ladder_and_the_count() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.net = Net::relay(CarrierAnswer::Stored);
    let stored = sim.send(BOB);
    sim.net = Net::relay(UNREACHABLE);
    let parked = sim.send(BOB);
    assert_eq!(sim.engine.stats().parked, 2);
    assert_eq!(sim.rows[&stored].next_at, Some(15 * SEC));
    assert_eq!(
        sim.rows[&parked].next_at,
        Some(30 * SEC),
        "one ladder per recipient"
    );
    assert_eq!(sim.engine.park_counter(BOB), 2);
}

// ---- edgeDrivenUnreachableDm --------------------------------------------------------------

#[test]
fn edge_driven_stops_timed_probing_after_its_bound() {
    let mut sim = parked_sim(edge_driven());
    let id = sim.send(BOB);
    sim.advance(DAY);
    assert_eq!(
        secs(&sim.sends(&id)),
        [0, 15, 45, 105],
        "three timed probes, then quiet"
    );
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    assert_eq!(sim.rows[&id].next_at, None, "resting: no timer");
    assert_eq!(
        sim.engine.next_deadline(),
        Some(105 * SEC + 7 * DAY),
        "only the sliding lifetime is left"
    );

    // Every edge still re-drives it, and opens a new episode of three probes.
    let t = sim.now;
    assert_eq!(sim.presence(BOB, true), 1);
    sim.advance(HOUR);
    assert_eq!(
        secs(&sim.sends(&id))[4..],
        [t / SEC, t / SEC + 15, t / SEC + 45, t / SEC + 105]
    );
    sim.carrier_down();
    sim.carrier_up();
    assert_eq!(sim.sends(&id).last(), Some(&sim.now), "reconnect re-drives");
    sim.local_up(BLE);
    sim.net.ack_after = None;
    sim.local.ack_after = None;
    sim.discover(BOB, BLE);
    assert!(
        matches!(
            sim.events_of(&id).last(),
            Some((_, Event::MessageSent { transport, attempt: 1, .. })) if transport == BLE
        ),
        "neighbor discovery re-drives over the direct link with a fresh budget"
    );
    sim.lose(BOB, BLE);
    sim.advance(2 * HOUR);

    // Quiet means quiet: no probe while it rests, and the sliding lifetime ends it.
    let last = *sim.sends(&id).last().unwrap();
    sim.advance(8 * DAY);
    let (at, failed) = sim.terminal(&id).unwrap();
    assert!(matches!(
        failed,
        Event::MessageFailed {
            reason: FailReason::OutboxLifetimeExceeded,
            ..
        }
    ));
    assert_eq!(at, last + 7 * DAY);
    assert_eq!(sim.failures(), 1);
}

#[test]
fn edge_driven_caps_the_resend_rate_to_gone_peers() {
    let mut config = edge_driven();
    config.outbox_max_entries = 1000;
    let mut sim = parked_sim(config);
    let ids: Vec<String> = (0..100).map(|n| sim.send(&format!("peer{n}"))).collect();
    sim.advance(DAY); // every one rests after its three probes
    assert!(sim.rows.values().all(|r| r.next_at.is_none()));
    sim.carrier_down();
    let mark = sim.mark();
    let t = sim.now;
    sim.carrier_up();
    sim.advance(MIN);
    let mut times: Vec<Millis> = sim
        .outbox_frames_since(mark)
        .iter()
        .map(|(at, _)| at - t)
        .collect();
    times.sort_unstable();
    // All 100 are re-driven (never dropped): a burst of 20, then 5 per second. The re-parks'
    // first timed probes (15 s out) draw on the same budget.
    assert!(times.len() >= 100);
    assert_eq!(times[19], 0);
    assert_eq!(times[20], 200);
    assert_eq!(times[99], 80 * 200);
    for window in times.windows(2).skip(20) {
        assert!(window[1] - window[0] >= 200, "{times:?}");
    }
    for id in &ids {
        assert!(
            sim.sends(id).iter().any(|at| *at >= t),
            "{id} was re-driven"
        );
    }
}

#[test]
fn an_idle_engine_wakes_only_for_due_probes() {
    let mut sim = parked_sim(Config::new("chat"));
    for n in 0..50 {
        sim.send(&format!("peer{}", n % 5));
    }
    sim.advance(HOUR);
    let mut wakeups = 0;
    let mut probes = 0;
    let until = sim.now + HOUR;
    while let Some(deadline) = sim.engine.next_deadline().filter(|d| *d <= until) {
        sim.now = deadline;
        wakeups += 1;
        let sent = sim.timeout();
        assert!(sent > 0, "a wake-up at {deadline} with nothing due");
        probes += sent;
    }
    // At the 600 s cap: each message probed every 10 minutes, probes of one recipient spread.
    assert_eq!(probes, 50 * 6);
    assert!(wakeups <= probes);
}

#[test]
fn message_undeliverable_carries_the_relays_cause() {
    use courier_proto::UnreachableCause;
    for cause in [
        UnreachableCause::UnknownRecipient,
        UnreachableCause::OfflineNoMailbox,
        UnreachableCause::MailboxFull,
        UnreachableCause::Unspecified,
    ] {
        let mut sim = Sim::with_defaults();
        sim.net = Net::relay(CarrierAnswer::Unreachable(cause));
        sim.carrier_up();
        let id = sim.send(BOB);
        sim.advance(0);
        let codes: Vec<UnreachableCause> = sim
            .events_of(&id)
            .filter_map(|(_, e)| match e {
                Event::MessageUndeliverable { reason_code, .. } => Some(*reason_code),
                _ => None,
            })
            .collect();
        assert_eq!(codes, [cause]);
    }
}

fn edge_from_bob(sim: &mut Sim, seq: u64) {
    let hello = message_from(BOB, &format!("b{seq}"));
    let origin = InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: BOB.into(),
        sender_account: None,
        seq: Some(seq),
        sealed_by: None,
    };
    sim.inbound(hello, origin);
}

#[test]
fn an_edge_gives_a_parked_message_a_fresh_ack_budget() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(25 * SEC);
    assert!(sim.rows[&id].ack_attempts >= 1);
    // The relay then finds bob gone for its next attempt.
    sim.net = Net::relay(UNREACHABLE);
    for _ in 0..120 {
        if sim.status(&id) == Some(EntryState::Parked) {
            break;
        }
        sim.advance(SEC);
    }
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    sim.net = Net::silent_peer();
    edge_from_bob(&mut sim, 1);
    assert_eq!(sim.rows[&id].ack_attempts, 0, "a fresh budget");
}

#[test]
fn an_edge_leaves_the_budget_of_a_message_outside_the_park_episode() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let in_flight = sim.send(BOB);
    sim.advance(12 * SEC);
    let spent = sim.rows[&in_flight].ack_attempts;
    assert!(spent >= 1);
    sim.net = Net::relay(UNREACHABLE);
    let parked = sim.send(BOB);
    sim.advance(100);
    assert_eq!(sim.status(&parked), Some(EntryState::Parked));
    assert_eq!(sim.status(&in_flight), Some(EntryState::InFlight));
    sim.net = Net::silent_peer();
    edge_from_bob(&mut sim, 1);
    assert_eq!(
        sim.rows[&in_flight].ack_attempts, spent,
        "a message outside the episode keeps what it spent"
    );
}

#[test]
fn without_edge_driven_mode_probes_are_not_paced_by_the_resend_budget() {
    let mut sim = parked_sim(Config::new("chat"));
    let ids: Vec<String> = (0..25).map(|n| sim.send(&format!("peer{n:02}"))).collect();
    assert!(ids
        .iter()
        .all(|id| sim.status(id) == Some(EntryState::Parked)));
    sim.advance(15 * SEC);
    let probed = ids
        .iter()
        .filter(|id| sim.sends(id).contains(&(15 * SEC)))
        .count();
    assert_eq!(
        probed, 25,
        "every first probe at 15 s, more than one burst of the budget"
    );
}
