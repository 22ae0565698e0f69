//! Inbound: data messages and delivery ACKs from every carrier, dedup, the sender gate, the
//! durability hook's commits, and the delivery ACKs and frame releases that follow processing.

use courier_proto::message::META_GROUP_ID;
use courier_proto::RichParts;

use super::*;

impl Engine {
    /// A message from a carrier (`docs/delivery.md#processing-order`). A delivery ACK settles its
    /// entry when attributed to the recipient (over an app carrier its peer id is the stamped
    /// identity). A data message is dispatched once per dedup key (`MarkProcessed` +
    /// `message_received`), then given a delivery ACK if it asks for it — also when it is a
    /// duplicate, since the first ACK may have been lost — on the carrier it came by (to that peer
    /// for an app carrier). The relay frame's frame release comes last. The runtime commits store
    /// ops, then dispatches events, then executes transmits, so both ACKs follow the processing
    /// (`docs/delivery.md#ack-after-processing`). Either kind is a reachability edge for the peer
    /// that carried it.
    ///
    /// With `durability_hook` a data message that is not processed yet goes to the durability
    /// pipeline instead (see [`Engine::poll_hook`]): it is buffered (`StoreOp::BufferInbound`,
    /// written at the end of this call) unless it already is, and neither ACK goes out before
    /// the hook committed it. A processed one is re-ACKed and released at once, as without a
    /// hook. frame releases therefore do not come out in seq order across batches: the runtime may
    /// coalesce them into `AckUpTo` only over seqs that are all released.
    ///
    /// Over a local carrier a data message addressed to another device is a copy that neighbor
    /// only carries (a parked message offered on park or probe): it is neither processed nor
    /// acknowledged (a `Debug` diagnostic), and is still an edge for the neighbor.
    pub(super) fn inbound(&mut self, message: Message, origin: InboundOrigin, now: Millis) {
        if origin.carrier.is_addressed() && is_relay_answer(&message.content) {
            // A relay's answer is never a message (`docs/protocol.md#client-processing-order`): dropped unprocessed
            // and unacknowledged; its journal frame is released, it will not get better.
            let text = format!(
                "dropped {} from {}: a relay answer in the message plane",
                message.id, origin.stamped_sender
            );
            self.diagnostic(DiagnosticLevel::Warn, text);
            self.release_frame(&origin);
            return;
        }
        // An opened group message is addressed to its group; a group copy a neighbor carries
        // for another member is addressed to that member, like any carried copy.
        let opened_group = message.metadata.get(META_GROUP_ID) == Some(&message.recipient);
        if message.ack_for().is_none()
            && matches!(origin.carrier, Carrier::Local(_))
            && !self.names_this_device(&message.recipient)
            && !opened_group
        {
            // Nothing routed it here, so it is not ours to deliver, record or acknowledge.
            let text = format!(
                "carried copy of {} for {} from {} not delivered: not addressed to this device",
                message.id, message.recipient, origin.stamped_sender
            );
            self.diagnostic(DiagnosticLevel::Debug, text);
            self.edge(&origin.stamped_sender, now);
            self.send_due(now);
            return;
        }
        if message.ack_for().is_none() {
            match self.gate.check(&message, &origin, now) {
                Verdict::NotControl => {}
                Verdict::Verified => {
                    // Authentic: processed (so a resend is only re-ACKed), handed to the runtime
                    // once (`poll_control`, in this step, before its commit) and never to the
                    // application.
                    let key = InboundKey {
                        chat: message.sender.clone(),
                        sender: message.sender.clone(),
                        message_id: message.id.clone(),
                    };
                    if self.dedup.first_control_sighting(&key, now) {
                        self.store
                            .push_back(StoreOp::MarkControl(ProcessedKey { key, at: now }));
                        self.control.push_back(message.clone());
                    }
                    if message.requires_ack {
                        let ack = message.ack(
                            ack_id(&message.sender, &message.id),
                            now,
                            origin.carrier.name(),
                        );
                        self.ack_back(&origin, ack);
                    }
                    self.release_frame(&origin);
                    return;
                }
                // Dropped before dedup (so a good copy can still enter), never given a delivery
                // ACK; its relay frame is still released (`docs/protocol.md#control-signatures`).
                Verdict::Refused(events) => {
                    self.events.extend(events);
                    self.release_frame(&origin);
                    return;
                }
            }
        }
        let release = match message.ack_for().map(str::to_owned) {
            Some(acked) => {
                self.inbound_ack(&acked, &message, &origin, now);
                true
            }
            None => self.inbound_data(message, &origin, now),
        };
        if release {
            self.release_frame(&origin);
        }
    }

