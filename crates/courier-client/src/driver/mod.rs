//! The driver: one thread that owns the engine and the store (the only writer). It turns what
//! happened into engine inputs, stamps them with the time, and carries each step out in the
//! engine's order (`courier_engine::step`, `docs/architecture.md#the-step`): many concurrent
//! commands become one step, and so one commit. It decides nothing about delivery.

pub mod connections;
pub mod e2e;
pub mod groups;
mod host;
pub mod media;
mod signed;

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use courier_engine::step::Step;
use courier_engine::{
    Carrier, Config, DiagnosticLevel, Engine, Input, Millis, Restore, SendRequest, Stats,
};
use courier_proto::CONTROL_REPLAY_WINDOW_MS;
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

use crate::app::{App, Barrier};
use crate::carrier::gateway::GatewayOut;
use crate::carrier::relay::RelayOut;
use crate::error::ClientError;
use crate::event::ClientEvent;
use crate::ledger::explain::{self, Explanation};
use crate::ledger::Observer;
use crate::send::{self, ContentCap, ForwardInput};
use crate::store::{GroupSendStatus, MessageStatus, PendingRequest, Reports, Store, StoreError};

use connections::{ConnectionCommand, Connections};
use groups::{GroupCommand, GroupInfo, GroupRelayReport, GroupSendInput, Groups};
use media::{Media, SendMedia};

use e2e::{DirectoryReport, E2e};
use host::{CommitFailed, StepHost};

/// Commands handled in one step at most; the rest wait for the next step.
const MAX_STEP: usize = 4096;

pub enum Command {
    /// An engine input, applied in the order it arrives.
    Engine(Input),
    /// `sendMessage` calls, in call order, each answered once the step that took it is
    /// committed. A batch crosses the channel once: a burst of sends costs one wake-up.
    Send(Vec<Accept>),
    /// `forwardMessage`: the received message is looked up in storage, then sent like a
    /// `sendMessage` (or a `sendGroupMessage` when `to` is a group this device is in).
    Forward {
        forward: ForwardInput,
        reply: oneshot::Sender<Result<String, ClientError>>,
    },
    Status {
        id: String,
        reply: oneshot::Sender<Result<MessageStatus, ClientError>>,
    },
    /// `explainMessage`, from the ledger and the live outbox row.
    Explain {
        id: String,
        reply: oneshot::Sender<Result<Explanation, ClientError>>,
    },
    /// `messageTimeline`: the ledger of one message as JSON.
    Timeline {
        id: String,
        reply: oneshot::Sender<Result<serde_json::Value, ClientError>>,
    },
    /// A runtime event, dispatched in order with the engine's.
    Emit(ClientEvent),
    /// The application's listeners ran for this message's terminal event ([`Receipts`]).
    TerminalSeen {
        message_id: String,
    },
    /// Answered once every command queued before it has been applied and the application has
    /// taken the events dispatched so far ([`App::caught_up`]): how a carrier keeps what it has
    /// read and not yet handed over bounded (`carrier::intake`).
    Barrier(oneshot::Sender<()>),
    /// Answered once every command queued before it has been applied and its step carried
    /// out, so that what the getters read reflects them.
    Sync(oneshot::Sender<()>),
    /// What the relay's key-package directory said (`docs/protocol.md#key-package-directory`).
    Directory(DirectoryReport),
    /// A connection request, or an answer to one; answered with the id of the frame it sent
    /// once the step that took it is committed.
    Connection {
        command: ConnectionCommand,
        reply: oneshot::Sender<Result<String, ClientError>>,
    },
    /// The connection requests waiting for an answer.
    ConnectionRequests {
        reply: oneshot::Sender<Vec<PendingRequest>>,
    },
    /// A group command (`createGroup`, `sendGroupMessage`, …), answered with the group's or the
    /// message's id once the step that carried it out is committed.
    Group {
        command: GroupCommand,
        reply: oneshot::Sender<Result<String, ClientError>>,
    },
    /// `sendMedia`, answered with the file id once the step that took it is committed.
    Media {
        command: Box<SendMedia>,
        reply: oneshot::Sender<Result<String, ClientError>>,
    },
    /// What the relay said about groups.
    GroupRelay(GroupRelayReport),
    /// `getGroupMessageStatus`, from storage.
    GroupStatus {
        id: String,
        reply: oneshot::Sender<Result<Option<GroupSendStatus>, ClientError>>,
    },
    ListGroups {
        reply: oneshot::Sender<Vec<GroupInfo>>,
    },
    /// The relay carrier needs a token from the application's provider.
    TokenWanted {
        request: u64,
    },
    Stop {
        reply: oneshot::Sender<()>,
    },
}

