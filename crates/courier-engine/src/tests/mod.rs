//! A virtual-time simulator around one engine, in the shape of quinn-proto's test `Pair`: a
//! store that applies `StoreOp`s like the runtime's SQLite, a network model that executes
//! transmits (carrier writes, relay answers, the recipient's ACKs), and a clock that only moves
//! when a scenario says so. After every engine call it checks the crate's invariants.

mod chaos;
mod connection_requests;
mod custody;
mod gateway;
mod groups;
mod inbound;
mod inbound_durable;
mod ladder;
mod lamport;
mod lifecycle;
mod lifetime;
mod media;
mod neighbors;
mod parking;
mod presence;
mod presession;
mod sealed;
mod sender_gate;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use courier_proto::{ContentType, Message, Priority};

use courier_proto::message::{META_GROUP_COPY, META_GROUP_ID, META_GROUP_MESSAGE};

use crate::{
    Carrier, CarrierAnswer, ChunkOutcome, Config, Engine, EntryState, Event, GroupSendRecord,
    HookBatch, HookMessage, InboundKey, InboundOrigin, Input, MemberState, Millis, OutboxRecord,
    PendingInbound, PresenceChange, ProcessedKey, Restore, SendRequest, Settlement, StoreOp,
    Transmit, TransmitKind,
};

pub(crate) const ALICE: &str = "alice";
pub(crate) const BOB: &str = "bob";
pub(crate) const CAROL: &str = "carol";
/// The local carrier the scenarios register.
pub(crate) const BLE: &str = "ble";
pub(crate) const SEC: Millis = 1000;
pub(crate) const MIN: Millis = 60 * SEC;
pub(crate) const HOUR: Millis = 60 * MIN;
pub(crate) const DAY: Millis = 24 * HOUR;
/// The relay's unreachable verdict as most scenarios hear it.
pub(crate) const UNREACHABLE: CarrierAnswer =
    CarrierAnswer::Unreachable(courier_proto::UnreachableCause::OfflineNoMailbox);

/// One engine output, in the order the runtime acts on a call's outputs.
#[derive(Debug, Clone)]
pub(crate) enum Out {
    Store(StoreOp),
    Event(Event),
    Transmit(Transmit),
}

/// How the world answers each outbox frame.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Net {
    /// The carrier writes frames at once; otherwise they wait in `Sim::unwritten`.
    pub write: bool,
    /// The relay's answer to each written frame; `None`: it says nothing.
    pub answer: Option<CarrierAnswer>,
    /// The recipient ACKs this long after a write that reached it (relay answer `Live` or none).
    pub ack_after: Option<Millis>,
    /// The relay refuses every frame (a `DeliveryError` that is not a verdict): a failed send.
    pub refuse: bool,
}

/// How direct links to neighbors behave.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalNet {
    /// The link writes frames at once; otherwise they wait in `Sim::unwritten`.
    pub write: bool,
    /// A recipient that got a frame over a direct link ACKs on that link this long after.
    pub ack_after: Option<Millis>,
}

impl Net {
    pub(crate) fn honest() -> Self {
        Self {
            write: true,
            answer: Some(CarrierAnswer::Live),
            ack_after: Some(100),
            refuse: false,
        }
    }

    /// Frames are written and the relay takes them, but the recipient never answers.
    pub(crate) fn silent_peer() -> Self {
        Self {
            write: true,
            answer: Some(CarrierAnswer::Live),
            ack_after: None,
            refuse: false,
        }
    }

    pub(crate) fn relay(answer: CarrierAnswer) -> Self {
        Self {
            write: true,
            answer: Some(answer),
            ack_after: None,
            refuse: false,
        }
    }

    /// The relay refuses every frame: each attempt is a failed send.
    pub(crate) fn refusing() -> Self {
        Self {
            write: true,
            answer: None,
            ack_after: None,
            refuse: true,
        }
    }
}

pub(crate) struct Sim {
    pub engine: Engine,
    pub config: Config,
    pub now: Millis,
    pub net: Net,
    /// The runtime's store: outbox rows by id, processed inbound keys.
    pub rows: BTreeMap<String, OutboxRecord>,
    pub processed: Vec<ProcessedKey>,
    /// Verified control frames' keys (`MarkControl`).
    pub controls: Vec<ProcessedKey>,
    /// Every output with the virtual time it came out at.
    pub log: Vec<(Millis, Out)>,
    /// Outbox frames handed to a carrier and not yet written: (id, send_seq, carrier).
    pub unwritten: Vec<(String, u64, Carrier)>,
    pub local: LocalNet,
    /// Registered local carriers and the neighbors each reaches now (the world's view).
    pub links: BTreeMap<String, BTreeSet<String>>,
    /// Carry-only offers: (at, carrier, neighbor, message id).
    pub offers: Vec<(Millis, String, String, String)>,
    /// The watchlist as the runtime knows it from `poll_presence`.
    pub watching: BTreeSet<String>,
    /// Every presence change the runtime polled, with its time.
    pub presence_log: Vec<(Millis, PresenceChange)>,
    /// The recipients `poll_session_wanted` asked a session for, and when.
    pub sessions_wanted: Vec<(Millis, String)>,
    /// Full invariant checks after every call (O(outbox) each); bulk setups may pause them.
    pub checks: bool,
    pub internet_up: bool,
    /// How the gateway answers and whether the recipient is attached to it.
    pub gateway: Net,
    pub gateway_up: bool,
    /// Carry-only copies offered over the gateway: (at, message id, send_seq).
    pub gateway_offers: Vec<(Millis, String, u64)>,
    arrivals: BTreeMap<(Millis, u64), (Message, InboundOrigin)>,
    arrival_seq: u64,
    relay_seq: u64,
    minted: u64,
    /// The app id of each wire id the engine may put on the wire.
    app_ids: BTreeMap<String, String>,
    /// The last frame transmitted for each (app) id: what the recipient would acknowledge.
    pub frames: BTreeMap<String, Message>,
    /// The latest attempt handed out for each id.
    pub send_seqs: BTreeMap<String, u64>,
    /// Ids the recipient really acknowledged; only these may be delivered.
    pub acked_by_recipient: BTreeSet<String>,
    terminal: BTreeMap<String, u32>,
    /// When each inbound (sender, id) last reached the application.
    pub(crate) received: BTreeMap<(String, String), Millis>,
    /// The store's `pending_inbound` table: rows buffered for the durability hook.
    pub inbound_rows: BTreeMap<InboundKey, PendingInbound>,
    /// Keys the store holds as processed (`MarkProcessed`, `CommitInbound`).
    pub processed_keys: BTreeSet<InboundKey>,
    /// `CommitInbound`s per key, and when the last one came.
    pub commits: BTreeMap<InboundKey, (u32, Millis)>,
    /// Keys removed by retention, and how many rows were.
    pub expired: BTreeSet<InboundKey>,
    /// Seqs of frames the sender gate may drop (control frames, and messages claiming another
    /// sender than their stamp), which releases them without processing.
    pub gated: BTreeSet<u64>,
    pub expired_rows: usize,
    /// The batch with the hook now, and every batch offered (when).
    pub hook: Option<HookBatch>,
    pub offered: Vec<(Millis, HookBatch)>,
    /// What the hook committed, as the runtime dispatches it (`message_received`), in order.
    pub dispatched: Vec<(Millis, HookMessage)>,
    /// The relay's journal of data frames for us that are not released yet: seq → frame.
    pub journal: BTreeMap<u64, (Message, InboundOrigin)>,
    /// The key each data frame's seq carried.
    seq_keys: BTreeMap<u64, InboundKey>,
    /// The outputs being drained are the hook's verdict.
    committing: bool,
    /// The store's group message rows, and the ids marked done.
    pub group_rows: BTreeMap<String, GroupSendRecord>,
    pub groups_done: BTreeSet<String>,
    /// Relay broadcasts handed out: (at, group, message).
    pub broadcasts: Vec<(Millis, String, Message)>,
    /// Group member states as the events reported them: (message id, member) → state.
    pub member_events: BTreeMap<(String, String), MemberState>,
    /// The message each received group copy carried, by the copy's id (what its ACK names).
    copy_keys: BTreeMap<String, InboundKey>,
    /// Inbound file chunks: processed at once even with the hook.
    chunk_keys: BTreeSet<InboundKey>,
    /// What the engine reported of this device's chunks, in order.
    pub chunk_outcomes: Vec<ChunkOutcome>,
}

