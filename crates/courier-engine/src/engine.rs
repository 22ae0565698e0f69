//! The engine façade: the public inputs and outputs, and the transitions between entry phases.
//! Every phase change goes through `set_phase`, which re-indexes the entry's timers and marks it
//! for a `StoreOp::Put` at the end of the call (one Put per changed entry per call).

use std::collections::{BTreeSet, VecDeque};

use courier_proto::Message;
use serde_json::Value;

use crate::ack::{self, AfterTimeout};
use crate::config::Config;
use crate::custody::Custody;
use crate::dedup::{Dedup, DedupKey};
use crate::event::{DiagnosticLevel, Event};
use crate::inbound;
use crate::io::{
    Carrier, EntryState, FailReason, InboundOrigin, Millis, OutboxRecord, PresenceChange,
    ProcessedKey, RelayAnswer, SendOutcome, SendRequest, Settlement, Stats, StoreOp, Transmit,
    TransmitKind,
};
use crate::outbox::{self, Class, Entry, Key, Outbox, Phase};
use crate::timers::Timers;

/// Hops a message may still travel. Only mesh forwarding spends it; the relay leg does not.
const DEFAULT_TTL: u8 = 10;
/// Receivers clamp Lamport clocks to this (`relay-protocol.md` §9.1); ours never exceeds it.
const MAX_LAMPORT: u64 = i64::MAX as u64;

const REASON_NO_CARRIER: &str = "no carrier available";
const REASON_IN_FLIGHT_LIMIT: &str = "in-flight limit reached";
const REASON_CARRIER_DOWN: &str = "carrier unavailable";
const REASON_UNREACHABLE: &str = "recipient unreachable";

/// The delivery engine. See the crate docs for the invariants it keeps.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    local_identity: String,
    outbox: Outbox,
    timers: Timers,
    custody: Custody,
    dedup: Dedup,
    carriers: BTreeSet<Carrier>,
    lamport: u64,
    last_send_seq: u64,
    /// Entries changed during the current call; each gets one Put when the call ends.
    dirty: BTreeSet<Key>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    store: VecDeque<StoreOp>,
}

impl Engine {
    /// `local_identity` goes into `Message.sender` of every message this device sends.
    pub fn new(config: Config, local_identity: String) -> Self {
        let dedup = Dedup::new(config.dedup_max_entries, config.dedup_retention_ms());
        Self {
            config,
            local_identity,
            outbox: Outbox::default(),
            timers: Timers::default(),
            custody: Custody::default(),
            dedup,
            carriers: BTreeSet::new(),
            lamport: 0,
            last_send_seq: 0,
            dirty: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            store: VecDeque::new(),
        }
    }

