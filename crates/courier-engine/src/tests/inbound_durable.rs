//! The opt-in at-least-once inbound pipeline: drain batching and its triggers, the order of a
//! commit (rows cleared → relay Acks → end-to-end ACKs), refusals and their backoff,
//! redeliveries with and without a buffered copy, restarts, retention, the buffer bound, and
//! the drain → live hand-over. The simulator checks after every call that no relay Ack or
//! end-to-end ACK precedes its message's commit and that the store and the engine hold the same
//! buffered rows.

use super::*;
use crate::config::HookConfig;
use crate::hook::RETENTION_EXPIRED;
use crate::{BatchOrigin, DiagnosticLevel};

fn hooked_with(durable: HookConfig) -> Sim {
    let mut config = Config::new("chat");
    config.durability_hook = Some(durable);
    Sim::new(config)
}

fn hooked() -> Sim {
    hooked_with(HookConfig::default())
}

fn relay(sender: &str, seq: u64) -> InboundOrigin {
    InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: sender.to_owned(),
        sender_account: None,
        seq: Some(seq),
        sealed_by: None,
    }
}

fn over_ble(sender: &str) -> InboundOrigin {
    InboundOrigin {
        carrier: Carrier::Local(BLE.to_owned()),
        stamped_sender: sender.to_owned(),
        sender_account: None,
        seq: None,
        sealed_by: None,
    }
}

/// Bob's message `id`, carried by relay journal frame `seq`.
fn deliver(sim: &mut Sim, id: &str, seq: u64) {
    sim.inbound(message_from(BOB, id), relay(BOB, seq));
}

fn key(id: &str) -> InboundKey {
    InboundKey {
        chat: BOB.to_owned(),
        sender: BOB.to_owned(),
        message_id: id.to_owned(),
    }
}

/// What the calls since `mark` produced, reduced to kinds, in the runtime's order.
fn shape(sim: &Sim, mark: usize) -> Vec<&'static str> {
    sim.log[mark..]
        .iter()
        .map(|(_, out)| match out {
            Out::Store(StoreOp::BufferInbound(_)) => "buffer",
            Out::Store(StoreOp::CommitInbound { .. }) => "commit",
            Out::Store(StoreOp::ExpireInbound { .. }) => "expire",
            Out::Store(StoreOp::MarkProcessed(_)) => "mark_processed",
            Out::Store(_) => "store",
            Out::Event(Event::MessageReceived { .. }) => "message_received",
            Out::Event(Event::InboundDrainCompleted { .. }) => "drain_completed",
            Out::Event(Event::SecurityWarning { .. }) => "security_warning",
            Out::Event(Event::Diagnostic { .. }) => "diagnostic",
            Out::Event(_) => "event",
            Out::Transmit(Transmit {
                kind: TransmitKind::DeliveryAck { .. },
                ..
            }) => "ack",
            Out::Transmit(Transmit {
                kind: TransmitKind::ReleaseFrame { .. },
                ..
            }) => "release",
            Out::Transmit(_) => "frame",
        })
        .collect()
}

fn releases_since(sim: &Sim, mark: usize) -> Vec<u64> {
    sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Transmit(Transmit {
                kind: TransmitKind::ReleaseFrame { seq },
                ..
            }) => Some(*seq),
            _ => None,
        })
        .collect()
}

/// End-to-end ACKs since `mark`: (carrier, peer, acknowledged id).
fn acks_since(sim: &Sim, mark: usize) -> Vec<(Carrier, Option<String>, String)> {
    sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Transmit(Transmit {
                carrier,
                peer,
                kind: TransmitKind::DeliveryAck { message },
            }) => Some((
                carrier.clone(),
                peer.clone(),
                message.ack_for().unwrap_or_default().to_owned(),
            )),
            _ => None,
        })
        .collect()
}

fn buffered_since(sim: &Sim, mark: usize) -> Vec<String> {
    sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Store(StoreOp::BufferInbound(rows)) => Some(rows),
            _ => None,
        })
        .flatten()
        .map(|row| row.key.message_id.clone())
        .collect()
}

fn drain_completions(sim: &Sim) -> Vec<(usize, u64)> {
    sim.log
        .iter()
        .enumerate()
        .filter_map(|(at, (_, out))| match out {
            Out::Event(Event::InboundDrainCompleted { count }) => Some((at, *count)),
            _ => None,
        })
        .collect()
}

fn ids(batch: &HookBatch) -> Vec<&str> {
    batch
        .messages
        .iter()
        .map(|m| m.key.message_id.as_str())
        .collect()
}

