//! The driver: one thread that owns the engine and the store (the only writer). It feeds the
//! engine its inputs with the time, and executes its outputs in a fixed order per step:
//!
//! 1. apply every queued command (many concurrent sends become one step: group commit);
//! 2. commit all store writes of the step in one transaction;
//! 3. only then resolve the sends (a resolved `sendMessage` is durable), dispatch the events,
//!    and hand the transmits to the carriers.
//!
//! That order is what makes "ACK after processing" hold: an inbound message's dedup record is
//! committed and its `message_received` dispatched before its relay `Ack` or end-to-end ACK is
//! written.

use std::collections::{BTreeSet, HashSet};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use courier_engine::{
    Carrier, CarrierAnswer, DiagnosticLevel, Engine, Event, InboundOrigin, Millis, PresenceChange,
    SendOutcome, SendRequest, Settlement, Stats, StoreOp, Transmit, TransmitKind,
};
use courier_proto::{ClientFrame, Message};
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use crate::carrier::gateway::GatewayOut;
use crate::carrier::relay::RelayOut;
use crate::carrier::Submit;
use crate::error::ClientError;
use crate::event::ClientEvent;
use crate::store::{MessageStatus, Reports, SettledRecord, Store};

/// Commands handled in one step at most; the rest wait for the next step.
const MAX_STEP: usize = 4096;

pub type EventSink = Box<dyn Fn(ClientEvent) + Send + 'static>;

pub enum Command {
    Send {
        req: SendRequest,
        reply: oneshot::Sender<Result<String, ClientError>>,
    },
    Status {
        id: String,
        reply: oneshot::Sender<Result<MessageStatus, ClientError>>,
    },
    CarrierUp(Carrier),
    CarrierDown(Carrier),
    /// The relay authenticated this device as this account.
    AccountName(String),
    Written {
        id: String,
        send_seq: u64,
    },
    SendFailed {
        id: String,
        send_seq: u64,
        reason: String,
    },
    CarrierAnswer {
        id: String,
        send_seq: u64,
        answer: CarrierAnswer,
    },
    Inbound {
        message: Box<Message>,
        origin: InboundOrigin,
    },
    /// A relay connection with a mailbox is up: what arrives until `DrainComplete` is backlog.
    DrainStarted,
    DrainComplete {
        count: u64,
    },
    /// The app's durability hook settled a batch.
    HookResult {
        batch_id: u64,
        result: Result<(), String>,
    },
    /// A relay `PresenceStatus` (answer or watch push).
    Presence {
        peer: String,
        online: bool,
        last_seen_ms: Option<u64>,
    },
    NeighborDiscovered {
        peer: String,
        transport: String,
    },
    NeighborLost {
        peer: String,
        transport: String,
    },
    Emit(ClientEvent),
    /// The application's listeners ran for this message's terminal event ([`Receipts`]).
    TerminalSeen {
        message_id: String,
    },
    /// Answered once every command queued before it has been applied: how a carrier keeps
    /// what it has read and not yet handed over bounded (`carrier::intake`).
    Barrier(oneshot::Sender<()>),
    Stop {
        reply: oneshot::Sender<()>,
    },
}

/// The sending side of the driver's queue; cheap to clone, never blocks.
#[derive(Clone)]
pub struct DriverTx(mpsc::Sender<Command>);

impl DriverTx {
    /// Sends a command; after the driver stopped there is nobody to tell, so it is dropped.
    pub fn send(&self, cmd: Command) {
        let _ = self.0.send(cmd);
    }
}

pub fn channel() -> (DriverTx, mpsc::Receiver<Command>) {
    let (tx, rx) = mpsc::channel();
    (DriverTx(tx), rx)
}

pub fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

