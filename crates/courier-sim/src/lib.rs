//! Deterministic simulation of offline-courier under faults.
//!
//! A seed builds a world — three to five devices each running the real sans-IO engine behind a
//! model of the client driver, a relay with or without its mailbox, local-carrier links between
//! some of the devices, and a virtual clock — and a scheduler that drives it with app traffic
//! while injecting faults: lost, duplicated, delayed and reordered frames, disconnects, relay
//! restarts, process crashes at every point of the driver's step (before the commit, after it,
//! after resolving the sends, after the events, amid the transmits, after them) and inside the
//! durability hook, and hooks that commit, refuse or hang. Every run is a pure function of its
//! seed (the randomness is one splitmix64 stream and every collection is ordered).
//!
//! About half the seeds build an *encrypted* world (`--encryption` forces it for all): every
//! device has a real Ed25519 identity and its `off1` address, `Config::encryption` is on, and
//! the driver model runs the client's end-to-end layer with real MLS sessions
//! (`docs/delivery.md#sealed-messages`, `docs/protocol.md#session-setup`): frames sealed before
//! the step's commit, sealed copies opened before the engine, sessions set up through the
//! relay's key-package directory or, without it, by the round trip through the peer, session
//! rows committed with the step. openmls draws its own randomness, so no ciphertext byte reaches
//! the run's digest: only what the engine and the driver decide does.
//!
//! About two seeds in five have chat groups (`--groups` forces them for all, `--no-groups`
//! leaves them out; `docs/delivery.md#group-sends`): one to three groups among the devices,
//! whose rosters change in epochs between sends, and whose members send group messages. MLS is
//! modelled minimally: a message is sealed (a reversible transform) for its epoch's roster,
//! which is what its sender hands the engine and what must receive it, and only a member of that
//! epoch can open it. The relay advertises group delivery (mostly), registers each group per
//! connection (now and then refusing), keeps its own roster of each group — lagging behind
//! membership changes, or drifting — journals a broadcast once per member of it but the sender,
//! writes no second copy for a broadcast sent again under its id, and reports each broadcast on
//! time, late, after the sender's 60 s wait or never, refuses it, or sees its sender disconnect
//! (the report waits for its next connection) or die right after it. Per-member copies travel
//! as ordinary entries, never sealed in a 1:1 session. The relay models no rate limiter and the
//! clients write every frame as it is handed over, so the relay's rate budget is not checked.
//!
//! Checked during the run (see `ledger` and `world`):
//! - an accepted send is durable before `sendMessage` resolves;
//! - no message settles twice; every terminal event is the committed settlement, and every one
//!   beyond a message's first is flagged replayed (a start emits again what a crash kept from
//!   being recorded as dispatched: at-least-once, never an unflagged duplicate);
//! - no application sees a message twice, nor one addressed to somebody else;
//! - no end-to-end ACK and no relay hop ack of a data message before it is processed in the
//!   committed store (with a hook: before the application committed it), and no batch offered
//!   to a hook after its commit was durable;
//! - `message_delivered` at the sender means the recipient processed the message (with a hook:
//!   its application committed it);
//! - the engine's queues stay within their configured bounds, and no engine spins;
//! - a message fails by capacity only with its class full in the outbox, by lifetime only once
//!   its lifetime ran out;
//! - in an encrypted world no message reaches an application in the clear (`encrypted: true` on
//!   every `message_received`, the probes' included), and the pre-session queue stays within
//!   its fixed bounds;
//! - no device warns of a forgery (only the durability buffer's retention may warn);
//! - a group message reaches only the applications of its roster, each at most once; a member
//!   is marked delivered only by its copy's ACK (it processed the message) or by the relay's
//!   live write of it, stored only by a journal that holds it, failed only with its copy or its
//!   whole evicted message; each copy settles once, reported as exactly one member event and
//!   never as a `message_*` event; a copy is never sent again before its write was reported; a
//!   group message with something left counts as one entry against the outbox bound, its copies
//!   against its roster; at most 64 broadcasts await a report.
//!
//! Liveness, once the world is honest (every device up and reachable over the relay): a
//! message to a device that fails must have an excuse the chaos left behind, with its evidence
//! (see `World::excuse`: a lifetime that ran out during the chaos, a last attempt written during
//! it, a message the recipient never processed, an ACK refused by the relay or still on its way,
//! an attempt answered "offline", a Welcome ahead of the last attempt that the relay refused, a
//! group copy's ACK sealed in a session its sender does not hold); an engine that does not
//! acknowledge what it processed has none. When the honest world is quiet every device sends a probe of each priority to another
//! device, and every probe must be delivered; a run that sent to devices must deliver something.
//! Never lost to a ratchet: in an encrypted world every `message_decryption_failed` is counted,
//! and a message whose last attempt, written in the honest phase, its recipient failed to
//! decrypt has no excuse — unless both devices had started a session at once and the attempt was sealed in the
//! one that lost the tie (the sender joined the winner after it). A message to a live device
//! may fail by its pre-session lifetime only if that ran out during the chaos.
//!
//! Checked once the world turned honest and nothing is pending: every durable send reached
//! exactly one settlement and at least one terminal event (a crash between the settlement's
//! commit and its dispatch is made good by the replay at the next start, counted as
//! `replays_after_loss`); no terminal event is left held that was never dispatched; every
//! delivered message reached its recipient's application (without a hook a crash between
//! processing and dispatch loses it: the documented at-most-once, counted as
//! `at_most_once_losses`); no buffered inbound row and no relay frame is left; idle engines ask
//! for no wake-up. Every group message's tracker is done, with no member pending and no tracker
//! active in an engine (every backstop fired), and every member its matrix marks delivered or
//! stored has it in its application — unless the model allows the loss and it is counted: a
//! live write by a relay without a mailbox, a journal frame the mailbox TTL deleted, a row the
//! member's durability buffer let expire. Every member of a group probe, sent into the quiet
//! honest world by each member of each group in turn, gets it and is delivered or stored. In an encrypted world: every data message that failed to decrypt was
//! delivered after all or failed with an excuse, and nothing is left that no one can open —
//! what each device would seal for a peer next, the peer opens (after the Welcome that goes
//! ahead of it), tried on copies of the committed session state.