fn origins(batch: &HookBatch) -> Vec<BatchOrigin> {
    batch.messages.iter().map(|m| m.origin).collect()
}

#[test]
fn a_drain_of_1000_reaches_the_hook_once_each_in_order_in_batches_of_at_most_400() {
    let mut sim = hooked();
    sim.drain_started();
    let mut sizes = Vec::new();
    for n in 0..1000 {
        deliver(&mut sim, &format!("d{n}"), 10_000 + n);
        // The runtime polls the hook after every step; this hook commits at once.
        while let Some(batch) = sim.poll_hook() {
            sizes.push(batch.messages.len());
            sim.hook_result(true);
        }
    }
    assert_eq!(sizes, [400, 400], "the count trigger");
    assert!(drain_completions(&sim).is_empty());
    assert_eq!(sim.journal.len(), 200, "the open batch is not released");

    sim.drain_complete(1000);
    assert!(
        drain_completions(&sim).is_empty(),
        "not before the tail batch commits"
    );
    let tail = sim.poll_hook().expect("DrainComplete forces the tail");
    assert_eq!(tail.messages.len(), 200);

    // A live message arrives while the tail is with the hook: it waits behind it.
    deliver(&mut sim, "live", 20_000);
    assert!(sim.poll_hook().is_none());
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(
        drain_completions(&sim),
        [(sim.log.len() - 1, 1000)],
        "with the tail's verdict, after its messages"
    );
    assert!(sim.log.len() - 1 > mark);
    let live = sim.poll_hook().expect("the live message");
    assert_eq!(ids(&live), ["live"]);
    assert_eq!(origins(&live), [BatchOrigin::Live]);
    sim.hook_result(true);

    let offered: Vec<&str> = sim.offered.iter().flat_map(|(_, b)| ids(b)).collect();
    let expected: Vec<String> = (0..1000).map(|n| format!("d{n}")).collect();
    assert_eq!(offered[..1000], expected, "each once, in arrival order");
    assert_eq!(offered[1000..], ["live"]);
    assert!(sim.offered[..3]
        .iter()
        .all(|(_, b)| origins(b).iter().all(|o| *o == BatchOrigin::Drain)));
    assert_eq!(sim.dispatched.len(), 1001);
    assert!(sim.journal.is_empty(), "every frame released");
    assert!(sim.inbound_rows.is_empty());
    assert_eq!(
        sim.engine.next_deadline(),
        None,
        "nothing buffered, no wake-up"
    );
}

#[test]
fn a_drain_batch_goes_to_the_hook_3_s_after_its_first_message() {
    let mut sim = hooked();
    sim.now = 50_000;
    sim.drain_started();
    let first = sim.now;
    deliver(&mut sim, "d0", 1);
    sim.advance(SEC);
    deliver(&mut sim, "d1", 2);
    sim.advance(SEC);
    deliver(&mut sim, "d2", 3);
    assert!(sim.poll_hook().is_none());
    assert_eq!(sim.engine.next_deadline(), Some(first + 3 * SEC));
    sim.advance_to(first + 3 * SEC - 1);
    assert!(sim.poll_hook().is_none());
    sim.advance_to(first + 3 * SEC);
    let batch = sim.poll_hook().expect("the age trigger");
    assert_eq!(ids(&batch), ["d0", "d1", "d2"]);

    // The next batch's clock starts at its own first message.
    sim.advance(10 * SEC);
    let second = sim.now;
    deliver(&mut sim, "d3", 4);
    assert_eq!(sim.engine.next_deadline(), Some(second + 3 * SEC));
}

#[test]
fn a_drain_batch_closes_before_it_would_pass_its_byte_bound() {
    let mut sim = hooked_with(HookConfig {
        batch_max_bytes: 1000,
        ..HookConfig::default()
    });
    sim.drain_started();
    for n in 0..7 {
        let mut message = message_from(BOB, &format!("d{n}"));
        message.content = "x".repeat(300);
        sim.inbound(message, relay(BOB, 100 + n));
    }
    sim.drain_complete(7);
    let mut sizes = Vec::new();
    while let Some(batch) = sim.poll_hook() {
        sizes.push(batch.messages.len());
        sim.hook_result(true);
    }
    assert_eq!(sizes, [3, 3, 1]);

    // A message that fills the batch exactly still joins it.
    let mut sim = hooked_with(HookConfig {
        batch_max_bytes: 900,
        ..HookConfig::default()
    });
    sim.drain_started();
    for n in 0..4 {
        let mut message = message_from(BOB, &format!("e{n}"));
        message.content = "x".repeat(300);
        sim.inbound(message, relay(BOB, 200 + n));
    }
    sim.drain_complete(4);
    let sizes: Vec<usize> = offered_batches(&mut sim).iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 1]);
}