pub struct Driver {
    pub engine: Engine,
    pub store: Store,
    pub rx: mpsc::Receiver<Command>,
    pub sink: EventSink,
    pub relay: Option<tokio_mpsc::UnboundedSender<RelayOut>>,
    pub gateway: Option<tokio_mpsc::UnboundedSender<GatewayOut>>,
    /// Published after every step, so `stats()` is a synchronous read that never waits on a commit.
    pub stats: Arc<Mutex<Stats>>,
    /// The engine's presence watchlist, mirrored for `internetPresenceWatchlist()`.
    pub watchlist: Arc<Mutex<BTreeSet<String>>>,
    pub retention: Retention,
    pub rebuild: Rebuild,
    /// How long the app's durability hook may take for one batch.
    pub hook_timeout_ms: u64,
    /// The batch now with the hook, if any (one at a time).
    pub hook: Option<OutstandingHook>,
    /// Messages whose terminal events reached the application since the last commit; the next
    /// commit (or `stop()`) records it, so a restart does not emit them again.
    pub reported: Vec<String>,
    /// `Some` when the application confirms each terminal event once its listeners ran
    /// ([`Receipts`]): the messages whose events were dispatched and not confirmed yet. `None`
    /// when the sink handles events before it returns, so a dispatch is a report.
    pub unconfirmed: Option<HashSet<String>>,
}

/// How the application confirms that a terminal event reached its listeners, when its sink
/// only queues events for another thread (the Node binding's JS thread). Until confirmed, the
/// event stays held in storage and the next start emits it again.
#[derive(Clone)]
pub struct Receipts(DriverTx);

impl Receipts {
    pub fn new(driver: DriverTx) -> Self {
        Self(driver)
    }

    /// The terminal event of `message_id` reached the application's listeners.
    pub fn seen(&self, message_id: String) {
        self.0.send(Command::TerminalSeen { message_id });
    }
}

/// How long `stop()` waits for the application to confirm the terminal events it was already
/// handed (its listeners are free to run while it awaits `stop()`), so that a clean stop does
/// not leave them to be replayed.
const RECEIPT_WAIT_AT_STOP: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
pub struct OutstandingHook {
    pub batch_id: u64,
    pub deadline: Millis,
}

/// What it takes to rebuild the engine from storage after a failed commit.
pub struct Rebuild {
    pub config: courier_engine::Config,
    pub local_identity: String,
    pub carriers_up: BTreeSet<Carrier>,
    /// The relay account, once a relay named it.
    pub account: Option<String>,
}

/// How long settled outcomes and inbound dedup records are kept, and how many at most.
pub struct Retention {
    pub age_ms: u64,
    pub max_settled: usize,
    pub max_processed: usize,
}

/// Pruning runs at most this often, and only when the driver wakes for other work anyway.
const PRUNE_EVERY_MS: u64 = 3_600_000;
pub const MAX_SETTLED: usize = 100_000;

/// What a step owes once its writes are committed.
#[derive(Default)]
struct Step {
    accepted: Vec<(String, oneshot::Sender<Result<String, ClientError>>)>,
    events: Vec<ClientEvent>,
    /// What follows a durability hook's verdict — the committed messages' `message_received`,
    /// then what the engine reported with it (the end of a drain) — goes after the step's relay
    /// Acks and end-to-end ACKs (api.md, "Inbound durability").
    after_transmits: Vec<ClientEvent>,
    /// A relay frame was processed in this step: if the commit fails, it was neither stored nor
    /// acked, and only a new session makes the relay write it again.
    relay_inbound: bool,
    stop: Option<oneshot::Sender<()>>,
}

impl Driver {
    pub fn run(mut self) {
        let mut next_prune = 0;
        loop {
            let first = match self.wait() {
                Ok(cmd) => cmd,
                Err(()) => return,
            };
            let mut step = Step::default();
            let now = now_ms();
            let batch: Vec<Command> = first
                .into_iter()
                .chain(self.rx.try_iter().take(MAX_STEP))
                .collect();
            for cmd in batch {
                self.apply(cmd, now, &mut step);
            }
            if let Some(outstanding) = self.hook.filter(|h| h.deadline <= now) {
                let reason = format!("the hook did not settle within {} ms", self.hook_timeout_ms);
                self.hook_result(outstanding.batch_id, Err(reason), now, &mut step);
            }
            self.engine.handle_timeout(now);
            self.collect_events(&mut step);
            let stop = step.stop.take();
            self.finish(step);
            if now >= next_prune {
                next_prune = now + PRUNE_EVERY_MS;
                self.prune(now);
            }
            if let Some(reply) = stop {
                self.await_receipts();
                let done = Reports {
                    held: Vec::new(),
                    done: std::mem::take(&mut self.reported),
                };
                if let Err(e) = self.store.commit_step(&[], &done) {
                    (self.sink)(ClientEvent::Diagnostic {
                        level: DiagnosticLevel::Warn,
                        message: format!(
                            "cannot record dispatched terminal events ({e}); the next start \
                             emits them again"
                        ),
                        target: "courier_client::store",
                    });
                }
                let _ = self.store.maybe_checkpoint();
                let _ = reply.send(());
                return;
            }
        }
    }

