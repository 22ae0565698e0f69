//! File chunks: delivered like messages but reported to the runtime's transfer (`poll_chunk`),
//! withdrawn without a trace, and received without the durability hook or `message_received`.

use super::*;
use crate::config::HookConfig;
use crate::FailReason;
use courier_proto::ChunkHeader;

/// Chunk `index` of transfer `file_id` (4 chunks of 1 KiB) to `recipient`, bytes left to the
/// runtime as they are on submission.
fn chunk(recipient: &str, file_id: &str, index: u32) -> SendRequest {
    let header = ChunkHeader {
        file_id: file_id.to_owned(),
        generation: 0,
        index,
        count: 4,
        size: 4096,
        chunk_size: 1024,
        sha256: "0".repeat(64),
        details: None,
    };
    let id = courier_proto::file_chunk_id(file_id, 0, index);
    SendRequest {
        media: Some(serde_json::to_value(header).unwrap()),
        ..request(recipient, Priority::Low, ContentType::FileChunk, &id)
    }
}

fn submit_chunk(sim: &mut Sim, file_id: &str, index: u32) -> String {
    let req = chunk(BOB, file_id, index);
    let id = req.id.clone();
    assert!(sim.submit(req), "the chunk took an outbox entry");
    id
}

/// No message event but the verdict ever names a chunk.
fn assert_no_message_events(sim: &Sim, id: &str) {
    let seen: Vec<&Event> = sim
        .events_of(id)
        .map(|(_, e)| e)
        .filter(|e| !matches!(e, Event::MessageUndeliverable { .. }))
        .collect();
    assert!(seen.is_empty(), "{id} surfaced as {seen:?}");
}

#[test]
fn an_acknowledged_chunk_is_reported_to_the_transfer_only() {
    let mut sim = Sim::with_defaults();
    sim.carrier_up();
    let id = submit_chunk(&mut sim, "f1", 0);
    assert_eq!(sim.engine.stats().outbox_media, 1);
    sim.advance(SEC);
    assert_eq!(
        sim.chunk_outcomes,
        [ChunkOutcome {
            id: id.clone(),
            file_id: "f1".into(),
            result: Ok(()),
        }]
    );
    assert_no_message_events(&sim, &id);
    assert_eq!(sim.engine.stats().outbox_media, 0);
    assert_eq!(sim.engine.next_deadline(), None, "nothing left to do");
}

#[test]
fn a_chunk_out_of_retries_fails_its_transfer_not_the_app() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let id = submit_chunk(&mut sim, "f1", 1);
    sim.advance(DAY);
    assert_eq!(
        sim.chunk_outcomes,
        [ChunkOutcome {
            id: id.clone(),
            file_id: "f1".into(),
            result: Err(FailReason::MaxRetriesExceeded),
        }]
    );
    assert_no_message_events(&sim, &id);
}

#[test]
fn a_verdict_on_a_chunk_names_its_file_and_keeps_it_in_flight() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::relay(UNREACHABLE);
    sim.carrier_up();
    let id = submit_chunk(&mut sim, "f9", 2);
    let verdicts: Vec<Option<String>> = sim
        .events_of(&id)
        .filter_map(|(_, e)| match e {
            Event::MessageUndeliverable { file_id, .. } => Some(file_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(verdicts, [Some("f9".to_owned())]);
    assert_eq!(sim.status(&id), Some(EntryState::InFlight), "not parked");
}

#[test]
fn withdrawn_chunks_leave_without_a_trace() {
    let mut sim = Sim::with_defaults();
    sim.net = Net::silent_peer();
    sim.carrier_up();
    let sent = submit_chunk(&mut sim, "f1", 0);
    // One waits in the pre-session queue: withdrawn from there too.
    let mut config = Config::new("chat");
    config.encryption = true;
    let mut sealed = Sim::new(config);
    let waiting_req = chunk(BOB, "f2", 0);
    let waiting = waiting_req.id.clone();
    sealed.submit(waiting_req);
    assert_eq!(sealed.status(&waiting), Some(EntryState::AwaitingSession));

    for (sim, id) in [(&mut sim, sent), (&mut sealed, waiting)] {
        let unknown = "not-a-chunk".to_owned();
        sim.input(Input::CancelChunks {
            ids: vec![id.clone(), unknown],
        });
        assert_eq!(sim.status(&id), None);
        assert!(sim.rows.is_empty(), "its row is gone");
        sim.advance(DAY);
        assert!(sim.chunk_outcomes.is_empty());
        assert_no_message_events(sim, &id);
    }
}

#[test]
fn a_restored_chunk_still_reports_to_its_transfer() {
    let mut sim = Sim::with_defaults();
    let id = submit_chunk(&mut sim, "f1", 3);
    sim.restart();
    sim.carrier_up();
    sim.advance(SEC);
    assert_eq!(sim.chunk_outcomes.len(), 1);
    assert_eq!(sim.chunk_outcomes[0].id, id);
    assert_no_message_events(&sim, &id);
}

#[test]
fn an_inbound_chunk_is_acknowledged_at_once_even_with_the_hook() {
    let mut config = Config::new("chat");
    config.durability_hook = Some(HookConfig::default());
    let mut sim = Sim::new(config);
    sim.carrier_up();
    let mut message = message_from(BOB, "c1");
    message.content_type = ContentType::FileChunk;
    message.media_metadata = chunk(ALICE, "f1", 0).media;
    let origin = InboundOrigin {
        carrier: Carrier::Relay,
        stamped_sender: BOB.to_owned(),
        sender_account: None,
        seq: Some(1),
        sealed_by: None,
    };
    let mark = sim.mark();
    sim.inbound(message.clone(), origin.clone());
    let outputs: Vec<&'static str> = sim.log[mark..]
        .iter()
        .filter_map(|(_, out)| match out {
            Out::Store(StoreOp::MarkProcessed(_)) => Some("processed"),
            Out::Store(StoreOp::BufferInbound(_)) => Some("buffered"),
            Out::Event(Event::MessageReceived { .. }) => Some("received"),
            Out::Transmit(Transmit {
                kind: TransmitKind::DeliveryAck { .. },
                ..
            }) => Some("ack"),
            Out::Transmit(Transmit {
                kind: TransmitKind::ReleaseFrame { .. },
                ..
            }) => Some("release"),
            _ => None,
        })
        .collect();
    assert_eq!(outputs, ["processed", "ack", "release"]);
    assert!(sim.poll_hook().is_none());
    assert!(sim.engine.knows_inbound(BOB, "c1", sim.now));

    let mark = sim.mark();
    sim.inbound(
        message,
        InboundOrigin {
            seq: Some(2),
            ..origin
        },
    );
    let again = sim.log[mark..]
        .iter()
        .filter(|(_, out)| {
            matches!(
                out,
                Out::Transmit(Transmit {
                    kind: TransmitKind::DeliveryAck { .. },
                    ..
                })
            )
        })
        .count();
    assert_eq!(
        again, 1,
        "a repeat is acknowledged again, never processed twice"
    );
}
