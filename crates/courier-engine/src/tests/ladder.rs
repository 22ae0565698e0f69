//! The ACK ladder: exact retry times, the budget across restarts and flushes, the presets of
//! `docs/delivery.md#presets`.

use super::*;
use crate::FailReason;

/// Seconds, for readable timelines.
fn secs(times: &[Millis]) -> Vec<Millis> {
    times.iter().map(|t| t / SEC).collect()
}

fn attempts(sim: &Sim, id: &str) -> Vec<u32> {
    sim.events_of(id)
        .filter_map(|(_, e)| match e {
            Event::MessageSent { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect()
}

#[test]
fn unacknowledged_message_climbs_the_ladder_then_fails_at_921_s() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(HOUR);

    // 10 s ACK timeout, then 1, 2, 4 … 256, 300 s of backoff before each re-send.
    assert_eq!(
        secs(&sim.sends(&id)),
        [0, 11, 23, 37, 55, 81, 123, 197, 335, 601, 911]
    );
    assert_eq!(attempts(&sim, &id), (1..=11).collect::<Vec<_>>());
    let retries: Vec<(u32, Millis)> = sim
        .retries(&id)
        .into_iter()
        .map(|(n, at)| (n, at / SEC))
        .collect();
    assert_eq!(
        retries,
        [
            (0, 11),
            (1, 23),
            (2, 37),
            (3, 55),
            (4, 81),
            (5, 123),
            (6, 197),
            (7, 335),
            (8, 601),
            (9, 911)
        ]
    );
    // Each message_retrying is announced at its ACK timeout with the real next time.
    for (at, event) in sim.events_of(&id) {
        if let Event::MessageRetrying {
            retry_count,
            next_retry_at,
            ..
        } = event
        {
            assert_eq!(next_retry_at - at, sim.config.backoff_ms(*retry_count));
        }
    }
    let (at, failed) = sim.terminal(&id).unwrap();
    assert_eq!(at, 921 * SEC);
    assert!(matches!(
        failed,
        Event::MessageFailed {
            reason: FailReason::MaxRetriesExceeded,
            retry_count: 10,
            ..
        }
    ));
    assert_eq!(sim.engine.next_deadline(), None);
}

#[test]
fn the_ladder_survives_a_restart() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance_to(300 * SEC); // waiting for retry 7, due at 335 s
    assert_eq!(sim.rows[&id].ack_attempts, 8);
    assert_eq!(sim.rows[&id].next_at, Some(335 * SEC));

    sim.restart();
    assert_eq!(sim.status(&id), Some(EntryState::Queued));
    sim.carrier_up(); // the restart is a reachability edge: re-driven at once
    sim.advance(HOUR);

    assert_eq!(
        secs(&sim.sends(&id)),
        [0, 11, 23, 37, 55, 81, 123, 197, 300, 566, 876]
    );
    assert_eq!(attempts(&sim, &id), (1..=11).collect::<Vec<_>>());
    let (at, failed) = sim.terminal(&id).unwrap();
    assert_eq!(at, 886 * SEC);
    assert!(matches!(
        failed,
        Event::MessageFailed {
            reason: FailReason::MaxRetriesExceeded,
            retry_count: 10,
            ..
        }
    ));
}

#[test]
fn an_attempt_cut_short_by_a_restart_is_repeated_not_charged() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance_to(340 * SEC); // attempt 9 was written at 335 s; its ACK is due at 345 s
    sim.restart();
    sim.carrier_up();
    sim.advance(HOUR);
    let attempts = attempts(&sim, &id);
    assert_eq!(attempts[7..], [8, 9, 9, 10, 11]);
    assert!(matches!(
        sim.terminal(&id),
        Some((
            _,
            Event::MessageFailed {
                retry_count: 10,
                ..
            }
        ))
    ));
}

#[test]
fn a_flush_resend_arms_a_fresh_ack_timer() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(5 * SEC);
    sim.carrier_down(); // the written frame keeps its ACK timer
    sim.advance_to(60 * SEC);
    assert_eq!(sim.retries(&id), [(0, 11 * SEC)]);
    assert_eq!(
        secs(&sim.sends(&id)),
        [0],
        "no carrier at 11 s: the retry waits for one"
    );

    sim.carrier_up();
    sim.advance_to(80 * SEC);
    assert_eq!(secs(&sim.sends(&id)), [0, 60, 72]);
    assert_eq!(
        sim.retries(&id),
        [(0, 11 * SEC), (1, 72 * SEC)],
        "the flushed send timed out at 70 s"
    );
}

#[test]
fn a_short_outage_while_awaiting_the_ack_changes_nothing() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = sim.send(BOB);
    sim.advance(3 * SEC);
    sim.carrier_down();
    sim.advance(2 * SEC);
    assert_eq!(
        sim.carrier_up(),
        0,
        "a frame awaiting its ACK is not stranded"
    );
    sim.advance_to(30 * SEC);
    assert_eq!(secs(&sim.sends(&id)), [0, 11, 23]);
    assert_eq!(sim.retries(&id), [(0, 11 * SEC), (1, 23 * SEC)]);
}

/// The three presets of `docs/delivery.md#presets`, as a TypeScript user writes them.
fn presets() -> Vec<(&'static str, Config, Millis)> {
    let mut high = Config::new("field-ops");
    high.ack_timeout_ms = 15_000;
    high.max_retries = 20;
    high.outbox_max_lifetime_ms = 2_592_000_000;
    let mut low = Config::new("chat");
    low.ack_timeout_ms = 5000;
    low.max_retries = 5;
    low.max_delay_ms = 10_000;
    let mut battery = Config::new("sensors");
    battery.max_retries = 3;
    battery.initial_delay_ms = 5000;
    battery.max_delay_ms = 60_000;
    // Time to "Max retries exceeded": (max_retries + 1) timeouts plus the backoff ladder.
    vec![
        ("High-reliability", high, 4126 * SEC),
        ("Low-latency", low, 55 * SEC),
        ("Battery-constrained", battery, 75 * SEC),
    ]
}

#[test]
fn the_three_presets_deliver_and_fail_on_their_own_ladders() {
    for (name, config, fails_at) in presets() {
        let mut sim = Sim::new(config.clone());
        sim.carrier_up();
        let delivered = sim.send(BOB);
        sim.advance(SEC);
        assert!(
            matches!(
                sim.terminal(&delivered),
                Some((_, Event::MessageDelivered { .. }))
            ),
            "{name}"
        );

        let mut sim = Sim::new(config);
        sim.net = Net::silent_peer();
        sim.carrier_up();
        let failed = sim.send(BOB);
        sim.advance(2 * HOUR);
        let (at, event) = sim.terminal(&failed).unwrap();
        assert_eq!(at, fails_at, "{name}");
        assert!(
            matches!(
                event,
                Event::MessageFailed {
                    reason: FailReason::MaxRetriesExceeded,
                    ..
                }
            ),
            "{name}"
        );
        assert_eq!(
            sim.sends(&failed).len() as u32,
            sim.config.max_retries + 1,
            "{name}"
        );
    }
}