    /// A dispatched terminal event reached the application: the next commit records it.
    fn confirm(&mut self, message_id: String) {
        if let Some(unconfirmed) = &mut self.unconfirmed {
            if unconfirmed.remove(&message_id) {
                self.reported.push(message_id);
            }
        }
    }

    /// At `stop()`: takes the confirmations of terminal events already dispatched, for at most
    /// [`RECEIPT_WAIT_AT_STOP`]. The client is stopping, so any other command goes unanswered
    /// (a send's caller sees `ERR_NOT_STARTED`, as for every command after the stop).
    fn await_receipts(&mut self) {
        let deadline = Instant::now() + RECEIPT_WAIT_AT_STOP;
        while self.unconfirmed.as_ref().is_some_and(|u| !u.is_empty()) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            match self.rx.recv_timeout(left) {
                Ok(Command::TerminalSeen { message_id }) => self.confirm(message_id),
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }

    /// Blocks until a command arrives or the engine's next deadline; `Ok(None)` means due work.
    fn wait(&self) -> Result<Option<Command>, ()> {
        let hook_deadline = self.hook.map(|h| h.deadline);
        let deadline = match (self.engine.next_deadline(), hook_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match deadline {
            None => self.rx.recv().map(Some).map_err(|_| ()),
            Some(deadline) => {
                let now = now_ms();
                if deadline <= now {
                    return Ok(None);
                }
                match self.rx.recv_timeout(Duration::from_millis(deadline - now)) {
                    Ok(cmd) => Ok(Some(cmd)),
                    Err(RecvTimeoutError::Timeout) => Ok(None),
                    Err(RecvTimeoutError::Disconnected) => Err(()),
                }
            }
        }
    }

    fn apply(&mut self, cmd: Command, now: Millis, step: &mut Step) {
        match cmd {
            Command::Send { req, reply } => self.send(req, reply, now, step),
            Command::Status { id, reply } => {
                // Every step commits before it answers, so storage is as current as the engine.
                let _ = reply.send(self.store.status(&id).map_err(ClientError::from));
            }
            Command::CarrierUp(carrier) => {
                self.rebuild.carriers_up.insert(carrier.clone());
                self.engine.handle_carrier_up(carrier, now);
            }
            Command::AccountName(account) => {
                self.rebuild.account = Some(account.clone());
                self.engine.handle_account_name(account);
            }
            Command::CarrierDown(carrier) => {
                self.rebuild.carriers_up.remove(&carrier);
                self.engine.handle_carrier_down(carrier, now);
            }
            Command::Written { id, send_seq } => self.engine.handle_written(&id, send_seq, now),
            Command::SendFailed {
                id,
                send_seq,
                reason,
            } => self.engine.handle_send_failed(&id, send_seq, &reason, now),
            Command::CarrierAnswer {
                id,
                send_seq,
                answer,
            } => self.engine.handle_relay_answer(&id, send_seq, answer, now),
            Command::Inbound { message, origin } => {
                step.relay_inbound |= origin.carrier == Carrier::Relay;
                self.engine.handle_inbound(*message, origin, now)
            }
            Command::Presence {
                peer,
                online,
                last_seen_ms,
            } => {
                self.engine.handle_presence(&peer, online, now);
                self.collect_events(step);
                step.events.push(ClientEvent::PresenceUpdated {
                    peer_id: peer,
                    online,
                    last_seen_ms,
                });
            }
            Command::NeighborDiscovered { peer, transport } => {
                self.engine.handle_neighbor_discovered(
                    &peer,
                    Carrier::Local(transport.clone()),
                    now,
                );
                self.collect_events(step);
                step.events.push(ClientEvent::NeighborDiscovered {
                    peer_id: peer,
                    transport,
                });
            }
            Command::NeighborLost { peer, transport } => {
                self.engine
                    .handle_neighbor_lost(&peer, Carrier::Local(transport.clone()), now);
                self.collect_events(step);
                step.events.push(ClientEvent::NeighborLost {
                    peer_id: peer,
                    transport,
                });
            }
            Command::DrainStarted => self.engine.handle_drain_started(Carrier::Relay, now),
            Command::DrainComplete { count } => {
                self.engine
                    .handle_drain_complete(Carrier::Relay, count, now)
            }
            Command::HookResult { batch_id, result } => {
                self.hook_result(batch_id, result, now, step)
            }
            Command::Emit(event) => {
                // Keep runtime events in order with the engine's.
                self.collect_events(step);
                step.events.push(event);
            }
            Command::Barrier(reply) => {
                let _ = reply.send(());
            }
            Command::TerminalSeen { message_id } => self.confirm(message_id),
            Command::Stop { reply } => step.stop = Some(reply),
        }
        self.collect_events(step);
    }

    fn send(
        &mut self,
        req: SendRequest,
        reply: oneshot::Sender<Result<String, ClientError>>,
        now: Millis,
        step: &mut Step,
    ) {
        // An id that was already delivered is a no-op returning that id (delivery.md 2).
        if let Some(id) = &req.id {
            match self.store.settled(id) {
                Ok(Some(SettledRecord {
                    outcome: Settlement::Delivered,
                    ..
                })) => {
                    let _ = reply.send(Ok(id.clone()));
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = reply.send(Err(e.into()));
                    return;
                }
            }
        }
        match self.engine.send(req, mint_id, now) {
            // A duplicate may name an entry accepted earlier in this very step: it is only
            // durable once the step commits, so both kinds are answered after the commit.
            SendOutcome::Accepted(id) | SendOutcome::Duplicate(id) => {
                step.accepted.push((id, reply))
            }
        }
    }

    fn hook_result(
        &mut self,
        batch_id: u64,
        result: Result<(), String>,
        now: Millis,
        step: &mut Step,
    ) {
        if self.hook.is_some_and(|h| h.batch_id == batch_id) {
            self.hook = None;
        }
        // Everything earlier in the step was collected already: what the engine reports now
        // belongs to this verdict.
        self.collect_events(step);
        for m in self.engine.handle_hook_result(batch_id, result, now) {
            step.after_transmits
                .push(ClientEvent::Engine(Box::new(Event::MessageReceived {
                    chat: m.key.chat,
                    sender: m.key.sender,
                    transport: m.transport,
                    message: m.message,
                })));
        }
        while let Some(event) = self.engine.poll_event() {
            step.after_transmits.push(event.into());
        }
    }

    /// A failed commit leaves the engine ahead of storage. Rebuilding it from storage — the state
    /// at the end of the last committed step — makes the failed step change nothing; its events
    /// and transmits are dropped with the old engine.
    fn roll_back(&mut self) {
        let now = now_ms();
        let loaded = self.store.load_outbox().and_then(|records| {
            let processed = self.store.load_processed(
                now,
                self.retention.age_ms,
                self.retention.max_processed,
            )?;
            let pending = self.store.load_pending_inbound()?;
            Ok((records, processed, pending))
        });
        match loaded {
            Ok((records, processed, pending)) => {
                let mut engine = Engine::new(
                    self.rebuild.config.clone(),
                    self.rebuild.local_identity.clone(),
                );
                engine.restore(records, processed, now);
                engine.restore_inbound(pending, now);
                // The batch with the hook belonged to the old engine; its verdict is stale now.
                self.hook = None;
                if let Some(account) = &self.rebuild.account {
                    engine.handle_account_name(account.clone());
                }
                for carrier in &self.rebuild.carriers_up {
                    engine.handle_carrier_up(carrier.clone(), now);
                }
                self.engine = engine;
            }
            Err(e) => (self.sink)(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Error,
                message: format!("cannot reload storage after a failed commit: {e}"),
                target: "courier_client::store",
            }),
        }
    }

    /// Hands a transmit to its carrier: the relay or gateway task, or the facade for an app
    /// carrier.
    fn route(&mut self, transmit: Transmit) {
        match transmit.carrier {
            Carrier::Relay => {
                let Some(relay) = &self.relay else { return };
                let out = match addressed(transmit.kind) {
                    Addressed::Frame(frame) => RelayOut::Submit(frame),
                    Addressed::ReleaseFrame(seq) => RelayOut::ReleaseFrame { seq },
                };
                let _ = relay.send(out);
            }
            Carrier::Gateway => {
                let Some(gateway) = &self.gateway else { return };
                // Only the relay journals frames: the engine releases none of a gateway's.
                if let Addressed::Frame(frame) = addressed(transmit.kind) {
                    let _ = gateway.send(GatewayOut::Submit(frame));
                }
            }
            Carrier::Local(name) => {
                // App carriers move the end-to-end Message itself; there is no journal to release.
                let (message, report) = match transmit.kind {
                    TransmitKind::Outbox { message, send_seq } => {
                        let report = Some((message.id.clone(), send_seq));
                        (message, report)
                    }
                    TransmitKind::DeliveryAck { message } => (message, None),
                    TransmitKind::ReleaseFrame { .. } => return,
                };
                let peer = transmit.peer.unwrap_or_else(|| message.recipient.clone());
                (self.sink)(ClientEvent::LocalTransmit {
                    carrier: name,
                    peer,
                    frame: message.encode(),
                    report,
                });
            }
        }
    }

    fn prune(&mut self, now: Millis) {
        let older_than = now.saturating_sub(self.retention.age_ms);
        let settled = self
            .store
            .prune_settled(older_than, self.retention.max_settled);
        let processed = self
            .store
            .prune_processed(older_than, self.retention.max_processed);
        if let Err(e) = settled.and(processed) {
            (self.sink)(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Warn,
                message: format!("pruning old delivery records failed: {e}"),
                target: "courier_client::store",
            });
        }
    }