impl Sim {
    pub(crate) fn new(config: Config) -> Self {
        Self {
            engine: Engine::new(config.clone(), ALICE.to_owned()),
            config,
            now: 0,
            net: Net::honest(),
            rows: BTreeMap::new(),
            processed: Vec::new(),
            controls: Vec::new(),
            log: Vec::new(),
            unwritten: Vec::new(),
            local: LocalNet {
                write: true,
                ack_after: Some(100),
            },
            links: BTreeMap::new(),
            offers: Vec::new(),
            watching: BTreeSet::new(),
            presence_log: Vec::new(),
            sessions_wanted: Vec::new(),
            checks: true,
            internet_up: false,
            gateway: Net::honest(),
            gateway_up: false,
            gateway_offers: Vec::new(),
            arrivals: BTreeMap::new(),
            arrival_seq: 0,
            relay_seq: 0,
            minted: 0,
            app_ids: BTreeMap::new(),
            frames: BTreeMap::new(),
            send_seqs: BTreeMap::new(),
            acked_by_recipient: BTreeSet::new(),
            terminal: BTreeMap::new(),
            received: BTreeMap::new(),
            inbound_rows: BTreeMap::new(),
            processed_keys: BTreeSet::new(),
            commits: BTreeMap::new(),
            expired: BTreeSet::new(),
            gated: BTreeSet::new(),
            expired_rows: 0,
            hook: None,
            offered: Vec::new(),
            dispatched: Vec::new(),
            journal: BTreeMap::new(),
            group_rows: BTreeMap::new(),
            groups_done: BTreeSet::new(),
            broadcasts: Vec::new(),
            member_events: BTreeMap::new(),
            copy_keys: BTreeMap::new(),
            chunk_keys: BTreeSet::new(),
            chunk_outcomes: Vec::new(),
            seq_keys: BTreeMap::new(),
            committing: false,
        }
    }

    pub(crate) fn with_defaults() -> Self {
        Self::new(Config::new("chat"))
    }

    // ---- inputs ---------------------------------------------------------------------------

    pub(crate) fn send(&mut self, recipient: &str) -> String {
        self.send_with(recipient, Priority::Medium, ContentType::Text, None)
    }

    pub(crate) fn send_with(
        &mut self,
        recipient: &str,
        priority: Priority,
        content_type: ContentType,
        id: Option<&str>,
    ) -> String {
        let id = id.map_or_else(|| self.mint(), str::to_owned);
        self.submit(request(recipient, priority, content_type, &id));
        id
    }

    /// An id as the runtime mints one for a send without its own.
    pub(crate) fn mint(&mut self) -> String {
        self.minted += 1;
        format!("m{}", self.minted)
    }

    /// Hands `req` to the engine; true when it took a new outbox entry (a Put of its id came
    /// out), false when the send was a no-op.
    pub(crate) fn submit(&mut self, req: SendRequest) -> bool {
        let id = req.id.clone();
        self.app_ids.insert(courier_proto::wire_id(&id), id.clone());
        let mark = self.mark();
        self.input(Input::Send(req));
        self.log[mark..]
            .iter()
            .any(|(_, out)| matches!(out, Out::Store(StoreOp::Put(r)) if r.message.id == id))
    }

    /// Feeds one input to the engine and executes its outputs like the runtime.
    pub(crate) fn input(&mut self, input: Input) {
        self.engine.handle(input, self.now);
        self.after_call();
    }

    pub(crate) fn carrier_up(&mut self) -> usize {
        self.internet_up = true;
        let mark = self.mark();
        self.engine
            .handle(Input::CarrierUp(Carrier::Relay), self.now);
        self.after_call_counting(mark)
    }

    pub(crate) fn carrier_down(&mut self) {
        self.internet_up = false;
        // Frames the carrier had not written die with it.
        self.unwritten.retain(|(_, _, c)| *c != Carrier::Relay);
        self.input(Input::CarrierDown(Carrier::Relay));
    }

