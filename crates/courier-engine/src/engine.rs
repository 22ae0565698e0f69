//! The engine façade: the public inputs and outputs, and the transitions between entry phases.
//! Every phase change goes through `set_phase` (and every park flag change through `set_park`),
//! which re-index the entry's timers and mark it for a `StoreOp::Put` at the end of the call
//! (one Put per changed entry per call).
//!
//! # Carrier choice
//!
//! One function, [`Engine::route_for`]: a direct link to the recipient (it is a current neighbor
//! on a registered local carrier) is preferred over the relay; else the relay when the relay
//! carrier is up; else a gateway when the Gateway carrier is up; else the send is deferred
//! (`message_deferred`, `next_retry_at: None`) until a carrier or neighbor edge. A parked message
//! is also *offered* to every other current neighbor on every park and every probe
//! (`Transmit.peer` = that neighbor): the neighbor only carries it, the offer is fire-and-forget
//! (its `send_seq` is never the entry's attempt, so reports for it are ignored) and only the
//! recipient's ACK settles the message.
//!
//! The relay and a gateway are both *addressed* carriers: they route by the recipient's address
//! and answer each send live or unreachable, so their answers, reconnect flush and edges are
//! the same. With both up the relay carries the attempts: it is the one with a mailbox
//! (custody) and presence, and its answers are what the ladder and the parking rules are tuned
//! for. The gateway then reaches what the relay cannot the way a neighbor does: a parked
//! message is offered over it too (peer `None`) on every park and probe, because a gateway
//! bridges a mesh where a recipient the relay calls unreachable may well be attached.
//!
//! # Reachability edges and the ACK budget
//!
//! An edge — reconnect (`carrier up: Relay`), `restore`, the peer discovered as a
//! neighbor, the peer reported online (news only, see `presence`), the delivery of one of the
//! peer's messages, an inbound message carried by the peer — resets the peer's probe ladder and
//! verdict, re-drives its parked entries at once, and gives every entry of the peer's park
//! episode (parked, resting, or a probe climbing the ladder) a **fresh ACK budget**
//! (`ack_attempts = 0`) and a new episode (`edgeDrivenUnreachableDm` probes count afresh). A **timed probe** instead **carries the budget forward**: it resumes at
//! the entry's accumulated `ack_attempts`, so a probe the relay accepts but nobody acknowledges
//! re-parks after about one more ACK timeout rather than re-walking the whole ladder (the seed's
//! ~800 s fresh-entry bound is the edge case, not the probe case).
//!
//! A parked entry stays parked while its probe or re-drive is in flight: an ACK timeout then
//! re-parks it without spending budget (a probe nobody answered). It joins the ordinary ACK
//! ladder only when its attempt is accepted by the recipient's side: the relay's `live` answer,
//! or a write on a direct link to the recipient (the local analogue of `live`).

use std::collections::{BTreeSet, VecDeque};

use courier_proto::{Address, ContentType, Message};
use serde_json::Value;

use crate::ack::{self, AfterTimeout};
use crate::config::Config;
use crate::control_gate::{ControlGate, Verdict};
use crate::dedup::{Dedup, DedupKey};
use crate::event::{DiagnosticLevel, Event};
use crate::hook::{Commit, HookPipeline, Sink};
use crate::inbound;
use crate::io::{
    Carrier, CarrierAnswer, EntryState, FailReason, HookBatch, HookMessage, InboundKey,
    InboundOrigin, Millis, OutboxRecord, PendingInbound, PresenceChange, ProcessedKey, SendOutcome,
    SendRequest, Settlement, Stats, StoreOp, Transmit, TransmitKind,
};
use crate::neighbors::Neighbors;
use crate::outbox::{self, Class, Entry, Key, Outbox, Phase};
use crate::parking::{Park, Parking, ResendBudget, EDGE_DRIVEN_PROBES};
use crate::presence::Presence;
use crate::timers::{Gate, Slot, Timers};

/// Hops a message may still travel. Only mesh forwarding spends it; the relay leg does not.
const DEFAULT_TTL: u8 = 10;
/// Receivers clamp Lamport clocks to this (`relay-protocol.md` §9.1); ours never exceeds it.
const MAX_LAMPORT: u64 = i64::MAX as u64;

const REASON_NO_CARRIER: &str = "no carrier available";
const REASON_IN_FLIGHT_LIMIT: &str = "in-flight limit reached";
const REASON_CARRIER_DOWN: &str = "carrier unavailable";
const REASON_NEIGHBOR_LOST: &str = "neighbor lost";
/// `message_undeliverable.reason`: fixed and local; the relay's detail never reaches events.
const REASON_UNREACHABLE: &str = "recipient unreachable";

/// Where an outbox send goes: the carrier, and for a local carrier the neighbor.
type Route = (Carrier, Option<String>);

