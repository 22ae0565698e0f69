//! Turns what a step saw into ledger entries. The driver tells the observer the inputs it
//! applies and the batches it offers the hook; the step host hands it the step's events and
//! store ops just before the commit, which writes the entries.
//!
//! What the engine does not say as an event is inferred from what it does say: a parked
//! message handed to a carrier again was *re-driven* when a reachability edge reached its
//! recipient in the same step (`docs/delivery.md#reachability-edges`), else it is a timed
//! *probe*, and its next write says so.

use std::collections::{HashMap, HashSet};

use courier_engine::io::{EntryState, OutboxRecord};
use courier_engine::{
    Carrier, CarrierAnswer, Event, HookBatch, InboundKey, Input, Millis, StoreOp,
};

use courier_proto::wire_id::wire_id;

use super::{Direction, Entry, Kind};
use crate::event::ClientEvent;

/// A reachability edge seen in the current step.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Edge {
    /// The relay (or a gateway) came up: an edge for every recipient.
    CarrierUp(&'static str),
    /// The relay's presence says `peer` is online.
    Online(String),
    /// `peer` came in range of app carrier `carrier`.
    Neighbor { peer: String, carrier: String },
}

impl Edge {
    fn reaches(&self, recipient: &str) -> bool {
        match self {
            Self::CarrierUp(_) => true,
            Self::Online(peer) | Self::Neighbor { peer, .. } => peer == recipient,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::CarrierUp(carrier) => format!("the {carrier} connected"),
            Self::Online(peer) => format!("the relay saw {peer} come online"),
            Self::Neighbor { peer, carrier } => format!("{peer} came in range over {carrier}"),
        }
    }
}

/// The observer's memory between steps, bounded by the outbox (live outbound messages) and by
/// the one batch the durability hook holds at a time.
#[derive(Debug, Default)]
pub struct Observer {
    /// Entries seen since the last commit that no event carries: acceptances, carrier answers,
    /// hook offers and verdicts.
    noted: Vec<Entry>,
    edges: Vec<Edge>,
    /// Live outbound messages: id → recipient.
    recipients: HashMap<String, String>,
    /// Their wire ids (`docs/protocol.md#message-ids`), which carriers answer by: wire id → id.
    wire_ids: HashMap<String, String>,
    /// Parked outbound messages (custody or unreachable): id → recipient.
    parked: HashMap<String, String>,
    /// Parked messages handed to a carrier for a timed probe, not written yet.
    probing: HashSet<String>,
    /// The batches offered to the hook and not answered yet: their messages.
    batches: HashMap<u64, Vec<InboundKey>>,
}

impl Observer {
    /// An observer that knows the outbox as storage holds it at start.
    pub fn restore(outbox: &[OutboxRecord]) -> Self {
        let mut observer = Self::default();
        for record in outbox.iter().filter(|r| !is_chunk(r)) {
            let (id, recipient) = (&record.message.id, &record.message.recipient);
            observer.recipients.insert(id.clone(), recipient.clone());
            observer.wire_ids.insert(wire_id(id), id.clone());
            if record.state == EntryState::Parked {
                observer.parked.insert(id.clone(), recipient.clone());
            }
        }
        observer
    }

    /// `sendMessage` accepted `id` for `recipient`.
    /// A repeat of an id still in the outbox is no new life: it is not noted.
    pub fn accepted(&mut self, id: &str, recipient: &str, now: Millis) {
        if self
            .recipients
            .insert(id.to_owned(), recipient.to_owned())
            .is_some()
        {
            return;
        }
        self.wire_ids.insert(wire_id(id), id.to_owned());
        self.note(Direction::Outbound, id, recipient, now, Kind::Accepted);
    }

    /// An input the driver is about to apply.
    pub fn input(&mut self, input: &Input, now: Millis) {
        match input {
            Input::Answer {
                id: wire, answer, ..
            } => {
                // Only the messages the ledger follows: a file chunk's answers are its transfer's.
                let Some(id) = self.wire_ids.get(wire).cloned() else {
                    return;
                };
                let id = &id;
                let recipient = self.recipients.get(id).cloned().unwrap_or_default();
                let (disposition, cause) = match answer {
                    CarrierAnswer::Live => {
                        self.parked.remove(id);
                        self.probing.remove(id);
                        ("live", None)
                    }
                    CarrierAnswer::Stored => ("stored", None),
                    CarrierAnswer::Unreachable(cause) => {
                        ("unreachable", Some(cause.as_str().to_owned()))
                    }
                };
                let kind = Kind::Answer {
                    disposition: disposition.to_owned(),
                    cause,
                };
                self.note(Direction::Outbound, id, &recipient, now, kind);
            }
            Input::HookResult { batch_id, result } => {
                let batch = *batch_id;
                for key in self.batches.remove(&batch).unwrap_or_default() {
                    let kind = match result {
                        Ok(()) => Kind::HookCommitted { batch },
                        Err(reason) => Kind::HookRefused {
                            batch,
                            reason: reason.clone(),
                        },
                    };
                    self.note(Direction::Inbound, &key.message_id, &key.sender, now, kind);
                }
            }
            Input::CarrierUp(Carrier::Relay) => self.edges.push(Edge::CarrierUp("relay")),
            Input::CarrierUp(Carrier::Gateway) => self.edges.push(Edge::CarrierUp("gateway")),
            Input::Presence {
                peer, online: true, ..
            } => self.edges.push(Edge::Online(peer.clone())),
            Input::NeighborDiscovered { peer, carrier } => self.edges.push(Edge::Neighbor {
                peer: peer.clone(),
                carrier: carrier.clone(),
            }),
            _ => {}
        }
    }