    /// The gateway carrier is bound; returns the outbox frames sent.
    pub(crate) fn gateway_up(&mut self) -> usize {
        self.gateway_up = true;
        let mark = self.mark();
        self.engine
            .handle(Input::CarrierUp(Carrier::Gateway), self.now);
        self.after_call_counting(mark)
    }

    pub(crate) fn gateway_down(&mut self) {
        self.gateway_up = false;
        self.unwritten.retain(|(_, _, c)| *c != Carrier::Gateway);
        self.input(Input::CarrierDown(Carrier::Gateway));
    }

    /// The app registers local carrier `name`.
    pub(crate) fn local_up(&mut self, name: &str) {
        self.links.entry(name.to_owned()).or_default();
        self.input(Input::CarrierUp(Carrier::Local(name.to_owned())));
    }

    /// Local carrier `name` goes away with its links.
    pub(crate) fn local_down(&mut self, name: &str) {
        self.links.remove(name);
        let carrier = Carrier::Local(name.to_owned());
        self.unwritten.retain(|(_, _, c)| *c != carrier);
        self.input(Input::CarrierDown(carrier));
    }

    /// `peer` comes in range of local carrier `name`; returns the outbox frames sent.
    pub(crate) fn discover(&mut self, peer: &str, name: &str) -> usize {
        if let Some(peers) = self.links.get_mut(name) {
            peers.insert(peer.to_owned());
        }
        let mark = self.mark();
        let input = Input::NeighborDiscovered {
            peer: peer.to_owned(),
            carrier: name.to_owned(),
        };
        self.engine.handle(input, self.now);
        self.after_call_counting(mark)
    }

    /// `peer` goes out of range of local carrier `name`.
    pub(crate) fn lose(&mut self, peer: &str, name: &str) {
        if let Some(peers) = self.links.get_mut(name) {
            peers.remove(peer);
        }
        let carrier = Carrier::Local(name.to_owned());
        let frames = &self.frames;
        self.unwritten
            .retain(|(id, _, c)| !(*c == carrier && frames[id].recipient == peer));
        self.input(Input::NeighborLost {
            peer: peer.to_owned(),
            carrier: name.to_owned(),
        });
    }

    /// The relay reports `peer`'s presence; returns the outbox frames sent.
    pub(crate) fn presence(&mut self, peer: &str, online: bool) -> usize {
        let mark = self.mark();
        let input = Input::Presence {
            peer: peer.to_owned(),
            online,
            last_seen_ms: None,
        };
        self.engine.handle(input, self.now);
        self.after_call_counting(mark)
    }

    /// One `Input::Timeout` at the current time; returns the outbox frames it sent.
    pub(crate) fn timeout(&mut self) -> usize {
        let mark = self.mark();
        self.engine.handle(Input::Timeout, self.now);
        self.after_call_counting(mark)
    }

    pub(crate) fn write_unwritten(&mut self, index: usize) {
        if index < self.unwritten.len() {
            let frame = self.unwritten.remove(index);
            let more = self.write(frame);
            self.execute(more);
        }
    }

    pub(crate) fn fail_unwritten(&mut self, index: usize, reason: &str) {
        if index < self.unwritten.len() {
            let (id, seq, _) = self.unwritten.remove(index);
            self.input(Input::SendFailed {
                id: courier_proto::wire_id(&id),
                send_seq: seq,
                reason: reason.to_owned(),
            });
        }
    }

    /// The relay's answer to the latest attempt of `id`.
    pub(crate) fn answer(&mut self, id: &str, answer: CarrierAnswer) {
        let seq = self.send_seqs.get(id).copied().unwrap_or(0);
        self.answer_seq(id, seq, answer);
    }

    pub(crate) fn answer_seq(&mut self, id: &str, send_seq: u64, answer: CarrierAnswer) {
        self.input(Input::Answer {
            id: courier_proto::wire_id(id),
            send_seq,
            answer,
        });
    }

    /// The recipient's end-to-end ACK of the last frame sent for `id`, arriving now.
    pub(crate) fn ack(&mut self, id: &str) {
        let (ack, origin) = self.recipient_ack(id);
        self.inbound(ack, origin);
    }

    /// An ACK of `id` claiming to come from its recipient, carried on `carrier` by `carried_by`
    /// (a local carrier's peer id, or the identity the relay stamped).
    pub(crate) fn ack_carried(&mut self, id: &str, carrier: Carrier, carried_by: &str) {
        let frame = &self.frames[id];
        if carried_by == frame.recipient {
            self.acked_by_recipient.insert(id.to_owned());
        }
        let ack = frame.ack(format!("peer-ack-{id}"), self.now, carrier.name());
        let origin = InboundOrigin {
            carrier,
            stamped_sender: carried_by.to_owned(),
            sender_account: None,
            seq: None,
            sealed_by: None,
        };
        self.inbound(ack, origin);
    }

    pub(crate) fn inbound(&mut self, message: Message, origin: InboundOrigin) {
        if let Some(copy) = message.metadata.get(META_GROUP_COPY) {
            self.copy_keys.insert(copy.clone(), inbound_key(&message));
        }
        if message.content_type == ContentType::FileChunk && message.media_metadata.is_some() {
            self.chunk_keys.insert(inbound_key(&message));
        }
        if let (None, Some(seq)) = (message.ack_for(), origin.seq) {
            // The relay journals a data frame until it is released.
            let key = inbound_key(&message);
            let vouched = crate::sender_gate::vouched_for(&message, &origin);
            if courier_proto::is_signature_gated(&message.content) || !vouched {
                self.gated.insert(seq);
            }
            if let Some(known) = self.seq_keys.insert(seq, key.clone()) {
                assert_eq!(known, key, "seq {seq} reused for another message");
            }
            self.journal.insert(seq, (message.clone(), origin.clone()));
        }
        self.input(Input::Inbound {
            message: Box::new(message),
            origin,
        });
    }

    /// The relay connection comes up with `mailbox_v1`: carrier up, then the drain starts.
    pub(crate) fn drain_started(&mut self) {
        if !self.internet_up {
            self.carrier_up();
        }
        self.input(Input::DrainStarted(Carrier::Relay));
    }

