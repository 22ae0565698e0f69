//! The pre-session queue (`docs/delivery.md#pre-session-queue`): with sessions required, a
//! message to a recipient without one waits — stored, bounded, for its lifetime at most — and
//! enters the outbox in order once the runtime reports the session ready.

use courier_proto::{ContentType, Priority};

use super::*;
use crate::presession::{BYTES, MESSAGES, PER_RECIPIENT_BYTES, PER_RECIPIENT_MESSAGES};
use crate::FailReason;

const LIFETIME: Millis = 604_800_000;

fn encrypted() -> Sim {
    let mut config = Config::new("chat");
    config.encryption = true;
    let mut sim = Sim::new(config);
    sim.carrier_up();
    sim
}

/// A send of `bytes` bytes of content to `recipient`.
fn send_sized(sim: &mut Sim, recipient: &str, bytes: usize) -> String {
    let id = sim.mint();
    let mut req = request(recipient, Priority::Medium, ContentType::Text, &id);
    req.content = "x".repeat(bytes);
    sim.submit(req);
    id
}

fn ready(sim: &mut Sim, recipient: &str) {
    sim.input(Input::SessionReady {
        recipient: recipient.to_owned(),
    });
}

fn failed_with(sim: &Sim, id: &str) -> Option<FailReason> {
    match sim.terminal(id) {
        Some((_, Event::MessageFailed { reason, .. })) => Some(reason),
        _ => None,
    }
}