    fn collect_events(&mut self, step: &mut Step) {
        while let Some(event) = self.engine.poll_event() {
            step.events.push(event.into());
        }
    }

    /// Commit, then resolve, dispatch and transmit — in that order; then hand the next batch
    /// to the durability hook, whose buffered rows are now committed.
    fn finish(&mut self, step: Step) {
        let Step {
            accepted,
            events,
            after_transmits,
            relay_inbound,
            ..
        } = step;
        let ops: Vec<StoreOp> = std::iter::from_fn(|| self.engine.poll_store()).collect();
        let reports = Reports {
            held: events
                .iter()
                .chain(&after_transmits)
                .filter_map(terminal_report)
                .collect(),
            done: std::mem::take(&mut self.reported),
        };
        let newly_reported: Vec<String> = reports.held.iter().map(|(id, _)| id.clone()).collect();
        if let Err(e) = self.store.commit_step(&ops, &reports) {
            // Still owed: nothing of the failed transaction was written.
            self.reported = reports.done;
            // The step's state is not durable: no send may claim it is, and none of its
            // events or transmits may leave.
            let message = e.to_string();
            self.roll_back();
            for (_, reply) in accepted {
                let _ = reply.send(Err(ClientError::Storage(format!(
                    "commit failed: {message}"
                ))));
            }
            (self.sink)(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Error,
                message: format!("storage commit failed: {message}"),
                target: "courier_client::store",
            });
            if relay_inbound {
                if let Some(relay) = &self.relay {
                    let _ = relay.send(RelayOut::Redeliver);
                }
            }
            return;
        }
        // Published before anything is resolved, so a caller never reads counts older than its send.
        if let Ok(mut stats) = self.stats.lock() {
            *stats = self.engine.stats();
        }
        for (id, reply) in accepted {
            let _ = reply.send(Ok(id));
        }
        for event in events {
            (self.sink)(event);
        }
        while let Some(transmit) = self.engine.poll_transmit() {
            self.route(transmit);
        }
        for event in after_transmits {
            (self.sink)(event);
        }
        match &mut self.unconfirmed {
            Some(unconfirmed) => unconfirmed.extend(newly_reported),
            None => self.reported = newly_reported,
        }
        if self.hook.is_none() {
            if let Some(batch) = self.engine.poll_hook() {
                self.hook = Some(OutstandingHook {
                    batch_id: batch.id,
                    deadline: now_ms().saturating_add(self.hook_timeout_ms),
                });
                (self.sink)(ClientEvent::HookCall {
                    batch_id: batch.id,
                    messages: batch.messages,
                });
            }
        }
        while let Some(change) = self.engine.poll_presence() {
            if let Ok(mut watchlist) = self.watchlist.lock() {
                match &change {
                    PresenceChange::Watch(peer) => watchlist.insert(peer.clone()),
                    PresenceChange::Unwatch(peer) => watchlist.remove(peer),
                };
            }
            if let Some(relay) = &self.relay {
                let _ = relay.send(match change {
                    PresenceChange::Watch(peer) => RelayOut::Watch(peer),
                    PresenceChange::Unwatch(peer) => RelayOut::Unwatch(peer),
                });
            }
        }
        let _ = self.store.maybe_checkpoint();
    }
}