#[test]
fn a_batch_is_acknowledged_only_after_its_commit_rows_first_then_relay_acks_then_acks() {
    let mut sim = hooked();
    sim.drain_started();
    let mark = sim.mark();
    deliver(&mut sim, "b1", 13);
    let mut quiet = message_from(BOB, "b2");
    quiet.requires_ack = false;
    sim.inbound(quiet, relay(BOB, 11));
    deliver(&mut sim, "b3", 12);
    assert_eq!(
        shape(&sim, mark),
        ["buffer", "buffer", "buffer"],
        "buffered in the step that received each; nothing acknowledged"
    );
    sim.drain_complete(3);
    let batch = sim.poll_hook().unwrap();
    assert_eq!(ids(&batch), ["b1", "b2", "b3"]);
    let mark = sim.mark();
    let committed = sim.hook_result(true);
    assert_eq!(
        shape(&sim, mark),
        [
            "commit",
            "release",
            "release",
            "release",
            "ack",
            "ack",
            "message_received",
            "message_received",
            "message_received",
            "drain_completed"
        ],
        "the app sees the messages after their acknowledgements are out"
    );
    assert_eq!(releases_since(&sim, mark), [11, 12, 13], "in seq order");
    let acked: Vec<String> = acks_since(&sim, mark).into_iter().map(|a| a.2).collect();
    assert_eq!(acked, ["b1", "b3"], "only those that ask");
    assert_eq!(committed.len(), 3);
    assert!(committed.iter().all(|m| m.transport == "internet"));
}

#[test]
fn a_refused_batch_is_not_acknowledged_and_is_offered_again_after_the_backoff() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    let batch = sim.poll_hook().unwrap();
    assert_eq!(origins(&batch), [BatchOrigin::Live]);
    let mark = sim.mark();
    sim.hook_result(false);
    assert_eq!(shape(&sim, mark), ["diagnostic"]);
    assert!(sim.log[mark..].iter().any(|(_, out)| matches!(out,
        Out::Event(Event::Diagnostic { level: DiagnosticLevel::Warn, message })
            if message.contains("refused") && message.contains("disk full"))));
    assert!(sim.poll_hook().is_none());

    // 1 s, 2 s, 4 s … up to 60 s per refusal.
    let mut waits = Vec::new();
    for _ in 0..8 {
        let refused_at = sim.now;
        let due = sim.engine.next_deadline().unwrap();
        waits.push(due - refused_at);
        sim.advance_to(due - 1);
        assert!(sim.poll_hook().is_none(), "not before the backoff");
        sim.advance_to(due);
        let again = sim.poll_hook().expect("offered again");
        assert_eq!(ids(&again), ["b1"]);
        assert_eq!(origins(&again), [BatchOrigin::Redelivery]);
        sim.hook_result(false);
    }
    assert_eq!(
        waits,
        [1, 2, 4, 8, 16, 32, 60, 60].map(|s| s * SEC).to_vec()
    );
    assert!(releases_since(&sim, mark).is_empty());
    assert!(acks_since(&sim, mark).is_empty());

    sim.advance(60 * SEC);
    sim.poll_hook().unwrap();
    let mark = sim.mark();
    let committed = sim.hook_result(true);
    assert_eq!(committed[0].origin, BatchOrigin::Redelivery);
    assert_eq!(releases_since(&sim, mark), [11]);
    assert_eq!(acks_since(&sim, mark).len(), 1);
    assert_eq!(sim.engine.next_deadline(), None);
}

#[test]
fn a_refused_batch_is_retried_only_while_a_carrier_is_up() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    sim.poll_hook().unwrap();
    sim.hook_result(false);
    sim.carrier_down();
    let retention = HookConfig::default().retention_ms;
    assert_eq!(
        sim.engine.next_deadline(),
        Some(retention),
        "only the retention while offline"
    );
    sim.advance(10 * MIN);
    assert!(sim.poll_hook().is_none());
    sim.carrier_up();
    sim.advance(0);
    let batch = sim.poll_hook().expect("due once a carrier is up");
    assert_eq!(origins(&batch), [BatchOrigin::Redelivery]);
}

