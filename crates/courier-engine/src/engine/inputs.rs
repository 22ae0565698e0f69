//! The engine's inputs other than inbound traffic: sends, restore, carriers, reports from the
//! carriers, presence, neighbors and time.

use super::*;

impl Engine {
    /// The relay authenticated this device as `account`: a message named to that account is for
    /// this device too.
    pub(super) fn account_name(&mut self, account: String) {
        self.account = Some(account);
    }

    /// Loads what storage holds at start: the inbound dedup keys, the outbox, then the buffered
    /// inbound rows (see `restore_inbound`). Entries past the absolute
    /// cap settle as "Outbox lifetime exceeded"; the others get a fresh window, keep their
    /// counters and are re-driven as soon as a carrier is up (a restart is a reachability edge,
    /// and an in-flight entry's pending ACK died with the old process). A parked entry gets a
    /// fresh ACK budget (the edge) and comes back parked; the record does not say which kind,
    /// so it resumes as relay custody and the relay's next answer says what it is now (an
    /// unreachable verdict parks it as such, with `message_undeliverable`). The capacity bounds
    /// apply, oldest first. Every kept entry gets a Put.
    pub(super) fn restore(&mut self, restore: Restore, now: Millis) {
        let Restore {
            outbox: mut records,
            processed,
            controls,
            inbound,
            group_sends,
        } = restore;
        self.dedup.restore(processed, controls, now);
        self.restore_groups(group_sends);
        records.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.message.id.cmp(&b.message.id))
        });
        for record in records {
            self.lamport = self
                .lamport
                .max(record.message.lamport_clock.min(MAX_LAMPORT));
            let wire_id = courier_proto::wire_id(&record.message.id);
            self.track_chunk(&record.message);
            if self.outbox.key_of(&record.message.id).is_some()
                || self.outbox.key_of_wire(&wire_id).is_some()
            {
                self.diagnostic(
                    DiagnosticLevel::Warn,
                    format!("restore: duplicate outbox row {}", record.message.id),
                );
                continue;
            }
            if record.state == EntryState::AwaitingSession {
                let waiting = Waiting {
                    message: record.message,
                    wire_id,
                    created_at: record.created_at,
                };
                self.restore_waiting(waiting, now);
                continue;
            }
            if now >= outbox::absolute_cap(record.created_at, &self.config) {
                let Message { id, recipient, .. } = record.message;
                let reason = FailReason::OutboxLifetimeExceeded;
                self.emit_failed(id, recipient, reason, record.ack_attempts, now);
                continue;
            }
            let parked = record.state == EntryState::Parked;
            let entry = Entry {
                wire_id,
                phase: Phase::Queued {
                    at: now,
                    expires_at: outbox::expires_at(record.created_at, now, &self.config),
                },
                message: record.message,
                created_at: record.created_at,
                window_start: now,
                ack_attempts: if parked { 0 } else { record.ack_attempts },
                transport_retries: record.transport_retries,
                first_sent_at: record.first_sent_at,
                last_sent_at: record.last_sent_at,
                park: parked.then_some(Park::Custody),
                timed_probes: 0,
            };
            let copy = entry.class() == Class::GroupCopy;
            self.make_room(entry.class(), now);
            let key = self.admit(entry);
            if copy {
                self.restore_copy(key, now);
            }
        }
        self.resume_groups(now);
        self.restore_inbound(inbound, now);
    }

    /// A pre-session row at restore: the bounds apply as at acceptance, so a queue written under
    /// other bounds cannot grow past them; past its lifetime it fails now. The session is asked
    /// for again. Without `encryption` (turned off since) it goes to the outbox.
    fn restore_waiting(&mut self, waiting: Waiting, now: Millis) {
        let lifetime = self.config.pending_session_max_lifetime_ms;
        if !self.config.encryption {
            self.make_room(Class::of(waiting.message.content_type), now);
            self.enter_outbox(waiting, now);
        } else if waiting.created_at.saturating_add(lifetime) <= now {
            let Message { id, recipient, .. } = waiting.message;
            self.emit_failed(
                id,
                recipient,
                FailReason::PendingSessionLifetimeExceeded,
                0,
                now,
            );
        } else {
            self.queue_for_session(waiting, now);
        }
    }

    /// Accepts a send (`docs/delivery.md#repeated-ids`). An id already in the outbox, or one
    /// storage remembers as delivered, is a no-op: the caller is answered with that id and
    /// nothing changes. A failed id is accepted again. Otherwise the Put comes out in this call
    /// (the runtime commits it before resolving), then the Transmit when a route and an
    /// in-flight slot are free, else `message_deferred`. A full outbox first evicts its oldest
    /// entry of the same class.
    pub(super) fn send(&mut self, req: SendRequest, now: Millis) {
        let SendRequest {
            id,
            settled,
            recipient,
            content,
            content_type,
            priority,
            metadata,
            binary_content,
            media,
            rich,
        } = req;
        let wire_id = courier_proto::wire_id(&id);
        // Two app ids with one wire id would be one message on the wire: the second is a
        // duplicate of the first.
        let known = self.outbox.key_of(&id).is_some()
            || self.outbox.key_of_wire(&wire_id).is_some()
            || self.presession.holds(&id)
            || self.presession.holds(&wire_id);
        let delivered = settled == Some(Settlement::Delivered) || self.delivered.contains(&id);
        if delivered || known {
            return;
        }
        // A signed control frame (a connection request and its answers) is what comes before a
        // session: it never waits for one (`docs/delivery.md#connection-requests`).
        let awaits_session = self.config.encryption
            && !self.sessions.contains(&recipient)
            && !courier_proto::is_signature_gated(&content);
        if !awaits_session {
            self.make_room(Class::of(content_type), now);
        }
        self.lamport = self.lamport.saturating_add(1).min(MAX_LAMPORT);
        let mut message = Message {
            id,
            sender: self.local_identity.clone(),
            recipient,
            app_id: self.config.app_id.clone(),
            priority,
            ttl: DEFAULT_TTL,
            hop_count: 0,
            timestamp: now,
            lamport_clock: self.lamport,
            content_type,
            content,
            metadata,
            requires_ack: true,
            reply_to_msg: None,
            rich: None,
            binary_content: binary_content.map(Value::String),
            media_metadata: media,
            forwarded_from: None,
            reply_context: None,
            encrypted: None,
        };
        rich.write_to(&mut message);
        self.track_chunk(&message);
        let waiting = Waiting {
            message,
            wire_id,
            created_at: now,
        };
        if awaits_session {
            self.await_session(waiting, now);
        } else {
            self.enter_outbox(waiting, now);
        }
    }

    /// A message whose recipient has a session: into the outbox, and out at once when a route
    /// and an in-flight slot are free, else `message_deferred`.
    fn enter_outbox(&mut self, waiting: Waiting, now: Millis) {
        let Waiting {
            message,
            wire_id,
            created_at,
        } = waiting;
        let entry = Entry {
            wire_id,
            message,
            created_at,
            window_start: now,
            ack_attempts: 0,
            transport_retries: 0,
            first_sent_at: None,
            last_sent_at: None,
            park: None,
            timed_probes: 0,
            phase: Phase::Queued {
                at: now,
                expires_at: outbox::expires_at(created_at, now, &self.config),
            },
        };
        let key = self.admit(entry);
        match self.sendable(key) {
            Ok(route) => self.transmit(key, route, now),
            Err(reason) => self.emit_deferred(key, reason, None),
        }
    }

    /// Into the pre-session queue (`docs/delivery.md#pre-session-queue`): stored, reported as
    /// deferred, and — the first time for its recipient — a session asked for. What the bounds
    /// push out fails with `Pending session queue capacity exceeded`.
    fn await_session(&mut self, waiting: Waiting, now: Millis) {
        self.store
            .push_back(StoreOp::Put(waiting.record(&self.config)));
        self.outbox_event(Event::MessageDeferred {
            message_id: waiting.message.id.clone(),
            recipient: waiting.message.recipient.clone(),
            reason: REASON_AWAITING_SESSION.to_owned(),
            retry_count: 0,
            next_retry_at: None,
        });
        self.queue_for_session(waiting, now);
    }

    /// Admits `waiting` to the pre-session queue, failing what its bounds push out, and asks for
    /// the recipient's session if nobody has yet.
    fn queue_for_session(&mut self, waiting: Waiting, now: Millis) {
        let recipient = waiting.message.recipient.clone();
        for evicted in self.presession.admit(waiting, now) {
            let Message { id, recipient, .. } = evicted.message;
            let reason = FailReason::PendingSessionCapacityExceeded;
            self.emit_failed(id, recipient, reason, 0, now);
        }
        self.want_session(recipient);
    }

    fn want_session(&mut self, recipient: String) {
        if self.wanted.insert(recipient.clone()) {
            self.session_wanted.push_back(recipient);
        }
    }

    /// The recipient came online while its messages wait, or its re-ask timer ran out: whatever
    /// setup found before (no key package, a round trip refused for an unknown device, a setup
    /// frame lost in transit), it is worth asking again.
    fn ask_session_again(&mut self, recipient: String) {
        if !self.session_wanted.contains(&recipient) {
            self.wanted.insert(recipient.clone());
            self.session_wanted.push_back(recipient);
        }
    }

    /// The runtime holds a session with `recipient`: what waited for it enters the outbox, in
    /// the order it was accepted. A session that replaces an earlier one (this device joined the
    /// one that won a tie) also sends again, now, what was sealed for the old one and awaits its
    /// ACK: the peer cannot open it, and waiting out the ACK timeout would only delay it
    /// (`docs/delivery.md#sealed-messages`).
    pub(super) fn session_ready(&mut self, recipient: String, now: Millis) {
        self.wanted.remove(&recipient);
        self.session_wanted.retain(|r| *r != recipient);
        for waiting in self.presession.take(&recipient) {
            self.make_room(Class::of(waiting.message.content_type), now);
            self.enter_outbox(waiting, now);
        }
        if !self.sessions.insert(recipient.clone()) {
            self.resend_sealed_for_old_session(&recipient, now);
        }
    }

    /// Every attempt to `recipient` in flight (handed to a carrier, or written and awaiting its
    /// ACK) goes back to the queue, due now, with no retry spent: the attempt was lost to the
    /// session change, not to the peer. A later report on the old attempt is stale and ignored.
    /// A group copy carries its group's ciphertext, never sealed in this session: it stays.
    fn resend_sealed_for_old_session(&mut self, recipient: &str, now: Millis) {
        let mut resent = 0;
        for key in self.outbox.keys_to(recipient) {
            let in_flight = self
                .outbox
                .get(key)
                .is_some_and(|e| e.current_send_seq().is_some() && e.class() != Class::GroupCopy);
            if in_flight && self.requeue(key, now, now) {
                resent += 1;
            }
        }
        if resent > 0 {
            self.diagnostic(
                DiagnosticLevel::Debug,
                format!(
                    "the session with {recipient} changed: {resent} message(s) sealed for the \
                     old one go again"
                ),
            );
            self.send_due(now);
        }
    }

    /// A carrier became available. `Carrier::Local(name)` registers an app-supplied carrier
    /// (it reaches only the neighbors reported for it). An addressed carrier (`Relay`,
    /// `Gateway`) is the reconnect flush and a reachability edge for everyone: every parked entry
    /// gets a fresh budget, every queued or resting entry is due now, the first `flush_batch` go
    /// in this call and the rest on the following `Input::Timeout`s.
    pub(super) fn carrier_up(&mut self, carrier: Carrier, now: Millis) {
        match &carrier {
            Carrier::Relay | Carrier::Gateway => {
                self.carriers.insert(carrier);
                self.edge_all(now);
                for key in self.timers.queued_later_than(now) {
                    self.bring_forward(key, now);
                }
                self.send_due(now);
            }
            Carrier::Local(name) => {
                self.neighbors.register(name);
                self.carriers.insert(carrier);
            }
        }
    }

    /// A carrier is gone (for a local carrier: unregistered, with all its neighbor links).
    /// Frames handed to it and not written are failed sends; written ones keep their ACK timers
    /// (the ACK may still come back by another way or after reconnect). With a durability hook,
    /// a drain batch pending on that carrier goes to the hook now and its drain ends there (no
    /// `DrainComplete` will come for that connection).
    pub(super) fn carrier_down(&mut self, carrier: Carrier, now: Millis) {
        self.carriers.remove(&carrier);
        if let Some(hook) = self.hook.as_mut() {
            hook.carrier_down(&carrier);
        }
        match &carrier {
            Carrier::Relay => {
                self.presence.disconnect();
                self.groups_relay_down(now);
            }
            Carrier::Gateway => {}
            Carrier::Local(name) => {
                self.neighbors.unregister(name);
            }
        }
        for key in self.timers.handed() {
            let on_this_carrier = self.outbox.get(key).is_some_and(
                |entry| matches!(&entry.phase, Phase::Handed { carrier: c, .. } if *c == carrier),
            );
            if on_this_carrier {
                self.transport_failure(key, REASON_CARRIER_DOWN, now);
            }
        }
    }

    /// The carrier wrote attempt `send_seq`: the ACK timer starts now
    /// (`docs/delivery.md#ack-ladder`).
    pub(super) fn written(&mut self, id: &str, send_seq: u64, now: Millis) {
        if let Some(key) = self.outbox.key_of_wire(id) {
            let handed = self.outbox.get(key).is_some_and(
                |entry| matches!(entry.phase, Phase::Handed { send_seq: s, .. } if s == send_seq),
            );
            if handed {
                self.mark_written(key, now);
            }
        }
    }

    /// Attempt `send_seq` did not make it (carrier error, relay `Error{internal}`, `RateLimited`,
    /// no relay answer within 15 s, connection loss, an app carrier's rejected `send`): back to
    /// the retry queue on the transport backoff, which has no attempt limit, keeping the ACK
    /// attempt count.
    pub(super) fn send_failed(&mut self, id: &str, send_seq: u64, reason: &str, now: Millis) {
        if let Some(key) = self.current_attempt(id, send_seq) {
            self.transport_failure(key, reason, now);
        }
    }

    /// The relay's or a gateway's answer to attempt `send_seq` of `id`; answers to any other
    /// attempt are stale and ignored. `Live` settles nothing (it is a write-ack) but puts a
    /// parked entry on the ACK ladder; `Stored` puts the entry in relay custody; `Unreachable`
    /// is the verdict: a regular message parks, a media chunk keeps its pending ACK
    /// (`docs/delivery.md#parking`); both emit `message_undeliverable` and are offered to the
    /// neighbors.
    pub(super) fn answer(&mut self, id: &str, send_seq: u64, answer: CarrierAnswer, now: Millis) {
        let Some(key) = self.current_attempt(id, send_seq) else {
            return;
        };
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let handed = matches!(entry.phase, Phase::Handed { .. });
        // The relay processed the frame: the transport works. A write alone does not prove that.
        if entry.transport_retries != 0 {
            entry.transport_retries = 0;
            self.dirty.insert(key);
        }
        // A Stored or Unreachable answer proves the frame was written even if that report is
        // still on its way.
        if handed && answer != CarrierAnswer::Live {
            self.mark_written(key, now);
        }
        match answer {
            CarrierAnswer::Live => self.set_park(key, None),
            CarrierAnswer::Stored => self.enter_custody(key, now),
            CarrierAnswer::Unreachable(cause) => self.on_unreachable(key, cause, now),
        }
    }

    /// All work due at `now`: ACK timeouts, app carrier sends past their deadline, lifetime
    /// expiries, then up to `flush_batch` sends from the retry and probe queues; then the
    /// durability hook's timers: a batch the hook has not settled in time (refused), retention
    /// expiries, the open drain batch's age, and the retries of refused batches (while a
    /// carrier is up). Nothing that is not due happens, so a spurious call is harmless.
    pub(super) fn timeout(&mut self, now: Millis) {
        for key in self.timers.due_acks(now) {
            self.ack_timeout(key, now);
        }
        for key in self.timers.due_send_deadlines(now) {
            self.transport_failure(key, REASON_APP_SEND_TIMEOUT, now);
        }
        for key in self.timers.due_expiries(now) {
            self.settle_failed(key, FailReason::OutboxLifetimeExceeded, now);
        }
        self.group_timeouts(now);
        for recipient in self.presession.due_reasks(now) {
            self.ask_session_again(recipient);
        }
        let lifetime = self.config.pending_session_max_lifetime_ms;
        for expired in self.presession.expire(now, lifetime) {
            let Message { id, recipient, .. } = expired.message;
            self.emit_failed(
                id,
                recipient,
                FailReason::PendingSessionLifetimeExceeded,
                0,
                now,
            );
        }
        self.send_due(now);
        let carrier_up = !self.carriers.is_empty();
        if let (Some(hook), mut sink) = self.hook_and_outputs() {
            hook.on_timeout(now, carrier_up, &mut sink);
        }
        let overdue = self.hook.as_ref().and_then(|hook| {
            let batch_id = hook.overdue(now)?;
            Some((batch_id, hook.timeout_ms()))
        });
        if let Some((batch_id, timeout_ms)) = overdue {
            let reason = format!("the hook did not settle within {timeout_ms} ms");
            self.hook_result(batch_id, Err(reason), now);
        }
    }

    /// A presence status from the relay (`PresenceStatus`, pushed under `presence_watch_v1` or
    /// polled). `online: true` that is news is a reachability edge for `peer`: its parked
    /// messages go now with a fresh budget. `online: false` only updates the remembered status:
    /// probes continue (offline per presence is not a verdict, and a local link may still reach
    /// the peer). `presence_updated` follows what the edge caused.
    pub(super) fn presence_report(
        &mut self,
        peer: String,
        online: bool,
        last_seen_ms: Option<Millis>,
        now: Millis,
    ) {
        if self.presence.report(&peer, online) {
            self.edge(&peer, now);
            self.send_due(now);
            if self.presession.waits_for(&peer) {
                self.ask_session_again(peer.clone());
            }
        }
        self.events.push_back(Event::PresenceUpdated {
            peer_id: peer,
            online,
            last_seen_ms,
        });
    }

    /// `peer` appeared on app carrier `carrier` (registered with `Input::CarrierUp`): a
    /// reachability edge for it, then the peer discovery flush — the peer's waiting
    /// outbox entries (queued, parked or resting) are pulled from the retry queue and sent now
    /// over the direct link, at most `flush_batch` in this call (the rest stay queued and due,
    /// never stranded); failed sends are re-enqueued with their attempt counts.
    /// `neighbor_discovered` follows what the flush caused.
    pub(super) fn neighbor_discovered(&mut self, peer: String, carrier: String, now: Millis) {
        if !self.neighbors.is_registered(&carrier) {
            let text = format!(
                "neighbor {peer} reported on {carrier}, which is not a registered app carrier"
            );
            self.diagnostic(DiagnosticLevel::Warn, text);
            return;
        }
        self.neighbors.discover(&carrier, &peer);
        self.edge(&peer, now);
        let mut waiting: Vec<Slot> = Vec::new();
        for key in self.outbox.keys_to(&peer) {
            self.bring_forward(key, now);
            if let Some(slot) = self.queued_slot(key) {
                waiting.push(slot);
            }
        }
        waiting.sort_unstable();
        for (_, _, key) in waiting.into_iter().take(self.config.flush_batch.max(1)) {
            if !self.try_send(key, now) {
                break;
            }
        }
        self.events.push_back(Event::NeighborDiscovered {
            peer_id: peer,
            transport: carrier,
        });
    }

    /// `peer` left app carrier `carrier`. Frames handed to that link and not written are
    /// failed sends (re-enqueued with their attempt counts; the next send takes the relay if it
    /// is up); written ones keep their ACK timers. `neighbor_lost` follows.
    pub(super) fn neighbor_lost(&mut self, peer: String, carrier: String, now: Millis) {
        if self.neighbors.lose(&carrier, &peer) {
            let carrier = Carrier::Local(carrier.clone());
            for key in self.timers.handed() {
                let on_link = self.outbox.get(key).is_some_and(|entry| {
                    entry.message.recipient == peer
                        && matches!(&entry.phase, Phase::Handed { carrier: c, .. } if *c == carrier)
                });
                if on_link {
                    self.transport_failure(key, REASON_NEIGHBOR_LOST, now);
                }
            }
        }
        self.events.push_back(Event::NeighborLost {
            peer_id: peer,
            transport: carrier,
        });
    }
}