impl From<Input> for Command {
    fn from(input: Input) -> Self {
        Self::Engine(input)
    }
}

/// The sending side of the driver's queue; cheap to clone, never blocks.
#[derive(Clone)]
pub struct DriverTx(mpsc::Sender<Command>);

/// Who chose a send's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdOrigin {
    /// The application: storage may remember how an earlier message with it settled.
    App,
    /// The runtime, just now (a fresh v4 UUID).
    Minted,
}

/// One validated send and where its answer goes.
pub struct Accept {
    req: SendRequest,
    id: IdOrigin,
    reply: oneshot::Sender<Result<String, ClientError>>,
}

impl Accept {
    pub fn new(
        req: SendRequest,
        id: IdOrigin,
        reply: oneshot::Sender<Result<String, ClientError>>,
    ) -> Self {
        Self { req, id, reply }
    }
}

impl DriverTx {
    /// Sends a command; after the driver stopped there is nobody to tell, so it is dropped.
    pub fn send(&self, cmd: Command) {
        let _ = self.0.send(cmd);
    }

    /// Sends an engine input.
    pub fn input(&self, input: Input) {
        self.send(Command::Engine(input));
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

/// An engine loaded with what storage holds, but the chunks of the transfers in `withheld`,
/// whose bytes are gone (`docs/delivery.md#resuming-a-transfer`).
pub fn restored_engine(
    store: &mut Store,
    config: &Config,
    local_identity: &str,
    now: Millis,
    withheld: &HashSet<String>,
) -> Result<Engine, StoreError> {
    let mut outbox = store.load_outbox()?;
    if !withheld.is_empty() {
        outbox.retain(|record| {
            courier_proto::media::header_of(&record.message)
                .map_or(true, |header| !withheld.contains(&header.file_id))
        });
    }
    let restore = Restore {
        outbox,
        processed: store.load_processed(
            now,
            config.dedup_retention_ms(),
            config.dedup_max_entries,
        )?,
        controls: store.load_processed_controls(now)?,
        inbound: store.load_pending_inbound()?,
        group_sends: store.load_group_sends()?,
    };
    let mut engine = Engine::new(config.clone(), local_identity.to_owned());
    engine.handle(Input::Restore(restore), now);
    Ok(engine)
}

/// What the driver publishes for the app's synchronous getters, before it dispatches a step's
/// events: a getter never answers from a state older than the last event dispatched.
#[derive(Clone, Default)]
pub struct Published {
    pub stats: Arc<Mutex<Stats>>,
    /// The engine's presence watchlist, for `internetPresenceWatchlist()`.
    pub watchlist: Arc<Mutex<Vec<String>>>,
}

pub struct Driver {
    engine: Engine,
    store: Store,
    rx: mpsc::Receiver<Command>,
    app: Box<dyn App>,
    relay: Option<tokio_mpsc::UnboundedSender<RelayOut>>,
    gateway: Option<tokio_mpsc::UnboundedSender<GatewayOut>>,
    published: Published,
    retention: Retention,
    config: Config,
    local_identity: String,
    /// Messages whose terminal events reached the application since the last commit; the next
    /// commit (or `stop()`) records it, so a restart does not emit them again.
    reported: Vec<String>,
    /// `Some` when the application confirms each terminal event once its listeners ran
    /// ([`Receipts`]): the messages whose events were dispatched and not confirmed yet. `None`
    /// when the app handles events before it returns, so a dispatch is a report.
    unconfirmed: Option<HashSet<String>>,
    /// End-to-end sessions, when encryption is on.
    e2e: Option<E2e>,
    connections: Connections,
    groups: Groups,
    media: Media,
    /// Inputs a step left for the next one (sends that could not be sealed).
    refeed: Vec<Input>,
    /// Derives each step's message ledger entries (`crate::ledger`).
    ledger: Observer,
}

/// Where the driver's outputs go and how it is told things.
pub struct Wiring {
    pub rx: mpsc::Receiver<Command>,
    pub app: Box<dyn App>,
    pub relay: Option<tokio_mpsc::UnboundedSender<RelayOut>>,
    pub gateway: Option<tokio_mpsc::UnboundedSender<GatewayOut>>,
    pub published: Published,
    /// Whether the app confirms terminal events with [`Receipts`].
    pub receipts: bool,
    /// End-to-end sessions, when encryption is on.
    pub e2e: Option<E2e>,
    pub connections: Connections,
    pub groups: Groups,
    pub media: Media,
}

/// How the application confirms that a terminal event reached its listeners, when its
/// [`App::event`] only queues events for another thread (the Node binding's JS thread). Until confirmed, the
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

/// How long settled outcomes and inbound dedup records are kept, and how many at most.
pub struct Retention {
    pub age_ms: u64,
    pub max_settled: usize,
    pub max_processed: usize,
    /// Received messages kept for forwarding (`docs/delivery.md#received-messages`): by count
    /// and by bytes, never by age.
    pub max_received: usize,
    pub max_received_bytes: u64,
}

/// Pruning runs at most this often, and only when the driver wakes for other work anyway.
const PRUNE_EVERY_MS: u64 = 3_600_000;
pub const MAX_SETTLED: usize = 100_000;
/// Received messages kept for forwarding, and the bytes they may take
/// (`docs/delivery.md#received-messages`).
pub const MAX_RECEIVED: usize = 10_000;
pub const MAX_RECEIVED_BYTES: u64 = 64 * 1024 * 1024;

/// A checked forward: to an address, or to a group this device is in.
enum Forwarding {
    Direct(SendRequest),
    Group(GroupSendInput),
    /// A file this device received (`docs/delivery.md#forwarding-a-file`).
    File(Box<SendMedia>),
}

/// What a step owes its callers besides its outputs.
#[derive(Default)]
struct Owed {
    accepted: Vec<(String, oneshot::Sender<Result<String, ClientError>>)>,
    /// `Command::Sync`s, answered once the step is carried out.
    synced: Vec<oneshot::Sender<()>>,
    /// `Command::Barrier`s, handed to the application once the step's events are dispatched.
    barriers: Vec<oneshot::Sender<()>>,
    /// A relay frame was processed in this step: if the commit fails, it was neither stored nor
    /// acked, and only a new session makes the relay write it again.
    relay_inbound: bool,
    stop: Option<oneshot::Sender<()>>,
    /// Reads of storage (`Status`, `Explain`, `Timeline`), answered once the step committed: a
    /// send taken in the same step is in storage only then.
    reads: Vec<Read>,
}

/// A read of storage a step answers after its commit.
enum Read {
    Status(String, oneshot::Sender<Result<MessageStatus, ClientError>>),
    Explain(String, oneshot::Sender<Result<Explanation, ClientError>>),
    Timeline(
        String,
        oneshot::Sender<Result<serde_json::Value, ClientError>>,
    ),
}

impl Driver {
    pub fn new(
        engine: Engine,
        store: Store,
        config: Config,
        local_identity: String,
        wiring: Wiring,
    ) -> Self {
        let Wiring {
            rx,
            app,
            relay,
            gateway,
            published,
            receipts,
            e2e,
            connections,
            groups,
            media,
        } = wiring;
        if let Ok(mut stats) = published.stats.lock() {
            *stats = engine.stats();
        }
        let ledger = Observer::restore(&store.load_outbox().unwrap_or_default());
        Self {
            ledger,
            retention: Retention {
                age_ms: config.dedup_retention_ms(),
                max_settled: MAX_SETTLED,
                max_processed: config.dedup_max_entries,
                max_received: MAX_RECEIVED,
                max_received_bytes: MAX_RECEIVED_BYTES,
            },
            engine,
            store,
            rx,
            app,
            relay,
            gateway,
            published,
            config,
            local_identity,
            reported: Vec::new(),
            unconfirmed: receipts.then(HashSet::new),
            e2e,
            connections,
            groups,
            media,
            refeed: Vec::new(),
        }
    }

    pub fn run(mut self) {
        let mut next_prune = 0;
        loop {
            let first = match self.wait() {
                Ok(cmd) => cmd,
                Err(()) => return,
            };
            let now = now_ms();
            let mut step = Step::default();
            let mut owed = Owed::default();
            for input in std::mem::take(&mut self.refeed) {
                step.apply(&mut self.engine, input, now);
            }
            let batch: Vec<Command> = first
                .into_iter()
                .chain(self.rx.try_iter().take(MAX_STEP))
                .collect();
            for cmd in batch {
                self.apply(cmd, now, &mut step, &mut owed);
            }
            let stop = owed.stop.take();
            let synced = std::mem::take(&mut owed.synced);
            let barriers = std::mem::take(&mut owed.barriers);
            let reads = std::mem::take(&mut owed.reads);
            self.finish(step, owed, now);
            for read in reads {
                self.answer_read(read, now);
            }
            for reply in synced {
                let _ = reply.send(());
            }
            for reply in barriers {
                self.app.caught_up(Barrier(reply));
            }
            if now >= next_prune {
                next_prune = now + PRUNE_EVERY_MS;
                self.prune(now);
            }
            if let Some(reply) = stop {
                self.await_receipts();
                self.record_reports_at_stop();
                let _ = self.store.maybe_checkpoint();
                let _ = reply.send(());
                return;
            }
        }
    }

    fn apply(&mut self, cmd: Command, now: Millis, step: &mut Step<ClientEvent>, owed: &mut Owed) {
        match cmd {
            Command::Engine(Input::Inbound { message, origin }) => {
                owed.relay_inbound |= origin.carrier == Carrier::Relay;
                let connections = &mut self.connections;
                let group = message.content.starts_with(courier_proto::MLS_GROUP_PREFIX);
                match &mut self.e2e {
                    Some(e2e) if group => {
                        let input =
                            self.groups
                                .inbound(*message, origin, &mut self.engine, e2e, now);
                        step.apply(&mut self.engine, input, now);
                    }
                    Some(e2e) => e2e.inbound(
                        &mut self.engine,
                        step,
                        connections,
                        &mut self.media,
                        *message,
                        origin,
                        now,
                    ),
                    // Sealed, and this device keeps no sessions: reported, never shown as text.
                    None if group || message.content.starts_with(courier_proto::MLS_ENC_PREFIX) => {
                        let code = courier_crypto::code::ENCRYPTION_DISABLED;
                        let reason = "a sealed message, and encryption is disabled here".into();
                        let input = Input::undecryptable(&message, origin, code, reason);
                        step.apply(&mut self.engine, input, now);
                    }
                    None if message.content_type == courier_proto::ContentType::FileChunk => {
                        let sender = message.sender.clone();
                        let input =
                            match self
                                .media
                                .receive(&message, &sender, &mut self.engine, step, now)
                            {
                                Ok(()) => Input::Inbound { message, origin },
                                Err(reason) => Input::Discard { origin, reason },
                            };
                        step.apply(&mut self.engine, input, now);
                    }
                    None => connections.deliver(&mut self.engine, step, *message, origin, now),
                }
                self.after_input(step, now);
            }
            Command::Engine(input) => {
                self.ledger.input(&input, now);
                step.apply(&mut self.engine, input, now);
                self.after_input(step, now);
            }
            Command::Directory(report) => {
                if let Some(e2e) = &mut self.e2e {
                    if let Some(answer) = e2e.directory(&mut self.engine, step, report, now) {
                        self.groups.package(answer.address, answer.package);
                        owed.accepted.extend(self.groups.ready_changes(
                            &mut self.engine,
                            step,
                            e2e,
                            now,
                        ));
                    }
                }
                self.after_input(step, now);
            }
            Command::Group {
                command: GroupCommand::Send(input),
                reply,
            } if self.is_group_send(&input.request.id) => {
                // A group message id already sent: a no-op answering that id.
                owed.accepted.push((input.request.id, reply));
            }
            Command::Group { command, reply } => {
                let e2e = self.e2e.as_mut();
                if let Some(accepted) =
                    self.groups
                        .command(command, reply, &mut self.engine, step, e2e, now)
                {
                    owed.accepted.push(accepted);
                }
                if let Some(e2e) = &mut self.e2e {
                    owed.accepted.extend(self.groups.ready_changes(
                        &mut self.engine,
                        step,
                        e2e,
                        now,
                    ));
                }
                self.after_input(step, now);
            }
            Command::Media { command, reply } => {
                match self.media.send(*command, &mut self.engine, step, now) {
                    Ok(id) => owed.accepted.push((id, reply)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
                self.after_input(step, now);
            }
            Command::GroupRelay(report) => {
                self.groups
                    .relay_report(report, &mut self.engine, step, now);
                self.after_input(step, now);
            }
            Command::GroupStatus { id, reply } => {
                let _ = reply.send(self.store.group_send_status(&id).map_err(ClientError::from));
            }
            Command::ListGroups { reply } => {
                let _ = reply.send(self.groups.list());
            }
            Command::Send(accepts) => {
                for accept in accepts {
                    self.accept(accept, now, step, owed);
                }
            }
            Command::Forward { forward, reply } => match self.forward(forward) {
                Ok(Forwarding::Direct(req)) => {
                    let accept = Accept::new(req, IdOrigin::App, reply);
                    self.accept(accept, now, step, owed)
                }
                Ok(Forwarding::Group(input)) => {
                    let command = GroupCommand::Send(input);
                    self.apply(Command::Group { command, reply }, now, step, owed)
                }
                Ok(Forwarding::File(command)) => {
                    self.apply(Command::Media { command, reply }, now, step, owed)
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::Connection { command, reply } => {
                let e2e = self.e2e.as_mut();
                match self
                    .connections
                    .command(command, &mut self.engine, step, e2e, now)
                {
                    Ok(id) => owed.accepted.push((id, reply)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
                self.after_input(step, now);
            }
            Command::ConnectionRequests { reply } => {
                let _ = reply.send(self.connections.pending());
            }
            Command::Status { id, reply } => owed.reads.push(Read::Status(id, reply)),
            Command::Explain { id, reply } => owed.reads.push(Read::Explain(id, reply)),
            Command::Timeline { id, reply } => owed.reads.push(Read::Timeline(id, reply)),
            Command::Emit(event) => step.emit(&mut self.engine, event),
            Command::Barrier(reply) => owed.barriers.push(reply),
            Command::Sync(reply) => owed.synced.push(reply),
            Command::TerminalSeen { message_id } => self.confirm(message_id),
            Command::TokenWanted { request } => self.app.auth_token_wanted(request),
            Command::Stop { reply } => owed.stop = Some(reply),
        }
    }

    /// The driver adds what storage remembers of an app-chosen id (`SendRequest::settled`),
    /// which the engine judges; an id minted here is new to storage, so its look-up is skipped.
    fn accept(
        &mut self,
        accept: Accept,
        now: Millis,
        step: &mut Step<ClientEvent>,
        owed: &mut Owed,
    ) {
        let Accept { mut req, id, reply } = accept;
        if id == IdOrigin::App {
            match self.store.settled(&req.id) {
                Ok(settled) => req.settled = settled.map(|record| record.outcome),
                Err(e) => {
                    let _ = reply.send(Err(e.into()));
                    return;
                }
            }
        }
        self.connections.sent_to(&req.recipient, now);
        if !matches!(req.settled, Some(courier_engine::Settlement::Delivered)) {
            self.ledger.accepted(&req.id, &req.recipient, now);
        }
        // Answered after the commit, a duplicate included: it may name an entry accepted
        // earlier in this very step, durable only once the step commits.
        owed.accepted.push((req.id.clone(), reply));
        step.apply(&mut self.engine, Input::Send(req), now);
        self.after_input(step, now);
    }

    /// What the engine handed the runtime in an input: verified control frames (a Welcome
    /// joins its session, a connection request is kept, in this step) and the recipients it
    /// wants a session with.
    fn after_input(&mut self, step: &mut Step<ClientEvent>, now: Millis) {
        self.media.outcomes(&mut self.engine, step, now);
        self.media.pump(&mut self.engine, step, now);
        while let Some(message) = self.engine.poll_control() {
            match courier_proto::ConnectionFrame::parse(&message.content) {
                Some(Ok(frame)) => self.connections.control(
                    frame,
                    &message,
                    &mut self.engine,
                    step,
                    self.e2e.as_mut(),
                    now,
                ),
                Some(Err(e)) => step.emit(
                    &mut self.engine,
                    ClientEvent::Diagnostic {
                        level: DiagnosticLevel::Warn,
                        message: format!(
                            "connection frame {} from {} not used: {e}",
                            message.id, message.sender
                        ),
                        target: "courier_client::connections",
                    },
                ),
                None if self.media.control(&message, &mut self.engine, step, now) => {}
                None => {
                    if let Some(e2e) = &mut self.e2e {
                        if !self
                            .groups
                            .control(&message, &mut self.engine, step, e2e, now)
                        {
                            e2e.control(&mut self.engine, step, message, now);
                        }
                    }
                }
            }
        }
        let Some(e2e) = &mut self.e2e else {
            return;
        };
        while let Some(recipient) = self.engine.poll_session_wanted() {
            e2e.want(&mut self.engine, step, &recipient, now);
        }
    }

    /// The send that forwards the received message `forward.message_id`, checked as
    /// `sendMessage` or `sendGroupMessage` checks theirs.
    fn forward(&self, forward: ForwardInput) -> Result<Forwarding, ClientError> {
        let Some(received) = self.store.received(&forward.message_id)? else {
            return self.forward_file(forward);
        };
        let origin = send::forward_origin(&received);
        let to_group = self.groups.is_member(&forward.to);
        let input = send::forward_input(&received, forward);
        let cap = if to_group {
            ContentCap::Exempt
        } else {
            ContentCap::Applies
        };
        let mut request = send::validate_send(input, cap)?;
        request.rich.forwarded_from = Some(origin);
        if to_group {
            let group_id = request.recipient.clone();
            return Ok(Forwarding::Group(GroupSendInput { group_id, request }));
        }
        send::check_direct_recipient(&request.recipient, self.e2e.is_some())?;
        Ok(Forwarding::Direct(request))
    }

    /// `forwardMessage` of an id no received message has: a received file's, or nothing known.
    fn forward_file(&self, forward: ForwardInput) -> Result<Forwarding, ClientError> {
        let ForwardInput {
            message_id, to, id, ..
        } = forward;
        if self.groups.is_member(&to) {
            if self.media.forward(&message_id, to.clone(), None).is_some() {
                return Err(ClientError::InvalidArgument(format!(
                    "{to} is a group: a file goes to a device"
                )));
            }
            return Err(ClientError::MessageNotFound(message_id));
        }
        send::check_direct_recipient(&to, self.e2e.is_some())?;
        match self.media.forward(&message_id, to, id) {
            Some(command) => Ok(Forwarding::File(Box::new(command?))),
            None => Err(ClientError::MessageNotFound(message_id)),
        }
    }

    /// Whether storage knows group message `id` (sent before, delivered or not).
    fn is_group_send(&self, id: &str) -> bool {
        matches!(self.store.group_send_status(id), Ok(Some(_)))
    }

    /// Carries the step out; a failed commit makes it change nothing.
    fn finish(&mut self, mut step: Step<ClientEvent>, owed: Owed, now: Millis) {
        self.after_input(&mut step, now);
        let Owed {
            accepted,
            relay_inbound,
            ..
        } = owed;
        let mut host = StepHost {
            store: &mut self.store,
            app: self.app.as_mut(),
            relay: self.relay.as_ref(),
            gateway: self.gateway.as_ref(),
            published: &self.published,
            reported: &mut self.reported,
            unconfirmed: &mut self.unconfirmed,
            accepted,
            held: Vec::new(),
            e2e: self.e2e.as_mut(),
            connections: &mut self.connections,
            groups: &mut self.groups,
            media: &mut self.media,
            now,
            refeed: &mut self.refeed,
            ledger: &mut self.ledger,
        };
        let outcome = step.finish(&mut self.engine, now, &mut host);
        if let (ControlFlow::Continue(()), Some(e2e), Some(relay)) =
            (&outcome, &mut self.e2e, &self.relay)
        {
            // Key packages are published only once their private halves are committed.
            for frame in e2e.take_outgoing() {
                let _ = relay.send(RelayOut::Setup(frame));
            }
        }
        if let (ControlFlow::Continue(()), Some(relay)) = (&outcome, &self.relay) {
            for frame in self.groups.take_outgoing() {
                let _ = relay.send(RelayOut::Group(frame));
            }
        }
        if let ControlFlow::Break(CommitFailed { message, accepted }) = outcome {
            self.roll_back();
            for (_, reply) in accepted {
                let _ = reply.send(Err(ClientError::Storage(format!(
                    "commit failed: {message}"
                ))));
            }
            self.app.event(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Error,
                message: format!("storage commit failed: {message}"),
                target: "courier_client::store",
            });
            if relay_inbound {
                if let Some(relay) = &self.relay {
                    let _ = relay.send(RelayOut::Redeliver);
                }
            }
        }
        let _ = self.store.maybe_checkpoint();
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

    fn record_reports_at_stop(&mut self) {
        let done = Reports {
            held: Vec::new(),
            done: std::mem::take(&mut self.reported),
        };
        if let Err(e) = self.store.commit_step(&[], &done) {
            self.app.event(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Warn,
                message: format!(
                    "cannot record dispatched terminal events ({e}); the next start emits them again"
                ),
                target: "courier_client::store",
            });
        }
    }

    /// Blocks until a command arrives or the engine's next deadline; `Ok(None)` means due work.
    fn wait(&self) -> Result<Option<Command>, ()> {
        if self.media.has_work() {
            return Ok(None);
        }
        match self.engine.next_deadline() {
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

    /// A failed commit leaves the engine ahead of storage. Rebuilding it from storage — the state
    /// at the end of the last committed step — makes the failed step change nothing; its events
    /// and transmits are dropped with the old engine. The carriers and the relay account are
    /// not storage's: the new engine hears them from the old one. A batch the hook holds
    /// belonged to the old engine, so its verdict is stale.
    fn roll_back(&mut self) {
        let now = now_ms();
        self.refeed.clear();
        if let Err(e) = self.groups.rollback(&self.store) {
            self.app.event(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Error,
                message: format!("cannot reload the groups: {e}"),
                target: "courier_client::groups",
            });
        }
        if let Err(e) = self.connections.rollback(&self.store) {
            self.app.event(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Error,
                message: format!("cannot reload the connection requests: {e}"),
                target: "courier_client::connections",
            });
        }
        if let Some(e2e) = &mut self.e2e {
            if let Err(e) = e2e.rollback() {
                self.app.event(ClientEvent::Diagnostic {
                    level: DiagnosticLevel::Error,
                    message: format!("cannot roll the session state back: {e}"),
                    target: "courier_client::e2e",
                });
            }
        }
        let records = self.store.load_outbox().unwrap_or_default();
        self.ledger.roll_back(&records);
        if let Err(e) = self.media.rollback(&self.store, &records, now) {
            self.app.event(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Error,
                message: format!("cannot reload the file transfers: {e}"),
                target: "courier_client::media",
            });
        }
        let withheld = self.media.withheld();
        match restored_engine(
            &mut self.store,
            &self.config,
            &self.local_identity,
            now,
            &withheld,
        ) {
            Ok(mut engine) => {
                if let Some(account) = self.engine.account() {
                    engine.handle(Input::AccountName(account.to_owned()), now);
                }
                for carrier in self.engine.carriers() {
                    engine.handle(Input::CarrierUp(carrier.clone()), now);
                }
                self.engine = engine;
            }
            Err(e) => self.app.event(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Error,
                message: format!("cannot reload storage after a failed commit: {e}"),
                target: "courier_client::store",
            }),
        }
    }

    /// Answers a read of storage, after the step that took it committed.
    fn answer_read(&self, read: Read, now: Millis) {
        match read {
            Read::Status(id, reply) => {
                let _ = reply.send(self.store.status(&id).map_err(ClientError::from));
            }
            Read::Explain(id, reply) => {
                let _ = reply.send(self.explain(&id, now));
            }
            Read::Timeline(id, reply) => {
                let history = self.store.history(&id).map_err(ClientError::from);
                let _ = reply.send(history.and_then(|history| {
                    history
                        .map(|h| h.to_json())
                        .ok_or(ClientError::MessageNotFound(id))
                }));
            }
        }
    }

    /// `explainMessage` of `id`: its ledger, and its outbox row while it is live.
    fn explain(&self, id: &str, now: Millis) -> Result<Explanation, ClientError> {
        let history = self
            .store
            .history(id)?
            .ok_or_else(|| ClientError::MessageNotFound(id.to_owned()))?;
        let live = self.store.outbox_record(id)?;
        Ok(explain::explain(&history, live.as_ref(), &self.config, now))
    }

    fn prune(&mut self, now: Millis) {
        let older_than = now.saturating_sub(self.retention.age_ms);
        let settled = self
            .store
            .prune_settled(older_than, self.retention.max_settled);
        let processed = self
            .store
            .prune_processed(older_than, self.retention.max_processed);
        let controls = self
            .store
            .prune_processed_controls(now.saturating_sub(CONTROL_REPLAY_WINDOW_MS));
        let media = self.store.prune_media(older_than);
        let ledger = self
            .store
            .prune_ledger(older_than, crate::ledger::MAX_MESSAGES);
        self.media.forget_before(older_than);
        let received = self.store.prune_received(
            self.retention.max_received,
            self.retention.max_received_bytes,
        );
        if let Err(e) = settled
            .and(processed)
            .and(controls)
            .and(media)
            .and(ledger)
            .and(received)
        {
            self.app.event(ClientEvent::Diagnostic {
                level: DiagnosticLevel::Warn,
                message: format!("pruning old delivery records failed: {e}"),
                target: "courier_client::store",
            });
        }
    }
}

pub fn mint_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;

    use courier_proto::{ContentType, Priority};

    use super::*;

    fn request(content: String) -> SendRequest {
        SendRequest {
            id: mint_id(),
            settled: None,
            recipient: "bob".into(),
            content,
            content_type: ContentType::Text,
            priority: Priority::Medium,
            metadata: Default::default(),
            binary_content: None,
            media: None,
            rich: Default::default(),
        }
    }

    /// An application with no hook and no app carrier: only events reach it.
    struct Events(std_mpsc::Sender<ClientEvent>);

    impl App for Events {
        fn event(&mut self, event: ClientEvent) {
            let _ = self.0.send(event);
        }

        fn hook_batch(&mut self, batch: courier_engine::HookBatch) {
            panic!(
                "no durability hook is configured, yet batch {} came",
                batch.id
            );
        }

        fn app_carrier_send(&mut self, send: crate::app::AppCarrierSend) {
            panic!(
                "no app carrier is registered, yet {} got a frame",
                send.carrier
            );
        }

        fn auth_token_wanted(&mut self, request: u64) {
            panic!("no token provider is configured, yet request {request} came");
        }
    }

    fn send(tx: &DriverTx, content: String) -> Result<String, ClientError> {
        let (reply, rx) = oneshot::channel();
        tx.send(Command::Send(vec![Accept::new(
            request(content),
            IdOrigin::App,
            reply,
        )]));
        rx.blocking_recv().expect("the driver answers every send")
    }

    #[test]
    fn a_failed_commit_rejects_the_send_and_changes_nothing() {
        let store = Store::open_memory().unwrap();
        store.cap_size_for_faults(4).unwrap();
        let config = Config::new("test");
        let (tx, rx) = channel();
        let (events_tx, events) = std_mpsc::channel();
        let published = Published::default();
        let wiring = Wiring {
            rx,
            app: Box::new(Events(events_tx)),
            relay: None,
            gateway: None,
            published: published.clone(),
            receipts: false,
            e2e: None,
            connections: Connections::restore(
                &store,
                courier_proto::IdentityKey::from_seed([1; 32]),
                "test".into(),
                Default::default(),
            )
            .unwrap(),
            groups: Groups::restore(
                &store,
                courier_proto::IdentityKey::from_seed([1; 32]),
                "test".into(),
                true,
            )
            .unwrap(),
            media: Media::restore(
                &store,
                crate::config::media::MediaConfig::new(std::env::temp_dir()),
                courier_proto::IdentityKey::from_seed([1; 32]),
                "test".into(),
                false,
                config.outbox_max_media_entries,
                &[],
                0,
            )
            .unwrap()
            .media,
        };
        let engine = Engine::new(config.clone(), "alice".into());
        let driver = Driver::new(engine, store, config, "alice".into(), wiring);
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
            published.stats.lock().unwrap().outbox_regular,
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
