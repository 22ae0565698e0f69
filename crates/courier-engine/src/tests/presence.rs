//! The presence watchlist (`docs/delivery.md#presence-watchlist`): what is watched, and that each
//! change is announced once, on the connection it belongs to.

use super::*;

fn changes(sim: &Sim) -> Vec<(Millis, PresenceChange)> {
    sim.presence_log.clone()
}

#[test]
fn watch_and_unwatch_are_emitted_once_each() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    let first = sim.send(BOB);
    let second = sim.send(BOB);
    sim.advance(MIN); // more verdicts: no duplicate watch
    assert_eq!(changes(&sim), [(0, PresenceChange::Watch(BOB.into()))]);
    assert_eq!(sim.engine.presence_watchlist(), [BOB]);

    sim.net = Net::honest();
    sim.presence(BOB, true);
    sim.advance(SEC);
    assert!(sim.terminal(&first).is_some() && sim.terminal(&second).is_some());
    let unwatch_at = changes(&sim)[1].0;
    assert_eq!(
        changes(&sim),
        [
            (0, PresenceChange::Watch(BOB.into())),
            (unwatch_at, PresenceChange::Unwatch(BOB.into()))
        ]
    );
    assert!(sim.engine.presence_watchlist().is_empty());
}

#[test]
fn the_watchlist_holds_parked_and_custody_recipients_not_in_flight_ones() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.net = Net::silent_peer();
    sim.send("dave");
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.send(CAROL);
    sim.net = Net::relay(UNREACHABLE);
    sim.send(BOB);
    assert_eq!(sim.engine.presence_watchlist(), [BOB, CAROL]);
    assert_eq!(sim.watching, [BOB, CAROL].map(String::from).into());
}

#[test]
fn the_watchlist_does_not_depend_on_the_connection() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    sim.send(BOB);
    let to_carol = sim.send(CAROL);
    assert_eq!(sim.presence_log.len(), 2);
    sim.carrier_down();
    // carol's message settles over a local link while the relay is down: she leaves the
    // watchlist now (the runtime drops her from the set it will watch on the next connection).
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    sim.advance(SEC);
    assert!(sim.terminal(&to_carol).is_some());
    assert_eq!(
        sim.presence_log[2..],
        [(0, PresenceChange::Unwatch(CAROL.into()))]
    );
    assert_eq!(sim.engine.presence_watchlist(), [BOB]);
    // The reconnect changes nothing in the watchlist (bob gets a fresh verdict at once).
    sim.carrier_up();
    assert_eq!(sim.presence_log.len(), 3);
}

#[test]
fn the_watchlist_is_not_capped_by_the_engine() {
    let mut config = Config::new("chat");
    config.outbox_max_entries = 2000;
    let mut sim = Sim::new(config);
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    sim.checks = false; // O(outbox) per call: checked once the backlog is built
    for n in 0..1100 {
        sim.send(&format!("peer{n:04}"));
    }
    sim.checks = true;
    sim.advance(SEC);
    // The relay's 1024-watch cap is the runtime's to apply (it polls the rest).
    assert_eq!(sim.engine.presence_watchlist().len(), 1100);
    assert_eq!(sim.watching.len(), 1100);
}

#[test]
fn a_peer_that_enters_and_leaves_between_polls_is_not_announced() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    sim.net = Net::silent_peer();
    let id = sim.send(BOB);
    // Verdict and delivery inside one engine call would be the same; here the runtime has not
    // polled in between.
    let seq = sim.send_seqs[&id];
    let answer = Input::Answer {
        id: id.clone(),
        send_seq: seq,
        answer: UNREACHABLE,
    };
    sim.engine.handle(answer, sim.now);
    let (ack, origin) = {
        let frame = &sim.frames[&id];
        let ack = frame.ack("peer-ack".into(), sim.now, "internet");
        let origin = InboundOrigin {
            carrier: Carrier::Relay,
            stamped_sender: BOB.into(),
            sender_account: None,
            seq: None,
            sealed_by: None,
        };
        (ack, origin)
    };
    sim.acked_by_recipient.insert(id.clone());
    sim.inbound(ack, origin);
    assert!(sim.presence_log.is_empty());
    assert!(sim.terminal(&id).is_some());
}

#[test]
fn after_a_reconnect_the_first_online_report_is_news_again() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.presence(BOB, true);
    sim.advance(SEC);
    let before = sim.sends(&id).len();
    sim.presence(BOB, true);
    sim.advance(SEC);
    assert_eq!(
        sim.sends(&id).len(),
        before,
        "an online report that is not news re-drives nothing"
    );
    sim.carrier_down();
    sim.carrier_up();
    sim.advance(SEC);
    let after_flush = sim.sends(&id).len();
    sim.presence(BOB, true);
    sim.advance(SEC);
    assert!(
        sim.sends(&id).len() > after_flush,
        "the first report on a new connection is an edge"
    );
}
