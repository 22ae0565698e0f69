//! Outbox lifetime: the sliding window waits for a pending ACK; the absolute cap holds across
//! restarts.

use super::*;
use crate::FailReason;

fn with_lifetime(lifetime: Millis) -> Config {
    let mut config = Config::new("chat");
    config.outbox_max_lifetime_ms = lifetime;
    config
}

fn expired(sim: &Sim, id: &str) -> Option<Millis> {
    match sim.terminal(id) {
        Some((
            at,
            Event::MessageFailed {
                reason: FailReason::OutboxLifetimeExceeded,
                ..
            },
        )) => Some(at),
        _ => None,
    }
}

#[test]
fn a_message_nobody_could_send_expires_with_its_lifetime() {
    let mut sim = Sim::new(with_lifetime(MIN));
    let id = sim.send(BOB);
    sim.advance(MIN - 1);
    assert_eq!(sim.terminal(&id), None);
    sim.advance(1);
    assert_eq!(expired(&sim, &id), Some(MIN));
}

#[test]
fn a_pending_ack_holds_the_expiry_until_its_timeout() {
    let mut config = with_lifetime(MIN);
    config.ack_timeout_ms = 2 * MIN;
    let mut sim = Sim::new(config);
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(90 * SEC);
    assert_eq!(
        sim.terminal(&id),
        None,
        "past its lifetime, but the ACK is pending"
    );
    sim.advance(30 * SEC);
    assert_eq!(
        expired(&sim, &id),
        Some(2 * MIN),
        "the ACK timeout decides: expired, not retried"
    );
    assert!(sim.retries(&id).is_empty());
}

#[test]
fn an_ack_within_its_timeout_still_delivers_past_the_lifetime() {
    let mut config = with_lifetime(MIN);
    config.ack_timeout_ms = 2 * MIN;
    let mut sim = Sim::new(config);
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(90 * SEC);
    sim.ack(&id);
    assert!(matches!(
        sim.terminal(&id),
        Some((
            _,
            Event::MessageDelivered {
                latency_ms: 90_000,
                ..
            }
        ))
    ));
}

#[test]
fn restarts_refresh_the_window_but_never_pass_the_absolute_cap() {
    let mut sim = Sim::new(with_lifetime(HOUR));
    let id = sim.send(BOB);
    for _ in 0..4 {
        sim.advance(50 * MIN);
        sim.restart();
    }
    sim.advance(30 * MIN); // 230 min: each restart granted a fresh hour
    sim.restart();
    assert_eq!(sim.terminal(&id), None);
    assert_eq!(sim.rows[&id].window_start, 230 * MIN);
    let before_the_cap = sim.rows.clone();

    sim.advance(HOUR);
    assert_eq!(
        expired(&sim, &id),
        Some(4 * HOUR),
        "the window would run to 290 min; the cap is 240"
    );

    // A store written before the cap, loaded after it: settled at restore, terminally.
    let mut late = Sim::new(with_lifetime(HOUR));
    late.rows = before_the_cap;
    late.advance_to(250 * MIN);
    late.restart();
    assert_eq!(expired(&late, &id), Some(250 * MIN));
    assert!(late.rows.is_empty());
    late.carrier_up();
    assert!(late.outbox_frames_since(0).is_empty());
}

#[test]
fn restore_applies_the_capacity_bound_oldest_first() {
    let mut config = Config::new("chat");
    config.outbox_max_entries = 3;
    let mut sim = Sim::new(config.clone());
    let ids: Vec<String> = (0..3)
        .map(|_| {
            sim.advance(SEC);
            sim.send(BOB)
        })
        .collect();
    let rows = sim.rows.clone();

    config.outbox_max_entries = 2; // an older build's bigger outbox
    let mut smaller = Sim::new(config);
    smaller.rows = rows;
    smaller.restart();
    assert!(matches!(
        smaller.terminal(&ids[0]),
        Some((
            _,
            Event::MessageFailed {
                reason: FailReason::OutboxCapacityExceeded,
                ..
            }
        ))
    ));
    assert_eq!(smaller.status(&ids[1]), Some(EntryState::Queued));
    assert_eq!(smaller.status(&ids[2]), Some(EntryState::Queued));
}