#[test]
fn a_duplicate_of_a_buffered_message_is_buffered_once_and_its_seq_released_at_the_commit() {
    let mut sim = hooked();
    sim.drain_started();
    let mark = sim.mark();
    deliver(&mut sim, "b1", 11);
    deliver(&mut sim, "b1", 12);
    assert_eq!(buffered_since(&sim, mark), ["b1"]);
    sim.drain_complete(2);
    let batch = sim.poll_hook().unwrap();
    assert_eq!(ids(&batch), ["b1"]);

    // Again while the hook has it.
    let mark = sim.mark();
    deliver(&mut sim, "b1", 13);
    assert!(
        shape(&sim, mark).is_empty(),
        "neither buffered nor released"
    );
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(releases_since(&sim, mark), [11, 12, 13]);
    assert_eq!(acks_since(&sim, mark).len(), 1);
    assert_eq!(sim.offered.len(), 1);
}

#[test]
fn a_redelivery_of_a_refused_message_reenters_at_once_from_the_buffered_copy() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    sim.poll_hook().unwrap();
    sim.hook_result(false);
    sim.advance(100);
    let mark = sim.mark();
    deliver(&mut sim, "b1", 12);
    assert!(buffered_since(&sim, mark).is_empty(), "no second copy");
    let batch = sim.poll_hook().expect("at once, not after the backoff");
    assert_eq!(origins(&batch), [BatchOrigin::Redelivery]);
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(releases_since(&sim, mark), [11, 12]);
    assert_eq!(sim.engine.next_deadline(), None, "its retry went with it");
}

#[test]
fn a_redelivery_during_a_drain_rejoins_the_drain_batch() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    sim.poll_hook().unwrap();
    sim.hook_result(false);
    // Reconnect: the relay drains b1 again, then a new message.
    sim.carrier_down();
    sim.drain_started();
    deliver(&mut sim, "b1", 11);
    deliver(&mut sim, "b2", 12);
    sim.drain_complete(2);
    let batch = sim.poll_hook().unwrap();
    assert_eq!(ids(&batch), ["b1", "b2"]);
    assert_eq!(
        origins(&batch),
        [BatchOrigin::Redelivery, BatchOrigin::Drain]
    );
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(releases_since(&sim, mark), [11, 12]);
    assert_eq!(drain_completions(&sim).len(), 1);
}

#[test]
fn a_duplicate_of_a_committed_message_is_acknowledged_without_the_hook() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    sim.hook_commits_all();
    let mark = sim.mark();
    deliver(&mut sim, "b1", 12);
    assert_eq!(shape(&sim, mark), ["ack", "release"]);
    assert!(sim.poll_hook().is_none());
    assert_eq!(sim.offered.len(), 1);
}

#[test]
fn after_a_restart_buffered_rows_are_offered_again_and_a_redelivery_adds_no_copy() {
    let mut sim = hooked();
    sim.drain_started();
    deliver(&mut sim, "b1", 11);
    deliver(&mut sim, "b2", 12);
    sim.drain_complete(2);
    let first = sim.poll_hook().unwrap();
    assert_eq!(origins(&first), [BatchOrigin::Drain, BatchOrigin::Drain]);

    // The process dies inside the hook.
    sim.advance(5 * SEC);
    sim.restart();
    assert_eq!(sim.inbound_rows.len(), 2);
    let again = sim.poll_hook().expect("offered again from the buffer");
    assert_eq!(ids(&again), ["b1", "b2"]);
    assert_eq!(
        origins(&again),
        [BatchOrigin::Redelivery, BatchOrigin::Redelivery]
    );

    // The relay redelivers both on the new connection while the hook has them.
    sim.drain_started();
    let mark = sim.mark();
    deliver(&mut sim, "b1", 11);
    deliver(&mut sim, "b2", 12);
    sim.drain_complete(2);
    assert!(buffered_since(&sim, mark).is_empty(), "no second copy");
    assert!(releases_since(&sim, mark).is_empty());
    assert_eq!(drain_completions(&sim).len(), 0);
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(releases_since(&sim, mark), [11, 12]);
    assert_eq!(drain_completions(&sim).len(), 1);
    assert_eq!(sim.dispatched.len(), 2);
}

#[test]
fn a_restored_row_committed_before_its_redelivery_is_acknowledged_from_dedup() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    sim.poll_hook().unwrap();
    sim.restart();
    sim.poll_hook().unwrap();
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(
        shape(&sim, mark),
        ["commit", "message_received"],
        "no carrier, no seq known yet"
    );

    sim.drain_started();
    let mark = sim.mark();
    deliver(&mut sim, "b1", 11);
    assert_eq!(shape(&sim, mark), ["ack", "release"]);
    assert!(sim.poll_hook().is_none());
}