    /// The relay writes every journal frame not released yet (its drain), in seq order.
    pub(crate) fn redeliver_journal(&mut self) -> u64 {
        let frames: Vec<(Message, InboundOrigin)> = self.journal.values().cloned().collect();
        let count = frames.len() as u64;
        for (message, origin) in frames {
            self.inbound(message, origin);
        }
        count
    }

    pub(crate) fn drain_complete(&mut self, count: u64) {
        self.input(Input::DrainComplete {
            carrier: Carrier::Relay,
            count,
        });
    }

    /// The runtime asks for the next hook batch; every row in it must already be in the store.
    pub(crate) fn poll_hook(&mut self) -> Option<HookBatch> {
        let batch = self.engine.poll_hook(self.now)?;
        assert!(
            self.hook.is_none(),
            "a second batch while one is with the hook"
        );
        assert!(!batch.messages.is_empty(), "an empty hook batch");
        if let Some(durable) = &self.config.durability_hook {
            let over_one = batch.messages.len() > 1;
            assert!(
                batch.messages.len() <= durable.batch_max_messages.max(1),
                "a batch of {}",
                batch.messages.len()
            );
            let bytes: usize = batch
                .messages
                .iter()
                .map(|m| crate::hook::content_bytes(&m.message))
                .sum();
            assert!(
                !over_one || bytes <= durable.batch_max_bytes,
                "a batch of {bytes} bytes"
            );
        }
        for message in &batch.messages {
            assert!(
                self.inbound_rows.contains_key(&message.key),
                "{:?} offered to the hook before it was buffered",
                message.key
            );
        }
        self.hook = Some(batch.clone());
        self.offered.push((self.now, batch.clone()));
        Some(batch)
    }

    /// The hook resolves (Ok) or rejects the batch it has; returns what the runtime dispatches.
    pub(crate) fn hook_result(&mut self, ok: bool) -> Vec<HookMessage> {
        let batch = self.hook.take().expect("no batch with the hook");
        for message in &batch.messages {
            assert!(
                self.inbound_rows.contains_key(&message.key),
                "{:?} with the hook lost its buffered row",
                message.key
            );
        }
        let result = if ok {
            Ok(())
        } else {
            Err("disk full".to_owned())
        };
        let mark = self.mark();
        self.engine.handle(
            Input::HookResult {
                batch_id: batch.id,
                result,
            },
            self.now,
        );
        self.committing = true;
        self.after_call();
        self.committing = false;
        let received: Vec<InboundKey> = self.log[mark..]
            .iter()
            .filter_map(|(_, out)| match out {
                Out::Event(event) => event.received_key(),
                _ => None,
            })
            .collect();
        if !ok {
            assert!(received.is_empty(), "a refused batch reached the app");
            return Vec::new();
        }
        let expected: Vec<InboundKey> = batch.messages.iter().map(|m| m.key.clone()).collect();
        assert_eq!(received, expected, "the committed messages are the batch");
        let ops: Vec<&StoreOp> = self.log[mark..]
            .iter()
            .filter_map(|(_, out)| match out {
                Out::Store(op) => Some(op),
                _ => None,
            })
            .collect();
        assert!(
            matches!(ops.first(), Some(StoreOp::CommitInbound { keys: k, .. }) if *k == expected),
            "the batch commits in its step"
        );
        for message in &batch.messages {
            self.dispatched.push((self.now, message.clone()));
        }
        batch.messages
    }

    /// The runtime with a hook that commits every batch at once.
    pub(crate) fn hook_commits_all(&mut self) -> usize {
        let mut batches = 0;
        while self.poll_hook().is_some() {
            self.hook_result(true);
            batches += 1;
        }
        batches
    }

    /// The process dies and starts again from the store; the carrier comes up separately.
    pub(crate) fn restart(&mut self) {
        self.engine = Engine::new(self.config.clone(), ALICE.to_owned());
        self.internet_up = false;
        self.unwritten.clear();
        self.links.clear();
        // The runtime starts again from the restored engine's watchlist.
        self.watching.clear();
        // The hook's batch died with the process.
        self.hook = None;
        self.input(Input::Restore(Restore {
            outbox: self.rows.values().cloned().collect(),
            processed: self.processed.clone(),
            controls: self.controls.clone(),
            inbound: self.inbound_rows.values().cloned().collect(),
            group_sends: self
                .group_rows
                .values()
                .filter(|row| !self.groups_done.contains(&row.id))
                .cloned()
                .collect(),
        }));
    }

    /// Moves the clock forward, feeding the engine its deadlines and the scheduled arrivals.
    pub(crate) fn advance(&mut self, by: Millis) {
        self.advance_to(self.now + by);
    }

    pub(crate) fn advance_to(&mut self, until: Millis) {
        // Timeouts handled at one instant: each sends at most a flush batch of what is due, so a
        // full outbox takes a few dozen; a deadline that stays due far longer is a spin.
        let mut timeouts_at_this_instant = 0;
        loop {
            let arrival = self.arrivals.keys().next().map(|(at, _)| *at);
            let deadline = self.engine.next_deadline();
            let Some(next) = [arrival, deadline]
                .into_iter()
                .flatten()
                .min()
                .filter(|t| *t <= until)
            else {
                break;
            };
            let next = next.max(self.now);
            if next != self.now {
                timeouts_at_this_instant = 0;
            }
            self.now = next;
            if arrival.is_some_and(|at| at <= next) {
                if let Some((_, (message, origin))) = self.arrivals.pop_first() {
                    self.inbound(message, origin);
                }
            } else {
                timeouts_at_this_instant += 1;
                assert!(
                    timeouts_at_this_instant <= 1000,
                    "the engine spins at {next}: its deadline stays due after 1000 Timeouts"
                );
                self.engine.handle(Input::Timeout, self.now);
                self.after_call();
            }
        }
        self.now = self.now.max(until);
    }

    // ---- observations ---------------------------------------------------------------------

    pub(crate) fn mark(&self) -> usize {
        self.log.len()
    }

    pub(crate) fn events(&self) -> impl Iterator<Item = (Millis, &Event)> {
        self.log.iter().filter_map(|(at, out)| match out {
            Out::Event(event) => Some((*at, event)),
            _ => None,
        })
    }

