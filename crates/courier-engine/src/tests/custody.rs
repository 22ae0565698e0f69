//! Relay custody (`docs/delivery.md#custody`): a message in the relay's mailbox is paced, not
//! retried, and ends only by its ACK or its lifetime.

use super::*;
use crate::FailReason;

fn secs(times: &[Millis]) -> Vec<Millis> {
    times.iter().map(|t| t / SEC).collect()
}

fn stored_events(sim: &Sim, id: &str) -> usize {
    sim.events_of(id)
        .filter(|(_, e)| matches!(e, Event::MessageStored { .. }))
        .count()
}

#[test]
fn a_stored_message_is_probed_not_failed() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.carrier_up();
    let id = sim.send(BOB);
    assert_eq!(stored_events(&sim, &id), 1);
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
    assert_eq!(sim.engine.stats().parked, 1);

    sim.advance(2 * HOUR);
    assert_eq!(
        sim.terminal(&id),
        None,
        "held by the relay: no failure after 15 minutes"
    );
    assert!(sim.retries(&id).is_empty(), "custody spends no ACK budget");
    assert_eq!(stored_events(&sim, &id), 1, "custody is announced once");
    // Probes at 15 s doubling to 600 s.
    let sends = secs(&sim.sends(&id));
    assert_eq!(
        sends[..10],
        [0, 15, 45, 105, 225, 465, 945, 1545, 2145, 2745]
    );
    let gaps: Vec<Millis> = sends.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps[..8], [15, 30, 60, 120, 240, 480, 600, 600]);
    assert!(gaps[6..].iter().all(|gap| *gap == 600));
    assert_eq!(sim.rows[&id].ack_attempts, 0);

    sim.ack(&id);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn the_absolute_cap_ends_custody() {
    let mut config = Config::new("chat");
    config.outbox_max_lifetime_ms = HOUR;
    let mut sim = Sim::new(config);
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.carrier_up();
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
fn reconnecting_redrives_custody_and_restarts_the_probe_ladder() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(1000 * SEC); // probes at 15, 45, 105, 225, 465, 945 s; next at 1545 s
    sim.carrier_down();
    sim.advance(10 * SEC);
    assert_eq!(sim.carrier_up(), 1, "custody is re-driven on the edge");
    sim.advance(20 * SEC);
    assert_eq!(
        secs(&sim.sends(&id))[6..],
        [945, 1010, 1025],
        "then 15 s again"
    );
}

#[test]
fn the_probe_ladder_is_shared_per_recipient() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.carrier_up();
    let first = sim.send(BOB);
    let second = sim.send(BOB);
    let other = sim.send("carol");
    let next_probe = |id: &str| sim.rows[id].next_at;
    assert_eq!(next_probe(&first), Some(15 * SEC));
    assert_eq!(
        next_probe(&second),
        Some(30 * SEC),
        "bob's ladder already climbed once"
    );
    assert_eq!(next_probe(&other), Some(15 * SEC));
}

#[test]
fn a_delivery_from_the_recipient_redrives_its_held_messages() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.carrier_up();
    let first = sim.send(BOB);
    let second = sim.send(BOB);
    sim.advance(100 * SEC);
    assert_eq!(
        secs(&sim.sends(&second)),
        [0, 30],
        "the shared ladder: next at 150 s"
    );
    sim.net = Net::honest();
    sim.ack(&first);
    sim.advance(SEC);
    assert_eq!(
        secs(&sim.sends(&second)).last(),
        Some(&100),
        "re-sent at once, not at its probe time"
    );
    assert!(matches!(
        sim.terminal(&second),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn an_unanswered_probe_is_paced_like_a_stored_answer() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.net.answer = None;
    sim.net.ack_after = None;
    sim.advance(2 * MIN);
    // The probe at 15 s gets no answer; its ACK timeout (25 s) parks it again, 30 s on.
    assert_eq!(secs(&sim.sends(&id)), [0, 15, 55]);
    assert!(sim.retries(&id).is_empty());
    assert_eq!(sim.status(&id), Some(EntryState::Parked));
}

#[test]
fn a_live_answer_puts_a_probe_back_on_the_ack_ladder() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(CarrierAnswer::Stored);
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.net = Net::silent_peer(); // bob is connected now, but never answers
    sim.advance(HOUR);
    assert_eq!(
        sim.retries(&id)[0],
        (0, 26 * SEC),
        "probe at 15 s, ACK timeout at 25 s"
    );
    let (_, failed) = sim.terminal(&id).unwrap();
    assert!(matches!(
        failed,
        Event::MessageFailed {
            reason: FailReason::MaxRetriesExceeded,
            ..
        }
    ));
}