#[test]
fn restored_rows_of_processed_messages_are_cleared() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    sim.hook_commits_all();
    // A stale row of b1 (the store crashed between …): the dedup record wins.
    let row = PendingInbound {
        key: key("b1"),
        message: message_from(BOB, "b1"),
        carrier: Carrier::Relay,
        stamped_sender: BOB.to_owned(),
        received_at: 0,
        encrypted: false,
    };
    sim.inbound_rows.insert(key("b1"), row);
    sim.restart();
    assert!(sim.inbound_rows.is_empty());
    assert!(sim.poll_hook().is_none());
}

#[test]
fn a_row_the_hook_never_commits_is_removed_after_retention_with_a_trace() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    sim.poll_hook().unwrap();
    sim.hook_result(false);
    sim.carrier_down();
    let retention = HookConfig::default().retention_ms;
    assert_eq!(retention, 7 * DAY);
    sim.advance_to(retention - 1);
    assert_eq!(sim.inbound_rows.len(), 1);
    let mark = sim.mark();
    sim.advance_to(retention);
    assert_eq!(
        shape(&sim, mark),
        ["expire", "diagnostic", "security_warning", "release"]
    );
    let Out::Event(Event::Diagnostic { level, message }) = &sim.log[mark + 1].1 else {
        panic!()
    };
    assert_eq!(*level, DiagnosticLevel::Warn);
    assert!(message.contains("b1") && message.contains(BOB), "{message}");
    let Out::Event(Event::SecurityWarning {
        peer_id,
        reason_code,
        ..
    }) = &sim.log[mark + 2].1
    else {
        panic!()
    };
    assert_eq!((peer_id.as_str(), *reason_code), (BOB, RETENTION_EXPIRED));
    assert!(acks_since(&sim, mark).is_empty(), "dropped, not delivered");
    assert!(sim.expired.contains(&key("b1")));
    assert_eq!(sim.engine.next_deadline(), None);
}

#[test]
fn retention_waits_for_the_verdict_on_a_batch_with_the_hook() {
    let mut sim = hooked_with(HookConfig {
        timeout_ms: 9 * DAY,
        ..HookConfig::default()
    });
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    deliver(&mut sim, "b2", 12);
    deliver(&mut sim, "b3", 13);
    sim.poll_hook().unwrap();
    sim.advance(7 * DAY);
    assert_eq!(
        sim.expired,
        [key("b2"), key("b3")].into_iter().collect(),
        "the rows not with the hook expire"
    );
    let mark = sim.mark();
    sim.hook_result(false);
    assert_eq!(
        shape(&sim, mark),
        [
            "expire",
            "release",
            "diagnostic",
            "diagnostic",
            "security_warning"
        ],
        "refused past its retention: expired at once"
    );
    assert!(sim.inbound_rows.is_empty());

    // Committed past its retention: a commit like any other.
    deliver(&mut sim, "b4", 14);
    sim.poll_hook().unwrap();
    sim.advance(8 * DAY);
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(
        shape(&sim, mark),
        ["commit", "release", "ack", "message_received"]
    );
}

#[test]
fn a_disconnect_or_a_new_drain_forces_the_pending_batch() {
    let mut sim = hooked();
    sim.drain_started();
    for n in 0..5 {
        deliver(&mut sim, &format!("a{n}"), 100 + n);
    }
    assert!(sim.poll_hook().is_none());
    sim.carrier_down();
    assert_eq!(sim.poll_hook().unwrap().messages.len(), 5);
    sim.hook_result(true);

    sim.drain_started();
    for n in 0..3 {
        deliver(&mut sim, &format!("b{n}"), 200 + n);
    }
    assert!(sim.poll_hook().is_none());
    // The relay connection is replaced without a carrier-down in between.
    sim.drain_started();
    assert_eq!(sim.poll_hook().unwrap().messages.len(), 3);
}

#[test]
fn live_messages_are_batches_of_one_and_local_carriers_are_always_live() {
    let mut sim = hooked();
    sim.carrier_up();
    for n in 0..3 {
        deliver(&mut sim, &format!("l{n}"), 100 + n);
    }
    for n in 0..3 {
        let batch = sim.poll_hook().unwrap();
        assert_eq!(ids(&batch), [format!("l{n}").as_str()]);
        assert_eq!(origins(&batch), [BatchOrigin::Live]);
        sim.hook_result(true);
    }

    // During a relay drain, a message over a local carrier is live and does not wait.
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    sim.drain_started();
    deliver(&mut sim, "d0", 200);
    sim.inbound(message_from(CAROL, "c1"), over_ble(CAROL));
    let batch = sim.poll_hook().unwrap();
    assert_eq!(ids(&batch), ["c1"]);
    assert_eq!(batch.messages[0].transport, BLE);
    assert_eq!(origins(&batch), [BatchOrigin::Live]);
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(
        acks_since(&sim, mark),
        [(
            Carrier::Local(BLE.to_owned()),
            Some(CAROL.to_owned()),
            "c1".to_owned()
        )],
        "the ACK goes back over the link it came by"
    );
    assert!(sim.poll_hook().is_none(), "d0 waits in the drain batch");
}

