//! The engine façade: its state, its outputs and its queries. Every phase change goes through
//! `set_phase` (and every park flag change through `set_park`), which re-index the entry's
//! timers and mark it for a `StoreOp::Put` at the end of the call (one Put per changed entry per
//! call). The transitions live in the child modules, each named for what it owns.

use std::collections::{BTreeSet, HashMap, VecDeque};

use courier_proto::limits::is_relay_answer;
use courier_proto::{ack_id, Address, ContentType, Message, UnreachableCause};
use serde_json::Value;

use crate::ack::{self, AfterTimeout};
use crate::config::Config;
use crate::dedup::Dedup;
use crate::event::{DiagnosticLevel, Event};
use crate::group::GroupSends;
use crate::hook::{Commit, HookPipeline, Sink};
use crate::inbound;
use crate::input::{Input, Restore};
use crate::io::{
    Carrier, CarrierAnswer, ChunkOutcome, EntryState, FailReason, HookBatch, InboundKey,
    InboundOrigin, Millis, PendingInbound, PresenceChange, ProcessedKey, SendRequest, Settlement,
    Stats, StoreOp, Transmit, TransmitKind,
};
use crate::neighbors::Neighbors;
use crate::outbox::{self, Class, Entry, Key, Outbox, Phase};
use crate::parking::{Park, Parking, ResendBudget, EDGE_DRIVEN_PROBES};
use crate::presence::Presence;
use crate::presession::{PreSession, Waiting};
use crate::recent::RecentlyDelivered;
use crate::sender_gate::{SenderGate, Verdict};
use crate::timers::{Gate, Slot, Timers};

mod bookkeeping;
mod groups;
mod inputs;
#[cfg(test)]
mod invariants;
mod media;
mod phases;
mod receive;
mod routing;

use bookkeeping::file_id;

/// Hops a message may still travel. Only mesh forwarding spends it; the relay leg does not.
const DEFAULT_TTL: u8 = 10;
/// Receivers clamp Lamport clocks to this (`docs/protocol.md#message-json`); ours never exceeds it.
pub(crate) const MAX_LAMPORT: u64 = i64::MAX as u64;
/// How far one received message may move our clock forward: a peer that claims a clock near
/// [`MAX_LAMPORT`] would otherwise pin ours there for good (`docs/protocol.md#message-json`).
pub(crate) const MAX_LAMPORT_JUMP: u64 = 1 << 32;

const REASON_NO_CARRIER: &str = "no carrier available";
const REASON_IN_FLIGHT_LIMIT: &str = "in-flight limit reached";
const REASON_CARRIER_DOWN: &str = "carrier unavailable";
const REASON_NEIGHBOR_LOST: &str = "neighbor lost";
const REASON_APP_SEND_TIMEOUT: &str = "app carrier send timed out";
const REASON_AWAITING_SESSION: &str = "awaiting end-to-end session";
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
    /// The durability hook's pipeline, when the app registered a hook.
    hook: Option<HookPipeline>,
    gate: SenderGate,
    /// Messages waiting for an end-to-end session, when sessions are required.
    presession: PreSession,
    /// Group messages with a report awaited or copies in the outbox.
    groups: GroupSends,
    /// App ids delivered lately: a repeat in the step that delivered it is a no-op.
    delivered: RecentlyDelivered,
    /// Recipients the runtime holds a session with.
    sessions: BTreeSet<String>,
    /// Recipients asked for and not ready yet; `session_wanted` is what is still to be polled.
    wanted: BTreeSet<String>,
    session_wanted: VecDeque<String>,
    /// Verified control frames for the runtime, each once (`poll_control`).
    control: VecDeque<Message>,
    /// File chunks in the outbox or the pre-session queue, by id, with their transfer's id.
    chunks: HashMap<String, String>,
    /// What became of chunks, for the runtime (`poll_chunk`).
    chunk_outcomes: VecDeque<ChunkOutcome>,
    carriers: BTreeSet<Carrier>,
    lamport: u64,
    last_send_seq: u64,
    /// Entries changed during the current call; each gets one Put when the call ends.
    dirty: BTreeSet<Key>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    /// What a durability hook verdict reports: dispatched after the step's transmits.
    after_transmits: VecDeque<Event>,
    store: VecDeque<StoreOp>,
}

impl Engine {
    /// `local_identity` goes into `Message.sender` of every message this device sends.
    pub fn new(config: Config, local_identity: String) -> Self {
        let dedup = Dedup::new(config.dedup_max_entries, config.dedup_retention_ms());
        let hook = config.durability_hook.clone().map(HookPipeline::new);
        let gate = SenderGate::new(config.accept_legacy_control_v1);
        Self {
            gate,
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
            hook,
            presession: PreSession::default(),
            groups: GroupSends::default(),
            delivered: RecentlyDelivered::default(),
            sessions: BTreeSet::new(),
            wanted: BTreeSet::new(),
            session_wanted: VecDeque::new(),
            control: VecDeque::new(),
            chunks: HashMap::new(),
            chunk_outcomes: VecDeque::new(),
            carriers: BTreeSet::new(),
            lamport: 0,
            last_send_seq: 0,
            dirty: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            after_transmits: VecDeque::new(),
            store: VecDeque::new(),
        }
    }