    pub(crate) fn events_of<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Iterator<Item = (Millis, &'a Event)> + 'a {
        self.events()
            .filter(move |(_, event)| event_id(event) == Some(id))
    }

    /// When each `message_sent` of `id` happened.
    pub(crate) fn sends(&self, id: &str) -> Vec<Millis> {
        self.events_of(id)
            .filter(|(_, e)| matches!(e, Event::MessageSent { .. }))
            .map(|(at, _)| at)
            .collect()
    }

    pub(crate) fn retries(&self, id: &str) -> Vec<(u32, Millis)> {
        self.events_of(id)
            .filter_map(|(_, e)| match e {
                Event::MessageRetrying {
                    retry_count,
                    next_retry_at,
                    ..
                } => Some((*retry_count, *next_retry_at)),
                _ => None,
            })
            .collect()
    }

    /// The terminal event of `id` and when it came, if it has come.
    pub(crate) fn terminal(&self, id: &str) -> Option<(Millis, Event)> {
        self.events_of(id)
            .find(|(_, e)| {
                matches!(
                    e,
                    Event::MessageDelivered { .. } | Event::MessageFailed { .. }
                )
            })
            .map(|(at, e)| (at, e.clone()))
    }

    pub(crate) fn failures(&self) -> usize {
        self.events()
            .filter(|(_, e)| matches!(e, Event::MessageFailed { .. }))
            .count()
    }

    pub(crate) fn status(&self, id: &str) -> Option<EntryState> {
        self.engine.status(id)
    }

    /// The carrier of each `message_sent` of `id`, in order.
    pub(crate) fn sent_over(&self, id: &str) -> Vec<String> {
        self.events_of(id)
            .filter_map(|(_, e)| match e {
                Event::MessageSent { transport, .. } => Some(transport.clone()),
                _ => None,
            })
            .collect()
    }

    /// The carrier and neighbor of every outbox frame of `id` since `mark`, offers included.
    pub(crate) fn frames_of(&self, mark: usize, id: &str) -> Vec<(Carrier, Option<String>)> {
        self.log[mark..]
            .iter()
            .filter_map(|(_, out)| match out {
                Out::Transmit(Transmit {
                    carrier,
                    peer,
                    kind: TransmitKind::Outbox { message, .. },
                }) if self.app_id(&message.id) == id => Some((carrier.clone(), peer.clone())),
                _ => None,
            })
            .collect()
    }

    /// Outbox attempts (not carry-only offers) since `mark`.
    pub(crate) fn outbox_frames_since(&self, mark: usize) -> Vec<(Millis, &Message)> {
        self.log[mark..]
            .iter()
            .filter_map(|(at, out)| match out {
                Out::Transmit(Transmit {
                    kind: TransmitKind::Outbox { message, send_seq },
                    peer,
                    ..
                }) if peer.as_ref().is_none_or(|p| *p == message.recipient)
                    && !self.gateway_offers.iter().any(|(_, _, s)| s == send_seq) =>
                {
                    Some((*at, message))
                }
                _ => None,
            })
            .collect()
    }

    pub(crate) fn terminal_count(&self, id: &str) -> u32 {
        self.terminal.get(id).copied().unwrap_or(0)
    }

    /// The app id of a message that went on the wire as `wire_id`.
    pub(crate) fn app_id(&self, wire_id: &str) -> String {
        self.app_ids
            .get(wire_id)
            .unwrap_or_else(|| panic!("{wire_id} is no wire id of a message sent here"))
            .clone()
    }

    // ---- the world's side ------------------------------------------------------------------

    fn recipient_ack(&mut self, id: &str) -> (Message, InboundOrigin) {
        self.addressed_ack(id, Carrier::Relay)
    }

    /// The recipient's ACK of `id` back over an addressed carrier (only the relay journals it).
    fn addressed_ack(&mut self, id: &str, carrier: Carrier) -> (Message, InboundOrigin) {
        let frame = self
            .frames
            .get(id)
            .unwrap_or_else(|| panic!("{id} was never transmitted"));
        self.acked_by_recipient.insert(id.to_owned());
        let ack = frame.ack(format!("peer-ack-{id}"), self.now, carrier.name());
        let seq = (carrier == Carrier::Relay).then(|| {
            self.relay_seq += 1;
            self.relay_seq
        });
        let origin = InboundOrigin {
            carrier,
            stamped_sender: frame.recipient.clone(),
            sender_account: None,
            seq,
            // With sessions required the recipient's ACK travels sealed in its session.
            sealed_by: self.config.encryption.then(|| frame.recipient.clone()),
        };
        (ack, origin)
    }

    /// An inbound frame arriving `after` from now.
    fn schedule_ack(&mut self, arrival: (Message, InboundOrigin), after: Millis) {
        self.arrival_seq += 1;
        self.arrivals
            .insert((self.now + after, self.arrival_seq), arrival);
    }

    /// The world's model of the addressed carrier `carrier`.
    fn net_of(&self, carrier: &Carrier) -> Option<Net> {
        match carrier {
            Carrier::Relay => Some(self.net),
            Carrier::Gateway => Some(self.gateway),
            Carrier::Local(_) => None,
        }
    }

    fn write(&mut self, (id, send_seq, carrier): (String, u64, Carrier)) -> VecDeque<Handed> {
        let wire_id = courier_proto::wire_id(&id);
        let written = Input::Written {
            id: wire_id.clone(),
            send_seq,
        };
        self.engine.handle(written, self.now);
        let mut more = self.after_call_collect();
        let (reached_recipient, ack_after) = match self.net_of(&carrier) {
            Some(net) if net.refuse => {
                let reason = "relay refused the message";
                let failed = Input::SendFailed {
                    id: wire_id.clone(),
                    send_seq,
                    reason: reason.to_owned(),
                };
                self.engine.handle(failed, self.now);
                more.extend(self.after_call_collect());
                (false, None)
            }
            Some(net) => match net.answer {
                Some(answer) => {
                    let answered = Input::Answer {
                        id: wire_id.clone(),
                        send_seq,
                        answer,
                    };
                    self.engine.handle(answered, self.now);
                    more.extend(self.after_call_collect());
                    (answer == CarrierAnswer::Live, net.ack_after)
                }
                None => (true, net.ack_after),
            },
            None => (true, self.local.ack_after),
        };
        if let (true, Some(after)) = (reached_recipient, ack_after) {
            let arrival = match &carrier {
                Carrier::Relay | Carrier::Gateway => self.addressed_ack(&id, carrier.clone()),
                Carrier::Local(_) => {
                    let frame = &self.frames[&id];
                    self.acked_by_recipient.insert(id.clone());
                    let ack = frame.ack(format!("peer-ack-{id}"), self.now, carrier.name());
                    let origin = InboundOrigin {
                        carrier: carrier.clone(),
                        stamped_sender: frame.recipient.clone(),
                        sender_account: None,
                        seq: None,
                        sealed_by: None,
                    };
                    (ack, origin)
                }
            };
            self.schedule_ack(arrival, after);
        }
        more
    }

    fn execute(&mut self, mut frames: VecDeque<Handed>) {
        while let Some(frame) = frames.pop_front() {
            let write = match self.net_of(&frame.2) {
                Some(net) => net.write,
                None => self.local.write,
            };
            if write {
                let more = self.write(frame);
                frames.extend(more);
            } else {
                self.unwritten.push(frame);
            }
        }
    }

    fn after_call(&mut self) {
        let frames = self.after_call_collect();
        self.execute(frames);
    }

    /// Executes a call's outputs; returns the attempts it handed out (offers not counted).
    fn after_call_counting(&mut self, mark: usize) -> usize {
        let frames = self.after_call_collect();
        let count = frames.len();
        debug_assert_eq!(count, self.outbox_frames_since(mark).len());
        self.execute(frames);
        count
    }

    /// Drains one call's outputs like the runtime (store, then events, then transmits) and
    /// checks the invariants; returns the outbox frames to execute.
    fn after_call_collect(&mut self) -> VecDeque<Handed> {
        // A chunk's terminal is its outcome for the transfer, or nothing when withdrawn.
        let outcomes: Vec<ChunkOutcome> = std::iter::from_fn(|| self.engine.poll_chunk()).collect();
        let mut terminal: BTreeSet<String> = outcomes.iter().map(|o| o.id.clone()).collect();
        self.chunk_outcomes.extend(outcomes);
        let mut settled = BTreeSet::new();
        while let Some(op) = self.engine.poll_store() {
            match &op {
                StoreOp::Put(record) => {
                    self.rows.insert(record.message.id.clone(), record.clone());
                }
                StoreOp::Settle { id, settlement, .. } => {
                    let row = self.rows.remove(id);
                    let row = row.unwrap_or_else(|| panic!("settled {id} which has no row"));
                    if row.state == EntryState::Parked {
                        assert_ne!(
                            *settlement,
                            Settlement::Failed(crate::FailReason::MaxRetriesExceeded),
                            "parked {id} failed before its lifetime"
                        );
                    }
                    assert!(settled.insert(id.clone()), "{id} settled twice in one call");
                    if *settlement == Settlement::Failed(crate::FailReason::TransferAborted) {
                        terminal.insert(id.clone());
                    }
                    if *settlement == Settlement::Delivered {
                        assert!(
                            self.acked_by_recipient.contains(id),
                            "{id} delivered without the recipient's ACK"
                        );
                    }
                }
                StoreOp::MarkProcessed(key) => {
                    assert!(
                        self.config.durability_hook.is_none() || self.chunk_keys.contains(&key.key),
                        "MarkProcessed with a hook"
                    );
                    self.processed.push(key.clone());
                    self.processed_keys.insert(key.key.clone());
                }
                StoreOp::MarkControl(key) => {
                    self.controls.push(key.clone());
                    self.processed_keys.insert(key.key.clone());
                }
                StoreOp::BufferInbound(rows) => {
                    assert!(!rows.is_empty(), "an empty BufferInbound");
                    for row in rows {
                        assert!(
                            !self.processed_keys.contains(&row.key)
                                || self.now
                                    >= self.commits.get(&row.key).map_or(0, |c| c.1)
                                        + self.config.dedup_retention_ms(),
                            "{:?} buffered after it was processed",
                            row.key
                        );
                        let old = self.inbound_rows.insert(row.key.clone(), row.clone());
                        assert!(old.is_none(), "{:?} buffered twice", row.key);
                    }
                }
                StoreOp::CommitInbound { keys, at } => {
                    for key in keys {
                        let buffered = self.inbound_rows.remove(key).is_some();
                        // A key already processed: a stale row cleared at restore, never a
                        // second commit by the hook.
                        let cleared = self.processed_keys.contains(key);
                        assert!(
                            buffered || cleared,
                            "{key:?} committed without a buffered row"
                        );
                        assert!(!(cleared && self.committing), "{key:?} committed twice");
                        if !cleared {
                            let retention = self.config.dedup_retention_ms();
                            let entry = self.commits.entry(key.clone()).or_insert((0, 0));
                            assert!(
                                entry.0 == 0 || *at >= entry.1 + retention,
                                "{key:?} committed twice"
                            );
                            *entry = (entry.0 + 1, *at);
                        }
                        self.processed_keys.insert(key.clone());
                        self.processed.push(ProcessedKey {
                            key: key.clone(),
                            at: *at,
                        });
                    }
                }
                StoreOp::PutGroupSend(record) => {
                    assert!(
                        !self.groups_done.contains(&record.id),
                        "group message {} written after it was done",
                        record.id
                    );
                    self.group_rows.insert(record.id.clone(), record.clone());
                }
                StoreOp::GroupMember { id, member, state } => {
                    let row = self
                        .group_rows
                        .get_mut(id)
                        .unwrap_or_else(|| panic!("member of {id} which has no row"));
                    let slot = row
                        .members
                        .get_mut(member)
                        .unwrap_or_else(|| panic!("{member} is no member of {id}"));
                    *slot = *state;
                }
                StoreOp::GroupSendDone { id } => {
                    assert!(self.group_rows.contains_key(id), "{id} done without a row");
                    assert!(self.groups_done.insert(id.clone()), "{id} done twice");
                }
                StoreOp::ExpireInbound { keys } => {
                    for key in keys {
                        assert!(
                            self.inbound_rows.remove(key).is_some(),
                            "{key:?} expired without a buffered row"
                        );
                        self.expired.insert(key.clone());
                        self.expired_rows += 1;
                    }
                }
            }
            self.log.push((self.now, Out::Store(op)));
        }
        let mut frames = VecDeque::new();
        let events: Vec<Event> = std::iter::from_fn(|| self.engine.poll_event()).collect();
        if self.config.durability_hook.is_some() {
            assert!(
                !events
                    .iter()
                    .any(|e| matches!(e, Event::MessageReceived { .. })),
                "with a hook, message_received only follows the hook's commit"
            );
        }
        let transmits: Vec<Transmit> = std::iter::from_fn(|| self.engine.poll_transmit()).collect();
        let after: Vec<Event> =
            std::iter::from_fn(|| self.engine.poll_event_after_transmits()).collect();
        let events = events.into_iter().map(Out::Event);
        let transmits = transmits.into_iter().map(Out::Transmit);
        let after = after.into_iter().map(Out::Event);
        for out in events.chain(transmits).chain(after) {
            let event = match out {
                Out::Transmit(transmit) => {
                    self.released(&transmit);
                    self.route(&transmit, &mut frames);
                    self.log.push((self.now, Out::Transmit(transmit)));
                    continue;
                }
                Out::Event(event) => event,
                Out::Store(_) => unreachable!("store ops were drained first"),
            };
            match &event {
                Event::MessageDelivered { message_id, .. }
                | Event::MessageFailed { message_id, .. } => {
                    let count = self.terminal.entry(message_id.clone()).or_default();
                    *count += 1;
                    assert_eq!(*count, 1, "second terminal event for {message_id}");
                    terminal.insert(message_id.clone());
                }
                Event::MessageReceived {
                    sender, message, ..
                } => {
                    let (sender, id) = (sender.clone(), message.id.clone());
                    self.note_received(&sender, &id);
                }
                Event::GroupMemberStatus {
                    message_id,
                    member,
                    state,
                    ..
                } => {
                    let key = (message_id.clone(), member.clone());
                    let before = self.member_events.insert(key, *state);
                    assert!(
                        !matches!(before, Some(MemberState::Delivered | MemberState::Failed)),
                        "{member} of {message_id} settled twice"
                    );
                    if matches!(state, MemberState::Delivered | MemberState::Failed) {
                        // A copy's settlement is reported as its member's.
                        let copy = courier_proto::group_copy_id(
                            &courier_proto::wire_id(message_id),
                            member,
                        );
                        if settled.contains(&copy) {
                            terminal.insert(copy);
                        }
                    }
                }
                _ => {}
            }
            self.log.push((self.now, Out::Event(event)));
        }
        assert_eq!(
            settled, terminal,
            "every terminal event comes with its Settle"
        );
        while let Some(recipient) = self.engine.poll_session_wanted() {
            self.sessions_wanted.push((self.now, recipient));
        }
        while let Some(change) = self.engine.poll_presence() {
            match &change {
                PresenceChange::Watch(peer) => {
                    assert!(self.watching.insert(peer.clone()), "{peer} watched twice")
                }
                PresenceChange::Unwatch(peer) => {
                    assert!(
                        self.watching.remove(peer),
                        "{peer} unwatched while not watched"
                    )
                }
            }
            self.presence_log.push((self.now, change));
        }
        // A batch the hook held past its deadline was refused by the engine.
        if self.hook.as_ref().map(|b| b.id) != self.engine.batch_with_hook() {
            self.hook = None;
        }
        self.check();
        frames
    }

    fn note_received(&mut self, sender: &str, id: &str) {
        let retention = self.config.dedup_retention_ms();
        if let Some(before) = self
            .received
            .insert((sender.to_owned(), id.to_owned()), self.now)
        {
            assert!(
                self.now >= before + retention,
                "{id} reached the application twice"
            );
        }
    }

    /// A data frame's frame release and its delivery ACK only after it was processed
    /// (`docs/delivery.md#ack-after-processing`; the store holds it as processed: `MarkProcessed`
    /// or the hook's `CommitInbound`), or dropped (expired). A released seq leaves the relay's
    /// journal.
    fn released(&mut self, transmit: &Transmit) {
        match &transmit.kind {
            TransmitKind::ReleaseFrame { seq } => {
                if let Some(key) = self.seq_keys.get(seq) {
                    assert!(
                        self.processed_keys.contains(key)
                            || self.expired.contains(key)
                            || self.gated.contains(seq),
                        "seq {seq} of {key:?} released before it was processed"
                    );
                    assert!(
                        !self.inbound_rows.contains_key(key),
                        "seq {seq} of {key:?} released while it is buffered"
                    );
                }
                self.journal.remove(seq);
            }
            TransmitKind::DeliveryAck { message } => {
                let id = message.ack_for().expect("an ACK names its message");
                let key = self.copy_keys.get(id).cloned().unwrap_or(InboundKey {
                    chat: message.recipient.clone(),
                    sender: message.recipient.clone(),
                    message_id: id.to_owned(),
                });
                assert!(
                    self.processed_keys.contains(&key),
                    "end-to-end ACK of {key:?} before it was processed"
                );
            }
            TransmitKind::Outbox { .. } | TransmitKind::GroupBroadcast { .. } => {}
        }
    }

    /// What the runtime does with one transmit: outbox attempts go to `execute`, offers to
    /// neighbors are recorded, and every local frame must address a current neighbor.
    fn route(&mut self, transmit: &Transmit, frames: &mut VecDeque<Handed>) {
        if let Carrier::Local(name) = &transmit.carrier {
            let peer = transmit
                .peer
                .as_deref()
                .expect("a local frame names its neighbor");
            assert!(
                self.links
                    .get(name)
                    .is_some_and(|peers| peers.contains(peer)),
                "frame for {peer}, who is not a neighbor on {name}"
            );
        } else {
            assert_eq!(transmit.peer, None, "relay frames name no neighbor");
        }
        if let TransmitKind::GroupBroadcast { group_id, message } = &transmit.kind {
            assert_eq!(
                transmit.carrier,
                Carrier::Relay,
                "only the relay broadcasts"
            );
            self.broadcasts
                .push((self.now, group_id.clone(), message.clone()));
            return;
        }
        let TransmitKind::Outbox { message, send_seq } = &transmit.kind else {
            return;
        };
        assert!(
            courier_proto::is_wire_id(&message.id),
            "{} went on the wire",
            message.id
        );
        let id = if message.metadata.contains_key(META_GROUP_MESSAGE) {
            assert!(
                !message.content.is_empty(),
                "a group copy without its content"
            );
            message.id.clone()
        } else {
            self.app_id(&message.id)
        };
        self.frames.insert(id.clone(), message.clone());
        match (&transmit.carrier, transmit.peer.as_deref()) {
            (Carrier::Local(name), Some(peer)) if peer != message.recipient => {
                self.offers
                    .push((self.now, name.clone(), peer.to_owned(), id));
            }
            // The relay carries the attempts: a gateway frame is a carry-only copy, which the
            // gateway hands to the recipient if it is attached there.
            (Carrier::Gateway, None) if self.internet_up => {
                self.gateway_offers.push((self.now, id.clone(), *send_seq));
                let gateway = self.gateway;
                let reaches =
                    !gateway.refuse && gateway.answer.is_none_or(|a| a == CarrierAnswer::Live);
                if let (true, Some(after)) = (reaches, gateway.ack_after) {
                    let arrival = self.addressed_ack(&id, Carrier::Gateway);
                    self.schedule_ack(arrival, after);
                }
            }
            (carrier, _) => {
                if carrier.is_addressed() {
                    self.send_seqs.insert(id.clone(), *send_seq);
                }
                frames.push_back((id, *send_seq, carrier.clone()));
            }
        }
    }

    fn check(&self) {
        if !self.checks {
            return;
        }
        self.engine.check_invariants();
        assert_eq!(
            self.engine.inbound_keys(),
            self.inbound_rows.keys().cloned().collect::<BTreeSet<_>>(),
            "buffered rows in the store and in the engine differ"
        );
        let records = self.engine.records();
        assert_eq!(
            records.len(),
            self.rows.len(),
            "store rows and live entries differ"
        );
        let stats = self.engine.stats();
        let slot = stats.pending_acks < self.config.max_pending_acks.max(1);
        let deadline = self.engine.next_deadline();
        let edge_driven = self.config.edge_driven_unreachable_dm;
        let watchlist: BTreeSet<String> = self.engine.presence_watchlist().into_iter().collect();
        assert_eq!(self.watching, watchlist, "the watch lags the watchlist");
        for record in &records {
            let id = &record.message.id;
            assert_eq!(
                self.rows.get(id),
                Some(record),
                "the last Put of {id} is stale"
            );
            match (record.state, record.next_at) {
                (EntryState::InFlight, Some(ack_due)) => {
                    assert!(
                        deadline.is_some_and(|d| d <= ack_due),
                        "{id} has no ACK timer"
                    )
                }
                (EntryState::InFlight, None) => {}
                // Its only deadline is its lifetime, which `next_deadline` covers.
                (EntryState::AwaitingSession, _) => {}
                (EntryState::Parked, None) => {
                    assert!(edge_driven, "parked {id} without a probe timer");
                }
                (EntryState::Queued | EntryState::Parked, next) => {
                    let next = next.unwrap_or_else(|| panic!("queued {id} without a time"));
                    let routed = self.internet_up
                        || self.gateway_up
                        || self.engine.is_neighbor(&record.message.recipient);
                    if slot && routed {
                        if edge_driven && record.state == EntryState::Parked {
                            // The resend budget may hold it back a little, never forever.
                            assert!(deadline.is_some(), "{id} is stranded");
                        } else {
                            assert!(deadline.is_some_and(|d| d <= next), "{id} is stranded");
                        }
                    }
                }
            }
        }
    }
}

/// An outbox frame handed to a carrier: (id, send_seq, carrier).
pub(crate) type Handed = (String, u64, Carrier);

pub(crate) fn request(
    recipient: &str,
    priority: Priority,
    content_type: ContentType,
    id: &str,
) -> SendRequest {
    SendRequest {
        id: id.to_owned(),
        settled: None,
        recipient: recipient.to_owned(),
        content: "hello".to_owned(),
        content_type,
        priority,
        metadata: BTreeMap::new(),
        binary_content: None,
        media: None,
        rich: Default::default(),
    }
}

/// A data message from `sender` to alice.
pub(crate) fn message_from(sender: &str, id: &str) -> Message {
    Message {
        id: id.to_owned(),
        sender: sender.to_owned(),
        recipient: ALICE.to_owned(),
        app_id: "chat".to_owned(),
        priority: Priority::Medium,
        ttl: 10,
        hop_count: 0,
        timestamp: 0,
        lamport_clock: 1,
        content_type: ContentType::Text,
        content: "hi alice".to_owned(),
        metadata: BTreeMap::new(),
        requires_ack: true,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    }
}

pub(crate) fn event_id(event: &Event) -> Option<&str> {
    match event {
        Event::MessageSent { message_id, .. }
        | Event::MessageDeferred { message_id, .. }
        | Event::MessageStored { message_id, .. }
        | Event::MessageUndeliverable { message_id, .. }
        | Event::MessageRetrying { message_id, .. }
        | Event::MessageDelivered { message_id, .. }
        | Event::MessageFailed { message_id, .. } => Some(message_id),
        Event::GroupMessageSent { .. }
        | Event::GroupMessageDeliveryReport { .. }
        | Event::GroupMemberStatus { .. }
        | Event::MessageReceived { .. }
        | Event::MessageDecryptionFailed { .. }
        | Event::Diagnostic { .. }
        | Event::InboundDrainCompleted { .. }
        | Event::PresenceUpdated { .. }
        | Event::NeighborDiscovered { .. }
        | Event::NeighborLost { .. }
        | Event::SecurityWarning { .. } => None,
    }
}

/// The dedup key of a received message: its chat is its group, or its sender.
pub(crate) fn inbound_key(message: &Message) -> InboundKey {
    InboundKey {
        chat: message
            .metadata
            .get(META_GROUP_ID)
            .unwrap_or(&message.sender)
            .clone(),
        sender: message.sender.clone(),
        message_id: message.id.clone(),
    }
}