#[test]
fn the_ack_of_a_message_whose_neighbor_left_takes_the_relay() {
    let mut sim = hooked();
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    sim.inbound(message_from(CAROL, "c1"), over_ble(CAROL));
    sim.poll_hook().unwrap();
    sim.lose(CAROL, BLE);
    sim.carrier_up();
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(
        acks_since(&sim, mark),
        [(Carrier::Relay, None, "c1".to_owned())]
    );
}

#[test]
fn drain_completion_is_immediate_without_a_hook_or_without_messages() {
    let mut sim = Sim::with_defaults();
    sim.drain_started();
    let mark = sim.mark();
    deliver(&mut sim, "b1", 11);
    assert_eq!(
        shape(&sim, mark),
        ["mark_processed", "message_received", "ack", "release"],
        "without a hook nothing changes"
    );
    sim.drain_complete(1);
    assert_eq!(drain_completions(&sim).len(), 1);
    assert!(sim.engine.poll_hook(sim.now).is_none());

    let mut sim = hooked();
    sim.drain_started();
    let mark = sim.mark();
    sim.drain_complete(0);
    assert_eq!(shape(&sim, mark), ["drain_completed"]);
}

#[test]
fn over_the_buffer_bound_a_message_is_left_unacknowledged_for_redelivery() {
    let mut sim = hooked_with(HookConfig {
        max_buffered_messages: 3,
        ..HookConfig::default()
    });
    sim.carrier_up();
    for n in 0..3 {
        deliver(&mut sim, &format!("b{n}"), 100 + n);
    }
    let mark = sim.mark();
    deliver(&mut sim, "b3", 103);
    deliver(&mut sim, "b4", 104);
    assert_eq!(
        shape(&sim, mark),
        ["diagnostic"],
        "neither buffered nor acknowledged; reported once"
    );
    assert_eq!(sim.hook_commits_all(), 3);

    // The relay redelivers them on the next connection.
    sim.carrier_down();
    sim.drain_started();
    let count = sim.redeliver_journal();
    assert_eq!(count, 2);
    sim.drain_complete(count);
    assert_eq!(sim.hook_commits_all(), 1);
    assert!(sim.journal.is_empty());
    assert_eq!(sim.dispatched.len(), 5);
    // Room again: the next time the buffer fills it is reported again.
    for n in 5..9 {
        deliver(&mut sim, &format!("b{n}"), 100 + n);
    }
    let full_reports = sim
        .log
        .iter()
        .filter(|(_, out)| matches!(out, Out::Event(Event::Diagnostic { message, .. }) if message.contains("buffer full")))
        .count();
    assert_eq!(full_reports, 2);
}

#[test]
fn an_idle_hooked_engine_sleeps() {
    let mut sim = hooked();
    sim.carrier_up();
    assert_eq!(sim.engine.next_deadline(), None);
    deliver(&mut sim, "b1", 11);
    assert_eq!(
        sim.engine.next_deadline(),
        Some(HookConfig::default().retention_ms),
        "a buffered row has its retention"
    );
    sim.hook_commits_all();
    assert_eq!(sim.engine.next_deadline(), None);
    assert_eq!(sim.engine.inbound_buffered(), 0);
}

#[test]
fn rows_left_by_a_removed_hook_are_delivered_once_at_start() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    sim.config.durability_hook = None;
    let mark = sim.mark();
    sim.restart();
    assert_eq!(shape(&sim, mark), ["commit", "message_received"]);
    assert!(sim.inbound_rows.is_empty());
    sim.carrier_up();
    let mark = sim.mark();
    deliver(&mut sim, "b1", 11);
    assert_eq!(shape(&sim, mark), ["ack", "release"]);
}