mod ledger;
mod peer;
mod relay;
mod rng;
mod scenario;
mod store;
mod world;

use std::panic::{self, AssertUnwindSafe};

pub use ledger::VIOLATION;
pub use world::{Counts, Summary};

/// How to run one seed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Scheduled fault actions before the world turns honest; `None`: the seed decides.
    pub actions: Option<u32>,
    /// Print every step, event and frame.
    pub verbose: bool,
    /// Whether messages travel sealed in end-to-end sessions; `None`: the seed decides (about
    /// half the seeds do).
    pub encryption: Option<bool>,
    /// Whether the peers form chat groups and send group messages; `None`: the seed decides
    /// (about two in five do).
    pub groups: Option<bool>,
}

/// A seed whose run broke an invariant (or panicked).
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub message: String,
}

/// Runs one seed to the end and checks it.
pub fn run_seed(seed: u64, options: Options) -> Result<Summary, Failure> {
    let result = panic::catch_unwind(AssertUnwindSafe(|| world::World::new(seed, options).run()));
    result.map_err(|payload| {
        let message = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic without a message".to_owned());
        // Addresses read better as the devices' short names.
        let message = world::World::new(
            seed,
            Options {
                verbose: false,
                ..options
            },
        )
        .shorten(&message);
        Failure { seed, message }
    })
}

/// One line describing the world a seed builds.
pub fn describe(seed: u64, options: Options) -> String {
    world::World::new(
        seed,
        Options {
            verbose: false,
            ..options
        },
    )
    .describe()
}

/// The command that replays a seed.
pub fn replay_command(seed: u64, options: Options) -> String {
    let actions = options
        .actions
        .map(|a| format!(" --actions {a}"))
        .unwrap_or_default();
    let encryption = match options.encryption {
        Some(true) => " --encryption",
        Some(false) => " --no-encryption",
        None => "",
    };
    let groups = match options.groups {
        Some(true) => " --groups",
        Some(false) => " --no-groups",
        None => "",
    };
    format!(
        "cargo run -p courier-sim --release -- --seed {seed}{actions}{encryption}{groups} --verbose"
    )
}