    /// The batch just offered to the durability hook: its entries go with the next commit.
    pub fn offered(&mut self, batch: &HookBatch, now: Millis) {
        let keys = batch.messages.iter().map(|m| m.key.clone()).collect();
        for message in &batch.messages {
            let kind = Kind::HookOffered {
                batch: batch.id,
                origin: message.origin.as_str().to_owned(),
            };
            let key = &message.key;
            self.note(Direction::Inbound, &key.message_id, &key.sender, now, kind);
        }
        self.batches.insert(batch.id, keys);
    }

    /// The entries of a step about to commit `ops`, with `events` in their order.
    pub fn step(&mut self, ops: &[StoreOp], events: &[&ClientEvent], now: Millis) -> Vec<Entry> {
        let noted = std::mem::take(&mut self.noted);
        let (answers, mut entries): (Vec<Entry>, Vec<Entry>) = noted
            .into_iter()
            .partition(|e| matches!(e.kind, Kind::Answer { .. }));
        let next_at: HashMap<&str, Option<Millis>> = ops
            .iter()
            .filter_map(|op| match op {
                StoreOp::Put(record) => Some((record.message.id.as_str(), record.next_at)),
                _ => None,
            })
            .collect();
        let probe_at = |id: &str| next_at.get(id).copied().flatten();
        for op in ops {
            match op {
                StoreOp::Put(record) if record.state != EntryState::Parked => {
                    self.unparked(&record.message.id, now, &mut entries)
                }
                StoreOp::BufferInbound(batch) => {
                    entries.extend(batch.iter().map(|pending| Entry {
                        direction: Direction::Inbound,
                        message_id: pending.key.message_id.clone(),
                        peer: pending.key.sender.clone(),
                        at: pending.received_at,
                        kind: Kind::Buffered {
                            carrier: pending.carrier.name().to_owned(),
                        },
                    }))
                }
                StoreOp::ExpireInbound { keys } => entries.extend(keys.iter().map(|key| Entry {
                    direction: Direction::Inbound,
                    message_id: key.message_id.clone(),
                    peer: key.sender.clone(),
                    at: now,
                    kind: Kind::Expired,
                })),
                _ => {}
            }
        }
        for event in events {
            let Some(event) = event.engine() else {
                continue;
            };
            self.event(event, now, &probe_at, &mut entries);
        }
        self.edges.clear();
        for answer in answers {
            place_answer(&mut entries, answer);
        }
        entries
    }