#[test]
fn stale_hook_results_are_ignored() {
    let mut sim = hooked();
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    let batch = sim.poll_hook().unwrap();
    let mark = sim.mark();
    sim.input(Input::HookResult {
        batch_id: batch.id + 1,
        result: Ok(()),
    });
    sim.input(Input::HookResult {
        batch_id: batch.id - 1,
        result: Err("late".into()),
    });
    assert!(shape(&sim, mark).is_empty());
    sim.hook_result(true);
    let mark = sim.mark();
    sim.input(Input::HookResult {
        batch_id: batch.id,
        result: Ok(()),
    });
    assert!(
        shape(&sim, mark).is_empty(),
        "a second verdict changes nothing"
    );
}

#[test]
fn a_batch_the_hook_does_not_settle_in_time_counts_as_refused() {
    let mut sim = hooked_with(HookConfig {
        timeout_ms: 30 * SEC,
        ..HookConfig::default()
    });
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    assert_eq!(sim.engine.inbound_buffered(), 1);
    let first = sim.poll_hook().unwrap();
    assert_eq!(
        sim.engine.next_deadline(),
        Some(sim.now + 30 * SEC),
        "the verdict's deadline wakes the engine"
    );
    let mark = sim.mark();
    sim.advance(30 * SEC - 1);
    assert!(
        sim.hook.is_some(),
        "still with the hook before its deadline"
    );
    sim.advance(1);
    assert!(sim.hook.is_none(), "refused at its deadline");
    assert!(sim.log[mark..].iter().any(|(_, out)| matches!(
        out,
        Out::Event(Event::Diagnostic { message, .. })
            if message.contains("did not settle within 30000 ms")
    )));
    assert!(
        releases_since(&sim, mark).is_empty(),
        "nothing acknowledged"
    );
    assert!(acks_since(&sim, mark).is_empty());

    // The late verdict on the refused batch changes nothing.
    let late = sim.mark();
    sim.input(Input::HookResult {
        batch_id: first.id,
        result: Ok(()),
    });
    assert!(shape(&sim, late).is_empty(), "a late verdict is stale");

    // Offered again after the refusal backoff, and committed this time.
    sim.advance(SEC);
    let again = sim.poll_hook().expect("offered again after the backoff");
    assert_eq!(ids(&again), ["b1"]);
    assert_ne!(again.id, first.id);
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(
        shape(&sim, mark),
        ["commit", "release", "ack", "message_received"]
    );
    assert_eq!(sim.engine.inbound_buffered(), 0);
}

#[test]
fn the_byte_bound_admits_a_message_that_fills_it_exactly() {
    let size = message_from(BOB, "b0").content.len();
    let mut sim = hooked_with(HookConfig {
        max_buffered_bytes: 3 * size,
        ..HookConfig::default()
    });
    sim.drain_started();
    for n in 0..3 {
        deliver(&mut sim, &format!("b{n}"), 100 + n);
    }
    assert_eq!(
        sim.engine.inbound_buffered(),
        3,
        "the third fills it exactly"
    );
    let mark = sim.mark();
    deliver(&mut sim, "b3", 103);
    assert_eq!(
        shape(&sim, mark),
        ["diagnostic"],
        "one byte over is refused"
    );
    assert_eq!(sim.engine.inbound_buffered(), 3);
}

/// The ids of every batch the hook is offered, each committed, until none is left.
fn offered_batches(sim: &mut Sim) -> Vec<Vec<String>> {
    let mut batches = Vec::new();
    while let Some(batch) = sim.poll_hook() {
        batches.push(ids(&batch).into_iter().map(str::to_owned).collect());
        sim.hook_result(true);
    }
    batches
}

/// Five buffered rows (never offered before the restart), restored under `config`.
fn restored_batches(config: HookConfig) -> Vec<Vec<String>> {
    let mut sim = hooked_with(config);
    sim.drain_started();
    for n in 0..5 {
        deliver(&mut sim, &format!("b{n}"), 100 + n);
    }
    sim.restart();
    assert_eq!(sim.engine.inbound_buffered(), 5);
    offered_batches(&mut sim)
}

fn batch_ids(shape: &[&[&str]]) -> Vec<Vec<String>> {
    shape
        .iter()
        .map(|batch| batch.iter().map(|id| (*id).to_owned()).collect())
        .collect()
}

#[test]
fn restored_rows_are_offered_in_batches_closed_by_count() {
    let batches = restored_batches(HookConfig {
        batch_max_messages: 2,
        ..HookConfig::default()
    });
    assert_eq!(
        batches,
        batch_ids(&[&["b0", "b1"], &["b2", "b3"], &["b4"]]),
        "the last partial batch is offered too"
    );
}