    /// Loads the persisted outbox and inbound dedup keys at start. Entries past the absolute
    /// cap settle as "Outbox lifetime exceeded"; the others get a fresh window, keep their
    /// counters and are re-driven as soon as a carrier is up (a restart is a reachability edge,
    /// and an in-flight entry's pending ACK died with the old process). Parked entries stay in
    /// relay custody. The capacity bounds apply, oldest first. Every kept entry gets a Put.
    pub fn restore(
        &mut self,
        mut records: Vec<OutboxRecord>,
        processed: Vec<ProcessedKey>,
        now: Millis,
    ) {
        self.dedup.restore(processed, now);
        records.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.message.id.cmp(&b.message.id))
        });
        for record in records {
            self.lamport = self
                .lamport
                .max(record.message.lamport_clock.min(MAX_LAMPORT));
            if self.outbox.key_of(&record.message.id).is_some() {
                self.diagnostic(
                    DiagnosticLevel::Warn,
                    format!("restore: duplicate outbox row {}", record.message.id),
                );
                continue;
            }
            if now >= outbox::absolute_cap(record.created_at, &self.config) {
                let Message { id, recipient, .. } = record.message;
                let reason = FailReason::OutboxLifetimeExceeded;
                self.emit_failed(id, recipient, reason, record.ack_attempts, now);
                continue;
            }
            let entry = Entry {
                phase: Phase::Queued {
                    at: now,
                    expires_at: outbox::expires_at(record.created_at, now, &self.config),
                },
                message: record.message,
                created_at: record.created_at,
                window_start: now,
                ack_attempts: record.ack_attempts,
                transport_retries: record.transport_retries,
                first_sent_at: record.first_sent_at,
                last_sent_at: record.last_sent_at,
                custody: record.state == EntryState::Parked,
            };
            self.make_room(entry.class(), now);
            self.admit(entry);
        }
        self.end_call();
    }

    /// Accepts a send. The id is `req.id` or `mint_id()`; an id already in the outbox is a
    /// no-op. The Put comes out in this call (the runtime commits it before resolving), then the
    /// Transmit when a carrier and an in-flight slot are free, else `message_deferred`. A full
    /// outbox first evicts its oldest entry of the same class.
    pub fn send(
        &mut self,
        req: SendRequest,
        mint_id: impl FnOnce() -> String,
        now: Millis,
    ) -> SendOutcome {
        let SendRequest {
            id,
            recipient,
            content,
            content_type,
            priority,
            metadata,
            binary_content,
        } = req;
        let id = id.unwrap_or_else(mint_id);
        if self.outbox.key_of(&id).is_some() {
            return SendOutcome::Duplicate(id);
        }
        self.make_room(Class::of(content_type), now);
        self.lamport = self.lamport.saturating_add(1).min(MAX_LAMPORT);
        let message = Message {
            id: id.clone(),
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
            binary_content: binary_content.map(Value::String),
            media_metadata: None,
            forwarded_from: None,
            reply_context: None,
        };
        let entry = Entry {
            message,
            created_at: now,
            window_start: now,
            ack_attempts: 0,
            transport_retries: 0,
            first_sent_at: None,
            last_sent_at: None,
            custody: false,
            phase: Phase::Queued {
                at: now,
                expires_at: outbox::expires_at(now, now, &self.config),
            },
        };
        let key = self.admit(entry);
        match self.sendable_carrier() {
            Ok(carrier) => self.transmit(key, carrier),
            Err(reason) => self.emit_deferred(key, reason, None),
        }
        self.end_call();
        SendOutcome::Accepted(id)
    }

    /// A carrier became available. For the outbox carrier this is the reconnect flush: every
    /// queued entry — retries, parked probes, entries waiting for a carrier — is due now, the
    /// first `flush_batch` go in this call and the rest on the following `handle_timeout` calls.
    /// It is also the reachability edge that resets the custody probe escalation.
    pub fn handle_carrier_up(&mut self, carrier: Carrier, now: Millis) {
        let carries_outbox = Self::carries_outbox(&carrier);
        self.carriers.insert(carrier);
        if carries_outbox {
            self.custody.reset_escalation();
            for key in self.timers.queued_later_than(now) {
                self.bring_forward(key, now);
            }
            self.send_due(now);
        }
        self.end_call();
    }

    /// A carrier is gone. Frames handed to it and not written are failed sends; written ones
    /// keep their ACK timers (the ACK may still come back by another way or after reconnect).
    pub fn handle_carrier_down(&mut self, carrier: Carrier, now: Millis) {
        self.carriers.remove(&carrier);
        for key in self.timers.handed() {
            let on_this_carrier = self.outbox.get(key).is_some_and(
                |entry| matches!(&entry.phase, Phase::Handed { carrier: c, .. } if *c == carrier),
            );
            if on_this_carrier {
                self.transport_failure(key, REASON_CARRIER_DOWN, now);
            }
        }
        self.end_call();
    }

    /// The carrier wrote attempt `send_seq`: the ACK timer starts now (`delivery.md` item 4).
    pub fn handle_written(&mut self, id: &str, send_seq: u64, now: Millis) {
        if let Some(key) = self.outbox.key_of(id) {
            let handed = self.outbox.get(key).is_some_and(
                |entry| matches!(entry.phase, Phase::Handed { send_seq: s, .. } if s == send_seq),
            );
            if handed {
                self.mark_written(key, now);
            }
        }
        self.end_call();
    }

    /// Attempt `send_seq` did not make it (carrier error, relay `Error{internal}`, `RateLimited`,
    /// no relay answer within 15 s, connection loss): back to the retry queue on the transport
    /// backoff, which has no attempt limit.
    pub fn handle_send_failed(&mut self, id: &str, send_seq: u64, reason: &str, now: Millis) {
        if let Some(key) = self.current_attempt(id, send_seq) {
            self.transport_failure(key, reason, now);
        }
        self.end_call();
    }

    /// The relay's answer to the entry's current attempt. `Live` settles nothing (it is a
    /// write-ack) but ends relay custody; `Stored` puts the entry in custody; `Unreachable` is,
    /// until parking lands, a failed send.
    pub fn handle_relay_answer(
        &mut self,
        id: &str,
        send_seq: u64,
        answer: RelayAnswer,
        now: Millis,
    ) {
        let Some(key) = self.current_attempt(id, send_seq) else {
            return;
        };
        let handed = match self.outbox.get(key).map(|entry| &entry.phase) {
            Some(Phase::Handed { .. }) => true,
            Some(Phase::AwaitingAck { .. }) => false,
            Some(Phase::Queued { .. }) | None => return,
        };
        if answer != RelayAnswer::Unreachable {
            // The relay took the frame: the transport works. A write alone does not prove that,
            // and resetting on it would re-send to an unreachable recipient every second.
            if let Some(entry) = self
                .outbox
                .get_mut(key)
                .filter(|entry| entry.transport_retries != 0)
            {
                entry.transport_retries = 0;
                self.dirty.insert(key);
            }
        }
        match answer {
            RelayAnswer::Live => self.set_custody(key, false),
            RelayAnswer::Stored => {
                // The relay has it, so the frame was written even if that report is still on its way.
                if handed {
                    self.mark_written(key, now);
                }
                self.enter_custody(key, now);
            }
            RelayAnswer::Unreachable => self.on_unreachable(key, now),
        }
        self.end_call();
    }

    /// A message from a carrier (`relay-protocol.md` §7.2, §9.2). An end-to-end ACK settles its
    /// entry when attributed to the recipient. A data message is dispatched once per dedup key
    /// (`MarkProcessed` + `message_received`), then ACKed end to end if it asks for it — also
    /// when it is a duplicate, since the first ACK may have been lost. The relay frame's
    /// `HopAck` comes last. The runtime commits store ops, then dispatches events, then executes
    /// transmits, so both ACKs follow the processing (`delivery.md` item 10).
    pub fn handle_inbound(&mut self, message: Message, origin: InboundOrigin, now: Millis) {
        match message.ack_for().map(str::to_owned) {
            Some(acked) => self.inbound_ack(&acked, &message, &origin, now),
            None => self.inbound_data(message, &origin, now),
        }
        if let Some(seq) = origin.seq {
            self.transmits.push_back(Transmit {
                carrier: origin.carrier,
                peer: None,
                kind: TransmitKind::HopAck { seq },
            });
        }
        self.end_call();
    }

    /// All work due at `now`: ACK timeouts, lifetime expiries, then up to `flush_batch` sends
    /// from the retry queue.
    pub fn handle_timeout(&mut self, now: Millis) {
        for key in self.timers.due_acks(now) {
            self.ack_timeout(key, now);
        }
        for key in self.timers.due_expiries(now) {
            self.settle_failed(key, FailReason::OutboxLifetimeExceeded, now);
        }
        self.send_due(now);
        self.end_call();
    }

    /// A presence edge from the relay (`PresenceStatus`).
    pub fn handle_presence(&mut self, _peer: &str, _online: bool, _now: Millis) {
        self.end_call();
    }

    /// A neighbor appeared on a local carrier.
    pub fn handle_neighbor_discovered(&mut self, _peer: &str, _carrier: Carrier, _now: Millis) {
        self.end_call();
    }

    /// A neighbor left a local carrier.
    pub fn handle_neighbor_lost(&mut self, _peer: &str, _carrier: Carrier, _now: Millis) {
        self.end_call();
    }

    /// The next change of the presence watchlist for the runtime to send.
    pub fn poll_presence(&mut self) -> Option<PresenceChange> {
        None
    }

    /// `internetPresenceWatchlist()`.
    pub fn presence_watchlist(&self) -> Vec<String> {
        Vec::new()
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    pub fn poll_store(&mut self) -> Option<StoreOp> {
        self.store.pop_front()
    }

    /// When `handle_timeout` is next needed; `None` when nothing is due until an input arrives.
    /// A queued entry that cannot go (no carrier, every in-flight slot taken) adds no deadline:
    /// carrier-up and slot-freeing inputs are what move it.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.timers.next_deadline(self.sendable_carrier().is_ok())
    }

    pub fn status(&self, id: &str) -> Option<EntryState> {
        let key = self.outbox.key_of(id)?;
        self.outbox.get(key).map(Entry::state)
    }

    pub fn stats(&self) -> Stats {
        let parked = self.timers.parked();
        Stats {
            outbox_regular: self.outbox.count(Class::Regular),
            outbox_media: self.outbox.count(Class::Media),
            pending_acks: self.timers.in_flight(),
            retry_queue: self.timers.queued().saturating_sub(parked),
            parked,
            pre_session_queue: 0,
            carriers_up: self.carriers.len(),
        }
    }

    pub fn carriers_up(&self) -> usize {
        self.carriers.len()
    }

    // ---- carrier choice and sending -------------------------------------------------------

    /// Only the relay reaches an arbitrary recipient today; local carriers join this choice
    /// with neighbour discovery.
    fn carries_outbox(carrier: &Carrier) -> bool {
        *carrier == Carrier::Internet
    }

    /// The carrier the next outbox send would take, or why none can go now.
    fn sendable_carrier(&self) -> Result<Carrier, &'static str> {
        let carrier = self
            .carriers
            .iter()
            .find(|c| Self::carries_outbox(c))
            .ok_or(REASON_NO_CARRIER)?;
        if self.timers.in_flight() >= self.config.max_pending_acks.max(1) {
            return Err(REASON_IN_FLIGHT_LIMIT);
        }
        Ok(carrier.clone())
    }

    /// Up to one batch of due entries, in retry-queue order, while carrier and slots allow.
    fn send_due(&mut self, now: Millis) {
        for _ in 0..self.config.flush_batch.max(1) {
            let Ok(carrier) = self.sendable_carrier() else {
                break;
            };
            let Some(key) = self.timers.first_due_send(now) else {
                break;
            };
            self.transmit(key, carrier);
        }
    }

    fn transmit(&mut self, key: Key, carrier: Carrier) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let message = entry.message.clone();
        self.last_send_seq += 1;
        let send_seq = self.last_send_seq;
        self.set_phase(
            key,
            Phase::Handed {
                send_seq,
                carrier: carrier.clone(),
            },
        );
        self.transmits.push_back(Transmit {
            carrier,
            peer: None,
            kind: TransmitKind::Outbox { message, send_seq },
        });
    }

    fn mark_written(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let Phase::Handed { send_seq, carrier } = &entry.phase else {
            return;
        };
        let (send_seq, transport) = (*send_seq, carrier.name().to_owned());
        entry.first_sent_at.get_or_insert(now);
        entry.last_sent_at = Some(now);
        entry.window_start = now;
        self.events.push_back(Event::MessageSent {
            message_id: entry.message.id.clone(),
            recipient: entry.message.recipient.clone(),
            priority: entry.message.priority,
            transport,
            attempt: ack::attempt_number(entry.ack_attempts),
        });
        let deadline = ack::deadline(&self.config, now);
        self.set_phase(key, Phase::AwaitingAck { send_seq, deadline });
    }

    fn current_attempt(&self, id: &str, send_seq: u64) -> Option<Key> {
        let key = self.outbox.key_of(id)?;
        (self.outbox.get(key)?.current_send_seq() == Some(send_seq)).then_some(key)
    }

    // ---- leaving flight ---------------------------------------------------------------------

    /// A failed send: transport backoff, no budget spent. `message_deferred.retry_count` is the
    /// number of transport failures before this one since the relay last accepted the frame,
    /// the exponent of its backoff.
    fn transport_failure(&mut self, key: Key, reason: &str, now: Millis) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let retry = entry.transport_retries;
        entry.transport_retries = retry.saturating_add(1);
        let at = now.saturating_add(self.config.backoff_ms(retry));
        if self.requeue(key, at, now) {
            // Without a carrier the time is only a lower bound: the carrier-up edge decides.
            let next = self.sendable_carrier().is_ok().then_some(at);
            self.emit_deferred_with(key, reason, retry, next);
        }
    }

    /// The seam for parking: until it lands, the unreachable verdict is a failed send.
    fn on_unreachable(&mut self, key: Key, now: Millis) {
        self.transport_failure(key, REASON_UNREACHABLE, now);
    }

    fn ack_timeout(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        if entry.custody {
            // A probe nobody answered: the relay still holds the message, so pace, don't spend.
            let delay = self.custody.next_probe_delay(&entry.message.recipient);
            self.requeue(key, now.saturating_add(delay), now);
            return;
        }
        match ack::after_timeout(&self.config, entry.ack_attempts, now) {
            AfterTimeout::Exhausted => self.settle_failed(key, FailReason::MaxRetriesExceeded, now),
            AfterTimeout::Retry { retry_count, at } => {
                if !self.requeue(key, at, now) {
                    return;
                }
                let Some(entry) = self.outbox.get_mut(key) else {
                    return;
                };
                entry.ack_attempts = retry_count.saturating_add(1);
                self.events.push_back(Event::MessageRetrying {
                    message_id: entry.message.id.clone(),
                    recipient: entry.message.recipient.clone(),
                    retry_count,
                    next_retry_at: at,
                });
            }
        }
    }

    fn enter_custody(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let newly = !entry.custody;
        let recipient = entry.message.recipient.clone();
        self.set_custody(key, true);
        let delay = self.custody.next_probe_delay(&recipient);
        if self.requeue(key, now.saturating_add(delay), now) && newly {
            if let Some(entry) = self.outbox.get(key) {
                self.events.push_back(Event::MessageStored {
                    message_id: entry.message.id.clone(),
                    recipient: entry.message.recipient.clone(),
                });
            }
        }
    }

    /// Back into the retry queue at `at` after an attempt ended without a settlement — unless
    /// the lifetime ran out while the attempt was pending: expiry waits for a pending ACK, and
    /// this is where it catches up. Returns whether the entry is still live.
    fn requeue(&mut self, key: Key, at: Millis, now: Millis) -> bool {
        let Some(entry) = self.outbox.get(key) else {
            return false;
        };
        let expires_at = entry.expires_at(&self.config);
        if now >= expires_at {
            self.settle_failed(key, FailReason::OutboxLifetimeExceeded, now);
            return false;
        }
        self.set_phase(key, Phase::Queued { at, expires_at });
        true
    }

    fn bring_forward(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        if let Phase::Queued { at, expires_at } = entry.phase {
            if at > now {
                self.set_phase(
                    key,
                    Phase::Queued {
                        at: now,
                        expires_at,
                    },
                );
            }
        }
    }

    // ---- inbound ----------------------------------------------------------------------------

    fn inbound_ack(&mut self, acked: &str, ack: &Message, origin: &InboundOrigin, now: Millis) {
        // No entry: a repeat ACK for something already settled, or never ours. Nothing to do.
        let Some(key) = self.outbox.key_of(acked) else {
            return;
        };
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        if !inbound::attributed(&entry.message.recipient, origin, ack) {
            let text = format!(
                "ignored ACK for {acked}: carried by {} claiming {}, not its recipient",
                origin.stamped_sender, ack.sender
            );
            self.diagnostic(DiagnosticLevel::Warn, text);
            return;
        }
        let Some(entry) = self.remove(key) else {
            return;
        };
        let recipient = entry.message.recipient;
        self.events.push_back(Event::MessageDelivered {
            message_id: entry.message.id.clone(),
            recipient: recipient.clone(),
            latency_ms: now.saturating_sub(entry.created_at),
            hop_count: inbound::ack_hop_count(ack),
            transport: origin.carrier.name().to_owned(),
        });
        self.store.push_back(StoreOp::Settle {
            id: entry.message.id,
            recipient: recipient.clone(),
            settlement: Settlement::Delivered,
            at: now,
        });
        // The recipient just proved reachable: what the relay holds for it goes again now.
        for key in self.custody.redrive(&recipient) {
            self.bring_forward(key, now);
        }
    }

    fn inbound_data(&mut self, message: Message, origin: &InboundOrigin, now: Millis) {
        self.lamport = self.lamport.max(message.lamport_clock.min(MAX_LAMPORT));
        let transport = origin.carrier.name().to_owned();
        let ack = message
            .requires_ack
            .then(|| message.ack(inbound::ack_id(&message.id), now, &transport));
        // Direct messages only for now: the chat of a DM is its sender.
        let key = DedupKey {
            chat: message.sender.clone(),
            sender: message.sender.clone(),
            message_id: message.id.clone(),
        };
        if self.dedup.first_sighting(&key, now) {
            let DedupKey {
                chat,
                sender,
                message_id,
            } = key;
            self.store.push_back(StoreOp::MarkProcessed(ProcessedKey {
                chat: chat.clone(),
                sender: sender.clone(),
                message_id,
                at: now,
            }));
            self.events.push_back(Event::MessageReceived {
                message,
                chat,
                sender,
                transport,
            });
        }
        if let Some(message) = ack {
            let peer = match origin.carrier {
                Carrier::Internet => None,
                Carrier::Local(_) => Some(origin.stamped_sender.clone()),
            };
            self.transmits.push_back(Transmit {
                carrier: origin.carrier.clone(),
                peer,
                kind: TransmitKind::Ack { message },
            });
        }
    }

    // ---- bookkeeping --------------------------------------------------------------------------

    fn admit(&mut self, entry: Entry) -> Key {
        let (priority, custody) = (entry.message.priority, entry.custody);
        let phase = entry.phase.clone();
        let held_for = custody.then(|| entry.message.recipient.clone());
        let key = self.outbox.insert(entry);
        self.timers.arm(key, priority, custody, &phase);
        if let Some(recipient) = held_for {
            self.custody.hold(&recipient, key);
        }
        self.dirty.insert(key);
        key
    }

    fn set_phase(&mut self, key: Key, phase: Phase) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let old = std::mem::replace(&mut entry.phase, phase);
        self.timers
            .disarm(key, entry.message.priority, entry.custody, &old);
        self.timers
            .arm(key, entry.message.priority, entry.custody, &entry.phase);
        self.dirty.insert(key);
    }

    fn set_custody(&mut self, key: Key, custody: bool) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        if entry.custody == custody {
            return;
        }
        self.timers
            .disarm(key, entry.message.priority, entry.custody, &entry.phase);
        entry.custody = custody;
        self.timers
            .arm(key, entry.message.priority, entry.custody, &entry.phase);
        if custody {
            self.custody.hold(&entry.message.recipient, key);
        } else {
            self.custody.release(&entry.message.recipient, key);
        }
        self.dirty.insert(key);
    }

    fn remove(&mut self, key: Key) -> Option<Entry> {
        let entry = self.outbox.remove(key)?;
        self.timers
            .disarm(key, entry.message.priority, entry.custody, &entry.phase);
        if entry.custody {
            self.custody.release(&entry.message.recipient, key);
        }
        self.dirty.remove(&key);
        Some(entry)
    }

    /// Evicts the oldest entries of `class` until one more fits.
    fn make_room(&mut self, class: Class, now: Millis) {
        while self.outbox.count(class) >= class.capacity(&self.config) {
            let Some(oldest) = self.outbox.oldest(class) else {
                break;
            };
            self.settle_failed(oldest, FailReason::OutboxCapacityExceeded, now);
        }
    }

    fn settle_failed(&mut self, key: Key, reason: FailReason, now: Millis) {
        if let Some(entry) = self.remove(key) {
            let Message { id, recipient, .. } = entry.message;
            self.emit_failed(id, recipient, reason, entry.ack_attempts, now);
        }
    }

    /// The terminal failure: `message_failed.retry_count` is the ACK retries the entry was
    /// granted (`ack_attempts`), `max_retries` for "Max retries exceeded".
    fn emit_failed(
        &mut self,
        id: String,
        recipient: String,
        reason: FailReason,
        ack_attempts: u32,
        now: Millis,
    ) {
        self.events.push_back(Event::MessageFailed {
            message_id: id.clone(),
            recipient: recipient.clone(),
            reason,
            retry_count: ack_attempts,
        });
        let settlement = Settlement::Failed(reason);
        self.store.push_back(StoreOp::Settle {
            id,
            recipient,
            settlement,
            at: now,
        });
    }

    fn emit_deferred(&mut self, key: Key, reason: &str, next_retry_at: Option<Millis>) {
        let retry_count = self
            .outbox
            .get(key)
            .map_or(0, |entry| entry.transport_retries);
        self.emit_deferred_with(key, reason, retry_count, next_retry_at);
    }

    fn emit_deferred_with(
        &mut self,
        key: Key,
        reason: &str,
        retry_count: u32,
        next_retry_at: Option<Millis>,
    ) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        self.events.push_back(Event::MessageDeferred {
            message_id: entry.message.id.clone(),
            recipient: entry.message.recipient.clone(),
            reason: reason.to_owned(),
            retry_count,
            next_retry_at,
        });
    }

    fn diagnostic(&mut self, level: DiagnosticLevel, message: String) {
        self.events.push_back(Event::Diagnostic { level, message });
    }

    /// One Put per entry changed during the call, reflecting where it ended up.
    fn end_call(&mut self) {
        for key in std::mem::take(&mut self.dirty) {
            if let Some(entry) = self.outbox.get(key) {
                self.store.push_back(StoreOp::Put(entry.record()));
            }
        }
    }
}

