//! One simulated device: its durable store and application state, and — while its process
//! runs — the engine with the client driver's volatile state (command queue, end-to-end
//! sessions, the relay session, the neighbors reported to the engine).

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::{Engine, Event, InboundKey, Input, Millis, SendRequest};

use crate::relay::ConnId;
use crate::scenario::PeerSpec;
use crate::store::Store;
use crate::world::{DirectoryReport, E2e};

/// What the driver is told between two steps (the client's `driver::Command`, as far as the
/// simulation goes).
#[derive(Debug)]
pub enum Command {
    Engine(Input),
    /// What the relay said about session setup.
    Directory(DirectoryReport),
}

impl From<Input> for Command {
    fn from(input: Input) -> Self {
        Self::Engine(input)
    }
}

/// Where inside a driver step a crash hits (the step order of `courier-client`'s driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CrashPoint {
    /// Inputs applied, nothing committed.
    BeforeCommit,
    /// Committed; no send resolved.
    AfterCommit,
    /// Sends resolved; no event dispatched.
    AfterResolve,
    /// Events dispatched; no transmit executed.
    AfterEvents,
    /// Some of the transmits executed.
    MidTransmits,
    /// Transmits executed; the events that follow a hook verdict not dispatched.
    AfterTransmits,
}

impl CrashPoint {
    pub const ALL: [CrashPoint; 6] = [
        Self::BeforeCommit,
        Self::AfterCommit,
        Self::AfterResolve,
        Self::AfterEvents,
        Self::MidTransmits,
        Self::AfterTransmits,
    ];
}

/// The client's relay connection.
#[derive(Debug)]
pub struct Session {
    pub conn: ConnId,
    /// `Authenticated` arrived: the relay carrier is up.
    pub authenticated: bool,
    /// The relay advertised group delivery.
    pub groups: bool,
    /// Outbox frames written and not answered: (id, send_seq).
    pub unanswered: BTreeSet<(String, u64)>,
}

/// The running process: engine and driver.
pub struct Running {
    pub engine: Engine,
    /// End-to-end sessions, in an encrypted world: loaded from the store at start.
    pub e2e: Option<E2e>,
    /// Commands queued for the driver's next step.
    pub inbox: Vec<Command>,
    /// Inputs a step left for the next one: sends that could not be sealed.
    pub refeed: Vec<Input>,
    /// When the driver takes its next step for queued commands.
    pub step_at: Option<Millis>,
    pub session: Option<Session>,
    /// A reconnect attempt is scheduled.
    pub connecting: bool,
    pub backoff_ms: Millis,
    /// The app registered the local carrier.
    pub ble: bool,
    /// Neighbors reported to the engine as in range.
    pub neighbors: BTreeSet<usize>,
    /// The next step crashes here.
    pub crash_at: Option<CrashPoint>,
    /// Steps taken at the current instant (a spinning engine never lets time move).
    pub steps_at: (Millis, u32),
    /// Terminal events still held in storage at start, emitted again (flagged replayed) ahead of
    /// everything else in the first step, as the client's start queues them.
    pub replays: Vec<Event>,
    /// Ids whose terminal events were dispatched since the last commit, which records them.
    pub reported: Vec<String>,
    /// Group copy attempts handed to the relay whose write (or failure) the engine has not been
    /// told of yet, by id: no attempt may follow before it is (the ACK timer starts on the write).
    pub unwritten: BTreeMap<String, u64>,
}

/// The application: its own durable store (what its durability hook committed) and the sends it
/// still owes an answer for.
#[derive(Debug, Default)]
pub struct App {
    pub hook_store: BTreeSet<InboundKey>,
    /// Sends under an app-chosen id whose promise has not resolved; after a crash the app
    /// sends them again under the same id.
    pub owed: BTreeMap<String, SendRequest>,
}

pub struct Peer {
    pub spec: PeerSpec,
    pub store: Store,
    pub app: App,
    pub run: Option<Running>,
    /// Bumped by every crash: timers and answers of an earlier process are void.
    pub incarnation: u64,
    /// The local carrier can reach some neighbor of this device.
    pub has_ble: bool,
}

impl Peer {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn push(&mut self, input: Input, at: Millis) {
        self.command(Command::Engine(input), at);
    }

    pub fn command(&mut self, command: Command, at: Millis) {
        if let Some(run) = self.run.as_mut() {
            run.inbox.push(command);
            run.step_at.get_or_insert(at);
        }
    }
}