    /// At start, after `restore`: the buffered rows from the store. With `durability_hook` they
    /// are offered to the hook again (origin Redelivery, in the order they were received, in
    /// batches within the count and byte bounds) as soon as no batch is with the hook; rows past
    /// retention are expired now (with their trace). A row whose key is already processed is
    /// cleared (`CommitInbound`). Without `durability_hook` (the hook was removed since) the rows
    /// are delivered at most once as without a hook: cleared and marked processed
    /// (`CommitInbound`), `message_received`, end-to-end ACK.
    pub(super) fn restore_inbound(&mut self, pending: Vec<PendingInbound>, now: Millis) {
        let (processed, fresh): (Vec<PendingInbound>, Vec<PendingInbound>) = pending
            .into_iter()
            .partition(|row| self.dedup.contains(&row.key, now));
        if !processed.is_empty() {
            let keys = processed.into_iter().map(|row| row.key).collect();
            self.store
                .push_back(StoreOp::CommitInbound { keys, at: now });
        }
        match self.hook_and_outputs() {
            (Some(hook), mut sink) => hook.restore(fresh, now, &mut sink),
            (None, _) => self.deliver_restored(fresh, now),
        }
    }

    /// The hook's verdict on batch `batch_id`; a stale id (not the batch with the hook) is
    /// ignored (`docs/delivery.md#durability-hook`).
    ///
    /// - `Ok`: `StoreOp::CommitInbound` for the batch, then a frame release for every seq that
    ///   carried any of its messages (duplicates that arrived while it was buffered included, in
    ///   seq order), then the delivery ACKs of those that ask for one (on the carrier they came
    ///   by while it is usable, else the current route to the sender, else none: the sender's
    ///   resend is re-ACKed from the dedup record).
    /// - `Err`: nothing is acknowledged (a `Warn` diagnostic carries the reason); the batch is
    ///   offered again (origin Redelivery) after `retry_initial_ms` doubling to `retry_max_ms`
    ///   per refusal, counted while a carrier is up, and a relay redelivery of one of its
    ///   messages re-enters that message at once.
    ///
    /// Everything this reports — the committed messages' `message_received` in batch order,
    /// then the rest — follows the step's transmits (`poll_event_after_transmits`): an app sees
    /// a message only once its acknowledgements are on their way.
    pub(super) fn hook_result(&mut self, batch_id: u64, result: Result<(), String>, now: Millis) {
        let before = self.events.len();
        let commit = match self.hook_and_outputs() {
            (Some(hook), mut sink) => hook.resolve(batch_id, result, now, &mut sink),
            (None, _) => None,
        };
        let reported: Vec<Event> = self.events.drain(before..).collect();
        if let Some(Commit { rows }) = commit {
            for (pending, _) in rows {
                self.dedup.record(pending.key.clone(), now);
                self.ack_committed(&pending, now);
                self.after_transmits.push_back(Event::MessageReceived {
                    transport: pending.carrier.name().to_owned(),
                    chat: pending.key.chat,
                    sender: pending.key.sender,
                    message: pending.message,
                    encrypted: pending.encrypted,
                });
            }
        }
        self.after_transmits.extend(reported);
    }