#[cfg(test)]
impl Engine {
    /// The engine's own consistency: indexes match phases, the in-flight cap holds, no Put is
    /// left unemitted between calls.
    pub(crate) fn check_invariants(&self) {
        self.outbox.check();
        let mut expected = Timers::default();
        let mut held = BTreeSet::new();
        for (key, entry) in self.outbox.iter() {
            expected.arm(key, entry.message.priority, entry.custody, &entry.phase);
            if entry.custody {
                held.insert(key);
            }
            if let Phase::Queued { expires_at, .. } = entry.phase {
                assert_eq!(
                    expires_at,
                    entry.expires_at(&self.config),
                    "expiry of {}",
                    entry.message.id
                );
            }
        }
        assert_eq!(
            expected, self.timers,
            "timer indexes out of step with entry phases"
        );
        assert_eq!(
            held,
            self.custody.keys().collect::<BTreeSet<_>>(),
            "custody index out of step"
        );
        assert!(
            self.timers.in_flight() <= self.config.max_pending_acks.max(1),
            "in-flight cap"
        );
        assert!(self.dirty.is_empty());
    }

    pub(crate) fn records(&self) -> Vec<OutboxRecord> {
        self.outbox
            .iter()
            .map(|(_, entry)| entry.record())
            .collect()
    }
}