    /// The one way in: applies `input` at `now`. Afterwards the runtime drains the outputs in
    /// the step's order (`crate::step`, `docs/architecture.md#the-step`):
    ///
    /// - [`poll_store`](Self::poll_store): commit every op of the step in one transaction;
    /// - then [`poll_event`](Self::poll_event): dispatch;
    /// - then [`poll_transmit`](Self::poll_transmit): hand to the carriers;
    /// - then [`poll_event_after_transmits`](Self::poll_event_after_transmits): dispatch;
    /// - then [`poll_hook`](Self::poll_hook) and [`poll_presence`](Self::poll_presence);
    /// - and wake the engine with `Input::Timeout` at [`next_deadline`](Self::next_deadline).
    ///
    /// Inputs may be batched into one step: the outputs queue up in order.
    pub fn handle(&mut self, input: Input, now: Millis) {
        match input {
            Input::Send(request) => self.send(request, now),
            Input::Restore(restore) => self.restore(restore, now),
            Input::CarrierUp(carrier) => self.carrier_up(carrier, now),
            Input::CarrierDown(carrier) => self.carrier_down(carrier, now),
            Input::AccountName(account) => self.account_name(account),
            Input::Written { id, send_seq } => self.written(&id, send_seq, now),
            Input::SendFailed {
                id,
                send_seq,
                reason,
            } => self.send_failed(&id, send_seq, &reason, now),
            Input::Answer {
                id,
                send_seq,
                answer,
            } => self.answer(&id, send_seq, answer, now),
            Input::Inbound { message, origin } => self.inbound(*message, origin, now),
            Input::DrainStarted(carrier) => self.drain_started(carrier),
            Input::DrainComplete { carrier, count } => self.drain_complete(carrier, count),
            Input::HookResult { batch_id, result } => self.hook_result(batch_id, result, now),
            Input::Presence {
                peer,
                online,
                last_seen_ms,
            } => self.presence_report(peer, online, last_seen_ms, now),
            Input::NeighborDiscovered { peer, carrier } => {
                self.neighbor_discovered(peer, carrier, now)
            }
            Input::NeighborLost { peer, carrier } => self.neighbor_lost(peer, carrier, now),
            Input::SessionReady { recipient } => self.session_ready(recipient, now),
            Input::Undecryptable {
                message_id,
                sender,
                origin,
                code,
                reason,
            } => self.undecryptable(message_id, sender, &origin, code, reason),
            Input::Discard { origin, reason } => {
                self.diagnostic(DiagnosticLevel::Debug, reason);
                self.release_frame(&origin);
            }
            Input::GroupSend(request) => self.group_send(*request, now),
            Input::GroupRelay { group_id, ready } => self.group_relay(&group_id, ready),
            Input::GroupReport(report) => self.group_report(report, now),
            Input::GroupRefused { message_id, reason } => {
                self.group_refused(&message_id, &reason, now)
            }
            Input::CancelChunks { ids } => self.cancel_chunks(ids, now),
            Input::Timeout => self.timeout(now),
        }
        self.end_call();
    }

    /// The durability hook's pipeline and the output queues it writes to, borrowed together.
    fn hook_and_outputs(&mut self) -> (Option<&mut HookPipeline>, Sink<'_>) {
        let sink = Sink {
            store: &mut self.store,
            events: &mut self.events,
            transmits: &mut self.transmits,
        };
        (self.hook.as_mut(), sink)
    }

    /// The next batch for the durability hook, if one is ready and none is with the hook (one at
    /// a time). Its rows were written with `StoreOp::BufferInbound` in the input that received
    /// them, so they are durable before the hook sees them. The hook has until `now` +
    /// `HookConfig::timeout_ms` to settle it (`Input::HookResult`); after that it counts as
    /// refused. `None` without `durability_hook`.
    #[must_use]
    pub fn poll_hook(&mut self, now: Millis) -> Option<HookBatch> {
        self.hook.as_mut()?.poll(now)
    }

    /// Inbound messages buffered for the durability hook and not committed yet.
    pub fn inbound_buffered(&self) -> usize {
        self.hook.as_ref().map_or(0, HookPipeline::len)
    }

    /// The next change of the presence watchlist: `Watch` when a peer enters it, `Unwatch` when
    /// it leaves, independent of the relay connection (the runtime tells each new connection the
    /// whole set); see the `presence` module for the rules.
    #[must_use]
    pub fn poll_presence(&mut self) -> Option<PresenceChange> {
        self.presence.poll()
    }