    /// The relay connection on `carrier` advertised `mailbox_v1`: until `DrainComplete` its new
    /// messages are the backlog, batched for the hook (`batch_max_messages`, `batch_max_bytes`,
    /// `batch_max_age_ms` after the batch's first message). A pending drain batch (of an earlier
    /// connection) is forced first. Nothing to do without `durability_hook`.
    pub(super) fn drain_started(&mut self, carrier: Carrier) {
        if let Some(hook) = self.hook.as_mut() {
            hook.drain_started(carrier);
        }
    }

    /// `DrainComplete{count}`: the pending drain batch is forced; `Event::InboundDrainCompleted`
    /// follows when every message that arrived during the drain has committed (or expired) —
    /// at once if there is none, and always at once without `durability_hook`. Batches go to
    /// the hook in the order they closed, so live messages wait behind the drain's tail batch.
    pub(super) fn drain_complete(&mut self, carrier: Carrier, count: u64) {
        match self.hook_and_outputs() {
            (Some(hook), mut sink) => hook.drain_complete(&carrier, count, &mut sink),
            (None, sink) => sink
                .events
                .push_back(Event::InboundDrainCompleted { count }),
        }
    }

    /// Whether `recipient` names this device: its address, or its relay account. An account name
    /// cannot be judged before a relay has said which account is ours, so it counts as ours.
    pub(super) fn names_this_device(&self, recipient: &str) -> bool {
        if recipient == self.local_identity {
            return true;
        }
        if Address::parse(recipient).is_ok() {
            return false;
        }
        self.account.as_deref().is_none_or(|a| a == recipient)
    }

    pub(super) fn inbound_ack(
        &mut self,
        acked: &str,
        ack: &Message,
        origin: &InboundOrigin,
        now: Millis,
    ) {
        // No entry: a repeat ACK for something already settled, or never ours. Nothing to do.
        let Some(key) = self.outbox.key_of_wire(acked) else {
            return;
        };
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        if !inbound::attributed(
            &entry.message.recipient,
            origin,
            ack,
            self.config.encryption,
            now,
        ) {
            let text = format!(
                "ignored ACK for {acked}: carried by {} claiming {}{}, not its recipient",
                origin.stamped_sender,
                ack.sender,
                match &origin.sealed_by {
                    Some(sealer) => format!(", sealed by {sealer}"),
                    None => ", neither sealed nor signed by it".to_owned(),
                }
            );
            self.diagnostic(DiagnosticLevel::Warn, text);
            return;
        }
        let Some(entry) = self.remove(key) else {
            return;
        };
        let recipient = entry.message.recipient;
        self.delivered.insert(entry.message.id.clone());
        let event = Event::MessageDelivered {
            message_id: entry.message.id.clone(),
            recipient: recipient.clone(),
            latency_ms: now.saturating_sub(entry.created_at),
            hop_count: inbound::ack_hop_count(ack),
            transport: origin.carrier.name().to_owned(),
        };
        self.outbox_event(event);
        self.store.push_back(StoreOp::Settle {
            id: entry.message.id,
            recipient: recipient.clone(),
            settlement: Settlement::Delivered,
            at: now,
        });
        // The recipient just proved reachable: its other parked messages go again now.
        self.edge(&recipient, now);
        self.send_due(now);
    }