#[test]
fn a_message_waits_for_its_session_then_goes_in_order() {
    let mut sim = encrypted();
    let first = sim.send(BOB);
    let second = sim.send(BOB);
    assert_eq!(sim.status(&first), Some(EntryState::AwaitingSession));
    assert_eq!(
        sim.rows[&first].state,
        EntryState::AwaitingSession,
        "stored"
    );
    assert!(sim.sends(&first).is_empty() && sim.sends(&second).is_empty());
    assert_eq!(
        sim.sessions_wanted,
        [(0, BOB.to_owned())],
        "asked once per recipient"
    );
    assert_eq!(sim.engine.stats().pre_session, 2);

    sim.advance(SEC);
    ready(&mut sim, BOB);
    assert_eq!(sim.sends(&first), [SEC]);
    assert_eq!(sim.sends(&second), [SEC]);
    let order: Vec<&str> = sim
        .events()
        .filter_map(|(_, e)| match e {
            Event::MessageSent { message_id, .. } => Some(message_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(order, [first.as_str(), second.as_str()]);
    assert_eq!(sim.engine.stats().pre_session, 0);

    let later = sim.send(BOB);
    assert_eq!(
        sim.sends(&later),
        [SEC],
        "a recipient with a session is sent to at once"
    );
    sim.advance(SEC);
    for id in [&first, &second, &later] {
        assert!(matches!(
            sim.terminal(id),
            Some((_, Event::MessageDelivered { .. }))
        ));
    }
}

#[test]
fn a_repeated_id_while_waiting_is_a_no_op() {
    let mut sim = encrypted();
    let id = sim.send_with(BOB, Priority::High, ContentType::Text, Some("chat-1"));
    assert!(!sim.submit(request(BOB, Priority::High, ContentType::Text, &id)));
    assert_eq!(sim.engine.stats().pre_session, 1);
}

#[test]
fn the_65th_message_to_a_recipient_fails_its_oldest() {
    let mut sim = encrypted();
    let ids: Vec<String> = (0..PER_RECIPIENT_MESSAGES).map(|_| sim.send(BOB)).collect();
    let carol = sim.send(CAROL);
    let newest = sim.send(BOB);
    assert_eq!(
        failed_with(&sim, &ids[0]),
        Some(FailReason::PendingSessionCapacityExceeded)
    );
    assert_eq!(
        FailReason::PendingSessionCapacityExceeded.as_str(),
        "Pending session queue capacity exceeded"
    );
    assert!(sim.terminal(&ids[1]).is_none() && sim.terminal(&carol).is_none());
    assert_eq!(sim.status(&newest), Some(EntryState::AwaitingSession));
    assert!(!sim.rows.contains_key(&ids[0]), "its row settled");
}

#[test]
fn a_recipients_bytes_are_bounded_with_room_for_an_exact_fit() {
    let mut sim = encrypted();
    let size = PER_RECIPIENT_BYTES / 8;
    let ids: Vec<String> = (0..8).map(|_| send_sized(&mut sim, BOB, size)).collect();
    assert!(
        ids.iter().all(|id| sim.terminal(id).is_none()),
        "8 fill it exactly"
    );
    let over = send_sized(&mut sim, BOB, 1);
    assert_eq!(
        failed_with(&sim, &ids[0]),
        Some(FailReason::PendingSessionCapacityExceeded)
    );
    assert!(sim.terminal(&ids[1]).is_none());
    assert_eq!(sim.status(&over), Some(EntryState::AwaitingSession));
}

#[test]
fn the_global_bounds_fail_the_oldest_of_all() {
    let mut sim = encrypted();
    sim.checks = false; // O(queue) per call: checked at the end
                        // Count: 4096 across 64 recipients, then one more for a 65th.
    let first = sim.send("r0");
    for n in 1..MESSAGES {
        sim.send(&format!("r{}", n % 64));
    }
    assert!(sim.terminal(&first).is_none());
    let more = sim.send("r64");
    assert_eq!(
        failed_with(&sim, &first),
        Some(FailReason::PendingSessionCapacityExceeded)
    );
    assert_eq!(sim.status(&more), Some(EntryState::AwaitingSession));
    assert_eq!(sim.engine.stats().pre_session, MESSAGES);
    sim.checks = true;
    sim.advance(1);

    // Bytes: 16 MiB over 8 recipients at 2 MiB each, then one byte more.
    let mut sim = encrypted();
    let size = BYTES / 64;
    let first = send_sized(&mut sim, "s0", size);
    for n in 1..64 {
        send_sized(&mut sim, &format!("s{}", n % 8), size);
    }
    assert!(sim.terminal(&first).is_none(), "16 MiB fits exactly");
    send_sized(&mut sim, "s8", 1);
    assert_eq!(
        failed_with(&sim, &first),
        Some(FailReason::PendingSessionCapacityExceeded)
    );
}

#[test]
fn a_message_waits_at_most_its_lifetime_from_acceptance() {
    let mut sim = encrypted();
    let first = sim.send(BOB);
    sim.advance(HOUR);
    let second = sim.send(CAROL);
    sim.advance_to(LIFETIME - 1);
    assert!(sim.terminal(&first).is_none());
    sim.advance_to(LIFETIME);
    assert_eq!(
        failed_with(&sim, &first),
        Some(FailReason::PendingSessionLifetimeExceeded)
    );
    assert_eq!(
        FailReason::PendingSessionLifetimeExceeded.as_str(),
        "Pending session lifetime exceeded"
    );
    assert!(sim.terminal(&second).is_none());
    sim.advance_to(HOUR + LIFETIME - 1);
    assert!(sim.terminal(&second).is_none());
    sim.advance_to(HOUR + LIFETIME);
    assert_eq!(
        failed_with(&sim, &second),
        Some(FailReason::PendingSessionLifetimeExceeded)
    );
    assert_eq!(
        sim.engine.next_deadline(),
        None,
        "nothing waits, nothing is timed"
    );
}

#[test]
fn a_restart_keeps_the_queue_asks_again_and_applies_bounds_and_lifetime() {
    let mut sim = encrypted();
    let waiting = sim.send(BOB);
    sim.advance(DAY);
    sim.restart();
    assert_eq!(sim.status(&waiting), Some(EntryState::AwaitingSession));
    assert_eq!(sim.sessions_wanted.last(), Some(&(DAY, BOB.to_owned())));
    // Rows written under other bounds (or by hand): the bounds apply at restore, oldest first.
    let mut extra = Vec::new();
    for n in 0..PER_RECIPIENT_MESSAGES {
        let mut row = sim.rows[&waiting].clone();
        row.message.id = format!("old-{n:02}");
        row.created_at = DAY + 1 + n as Millis;
        row.window_start = row.created_at;
        row.next_at = Some(row.created_at + LIFETIME);
        extra.push(row.message.id.clone());
        sim.rows.insert(row.message.id.clone(), row);
    }
    sim.restart();
    assert_eq!(
        failed_with(&sim, &waiting),
        Some(FailReason::PendingSessionCapacityExceeded),
        "65 rows for one recipient: the oldest fails at restore"
    );
    assert!(extra.iter().all(|id| sim.terminal(id).is_none()));
    // The device was off past the oldest row's lifetime: it fails at restore.
    sim.now = DAY + 1 + LIFETIME;
    sim.restart();
    assert_eq!(
        failed_with(&sim, &extra[0]),
        Some(FailReason::PendingSessionLifetimeExceeded)
    );
}

#[test]
fn without_sessions_required_rows_left_waiting_go_to_the_outbox() {
    let mut sim = encrypted();
    let waiting = sim.send(BOB);
    sim.config.encryption = false;
    sim.restart();
    sim.carrier_up();
    sim.advance(SEC);
    assert!(matches!(
        sim.terminal(&waiting),
        Some((_, Event::MessageDelivered { .. }))
    ));
}

#[test]
fn a_waiting_recipient_is_watched_and_its_coming_online_asks_for_the_session_again() {
    let mut sim = encrypted();
    let id = sim.send(BOB);
    assert_eq!(sim.engine.presence_watchlist(), [BOB]);
    assert_eq!(sim.sessions_wanted, [(0, BOB.to_owned())]);

    // Whatever setup found (nobody, say), Bob coming online is worth another try; a status
    // that is no news is not.
    sim.advance(SEC);
    sim.presence(BOB, true);
    sim.presence(BOB, true);
    sim.presence(BOB, false);
    assert_eq!(
        sim.sessions_wanted,
        [(0, BOB.to_owned()), (SEC, BOB.to_owned())]
    );

    ready(&mut sim, BOB);
    assert_eq!(sim.sends(&id), [SEC]);
    assert!(
        sim.engine.presence_watchlist().is_empty(),
        "nothing waits for Bob any more (his message is in flight, not parked)"
    );
    sim.presence(BOB, true);
    assert_eq!(
        sim.sessions_wanted.len(),
        2,
        "no session is asked for twice"
    );
}

#[test]
fn a_recipient_whose_waiting_messages_failed_is_no_longer_watched() {
    let mut sim = encrypted();
    let id = sim.send(BOB);
    assert_eq!(sim.engine.presence_watchlist(), [BOB]);
    sim.advance(LIFETIME);
    sim.timeout();
    assert_eq!(
        failed_with(&sim, &id),
        Some(FailReason::PendingSessionLifetimeExceeded)
    );
    assert!(sim.engine.presence_watchlist().is_empty());
}

#[test]
fn a_waiting_recipients_session_is_asked_for_again_at_doubling_gaps() {
    use crate::presession::{FIRST_REASK_MS, MAX_REASK_MS};
    let mut sim = encrypted();
    let id = sim.send(BOB);
    sim.advance(FIRST_REASK_MS - 1);
    assert_eq!(sim.sessions_wanted.len(), 1, "nothing before the first gap");
    sim.advance(4 * HOUR);
    let asks: Vec<Millis> = sim.sessions_wanted.iter().map(|(at, _)| *at).collect();
    let gaps: Vec<Millis> = asks.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        gaps[..7],
        [30, 60, 120, 240, 480, 960, 1800].map(|s| s * SEC),
        "asks at {asks:?}"
    );
    assert!(gaps[7..].iter().all(|gap| *gap == MAX_REASK_MS));
    assert!(sim.sessions_wanted.iter().all(|(_, r)| r == BOB));

    ready(&mut sim, BOB);
    let asked = sim.sessions_wanted.len();
    sim.advance(4 * HOUR);
    assert_eq!(
        sim.sessions_wanted.len(),
        asked,
        "a ready session is not asked for"
    );
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));
    assert_eq!(sim.engine.next_deadline(), None, "no timer is left behind");
}