    /// `internetPresenceWatchlist()`: the recipients of parked entries (unreachable or in relay
    /// custody), the peers that just got a verdict, and the recipients whose messages wait for
    /// a session, sorted.
    pub fn presence_watchlist(&self) -> Vec<String> {
        self.presence.wanted()
    }

    /// The next recipient to set up an end-to-end session with: a message waits for it in the
    /// pre-session queue. Each is asked once until `Input::SessionReady` names it (after a
    /// restart, again), once more each time presence says it came online, and again on a
    /// doubling timer while it waits (`docs/delivery.md#pre-session-queue`); setting the
    /// session up, and trying again over a new connection, is the runtime's.
    #[must_use]
    pub fn poll_session_wanted(&mut self) -> Option<String> {
        self.session_wanted.pop_front()
    }

    /// The next verified control frame (`docs/delivery.md#control-frames`), the first time it
    /// arrived. Poll right after the input that brought it: what the runtime does with it
    /// belongs to the same step, and so to the same commit as its dedup record.
    pub fn poll_control(&mut self) -> Option<Message> {
        self.control.pop_front()
    }

    /// What became of the next file chunk: acknowledged or failed. Poll after each input; one
    /// left over after a step makes [`next_deadline`](Self::next_deadline) due at once.
    pub fn poll_chunk(&mut self) -> Option<ChunkOutcome> {
        self.chunk_outcomes.pop_front()
    }

    /// Whether a message to `recipient` would go without waiting for an end-to-end session: the
    /// runtime holds one, or encryption is off.
    pub fn has_session(&self, recipient: &str) -> bool {
        !self.config.encryption || self.sessions.contains(recipient)
    }

    /// The next frame to put on a carrier. Poll after committing the step's store ops and
    /// dispatching its events. An outbox frame is only a request until the carrier reports it
    /// with `Input::Written` or `Input::SendFailed` (quoting its `send_seq`).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next application event of the step, dispatched after the commit and before the
    /// transmits.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next event that follows a durability hook verdict: the committed messages'
    /// `message_received`, then what the verdict reported. Dispatched after the step's
    /// transmits, so the acknowledgements of a message are on their way before the app sees it.
    #[must_use]
    pub fn poll_event_after_transmits(&mut self) -> Option<Event> {
        self.after_transmits.pop_front()
    }

    /// The next write for the runtime's store. Every op of a step is committed in one
    /// transaction before anything else of the step leaves.
    #[must_use]
    pub fn poll_store(&mut self) -> Option<StoreOp> {
        self.store.pop_front()
    }

    /// When `Input::Timeout` is next needed; `None` when nothing is due until an input arrives.
    /// Only due work counts: ACK deadlines, lifetime expiries, and queued sends that have a
    /// route and an in-flight slot (probes of parked entries not before the resend budget can
    /// fund one, under `edgeDrivenUnreachableDm`). A queued entry that cannot go adds no
    /// deadline: the carrier, neighbor or slot-freeing input is what moves it. Resting entries
    /// add only their expiry; app carrier sends their deadline. The durability hook adds the
    /// deadline of the batch it holds, the open drain batch's age, the retry of refused batches
    /// (while a carrier is up) and the retention of buffered rows; nothing when nothing is
    /// buffered. The pre-session queue adds the end of its oldest message's lifetime and the
    /// next time a session is asked for again; group broadcasts their report deadlines. A chunk
    /// outcome not polled yet makes it due at once.
    #[must_use]
    pub fn next_deadline(&self) -> Option<Millis> {
        if !self.chunk_outcomes.is_empty() {
            return Some(0);
        }
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
            .hook
            .as_ref()
            .and_then(|hook| hook.next_deadline(!self.carriers.is_empty()));
        let presession = self
            .presession
            .next_expiry(self.config.pending_session_max_lifetime_ms);
        let reask = self.presession.next_reask();
        let report = self.groups.next_report_deadline();
        [fixed, sends, inbound, presession, reask, report]
            .into_iter()
            .flatten()
            .min()
    }

    /// The relay account this device authenticated as, once a relay said.
    pub fn account(&self) -> Option<&str> {
        self.account.as_deref()
    }

    /// The carriers that are up (app carriers: registered).
    pub fn carriers(&self) -> impl Iterator<Item = &Carrier> + '_ {
        self.carriers.iter()
    }

    pub fn status(&self, id: &str) -> Option<EntryState> {
        if self.presession.holds(id) {
            return Some(EntryState::AwaitingSession);
        }
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
            pre_session: self.presession.len(),
            group_sends: self.groups.active(),
            carriers_up: self.carriers.len(),
        }
    }
}