    /// Returns whether the frame's seq is released now (processed or dropped); with the hook a
    /// buffered message's seq is released when it commits, and one over the buffer bound never.
    pub(super) fn inbound_data(
        &mut self,
        message: Message,
        origin: &InboundOrigin,
        now: Millis,
    ) -> bool {
        let reachable = self
            .lamport
            .saturating_add(MAX_LAMPORT_JUMP)
            .min(MAX_LAMPORT);
        self.lamport = self.lamport.max(message.lamport_clock.min(reachable));
        let transport = origin.carrier.name().to_owned();
        // The chat of a direct message is its sender; a group message's is its group.
        let key = InboundKey {
            chat: groups::chat_of(&message),
            sender: message.sender.clone(),
            message_id: message.id.clone(),
        };
        let mut release = true;
        let mut ack = None;
        // The runtime already holds a chunk's bytes: the hook and the application never see it.
        // Only a chunk of a transfer (its header names one) is: anything else is a message.
        let chunk = file_id(&message).is_some();
        if self.hook.is_some() && !chunk && !self.dedup.contains(&key, now) {
            // With the hook, a message not processed yet goes to the pipeline: its seq and its
            // ACK wait for the commit (or, over the buffer bound, for a redelivery).
            let pending = PendingInbound {
                key,
                message: self.without_malformed_parts(message),
                carrier: origin.carrier.clone(),
                stamped_sender: origin.stamped_sender.clone(),
                received_at: now,
                encrypted: origin.sealed_by.is_some(),
            };
            if let (Some(hook), mut sink) = self.hook_and_outputs() {
                hook.arrive(pending, origin.seq, now, &mut sink);
            }
            release = false;
        } else {
            ack = message
                .requires_ack
                .then(|| self.delivery_ack(&message, now, &transport));
            if (self.hook.is_none() || chunk) && self.dedup.first_sighting(&key, now) {
                self.store.push_back(StoreOp::MarkProcessed(ProcessedKey {
                    key: key.clone(),
                    at: now,
                }));
                if !chunk {
                    let message = self.without_malformed_parts(message);
                    self.events.push_back(Event::MessageReceived {
                        message,
                        chat: key.chat,
                        sender: key.sender,
                        transport,
                        encrypted: origin.sealed_by.is_some(),
                    });
                }
            }
        }
        // The peer that carried it is back: an edge for it (`docs/delivery.md#edge-driven-mode`
        // counts on returning peers that send an inbound frame). Over the relay it may be an old
        // frame from the mailbox; the cost of that false edge is one re-drive and a fresh verdict.
        self.edge(&origin.stamped_sender, now);
        if let Some(account) = &origin.sender_account {
            self.edge(account, now);
        }
        self.send_due(now);
        if let Some(message) = ack {
            self.ack_back(origin, message);
        }
        release
    }

    /// `message` with only the rich parts that keep their rules (`docs/protocol.md#rich-messages`):
    /// a malformed reply link, `rich` or `forwarded_from` is dropped with a `Warn` diagnostic,
    /// and the message is delivered without it.
    fn without_malformed_parts(&mut self, mut message: Message) -> Message {
        let (parts, problems) = RichParts::read(&message);
        if problems.is_empty() {
            return message;
        }
        for problem in problems {
            let text = format!(
                "message {} from {}: dropped its malformed part ({problem})",
                message.id, message.sender
            );
            self.diagnostic(DiagnosticLevel::Warn, text);
        }
        parts.write_to(&mut message);
        message
    }

    /// The end-to-end ACK of a committed (or restored and delivered) message: on the carrier it
    /// came by while that is usable (the relay or gateway up, or the peer still a neighbor
    /// there), else the current route to its sender, else none — the sender's resend is re-ACKed
    /// from dedup.
    pub(super) fn ack_committed(&mut self, pending: &PendingInbound, now: Millis) {
        if !pending.message.requires_ack {
            return;
        }
        let route = match &pending.carrier {
            addressed if addressed.is_addressed() && self.carriers.contains(addressed) => {
                Some((addressed.clone(), None))
            }
            Carrier::Local(name) if self.neighbors.links(name, &pending.stamped_sender) => Some((
                pending.carrier.clone(),
                Some(pending.stamped_sender.clone()),
            )),
            _ => self.route_for(&pending.message.sender).ok(),
        };
        let Some((carrier, peer)) = route else {
            return;
        };
        let ack = self.delivery_ack(&pending.message, now, pending.carrier.name());
        self.transmits.push_back(Transmit {
            carrier,
            peer,
            kind: TransmitKind::DeliveryAck { message: ack },
        });
    }