/// The delivery engine. See the crate docs for the invariants it keeps.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    local_identity: String,
    /// The relay account this device authenticated as, once a relay said so.
    account: Option<String>,
    outbox: Outbox,
    timers: Timers,
    parking: Parking,
    presence: Presence,
    neighbors: Neighbors,
    /// Funds sends of parked entries under `edgeDrivenUnreachableDm`.
    resend_budget: ResendBudget,
    dedup: Dedup,
    /// The at-least-once inbound pipeline, when a durability hook is registered.
    durable: Option<HookPipeline>,
    control: ControlGate,
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
        let durable = config.durability_hook.clone().map(HookPipeline::new);
        let control = ControlGate::new(config.accept_legacy_control_v1);
        Self {
            control,
            config,
            local_identity,
            account: None,
            outbox: Outbox::default(),
            timers: Timers::default(),
            parking: Parking::default(),
            presence: Presence::default(),
            neighbors: Neighbors::default(),
            resend_budget: ResendBudget::default(),
            dedup,
            durable,
            carriers: BTreeSet::new(),
            lamport: 0,
            last_send_seq: 0,
            dirty: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            store: VecDeque::new(),
        }
    }

    /// The relay authenticated this device as `account`: a message named to that account is for
    /// this device too.
    pub fn handle_account_name(&mut self, account: String) {
        self.account = Some(account);
    }

    /// Whether `recipient` names this device: its address, or its relay account. An account name
    /// cannot be judged before a relay has said which account is ours, so it counts as ours.
    fn names_this_device(&self, recipient: &str) -> bool {
        if recipient == self.local_identity {
            return true;
        }
        if Address::parse(recipient).is_ok() {
            return false;
        }
        self.account.as_deref().is_none_or(|a| a == recipient)
    }

    /// Loads the persisted outbox and inbound dedup keys at start. Entries past the absolute
    /// cap settle as "Outbox lifetime exceeded"; the others get a fresh window, keep their
    /// counters and are re-driven as soon as a carrier is up (a restart is a reachability edge,
    /// and an in-flight entry's pending ACK died with the old process). A parked entry gets a
    /// fresh ACK budget (the edge) and comes back parked; the record does not say which kind,
    /// so it resumes as relay custody and the relay's next answer says what it is now (an
    /// unreachable verdict parks it as such, with `message_undeliverable`). The capacity bounds
    /// apply, oldest first. Every kept entry gets a Put.
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
            let parked = record.state == EntryState::Parked;
            let entry = Entry {
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
            self.make_room(entry.class(), now);
            self.admit(entry);
        }
        self.end_call();
    }

    /// Accepts a send. The id is `req.id` or `mint_id()`; an id already in the outbox is a
    /// no-op. The Put comes out in this call (the runtime commits it before resolving), then the
    /// Transmit when a route and an in-flight slot are free, else `message_deferred`. A full
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
            park: None,
            timed_probes: 0,
            phase: Phase::Queued {
                at: now,
                expires_at: outbox::expires_at(now, now, &self.config),
            },
        };
        let key = self.admit(entry);
        match self.sendable(key) {
            Ok(route) => self.transmit(key, route),
            Err(reason) => self.emit_deferred(key, reason, None),
        }
        self.end_call();
        SendOutcome::Accepted(id)
    }

    /// A carrier became available. `Carrier::Local(name)` registers an app-supplied carrier
    /// (it reaches only the neighbors reported for it). An addressed carrier (`Relay`,
    /// `Gateway`) is the reconnect flush and a reachability edge for everyone: every parked entry
    /// gets a fresh budget, every queued or resting entry is due now, the first `flush_batch` go
    /// in this call and the rest on the following `handle_timeout` calls.
    pub fn handle_carrier_up(&mut self, carrier: Carrier, now: Millis) {
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
        self.end_call();
    }

    /// A carrier is gone (for a local carrier: unregistered, with all its neighbor links).
    /// Frames handed to it and not written are failed sends; written ones keep their ACK timers
    /// (the ACK may still come back by another way or after reconnect). With a durability hook,
    /// a drain batch pending on that carrier goes to the hook now and its drain ends there (no
    /// `DrainComplete` will come for that connection).
    pub fn handle_carrier_down(&mut self, carrier: Carrier, now: Millis) {
        self.carriers.remove(&carrier);
        if let Some(durable) = self.durable.as_mut() {
            durable.carrier_down(&carrier);
        }
        match &carrier {
            Carrier::Relay => self.presence.disconnect(),
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
    /// no relay answer within 15 s, connection loss, a local carrier's rejected `send`): back to
    /// the retry queue on the transport backoff, which has no attempt limit, keeping the ACK
    /// attempt count.
    pub fn handle_send_failed(&mut self, id: &str, send_seq: u64, reason: &str, now: Millis) {
        if let Some(key) = self.current_attempt(id, send_seq) {
            self.transport_failure(key, reason, now);
        }
        self.end_call();
    }

    /// The relay's answer to attempt `send_seq` of `id`; answers to any other attempt are stale
    /// and ignored. `Live` settles nothing (it is a write-ack) but puts a parked entry on the ACK
    /// ladder; `Stored` puts the entry in relay custody; `Unreachable` is the verdict: a regular
    /// message parks, a media chunk keeps its pending ACK (seed table "What parks and what
    /// doesn't"); both emit `message_undeliverable` and are offered to the neighbors.
    pub fn handle_relay_answer(
        &mut self,
        id: &str,
        send_seq: u64,
        answer: CarrierAnswer,
        now: Millis,
    ) {
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
            CarrierAnswer::Unreachable => self.on_unreachable(key, now),
        }
        self.end_call();
    }

    /// A message from a carrier (`relay-protocol.md` §7.2, §9.2). An end-to-end ACK settles its
    /// entry when attributed to the recipient (over a local carrier its peer id is the stamped
    /// identity). A data message is dispatched once per dedup key (`MarkProcessed` +
    /// `message_received`), then ACKed end to end if it asks for it — also when it is a
    /// duplicate, since the first ACK may have been lost — on the carrier it came by (to that
    /// peer for a local one). The relay frame's frame release comes last. The runtime commits store
    /// ops, then dispatches events, then executes transmits, so both ACKs follow the processing
    /// (`delivery.md` item 10). Either kind is a reachability edge for the peer that carried it.
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
    pub fn handle_inbound(&mut self, message: Message, origin: InboundOrigin, now: Millis) {
        if message.ack_for().is_none()
            && matches!(origin.carrier, Carrier::Local(_))
            && !self.names_this_device(&message.recipient)
        {
            // Nothing routed it here, so it is not ours to deliver, record or acknowledge.
            let text = format!(
                "carried copy of {} for {} from {} not delivered: not addressed to this device",
                message.id, message.recipient, origin.stamped_sender
            );
            self.diagnostic(DiagnosticLevel::Debug, text);
            self.edge(&origin.stamped_sender, now);
            self.send_due(now);
            self.end_call();
            return;
        }
        if message.ack_for().is_none() {
            match self.control.check(&message, &origin, now) {
                Verdict::NotControl => {}
                Verdict::Verified => {
                    // Authentic, but no control verb is consumed yet: processed (so a resend is
                    // only re-ACKed) and acknowledged so the sender settles it, never handed to
                    // the application.
                    let key = DedupKey {
                        chat: message.sender.clone(),
                        sender: message.sender.clone(),
                        message_id: message.id.clone(),
                    };
                    if self.dedup.first_sighting(&key, now) {
                        self.store.push_back(StoreOp::MarkProcessed(ProcessedKey {
                            chat: key.chat,
                            sender: key.sender,
                            message_id: key.message_id,
                            at: now,
                        }));
                        self.events.push_back(Event::Diagnostic {
                            level: DiagnosticLevel::Info,
                            message: format!(
                                "ignored control frame {} from {}",
                                message.id, message.sender
                            ),
                        });
                    }
                    if message.requires_ack {
                        let ack =
                            message.ack(inbound::ack_id(&message.id), now, origin.carrier.name());
                        self.ack_back(&origin, ack);
                    }
                    self.release_frame(&origin);
                    self.end_call();
                    return;
                }
                // Dropped before dedup (so a good copy can still enter), never ACKed end to
                // end; the relay hop is still released (identity.md §4.2).
                Verdict::Refused(events) => {
                    self.events.extend(events);
                    self.release_frame(&origin);
                    self.end_call();
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
        self.end_call();
    }

    /// An end-to-end ACK back the way the message came: over the relay or the gateway, or to
    /// the peer that handed it over on a local carrier.
    fn ack_back(&mut self, origin: &InboundOrigin, ack: Message) {
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

    /// Releases the relay journal frame that carried an inbound message, if it had one.
    fn release_frame(&mut self, origin: &InboundOrigin) {
        if let Some(seq) = origin.seq {
            self.transmits.push_back(Transmit {
                carrier: origin.carrier.clone(),
                peer: None,
                kind: TransmitKind::ReleaseFrame { seq },
            });
        }
    }

    /// At start, after `restore`: the buffered rows from the store. With `durability_hook` they
    /// are offered to the hook again (origin Redelivery, in the order they were received, in
    /// batches within the count and byte bounds) as soon as no batch is with the hook; rows past
    /// retention are expired now (with their trace). A row whose key is already processed is
    /// cleared (`CommitInbound`). Without `durability_hook` (the hook was removed since) the rows
    /// are delivered at most once as without a hook: cleared and marked processed
    /// (`CommitInbound`), `message_received`, end-to-end ACK.
    pub fn restore_inbound(&mut self, pending: Vec<PendingInbound>, now: Millis) {
        let (processed, fresh): (Vec<PendingInbound>, Vec<PendingInbound>) = pending
            .into_iter()
            .partition(|row| self.dedup.contains(&dedup_key(&row.key), now));
        if !processed.is_empty() {
            let keys = processed.into_iter().map(|row| row.key).collect();
            self.store
                .push_back(StoreOp::CommitInbound { keys, at: now });
        }
        match self.durable.as_mut() {
            Some(durable) => {
                let mut sink = Sink {
                    store: &mut self.store,
                    events: &mut self.events,
                    transmits: &mut self.transmits,
                };
                durable.restore(fresh, now, &mut sink);
            }
            None => self.deliver_restored(fresh, now),
        }
        self.end_call();
    }

    /// The next batch for the durability hook, if one is ready and none is with the hook (one at
    /// a time). Its rows were written with `StoreOp::BufferInbound` in the call that received
    /// them, so they are durable before the hook sees them. `None` without `durability_hook`.
    pub fn poll_hook(&mut self) -> Option<HookBatch> {
        self.durable.as_mut()?.poll()
    }

    /// The hook's verdict on batch `batch_id`; a stale id (not the batch with the hook) is
    /// ignored. `Ok`: `StoreOp::CommitInbound` for the batch, then a relay frame release for every seq
    /// that carried any of its messages (duplicates that arrived while it was buffered included,
    /// in seq order), then the end-to-end ACKs of those that ask for one (on the carrier they
    /// came by while it is usable, else the current route to the sender, else none: the sender's
    /// resend is re-ACKed from the dedup record). Returns the committed messages in batch order:
    /// the runtime dispatches their `message_received` after it has executed those transmits;
    /// the engine emits no `Event::MessageReceived` for them. `Err`: nothing is acknowledged
    /// (a `Warn` diagnostic carries the reason); the batch is offered again (origin Redelivery)
    /// after `retry_initial_ms` doubling to `retry_max_ms` per refusal, counted while a carrier
    /// is up, and a relay redelivery of one of its messages re-enters that message at once.
    pub fn handle_hook_result(
        &mut self,
        batch_id: u64,
        result: Result<(), String>,
        now: Millis,
    ) -> Vec<HookMessage> {
        let mut sink = Sink {
            store: &mut self.store,
            events: &mut self.events,
            transmits: &mut self.transmits,
        };
        let commit = match self.durable.as_mut() {
            Some(durable) => durable.resolve(batch_id, result, now, &mut sink),
            None => None,
        };
        let mut committed = Vec::new();
        if let Some(Commit { rows }) = commit {
            committed.reserve(rows.len());
            for (pending, origin) in rows {
                self.dedup.record(dedup_key(&pending.key), now);
                self.ack_committed(&pending, now);
                committed.push(HookMessage {
                    transport: pending.carrier.name().to_owned(),
                    key: pending.key,
                    message: pending.message,
                    origin,
                });
            }
        }
        self.end_call();
        committed
    }

    /// The relay connection on `carrier` advertised `mailbox_v1`: until `DrainComplete` its new
    /// messages are the backlog, batched for the hook (`batch_max_messages`, `batch_max_bytes`,
    /// `batch_max_age_ms` after the batch's first message). A pending drain batch (of an earlier
    /// connection) is forced first. Nothing to do without `durability_hook`.
    pub fn handle_drain_started(&mut self, carrier: Carrier, _now: Millis) {
        if let Some(durable) = self.durable.as_mut() {
            durable.drain_started(carrier);
        }
        self.end_call();
    }

    /// `DrainComplete{count}`: the pending drain batch is forced; `Event::InboundDrainCompleted`
    /// follows when every message that arrived during the drain has committed (or expired) —
    /// at once if there is none, and always at once without `durability_hook`. Batches go to
    /// the hook in the order they closed, so live messages wait behind the drain's tail batch.
    pub fn handle_drain_complete(&mut self, carrier: Carrier, count: u64, _now: Millis) {
        let mut sink = Sink {
            store: &mut self.store,
            events: &mut self.events,
            transmits: &mut self.transmits,
        };
        match self.durable.as_mut() {
            Some(durable) => durable.drain_complete(&carrier, count, &mut sink),
            None => sink
                .events
                .push_back(Event::InboundDrainCompleted { count }),
        }
        self.end_call();
    }

    /// Inbound messages buffered for the durability hook and not committed yet.
    pub fn inbound_buffered(&self) -> usize {
        self.durable.as_ref().map_or(0, HookPipeline::len)
    }

    /// All work due at `now`: ACK timeouts, lifetime expiries, then up to `flush_batch` sends
    /// from the retry and probe queues; then the inbound pipeline's timers: retention expiries,
    /// the open drain batch's age, and the retries of refused batches (while a carrier is up).
    pub fn handle_timeout(&mut self, now: Millis) {
        for key in self.timers.due_acks(now) {
            self.ack_timeout(key, now);
        }
        for key in self.timers.due_expiries(now) {
            self.settle_failed(key, FailReason::OutboxLifetimeExceeded, now);
        }
        self.send_due(now);
        let carrier_up = !self.carriers.is_empty();
        let mut sink = Sink {
            store: &mut self.store,
            events: &mut self.events,
            transmits: &mut self.transmits,
        };
        if let Some(durable) = self.durable.as_mut() {
            durable.on_timeout(now, carrier_up, &mut sink);
        }
        self.end_call();
    }

    /// A presence status from the relay (`PresenceStatus`, pushed under `presence_watch_v1` or
    /// polled). `online: true` that is news is a reachability edge for `peer`: its parked
    /// messages go now with a fresh budget. `online: false` only updates the remembered status:
    /// probes continue (offline per presence is not a verdict, and a local link may still reach
    /// the peer).
    pub fn handle_presence(&mut self, peer: &str, online: bool, now: Millis) {
        if self.presence.report(peer, online) {
            self.edge(peer, now);
            self.send_due(now);
        }
        self.end_call();
    }

    /// `peer` appeared on local carrier `carrier` (registered with `handle_carrier_up`): a
    /// reachability edge for it, then the seed's Peer Discovery Flush — the peer's waiting
    /// outbox entries (queued, parked or resting) are pulled from the retry queue and sent now
    /// over the direct link, at most `flush_batch` in this call (the rest stay queued and due,
    /// never stranded); failed sends are re-enqueued with their attempt counts.
    pub fn handle_neighbor_discovered(&mut self, peer: &str, carrier: Carrier, now: Millis) {
        let registered = match &carrier {
            Carrier::Local(name) => self.neighbors.is_registered(name),
            Carrier::Relay | Carrier::Gateway => false,
        };
        if !registered {
            let text = format!(
                "neighbor {peer} reported on {carrier}, which is not a registered local carrier"
            );
            self.diagnostic(DiagnosticLevel::Warn, text);
            self.end_call();
            return;
        }
        self.neighbors.discover(carrier.name(), peer);
        self.edge(peer, now);
        let mut waiting: Vec<Slot> = Vec::new();
        for key in self.outbox.keys_to(peer) {
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
        self.end_call();
    }

    /// `peer` left local carrier `carrier`. Frames handed to that link and not written are
    /// failed sends (re-enqueued with their attempt counts; the next send takes the relay if it
    /// is up); written ones keep their ACK timers.
    pub fn handle_neighbor_lost(&mut self, peer: &str, carrier: Carrier, now: Millis) {
        if self.neighbors.lose(carrier.name(), peer) {
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
        self.end_call();
    }

    /// The next change of the presence watchlist: `Watch` when a peer enters it, `Unwatch` when
    /// it leaves, independent of the relay connection (the runtime tells each new connection the
    /// whole set); see the `presence` module for the rules.
    pub fn poll_presence(&mut self) -> Option<PresenceChange> {
        self.presence.poll()
    }

    /// `internetPresenceWatchlist()`: the recipients of parked entries (unreachable or in relay
    /// custody) and the peers that just got a verdict, sorted.
    pub fn presence_watchlist(&self) -> Vec<String> {
        self.presence.wanted()
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
    /// Only due work counts: ACK deadlines, lifetime expiries, and queued sends that have a
    /// route and an in-flight slot (probes of parked entries not before the resend budget can
    /// fund one, under `edgeDrivenUnreachableDm`). A queued entry that cannot go adds no
    /// deadline: the carrier, neighbor or slot-freeing input is what moves it. Resting entries
    /// add only their expiry. The inbound pipeline adds the open drain batch's age, the retry of
    /// refused batches (while a carrier is up) and the retention of buffered rows; nothing when
    /// nothing is buffered.
    pub fn next_deadline(&self) -> Option<Millis> {
        let fixed = self.timers.next_fixed_deadline();
        let sends = if self.has_slot() {
            let probes_from = if self.config.edge_driven_unreachable_dm {
                self.resend_budget.ready_at()
            } else {
                0
            };
            if self.addressed().is_some() {
                self.timers.next_send(probes_from)
            } else {
                self.neighbor_queue()
                    .map(|((at, _, _), parked)| if parked { at.max(probes_from) } else { at })
                    .min()
            }
        } else {
            None
        };
        let inbound = self
            .durable
            .as_ref()
            .and_then(|durable| durable.next_deadline(!self.carriers.is_empty()));
        [fixed, sends, inbound].into_iter().flatten().min()
    }

    pub fn status(&self, id: &str) -> Option<EntryState> {
        let key = self.outbox.key_of(id)?;
        self.outbox.get(key).map(Entry::state)
    }

    /// `parked` counts parked entries not in flight — unreachable and relay custody alike,
    /// probing or resting; `retry_queue` the other queued entries; a probe in flight is a
    /// pending ACK.
    pub fn stats(&self) -> Stats {
        Stats {
            outbox_regular: self.outbox.count(Class::Regular),
            outbox_media: self.outbox.count(Class::Media),
            pending_acks: self.timers.in_flight(),
            retry_queue: self.timers.retry_queue(),
            parked: self.timers.parked(),
            pre_session_queue: 0,
            carriers_up: self.carriers.len(),
        }
    }

    pub fn carriers_up(&self) -> usize {
        self.carriers.len()
    }

    // ---- carrier choice and sending -------------------------------------------------------

    /// Carrier choice: a direct link to the recipient, else the relay, else a gateway, else
    /// none.
    fn route_for(&self, recipient: &str) -> Result<Route, &'static str> {
        if let Some(carrier) = self.neighbors.link_to(recipient) {
            return Ok((
                Carrier::Local(carrier.to_owned()),
                Some(recipient.to_owned()),
            ));
        }
        match self.addressed() {
            Some(carrier) => Ok((carrier, None)),
            None => Err(REASON_NO_CARRIER),
        }
    }

    /// The addressed carrier that carries attempts: the relay when it is up, else a gateway.
    fn addressed(&self) -> Option<Carrier> {
        [Carrier::Relay, Carrier::Gateway]
            .into_iter()
            .find(|carrier| self.carriers.contains(carrier))
    }

    fn has_slot(&self) -> bool {
        self.timers.in_flight() < self.config.max_pending_acks.max(1)
    }

    /// The route the entry's next send would take, or why it cannot go now.
    fn sendable(&self, key: Key) -> Result<Route, &'static str> {
        let entry = self.outbox.get(key).ok_or(REASON_NO_CARRIER)?;
        let route = self.route_for(&entry.message.recipient)?;
        if !self.has_slot() {
            return Err(REASON_IN_FLIGHT_LIMIT);
        }
        Ok(route)
    }

    /// Queued entries of current neighbors, with whether each is parked: what can go while the
    /// relay is down.
    fn neighbor_queue(&self) -> impl Iterator<Item = (Slot, bool)> + '_ {
        self.neighbors
            .peers()
            .flat_map(|peer| self.outbox.keys_to(peer))
            .filter_map(|key| {
                let parked = self.outbox.get(key)?.park.is_some();
                self.queued_slot(key).map(|slot| (slot, parked))
            })
    }

    fn queued_slot(&self, key: Key) -> Option<Slot> {
        let entry = self.outbox.get(key)?;
        match entry.phase {
            Phase::Queued { at, .. } => Some((at, std::cmp::Reverse(entry.message.priority), key)),
            _ => None,
        }
    }

    /// The next entry due at `now` that can go, in retry-queue order.
    fn next_due(&self, now: Millis) -> Option<Key> {
        if !self.has_slot() {
            return None;
        }
        let gate = Gate {
            probes: !self.config.edge_driven_unreachable_dm || self.resend_budget.available(now),
        };
        if self.addressed().is_some() {
            self.timers.first_due_send(now, gate)
        } else {
            self.neighbor_queue()
                .filter(|((at, _, _), parked)| *at <= now && (gate.probes || !parked))
                .map(|(slot, _)| slot)
                .min()
                .map(|(_, _, key)| key)
        }
    }

    /// Up to one batch of due entries, in retry-queue order, while routes, slots and the resend
    /// budget allow.
    fn send_due(&mut self, now: Millis) {
        for _ in 0..self.config.flush_batch.max(1) {
            let Some(key) = self.next_due(now) else {
                break;
            };
            if !self.try_send(key, now) {
                break;
            }
        }
    }

    /// Sends the entry now if it has a route and a slot and, when parked under
    /// `edgeDrivenUnreachableDm`, the resend budget funds it.
    fn try_send(&mut self, key: Key, now: Millis) -> bool {
        let Ok(route) = self.sendable(key) else {
            return false;
        };
        let parked = self.outbox.get(key).is_some_and(|e| e.park.is_some());
        if parked && self.config.edge_driven_unreachable_dm && !self.resend_budget.take(now) {
            return false;
        }
        self.transmit(key, route);
        true
    }

    /// Hands the entry's attempt to `route`. A parked entry's send is a probe on every carrier:
    /// it is also offered to every other current neighbor.
    fn transmit(&mut self, key: Key, (carrier, peer): Route) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let message = entry.message.clone();
        let parked = entry.park.is_some();
        self.last_send_seq += 1;
        let send_seq = self.last_send_seq;
        self.set_phase(
            key,
            Phase::Handed {
                send_seq,
                carrier: carrier.clone(),
            },
        );
        let recipient = message.recipient.clone();
        self.transmits.push_back(Transmit {
            carrier,
            peer,
            kind: TransmitKind::Outbox { message, send_seq },
        });
        if parked {
            self.offer(key, Some(&recipient));
        }
    }

    /// Offers the entry to every current neighbor but `except`, and to the gateway when the
    /// relay carries the attempts: carry-only copies, reports for which are ignored (their
    /// `send_seq` is never the entry's attempt).
    fn offer(&mut self, key: Key, except: Option<&str>) {
        let via_gateway =
            self.carriers.contains(&Carrier::Gateway) && self.carriers.contains(&Carrier::Relay);
        if self.neighbors.is_empty() && !via_gateway {
            return;
        }
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let mut targets: Vec<(Carrier, Option<String>)> = self
            .neighbors
            .each()
            .filter(|(_, peer)| Some(*peer) != except)
            .map(|(carrier, peer)| (Carrier::Local(carrier.to_owned()), Some(peer.to_owned())))
            .collect();
        if via_gateway {
            targets.push((Carrier::Gateway, None));
        }
        for (carrier, peer) in targets {
            self.last_send_seq += 1;
            self.transmits.push_back(Transmit {
                carrier,
                peer,
                kind: TransmitKind::Outbox {
                    message: entry.message.clone(),
                    send_seq: self.last_send_seq,
                },
            });
        }
    }

    fn mark_written(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let Phase::Handed { send_seq, carrier } = &entry.phase else {
            return;
        };
        let (send_seq, direct) = (*send_seq, matches!(carrier, Carrier::Local(_)));
        let transport = carrier.name().to_owned();
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
        if direct {
            // Written on a direct link: it reached the recipient's device, the local analogue
            // of the relay's "live".
            self.set_park(key, None);
        }
    }

    fn current_attempt(&self, id: &str, send_seq: u64) -> Option<Key> {
        let key = self.outbox.key_of(id)?;
        (self.outbox.get(key)?.current_send_seq() == Some(send_seq)).then_some(key)
    }

    // ---- leaving flight ---------------------------------------------------------------------

    /// A failed send: transport backoff, no budget spent. `message_deferred.retry_count` is the
    /// number of transport failures before this one since the relay last accepted the frame,
    /// the exponent of its backoff. A parked entry stays parked.
    fn transport_failure(&mut self, key: Key, reason: &str, now: Millis) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let retry = entry.transport_retries;
        entry.transport_retries = retry.saturating_add(1);
        let at = now.saturating_add(self.config.backoff_ms(retry));
        if self.requeue(key, at, now) {
            // Without a route the time is only a lower bound: the carrier edge decides.
            let next = self.sendable(key).is_ok().then_some(at);
            self.emit_deferred_with(key, reason, retry, next);
        }
    }

    /// The relay's unreachable verdict for the entry's current attempt (`delivery.md` item 7:
    /// exactly this message).
    fn on_unreachable(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        let recipient = entry.message.recipient.clone();
        let media = entry.class() == Class::Media;
        self.events.push_back(Event::MessageUndeliverable {
            message_id: entry.message.id.clone(),
            recipient: recipient.clone(),
            reason: REASON_UNREACHABLE.to_owned(),
            file_id: file_id(&entry.message),
        });
        self.parking.set_verdict(&recipient);
        self.presence.forget_status(&recipient);
        if media {
            // Not parked: it keeps its pending ACK and its ladder, and is offered to neighbors.
            self.set_park(key, None);
            self.offer(key, None);
        } else {
            self.park(key, Park::Unreachable, now);
        }
    }

    fn ack_timeout(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        if let Some(kind) = entry.park {
            // A probe nobody answered: pace it, don't spend.
            self.park(key, kind, now);
            return;
        }
        let regular = entry.class() == Class::Regular;
        let verdict = self.parking.has_verdict(&entry.message.recipient);
        match ack::after_timeout(&self.config, entry.ack_attempts, now) {
            AfterTimeout::Exhausted if regular && verdict => {
                // The recipient still holds a live park counter: re-park, don't settle.
                self.park(key, Park::Unreachable, now);
            }
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
        let newly = entry.park != Some(Park::Custody);
        if self.park(key, Park::Custody, now) && newly {
            if let Some(entry) = self.outbox.get(key) {
                self.events.push_back(Event::MessageStored {
                    message_id: entry.message.id.clone(),
                    recipient: entry.message.recipient.clone(),
                });
            }
        }
    }

    /// Parks the entry (pending ACK and retry entry dropped, outbox entry kept): the
    /// recipient's ladder climbs once and the probe is scheduled at the escalated interval —
    /// or, under `edgeDrivenUnreachableDm` once this episode's timed probes are spent, the entry
    /// rests until an edge. Every park offers the message to the current neighbors. Returns
    /// whether the entry is still live (a park past the lifetime settles it).
    fn park(&mut self, key: Key, kind: Park, now: Millis) -> bool {
        let Some(entry) = self.outbox.get(key) else {
            return false;
        };
        let recipient = entry.message.recipient.clone();
        let quiet =
            self.config.edge_driven_unreachable_dm && entry.timed_probes >= EDGE_DRIVEN_PROBES;
        self.set_park(key, Some(kind));
        let delay = self.parking.climb(&recipient);
        let live = if quiet {
            self.rest(key, now)
        } else {
            if let Some(entry) = self.outbox.get_mut(key) {
                entry.timed_probes = entry.timed_probes.saturating_add(1);
            }
            self.requeue(key, now.saturating_add(delay), now)
        };
        if live {
            self.offer(key, None);
        }
        live
    }

    /// Back into the retry queue at `at` after an attempt ended without a settlement — unless
    /// the lifetime ran out while the attempt was pending: expiry waits for a pending ACK, and
    /// this is where it catches up. Returns whether the entry is still live.
    fn requeue(&mut self, key: Key, at: Millis, now: Millis) -> bool {
        let Some(expires_at) = self.still_alive(key, now) else {
            return false;
        };
        self.set_phase(key, Phase::Queued { at, expires_at });
        true
    }

    /// Quiet until an edge: no send timer, only the lifetime.
    fn rest(&mut self, key: Key, now: Millis) -> bool {
        let Some(expires_at) = self.still_alive(key, now) else {
            return false;
        };
        self.set_phase(key, Phase::Resting { expires_at });
        true
    }

    /// The entry's expiry while it has one ahead; an entry whose lifetime ran out is settled
    /// failed here, and gone (`None`) like one that was never there.
    fn still_alive(&mut self, key: Key, now: Millis) -> Option<Millis> {
        let expires_at = self.outbox.get(key)?.expires_at(&self.config);
        if now >= expires_at {
            self.settle_failed(key, FailReason::OutboxLifetimeExceeded, now);
            return None;
        }
        Some(expires_at)
    }

    /// Makes a queued or resting entry due now.
    fn bring_forward(&mut self, key: Key, now: Millis) {
        let Some(entry) = self.outbox.get(key) else {
            return;
        };
        match entry.phase {
            Phase::Queued { at, expires_at } if at > now => {
                self.set_phase(
                    key,
                    Phase::Queued {
                        at: now,
                        expires_at,
                    },
                );
            }
            Phase::Resting { expires_at } => {
                self.set_phase(
                    key,
                    Phase::Queued {
                        at: now,
                        expires_at,
                    },
                );
            }
            _ => {}
        }
    }

    /// A reachability edge for `peer`: its ladder and verdict reset, and every entry of its
    /// park episode gets a fresh ACK budget and a new episode — parked ones go again now, and a
    /// probe that was climbing the ACK ladder restarts it from 0 (it was not parked at the
    /// moment, but its accumulated count came from the episode the edge just ended).
    fn edge(&mut self, peer: &str, now: Millis) {
        if !self.parking.edge(peer) {
            return;
        }
        for key in self.outbox.keys_to(peer) {
            let Some(entry) = self.outbox.get_mut(key) else {
                continue;
            };
            let parked = entry.park.is_some();
            if !parked && entry.timed_probes == 0 {
                continue;
            }
            if entry.ack_attempts != 0 || entry.timed_probes != 0 {
                entry.ack_attempts = 0;
                entry.timed_probes = 0;
                self.dirty.insert(key);
            }
            if parked {
                self.bring_forward(key, now);
            }
        }
    }

    /// A reachability edge for everyone (reconnect).
    fn edge_all(&mut self, now: Millis) {
        for peer in self.parking.recipients() {
            self.edge(&peer, now);
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
        // The recipient just proved reachable: its other parked messages go again now.
        self.edge(&recipient, now);
        self.send_due(now);
    }

    /// Returns whether the frame's seq is released now (processed or dropped); with the hook a
    /// buffered message's seq is released when it commits, and one over the buffer bound never.
    fn inbound_data(&mut self, message: Message, origin: &InboundOrigin, now: Millis) -> bool {
        self.lamport = self.lamport.max(message.lamport_clock.min(MAX_LAMPORT));
        let transport = origin.carrier.name().to_owned();
        // Direct messages only for now: the chat of a DM is its sender.
        let key = DedupKey {
            chat: message.sender.clone(),
            sender: message.sender.clone(),
            message_id: message.id.clone(),
        };
        let mut release = true;
        let mut ack = None;
        match self.durable.as_mut() {
            // With the hook, a message not processed yet goes to the pipeline: its seq and its
            // ACK wait for the commit (or, over the buffer bound, for a redelivery).
            Some(durable) if !self.dedup.contains(&key, now) => {
                let pending = PendingInbound {
                    key: InboundKey {
                        chat: key.chat,
                        sender: key.sender,
                        message_id: key.message_id,
                    },
                    message,
                    carrier: origin.carrier.clone(),
                    stamped_sender: origin.stamped_sender.clone(),
                    received_at: now,
                };
                let mut sink = Sink {
                    store: &mut self.store,
                    events: &mut self.events,
                    transmits: &mut self.transmits,
                };
                durable.arrive(pending, origin.seq, now, &mut sink);
                release = false;
            }
            _ => {
                ack = message
                    .requires_ack
                    .then(|| message.ack(inbound::ack_id(&message.id), now, &transport));
                if self.durable.is_none() && self.dedup.first_sighting(&key, now) {
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
            }
        }
        // The peer that carried it is back: an edge for it (the seed's opt-out paragraph counts
        // on returning peers that send an inbound frame). Over the relay it may be an old frame
        // from the mailbox; the cost of that false edge is one re-drive and a fresh verdict.
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

    /// The end-to-end ACK of a committed (or restored and delivered) message: on the carrier it
    /// came by while that is usable (the relay or gateway up, or the peer still a neighbor
    /// there), else the current route to its sender, else none — the sender's resend is re-ACKed
    /// from dedup.
    fn ack_committed(&mut self, pending: &PendingInbound, now: Millis) {
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
        let message = &pending.message;
        let ack = message.ack(inbound::ack_id(&message.id), now, pending.carrier.name());
        self.transmits.push_back(Transmit {
            carrier,
            peer,
            kind: TransmitKind::DeliveryAck { message: ack },
        });
    }

    /// Buffered rows restored without a hook: delivered at most once, as if they arrived now.
    fn deliver_restored(&mut self, mut rows: Vec<PendingInbound>, now: Millis) {
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
            self.dedup.record(dedup_key(&row.key), now);
            self.ack_committed(&row, now);
            let InboundKey { chat, sender, .. } = row.key;
            self.events.push_back(Event::MessageReceived {
                message: row.message,
                chat,
                sender,
                transport: row.carrier.name().to_owned(),
            });
        }
    }

    // ---- bookkeeping --------------------------------------------------------------------------

    fn admit(&mut self, entry: Entry) -> Key {
        let (priority, parked) = (entry.message.priority, entry.park.is_some());
        let phase = entry.phase.clone();
        let held_for = parked.then(|| entry.message.recipient.clone());
        let key = self.outbox.insert(entry);
        self.timers.arm(key, priority, parked, &phase);
        if let Some(recipient) = held_for {
            self.parking.hold(&recipient, key);
        }
        self.dirty.insert(key);
        key
    }

    fn set_phase(&mut self, key: Key, phase: Phase) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        let parked = entry.park.is_some();
        let old = std::mem::replace(&mut entry.phase, phase);
        self.timers
            .disarm(key, entry.message.priority, parked, &old);
        self.timers
            .arm(key, entry.message.priority, parked, &entry.phase);
        self.dirty.insert(key);
    }

    fn set_park(&mut self, key: Key, park: Option<Park>) {
        let Some(entry) = self.outbox.get_mut(key) else {
            return;
        };
        if entry.park == park {
            return;
        }
        let (was, is) = (entry.park.is_some(), park.is_some());
        entry.park = park;
        self.dirty.insert(key);
        if was == is {
            return;
        }
        self.timers
            .disarm(key, entry.message.priority, was, &entry.phase);
        self.timers
            .arm(key, entry.message.priority, is, &entry.phase);
        if is {
            self.parking.hold(&entry.message.recipient, key);
        } else {
            self.parking.release(&entry.message.recipient, key);
        }
    }

    fn remove(&mut self, key: Key) -> Option<Entry> {
        let entry = self.outbox.remove(key)?;
        let parked = entry.park.is_some();
        self.timers
            .disarm(key, entry.message.priority, parked, &entry.phase);
        if parked {
            self.parking.release(&entry.message.recipient, key);
        }
        if !self.outbox.has_recipient(&entry.message.recipient) {
            self.parking.forget(&entry.message.recipient);
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

    /// One Put per entry changed during the call, reflecting where it ended up; then the
    /// watchlist follows the parking bookkeeping.
    fn end_call(&mut self) {
        if let Some(durable) = self.durable.as_mut() {
            let rows = durable.take_to_buffer();
            if !rows.is_empty() {
                self.store.push_back(StoreOp::BufferInbound(rows));
            }
        }
        for peer in self.parking.take_touched() {
            let wanted = self.parking.watched(&peer);
            self.presence.set_wanted(&peer, wanted);
        }
        for key in std::mem::take(&mut self.dirty) {
            if let Some(entry) = self.outbox.get(key) {
                self.store.push_back(StoreOp::Put(entry.record()));
            }
        }
    }
}

fn dedup_key(key: &InboundKey) -> DedupKey {
    DedupKey {
        chat: key.chat.clone(),
        sender: key.sender.clone(),
        message_id: key.message_id.clone(),
    }
}

/// `file_id` of `message_undeliverable`: the transfer a media chunk belongs to, when it says.
fn file_id(message: &Message) -> Option<String> {
    if message.content_type != ContentType::FileChunk {
        return None;
    }
    let from_media = message.media_metadata.as_ref().and_then(|meta| {
        ["file_id", "fileId"]
            .iter()
            .find_map(|k| meta.get(k).and_then(Value::as_str))
    });
    from_media
        .or_else(|| message.metadata.get("file_id").map(String::as_str))
        .map(str::to_owned)
}

#[cfg(test)]
impl Engine {
    /// The engine's own consistency: indexes match phases, the in-flight cap holds, parked
    /// entries always have a probe timer or rest by the edge-driven rule, the watchlist follows
    /// the parking bookkeeping, no Put is left unemitted between calls.
    pub(crate) fn check_invariants(&self) {
        self.outbox.check();
        self.presence.check();
        if let Some(durable) = &self.durable {
            durable.check();
        }
        let mut expected = Timers::default();
        let mut held = BTreeSet::new();
        let records: BTreeSet<String> = self.parking.recipients().into_iter().collect();
        for (key, entry) in self.outbox.iter() {
            let parked = entry.park.is_some();
            if parked || entry.timed_probes > 0 {
                assert!(
                    records.contains(&entry.message.recipient),
                    "{} of a park episode its next edge cannot find",
                    entry.message.id
                );
            }
            expected.arm(key, entry.message.priority, parked, &entry.phase);
            if parked {
                held.insert(key);
            }
            match entry.phase {
                Phase::Queued { expires_at, .. } => assert_eq!(
                    expires_at,
                    entry.expires_at(&self.config),
                    "expiry of {}",
                    entry.message.id
                ),
                Phase::Resting { expires_at } => {
                    assert_eq!(expires_at, entry.expires_at(&self.config));
                    assert!(
                        parked
                            && self.config.edge_driven_unreachable_dm
                            && entry.timed_probes >= EDGE_DRIVEN_PROBES,
                        "{} rests outside the edge-driven rule",
                        entry.message.id
                    );
                }
                Phase::Handed { .. } | Phase::AwaitingAck { .. } => {}
            }
        }
        assert_eq!(
            expected, self.timers,
            "timer indexes out of step with entry phases"
        );
        assert_eq!(
            held,
            self.parking.keys().collect::<BTreeSet<_>>(),
            "parking index out of step"
        );
        for recipient in &self.parking.recipients() {
            assert!(
                self.outbox.has_recipient(recipient),
                "parking record of {recipient} outlived its entries"
            );
            assert_eq!(
                self.presence.is_wanted(recipient),
                self.parking.watched(recipient),
                "watchlist out of step for {recipient}"
            );
        }
        for peer in self.presence.wanted() {
            assert!(self.parking.watched(&peer), "{peer} watched for nothing");
        }
        assert!(
            self.timers.in_flight() <= self.config.max_pending_acks.max(1),
            "in-flight cap"
        );
        assert!(self.dirty.is_empty());
    }

    /// The keys of the buffered inbound rows the engine holds.
    pub(crate) fn inbound_keys(&self) -> BTreeSet<InboundKey> {
        self.durable
            .iter()
            .flat_map(|durable| durable.keys().cloned())
            .collect()
    }

    pub(crate) fn park_counter(&self, recipient: &str) -> u32 {
        self.parking.counter(recipient)
    }

    pub(crate) fn is_neighbor(&self, peer: &str) -> bool {
        self.neighbors.link_to(peer).is_some()
    }

    pub(crate) fn records(&self) -> Vec<OutboxRecord> {
        self.outbox
            .iter()
            .map(|(_, entry)| entry.record())
            .collect()
    }
}