    fn event(
        &mut self,
        event: &Event,
        now: Millis,
        probe_at: &dyn Fn(&str) -> Option<Millis>,
        entries: &mut Vec<Entry>,
    ) {
        let outbound = |id: &str, peer: &str, kind: Kind| Entry {
            direction: Direction::Outbound,
            message_id: id.to_owned(),
            peer: peer.to_owned(),
            at: now,
            kind,
        };
        match event {
            Event::MessageSent {
                message_id,
                recipient,
                transport,
                attempt,
                ..
            } => {
                let probe = self.probing.remove(message_id);
                let kind = Kind::Attempt {
                    carrier: transport.clone(),
                    attempt: *attempt,
                    probe,
                };
                entries.push(outbound(message_id, recipient, kind));
            }
            Event::MessageDeferred {
                message_id,
                recipient,
                reason,
                retry_count,
                next_retry_at,
            } => {
                let kind = Kind::Deferred {
                    reason: reason.clone(),
                    retry_count: *retry_count,
                    next_retry_at: *next_retry_at,
                };
                entries.push(outbound(message_id, recipient, kind));
            }
            Event::MessageStored {
                message_id,
                recipient,
            } => {
                self.parked.insert(message_id.clone(), recipient.clone());
                let kind = Kind::Custody {
                    next_probe_at: probe_at(message_id),
                };
                entries.push(outbound(message_id, recipient, kind));
            }
            Event::MessageUndeliverable {
                message_id,
                recipient,
                reason_code,
                file_id: None,
                ..
            } => {
                self.parked.insert(message_id.clone(), recipient.clone());
                let kind = Kind::Parked {
                    cause: reason_code.as_str().to_owned(),
                    next_probe_at: probe_at(message_id),
                };
                entries.push(outbound(message_id, recipient, kind));
            }
            Event::MessageRetrying {
                message_id,
                recipient,
                retry_count,
                next_retry_at,
            } => {
                let kind = Kind::Retrying {
                    ladder_step: *retry_count,
                    next_retry_at: *next_retry_at,
                };
                entries.push(outbound(message_id, recipient, kind));
            }
            Event::MessageDelivered {
                message_id,
                recipient,
                latency_ms,
                transport,
                ..
            } => {
                self.settled(message_id);
                let kind = Kind::Delivered {
                    carrier: transport.clone(),
                    from: recipient.clone(),
                    latency_ms: *latency_ms,
                };
                entries.push(outbound(message_id, recipient, kind));
            }
            Event::MessageFailed {
                message_id,
                recipient,
                reason,
                retry_count,
            } => {
                self.settled(message_id);
                let kind = Kind::Failed {
                    reason: reason.as_str().to_owned(),
                    retry_count: *retry_count,
                };
                entries.push(outbound(message_id, recipient, kind));
            }
            Event::MessageReceived {
                message,
                sender,
                transport,
                encrypted,
                ..
            } => entries.push(Entry {
                direction: Direction::Inbound,
                message_id: message.id.clone(),
                peer: sender.clone(),
                at: now,
                kind: Kind::Received {
                    carrier: transport.clone(),
                    encrypted: *encrypted,
                },
            }),
            Event::MessageDecryptionFailed {
                message_id,
                sender,
                code,
                reason,
            } => entries.push(Entry {
                direction: Direction::Inbound,
                message_id: message_id.clone(),
                peer: sender.clone(),
                at: now,
                kind: Kind::DecryptionFailed {
                    code: (*code).to_owned(),
                    reason: reason.clone(),
                },
            }),
            _ => {}
        }
    }

    /// A parked message left its park in this step: re-driven when an edge of the step reached
    /// its recipient (an entry names the edge), else handed out for a timed probe.
    fn unparked(&mut self, id: &str, now: Millis, entries: &mut Vec<Entry>) {
        let Some(recipient) = self.parked.get(id) else {
            return;
        };
        match self.edges.iter().find(|edge| edge.reaches(recipient)) {
            Some(edge) => {
                entries.push(Entry {
                    direction: Direction::Outbound,
                    message_id: id.to_owned(),
                    peer: recipient.clone(),
                    at: now,
                    kind: Kind::Redriven {
                        trigger: edge.describe(),
                    },
                });
                self.parked.remove(id);
                self.probing.remove(id);
            }
            None => {
                self.probing.insert(id.to_owned());
            }
        }
    }

    fn settled(&mut self, id: &str) {
        self.recipients.remove(id);
        self.wire_ids.remove(&wire_id(id));
        self.parked.remove(id);
        self.probing.remove(id);
    }

    fn note(&mut self, direction: Direction, id: &str, peer: &str, at: Millis, kind: Kind) {
        self.noted.push(Entry {
            direction,
            message_id: id.to_owned(),
            peer: peer.to_owned(),
            at,
            kind,
        });
    }

    /// A failed commit wrote none of the step's entries: the offers and verdicts it noted are
    /// dropped with it, as the engine rebuilt from storage forgets them too.
    pub fn roll_back(&mut self, outbox: &[OutboxRecord]) {
        *self = Self::restore(outbox);
    }
}

/// A carrier's answer goes right after the write of the same step it answers (the write and its
/// answer often reach the driver together), else first: it caused what the step did next.
fn place_answer(entries: &mut Vec<Entry>, answer: Entry) {
    let written = entries.iter().rposition(|e| {
        e.message_id == answer.message_id
            && e.direction == Direction::Outbound
            && matches!(e.kind, Kind::Attempt { .. })
    });
    match written {
        Some(i) => entries.insert(i + 1, answer),
        None => {
            let first = entries
                .iter()
                .position(|e| e.message_id == answer.message_id)
                .unwrap_or(entries.len());
            entries.insert(first, answer)
        }
    }
}

/// File chunks are followed by their transfer (`docs/delivery.md#file-transfers`), not the ledger.
fn is_chunk(record: &OutboxRecord) -> bool {
    record.message.content_type == courier_proto::ContentType::FileChunk
}