/// A transmit for an addressed carrier: an end-to-end frame, or the release of relay journal
/// frame `seq`.
enum Addressed {
    Frame(Submit),
    ReleaseFrame(u64),
}

fn addressed(kind: TransmitKind) -> Addressed {
    match kind {
        TransmitKind::Outbox { message, send_seq } => Addressed::Frame(Submit::Outbox {
            id: message.id.clone(),
            send_seq,
            recipient: message.recipient.clone(),
            frame: send_frame(&message),
        }),
        TransmitKind::DeliveryAck { message } => Addressed::Frame(Submit::Ack {
            frame: send_frame(&message),
        }),
        TransmitKind::ReleaseFrame { seq } => Addressed::ReleaseFrame(seq),
    }
}

fn send_frame(message: &Message) -> String {
    ClientFrame::SendMessage {
        recipient: message.recipient.clone(),
        content: message.encode(),
        message_id: message.id.clone(),
        reply_to_msg: message.reply_to_msg.clone(),
    }
    .encode()
}

fn mint_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A terminal event's `(message id, JSON)`, held in storage until it has been dispatched.
fn terminal_report(event: &ClientEvent) -> Option<(String, String)> {
    let id = event.terminal_message_id()?.to_owned();
    let json = match event {
        // Held again as it was: it is reported once this dispatch is recorded.
        ClientEvent::Replayed { json, .. } => json.to_string(),
        _ => event.to_json().to_string(),
    };
    Some((id, json))
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;

    use courier_engine::Config;
    use courier_proto::{ContentType, Priority};

    use super::*;

    fn request(content: String) -> SendRequest {
        SendRequest {
            id: None,
            recipient: "bob".into(),
            content,
            content_type: ContentType::Text,
            priority: Priority::Medium,
            metadata: Default::default(),
            binary_content: None,
        }
    }

    fn send(tx: &DriverTx, content: String) -> Result<String, ClientError> {
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Send {
            req: request(content),
            reply,
        });
        rx.blocking_recv().expect("the driver answers every send")
    }

    #[test]
    fn a_failed_commit_rejects_the_send_and_changes_nothing() {
        let store = Store::open_memory().unwrap();
        let config = Config::new("test");
        let (tx, rx) = channel();
        let (events_tx, events) = std_mpsc::channel();
        let stats = Arc::new(Mutex::new(Stats::default()));
        let driver = Driver {
            engine: Engine::new(config.clone(), "alice".into()),
            store,
            rx,
            sink: Box::new(move |e| {
                let _ = events_tx.send(e);
            }),
            relay: None,
            gateway: None,
            stats: stats.clone(),
            watchlist: Default::default(),
            hook_timeout_ms: 30_000,
            hook: None,
            reported: Vec::new(),
            unconfirmed: None,
            retention: Retention {
                age_ms: config.dedup_retention_ms(),
                max_settled: 10,
                max_processed: 10,
            },
            rebuild: Rebuild {
                config,
                local_identity: "alice".into(),
                carriers_up: Default::default(),
                account: None,
            },
        };
        driver.store.cap_size_for_faults(4).unwrap();
        let thread = std::thread::spawn(move || driver.run());

        let kept = send(&tx, "small".into()).expect("a send that fits is accepted");
        let big = "x".repeat(200_000);
        let err = send(&tx, big).expect_err("a send the disk cannot hold is refused");
        assert_eq!(err.code(), "ERR_STORAGE");

        let (reply, status) = oneshot::channel();
        tx.send(Command::Status {
            id: kept.clone(),
            reply,
        });
        assert_eq!(
            status.blocking_recv().unwrap().unwrap(),
            MessageStatus::Queued
        );
        assert_eq!(
            stats.lock().unwrap().outbox_regular,
            1,
            "the refused send left no entry"
        );
        let deferred: Vec<_> = events
            .try_iter()
            .filter(|e| matches!(e, ClientEvent::Engine(e) if matches!(&**e, courier_engine::Event::MessageDeferred { .. })))
            .collect();
        assert_eq!(
            deferred.len(),
            1,
            "only the accepted send produced an event"
        );

        let (reply, stopped) = oneshot::channel();
        tx.send(Command::Stop { reply });
        stopped.blocking_recv().unwrap();
        thread.join().unwrap();
    }
}