#[test]
fn restored_rows_are_offered_in_batches_closed_by_bytes() {
    let size = message_from(BOB, "b0").content.len();
    // Exactly two rows fill a batch.
    let batches = restored_batches(HookConfig {
        batch_max_bytes: 2 * size,
        ..HookConfig::default()
    });
    assert_eq!(batches, batch_ids(&[&["b0", "b1"], &["b2", "b3"], &["b4"]]));
    // Two and a half: a third row would pass the bound, so the batch closes before it.
    let batches = restored_batches(HookConfig {
        batch_max_bytes: 2 * size + size / 2,
        ..HookConfig::default()
    });
    assert_eq!(batches, batch_ids(&[&["b0", "b1"], &["b2", "b3"], &["b4"]]));
}

#[test]
fn two_batches_refused_at_once_are_both_offered_again() {
    let mut sim = hooked_with(HookConfig {
        batch_max_messages: 1,
        ..HookConfig::default()
    });
    sim.drain_started();
    deliver(&mut sim, "b0", 100);
    deliver(&mut sim, "b1", 101);
    sim.drain_complete(2);
    for expected in ["b0", "b1"] {
        let batch = sim.poll_hook().expect("a batch");
        assert_eq!(ids(&batch), [expected]);
        sim.hook_result(false);
    }
    sim.advance(SEC);
    let mut again: Vec<String> = offered_batches(&mut sim).concat();
    again.sort();
    assert_eq!(again, ["b0", "b1"], "neither refusal hides the other");
}

#[test]
fn the_ack_of_a_carried_message_goes_back_to_its_carrier_while_the_link_holds() {
    let mut sim = hooked();
    sim.carrier_up();
    sim.local_up(BLE);
    sim.discover(CAROL, BLE);
    // Carol hands over Bob's message: the relay is up and the direct route to Bob is the relay,
    // but the ACK goes back the way the message came while Carol is still there.
    sim.inbound(message_from(BOB, "b1"), over_ble(CAROL));
    sim.poll_hook().unwrap();
    let mark = sim.mark();
    sim.hook_result(true);
    let (carrier, peer, acked) = acks_since(&sim, mark).pop().expect("an ACK");
    assert_eq!(
        (carrier, peer.as_deref(), acked.as_str()),
        (Carrier::Local(BLE.to_owned()), Some(CAROL), "b1")
    );
}

#[test]
fn the_ack_of_a_committed_message_goes_back_over_the_relay_it_came_by() {
    let mut sim = hooked();
    sim.carrier_up();
    sim.local_up(BLE);
    sim.discover(BOB, BLE);
    // Bob is also a neighbor, the route a new message to him would take; the ACK still goes
    // back the way his message came.
    deliver(&mut sim, "b1", 11);
    sim.poll_hook().unwrap();
    let mark = sim.mark();
    sim.hook_result(true);
    assert_eq!(
        acks_since(&sim, mark),
        [(Carrier::Relay, None, "b1".to_owned())]
    );
}

#[test]
fn a_row_expiring_while_its_batch_waits_leaves_the_other_batches_alone() {
    let mut sim = hooked_with(HookConfig {
        retention_ms: 5 * SEC,
        timeout_ms: 60 * SEC,
        ..HookConfig::default()
    });
    sim.carrier_up();
    deliver(&mut sim, "b0", 10);
    let with_hook = sim.poll_hook().unwrap();
    assert_eq!(ids(&with_hook), ["b0"]);
    // While the hook works on b0, two live messages wait in their own batches.
    deliver(&mut sim, "b1", 11);
    sim.advance(3 * SEC);
    deliver(&mut sim, "b2", 12);
    sim.advance(2 * SEC); // b1's retention ends; b2 has 3 s left
    sim.hook_result(true);
    assert_eq!(offered_batches(&mut sim), batch_ids(&[&["b2"]]));
}

#[test]
fn a_row_past_retention_at_restart_is_removed_with_its_trace() {
    let mut sim = hooked_with(HookConfig {
        retention_ms: 5 * SEC,
        ..HookConfig::default()
    });
    sim.carrier_up();
    deliver(&mut sim, "b1", 11);
    // The device was off longer than the retention.
    sim.now += 10 * SEC;
    let mark = sim.mark();
    sim.restart();
    assert!(
        sim.inbound_rows.is_empty(),
        "the row is gone from the store"
    );
    assert!(shape(&sim, mark).contains(&"expire"));
    assert!(sim.log[mark..].iter().any(|(_, out)| matches!(out,
        Out::Event(Event::SecurityWarning { reason_code, .. }) if *reason_code == RETENTION_EXPIRED)));
    assert!(sim.poll_hook().is_none());
}