#[test]
fn what_was_sealed_for_a_replaced_session_goes_again_at_once_with_no_retry_spent() {
    let mut sim = encrypted();
    sim.net = Net::silent_peer();
    ready(&mut sim, BOB);
    let id = sim.send(BOB);
    assert_eq!(sim.sends(&id), [0]);
    sim.advance(SEC);

    // This device lost a tie and joined the peer's session: the first attempt can never open.
    sim.net = Net::honest();
    ready(&mut sim, BOB);
    assert_eq!(sim.sends(&id), [0, SEC], "sent again in the same step");
    assert!(sim.retries(&id).is_empty(), "no retry spent");
    sim.advance(SEC);
    assert!(matches!(
        sim.terminal(&id),
        Some((_, Event::MessageDelivered { .. }))
    ));

    // An attempt still being handed to the carrier goes again too; the carrier's late report
    // on it changes nothing.
    sim.net = Net::silent_peer();
    sim.net.write = false;
    let handed = sim.send(BOB);
    assert_eq!(sim.unwritten.len(), 1);
    ready(&mut sim, BOB);
    assert_eq!(sim.unwritten.len(), 2, "handed to the carrier again");
    sim.write_unwritten(0);
    assert!(
        sim.sends(&handed).is_empty(),
        "the old attempt's write is stale"
    );
    sim.write_unwritten(0);
    assert_eq!(sim.sends(&handed).len(), 1);
    sim.ack(&handed);
    assert!(sim.retries(&handed).is_empty());
    assert!(matches!(
        sim.terminal(&handed),
        Some((_, Event::MessageDelivered { .. }))
    ));

    // The first session with a recipient sends nothing again.
    sim.net = Net::silent_peer();
    ready(&mut sim, CAROL);
    let other = sim.send(CAROL);
    ready(&mut sim, ALICE);
    sim.advance(SEC);
    assert_eq!(sim.sends(&other).len(), 1);
}