    /// Buffered rows restored without a hook: delivered at most once, as if they arrived now.
    pub(super) fn deliver_restored(&mut self, mut rows: Vec<PendingInbound>, now: Millis) {
        if rows.is_empty() {
            return;
        }
        rows.sort_by(|a, b| {
            a.received_at
                .cmp(&b.received_at)
                .then_with(|| a.key.cmp(&b.key))
        });
        let mut seen = std::collections::HashSet::new();
        rows.retain(|row| seen.insert(row.key.clone()));
        let keys = rows.iter().map(|row| row.key.clone()).collect();
        self.store
            .push_back(StoreOp::CommitInbound { keys, at: now });
        for row in rows {
            self.dedup.record(row.key.clone(), now);
            self.ack_committed(&row, now);
            let InboundKey { chat, sender, .. } = row.key;
            self.events.push_back(Event::MessageReceived {
                message: row.message,
                chat,
                sender,
                transport: row.carrier.name().to_owned(),
                encrypted: row.encrypted,
            });
        }
    }

    /// An end-to-end ACK back the way the message came: over the relay or the gateway, or to
    /// the peer that handed it over on a local carrier.
    pub(super) fn ack_back(&mut self, origin: &InboundOrigin, ack: Message) {
        let peer = match origin.carrier {
            Carrier::Relay | Carrier::Gateway => None,
            Carrier::Local(_) => Some(origin.stamped_sender.clone()),
        };
        self.transmits.push_back(Transmit {
            carrier: origin.carrier.clone(),
            peer,
            kind: TransmitKind::DeliveryAck { message: ack },
        });
    }

    /// A sealed message that did not open: reported, never acknowledged; its relay frame is
    /// released, since only the sender's re-sealed retry can recover it.
    pub(super) fn undecryptable(
        &mut self,
        message_id: String,
        sender: String,
        origin: &InboundOrigin,
        code: &'static str,
        reason: String,
    ) {
        self.events.push_back(Event::MessageDecryptionFailed {
            message_id,
            sender,
            code,
            reason,
        });
        self.release_frame(origin);
    }

    /// Whether a data message `message_id` from `sender` is known: processed within dedup
    /// retention, or buffered for the durability hook. A runtime asks before it opens a sealed
    /// copy, since a ratchet opens each ciphertext only once.
    pub fn knows_inbound(&mut self, sender: &str, message_id: &str, now: Millis) -> bool {
        let key = InboundKey {
            chat: sender.to_owned(),
            sender: sender.to_owned(),
            message_id: message_id.to_owned(),
        };
        self.dedup.contains(&key, now) || self.hook.as_ref().is_some_and(|h| h.holds(&key))
    }

    /// Whether group message `message_id` from `sender` in `group_id` is known, as
    /// [`Engine::knows_inbound`] asks for a direct message: a runtime opens a group ciphertext
    /// only once.
    pub fn knows_group_inbound(
        &mut self,
        group_id: &str,
        sender: &str,
        message_id: &str,
        now: Millis,
    ) -> bool {
        let key = InboundKey {
            chat: group_id.to_owned(),
            sender: sender.to_owned(),
            message_id: message_id.to_owned(),
        };
        self.dedup.contains(&key, now) || self.hook.as_ref().is_some_and(|h| h.holds(&key))
    }

    /// Releases the relay journal frame that carried an inbound message, if it had one.
    pub(super) fn release_frame(&mut self, origin: &InboundOrigin) {
        if let Some(seq) = origin.seq {
            self.transmits.push_back(Transmit {
                carrier: origin.carrier.clone(),
                peer: None,
                kind: TransmitKind::ReleaseFrame { seq },
            });
        }
    }
}
