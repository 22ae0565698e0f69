//! The world: devices, the relay, the network between them and the virtual clock, driven by a
//! seeded scheduler. A run has two phases. In the *chaos* phase the scheduler injects faults
//! between ordinary traffic; then the world turns *honest* (no faults, every device up, every
//! hook committing) and runs until nothing is pending, and the ledger's end-of-run invariants
//! are checked.
//!
//! Once the honest world is quiet, every device sends one probe of each priority to another
//! device, one round at a time, then every member of every group one group message, one at a
//! time, and the world runs until quiet again: each probe must be delivered (every member of a
//! group probe's roster reached and given it), whatever the chaos left behind.
//!
//! Each device's process is modelled as `courier-client`'s driver runs it: commands queue up
//! and one step applies them all, then commits the step's store ops in one batch — holding the
//! step's terminal events and recording the dispatch of the previous ones — then resolves the
//! sends, dispatches the events, executes the transmits, dispatches what follows a hook verdict,
//! and hands the next batch to the durability hook. A crash can hit between any two of these;
//! the restarted process is rebuilt only from what the store committed, and emits the terminal
//! events still held there again, flagged replayed, before anything else.
//!
//! In a world with groups (`groups`) members send group messages, which the relay broadcasts
//! when the sender's engine chooses it, and the world checks each group message's per-member
//! matrix against what the relay did and what every member's application got.
//!
//! Relay connections are ordered (WebSocket over TCP): frames on one connection keep their
//! order, though the scheduler may lose or duplicate a frame (a lossy middlebox) and delay
//! spikes hold back the frames behind them. Local carriers are datagram-like: frames are lost,
//! duplicated and reordered freely.

mod checks;
mod driver;
mod e2e;
mod groups;
mod network;
mod scheduler;

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::{
    Carrier, CarrierAnswer, Engine, Event, FailReason, GroupReport, InboundKey, InboundOrigin,
    Input, Millis, Restore, SendRequest, Settlement, StoreOp, Transmit, TransmitKind,
};
use courier_proto::{ContentType, Message, Priority};

use crate::ledger::{violated, Ledger, Refused};
use crate::peer::{App, Command, CrashPoint, Peer, Running, Session};
use crate::relay::{ConnId, GroupFrame, Relay, ToClient, ToRelay, Writes};
use crate::rng::Rng;
use crate::scenario::{LinkFaults, Scenario, BLE, HOUR, POISON, SEC};
use crate::store::{key_of, Reports, Store};
use crate::Options;

pub use e2e::{DirectoryReport, E2e};
use groups::GroupState;
pub use scheduler::Action;

/// Whether `message` is a session Welcome, as the driver sends it ahead of messages.
fn is_welcome(message: &Message) -> bool {
    matches!(
        courier_proto::SessionFrame::parse(&message.content),
        Some((courier_proto::SessionFrame::Welcome, _))
    )
}

/// The virtual clock starts here (a plausible epoch time, so timestamps look like real ones).
pub const EPOCH: Millis = 1_700_000_000_000;
/// How long the client waits for the carrier answer to a write
/// (`docs/protocol.md#how-our-client-reads-the-answers`).
const WRITE_ACK_TIMEOUT: Millis = 15 * SEC;
const MAX_BACKOFF: Millis = 30 * SEC;
/// Steps of one device at one instant beyond which its engine is taken to spin.
const SPIN_LIMIT: u32 = 5000;
/// Every priority an app can send with.
const PRIORITIES: [Priority; 4] = [
    Priority::Low,
    Priority::Medium,
    Priority::High,
    Priority::Critical,
];
/// Virtual time between two rounds of probes.
const PROBE_GAP: Millis = 2 * SEC;
/// Reconnect rounds the honest phase may spend on frames the relay still holds. A message
/// refused over a full durability buffer is redelivered only on the next connection (by
/// design), so a backlog larger than the buffer takes several; each round must release some.
const FLUSH_ROUNDS: u32 = 500;

/// What happened during a run, for coverage and the report.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub sends: u64,
    pub accepted: u64,
    pub delivered: u64,
    pub failed_max_retries: u64,
    pub failed_lifetime: u64,
    pub failed_capacity: u64,
    pub stored: u64,
    pub undeliverable: u64,
    pub retrying: u64,
    pub deferred: u64,
    pub received: u64,
    pub drains_completed: u64,
    pub hook_batches: u64,
    pub hook_commits: u64,
    pub hook_refusals: u64,
    pub hook_hangs: u64,
    pub hook_crashes: u64,
    /// Offers of a key the app had already committed (at-least-once, absorbed by its dedup).
    pub hook_redeliveries: u64,
    pub expired_rows: u64,
    pub crashes: u64,
    pub step_crashes: [u64; 6],
    pub relay_restarts: u64,
    pub disconnects: u64,
    pub frames_lost: u64,
    pub frames_duplicated: u64,
    pub local_frames: u64,
    /// Terminal events a start emitted again, flagged replayed: their dispatch was never
    /// recorded (a crash hit before the commit after it).
    pub replays: u64,
    /// Of those, the message's first terminal event: a crash had cut off the original between
    /// the settlement's commit and its dispatch.
    pub replays_after_loss: u64,
    /// Messages processed without a hook whose `message_received` a crash swallowed (the
    /// documented at-most-once of the default path), of those the sender saw delivered.
    pub at_most_once_losses: u64,
    /// Runs whose messages travelled sealed, and of those with the relay's key-package directory.
    pub encrypted_worlds: u64,
    pub directory_worlds: u64,
    /// Messages and delivery ACKs sealed, and sealed copies opened and kept.
    pub sealed: u64,
    pub opened: u64,
    /// Sealed copies opened that the engine did not keep: the session was put back, so the
    /// redelivery opens again.
    pub opened_not_kept: u64,
    /// Sealed copies not opened because the engine already knew their id (a ratchet opens each
    /// ciphertext once).
    pub copies_known: u64,
    /// `message_decryption_failed` events.
    pub decryption_failures: u64,
    /// Of those, copies a device only carried for another, which it tries to open all the same
    /// (the client's driver opens every sealed copy before the engine sees whom it is for).
    pub carried_undecryptable: u64,
    /// Sealed copies whose key was spent (a repeat of one opened before), dropped.
    pub replays_discarded: u64,
    /// Transmits that could not be sealed.
    pub seal_failures: u64,
    /// Data messages that failed to decrypt somewhere, by how they ended at their sender.
    pub undecryptable_then_delivered: u64,
    pub undecryptable_then_failed: u64,
    /// Sessions this run's devices started (from a directory package or a peer's key package
    /// frame) and joined (from a Welcome).
    pub sessions_started: u64,
    pub sessions_joined: u64,
    /// Sessions started from a key package of the relay's directory, and from one the peer sent.
    pub directory_setups: u64,
    pub round_trip_setups: u64,
    /// Key package frames sent to a peer (the round trip), and Welcomes sent.
    pub key_packages_sent: u64,
    pub welcomes_sent: u64,
    /// Welcomes ignored because the receiver's own session wins the tie, and repeats of the
    /// Welcome of the session already joined.
    pub welcomes_outranked: u64,
    pub welcomes_repeated: u64,
    /// Welcomes joined whose sender no longer held that session (it had replaced it, or joined
    /// the receiver's): the two sides' sessions part ways unless a newer Welcome follows.
    pub stale_welcomes_joined: u64,
    /// Warnings of the end-to-end layer (a session frame not used, a package not usable).
    pub e2e_warnings: u64,
    /// `security_warning` events.
    pub security_warnings: u64,
    /// Runs with chat groups.
    pub group_worlds: u64,
    /// Group messages the apps sent, and of those the engines accepted durably.
    pub group_sends: u64,
    pub group_accepted: u64,
    /// Group messages that went by the relay's broadcast, and by per-member copies at once.
    pub group_broadcast_path: u64,
    pub group_fanout_path: u64,
    /// Broadcasts the relay took (re-broadcasts included), and per-member copies it did not
    /// journal again for a re-broadcast.
    pub group_relay_broadcasts: u64,
    pub group_relay_dedup: u64,
    /// Reports the engines took (`group_message_delivery_report`), and members given copies by
    /// them (the missed and the unnamed).
    pub group_reports: u64,
    pub group_reissued: u64,
    /// Reports the relay lost, wrote late (within the wait, after it), broadcasts it refused,
    /// and senders that lost their connection or died right after a broadcast.
    pub group_reports_lost: u64,
    pub group_reports_late: u64,
    pub group_reports_after_wait: u64,
    pub group_refusals: u64,
    pub group_sender_disconnects: u64,
    pub group_sender_crashes: u64,
    /// Registrations the relay refused, roster changes, and drifts of the relay's roster.
    pub group_registrations_refused: u64,
    pub group_roster_changes: u64,
    pub group_drifts: u64,
    /// Member states committed: delivered by a copy's ACK, delivered by a report, stored, failed.
    pub group_members_acked: u64,
    pub group_members_reported: u64,
    pub group_members_stored: u64,
    pub group_members_failed: u64,
    /// Group messages reaching an application, and broadcasts dropped unopened by a device
    /// outside the epoch they were sealed in.
    pub group_received: u64,
    pub group_unreadable: u64,
    /// Members reached by the matrix whose application never got the message, as the model
    /// allows: written live by a relay without a mailbox, deleted by the mailbox TTL, expired in
    /// the member's hook buffer.
    pub group_live_losses: u64,
    pub group_purged: u64,
    pub group_expired: u64,
    pub flush_rounds: u64,
    pub max_outbox: usize,
    pub max_pending_acks: usize,
    pub max_buffered: usize,
    pub max_watchlist: usize,
    pub max_in_flight: usize,
    pub max_transmits_per_step: usize,
    pub max_relay_journal: usize,
    pub steps: u64,
}

impl Counts {
    /// Adds another run's counts (maxima are kept as maxima).
    pub fn add(&mut self, other: &Counts) {
        let sums = [
            (&mut self.sends, other.sends),
            (&mut self.accepted, other.accepted),
            (&mut self.delivered, other.delivered),
            (&mut self.failed_max_retries, other.failed_max_retries),
            (&mut self.failed_lifetime, other.failed_lifetime),
            (&mut self.failed_capacity, other.failed_capacity),
            (&mut self.stored, other.stored),
            (&mut self.undeliverable, other.undeliverable),
            (&mut self.retrying, other.retrying),
            (&mut self.deferred, other.deferred),
            (&mut self.received, other.received),
            (&mut self.drains_completed, other.drains_completed),
            (&mut self.hook_batches, other.hook_batches),
            (&mut self.hook_commits, other.hook_commits),
            (&mut self.hook_refusals, other.hook_refusals),
            (&mut self.hook_hangs, other.hook_hangs),
            (&mut self.hook_crashes, other.hook_crashes),
            (&mut self.hook_redeliveries, other.hook_redeliveries),
            (&mut self.expired_rows, other.expired_rows),
            (&mut self.crashes, other.crashes),
            (&mut self.relay_restarts, other.relay_restarts),
            (&mut self.disconnects, other.disconnects),
            (&mut self.frames_lost, other.frames_lost),
            (&mut self.frames_duplicated, other.frames_duplicated),
            (&mut self.local_frames, other.local_frames),
            (&mut self.replays, other.replays),
            (&mut self.replays_after_loss, other.replays_after_loss),
            (&mut self.at_most_once_losses, other.at_most_once_losses),
            (&mut self.encrypted_worlds, other.encrypted_worlds),
            (&mut self.directory_worlds, other.directory_worlds),
            (&mut self.sealed, other.sealed),
            (&mut self.opened, other.opened),
            (&mut self.opened_not_kept, other.opened_not_kept),
            (&mut self.copies_known, other.copies_known),
            (&mut self.decryption_failures, other.decryption_failures),
            (&mut self.carried_undecryptable, other.carried_undecryptable),
            (&mut self.replays_discarded, other.replays_discarded),
            (&mut self.seal_failures, other.seal_failures),
            (
                &mut self.undecryptable_then_delivered,
                other.undecryptable_then_delivered,
            ),
            (
                &mut self.undecryptable_then_failed,
                other.undecryptable_then_failed,
            ),
            (&mut self.sessions_started, other.sessions_started),
            (&mut self.sessions_joined, other.sessions_joined),
            (&mut self.directory_setups, other.directory_setups),
            (&mut self.round_trip_setups, other.round_trip_setups),
            (&mut self.key_packages_sent, other.key_packages_sent),
            (&mut self.welcomes_sent, other.welcomes_sent),
            (&mut self.welcomes_outranked, other.welcomes_outranked),
            (&mut self.welcomes_repeated, other.welcomes_repeated),
            (&mut self.stale_welcomes_joined, other.stale_welcomes_joined),
            (&mut self.e2e_warnings, other.e2e_warnings),
            (&mut self.security_warnings, other.security_warnings),
            (&mut self.group_worlds, other.group_worlds),
            (&mut self.group_sends, other.group_sends),
            (&mut self.group_accepted, other.group_accepted),
            (&mut self.group_broadcast_path, other.group_broadcast_path),
            (&mut self.group_fanout_path, other.group_fanout_path),
            (
                &mut self.group_relay_broadcasts,
                other.group_relay_broadcasts,
            ),
            (&mut self.group_relay_dedup, other.group_relay_dedup),
            (&mut self.group_reports, other.group_reports),
            (&mut self.group_reissued, other.group_reissued),
            (&mut self.group_reports_lost, other.group_reports_lost),
            (&mut self.group_reports_late, other.group_reports_late),
            (
                &mut self.group_reports_after_wait,
                other.group_reports_after_wait,
            ),
            (&mut self.group_refusals, other.group_refusals),
            (
                &mut self.group_sender_disconnects,
                other.group_sender_disconnects,
            ),
            (&mut self.group_sender_crashes, other.group_sender_crashes),
            (
                &mut self.group_registrations_refused,
                other.group_registrations_refused,
            ),
            (&mut self.group_roster_changes, other.group_roster_changes),
            (&mut self.group_drifts, other.group_drifts),
            (&mut self.group_members_acked, other.group_members_acked),
            (
                &mut self.group_members_reported,
                other.group_members_reported,
            ),
            (&mut self.group_members_stored, other.group_members_stored),
            (&mut self.group_members_failed, other.group_members_failed),
            (&mut self.group_received, other.group_received),
            (&mut self.group_unreadable, other.group_unreadable),
            (&mut self.group_live_losses, other.group_live_losses),
            (&mut self.group_purged, other.group_purged),
            (&mut self.group_expired, other.group_expired),
            (&mut self.flush_rounds, other.flush_rounds),
            (&mut self.steps, other.steps),
        ];
        for (total, value) in sums {
            *total += value;
        }
        for (total, value) in self.step_crashes.iter_mut().zip(other.step_crashes) {
            *total += value;
        }
        let maxima = [
            (&mut self.max_outbox, other.max_outbox),
            (&mut self.max_pending_acks, other.max_pending_acks),
            (&mut self.max_buffered, other.max_buffered),
            (&mut self.max_watchlist, other.max_watchlist),
            (&mut self.max_in_flight, other.max_in_flight),
            (
                &mut self.max_transmits_per_step,
                other.max_transmits_per_step,
            ),
            (&mut self.max_relay_journal, other.max_relay_journal),
        ];
        for (max, value) in maxima {
            *max = (*max).max(value);
        }
    }
}

/// The outcome of a run that held every invariant.
#[derive(Debug, Clone)]
pub struct Summary {
    pub counts: Counts,
    /// A digest of the run's course: two runs of one seed must agree.
    pub digest: u64,
    pub virtual_ms: Millis,
    pub peers: usize,
    pub mailbox: bool,
}

#[derive(Debug, Clone)]
enum Ev {
    ToRelay {
        conn: ConnId,
        frame: ToRelay,
    },
    GroupToRelay {
        conn: ConnId,
        frame: GroupFrame,
    },
    ToClient {
        peer: usize,
        conn: ConnId,
        frame: ToClient,
    },
    Local {
        from: usize,
        to: usize,
        message: Box<Message>,
    },
    HookDone {
        peer: usize,
        inc: u64,
        batch_id: u64,
        ok: bool,
    },
    Crash {
        peer: usize,
        inc: u64,
    },
    Restart {
        peer: usize,
    },
    Connect {
        peer: usize,
        inc: u64,
    },
    WriteAckTimeout {
        peer: usize,
        inc: u64,
        conn: ConnId,
        id: String,
        send_seq: u64,
    },
    RelayUp,
    Chaos,
    /// Every device sends its probe of priority `PRIORITIES[round]`.
    Probe {
        round: usize,
    },
    /// The relay's report of a broadcast from `peer` on `conn` is due, unless the relay
    /// restarted since (it had restarted `restarts` times at the broadcast).
    GroupReport {
        conn: ConnId,
        peer: usize,
        restarts: u64,
        report: GroupReport,
    },
    /// The relay's roster of group `group` catches up with the real one.
    GroupSync {
        group: usize,
    },
    /// Device `peer` sends its probe to group `group`.
    GroupProbe {
        peer: usize,
        group: usize,
    },
}

/// An event for the application (the client's `ClientEvent` as far as the invariants go).
#[derive(Debug)]
enum AppEvent {
    Engine(Event),
    /// A terminal event held in storage, emitted again by a start (`replayed: true`).
    Replayed(Event),
}

impl AppEvent {
    /// A terminal event's `(message id, event)`, held in storage until its dispatch is recorded.
    fn terminal(&self) -> Option<(String, Event)> {
        let (AppEvent::Engine(event) | AppEvent::Replayed(event)) = self;
        match event {
            Event::MessageDelivered { message_id, .. }
            | Event::MessageFailed { message_id, .. } => Some((message_id.clone(), event.clone())),
            _ => None,
        }
    }
}

pub struct World {
    now: Millis,
    rng: Rng,
    scn: Scenario,
    peers: Vec<Peer>,
    relay: Relay,
    queue: BTreeMap<(Millis, u64), Ev>,
    qseq: u64,
    ledger: Ledger,
    counts: Counts,
    /// When the world turned honest: from then on no fault is injected.
    honest_since: Option<Millis>,
    /// The probes sent into the quiet honest world, as (sender, id); `None` before.
    probes: Option<Vec<(String, String)>>,
    /// The honest phase must be quiet by then.
    deadline: Millis,
    chaos_left: u32,
    in_range: BTreeSet<(usize, usize)>,
    /// The chat groups, by index (empty in a world without groups).
    groups: Vec<GroupState>,
    conn_owner: BTreeMap<ConnId, usize>,
    /// Ordered links: the arrival time of the last frame per (connection, towards the relay).
    fifo: BTreeMap<(ConnId, bool), Millis>,
    next_id: u64,
    /// Session frames minted so far (their ids).
    next_frame: u64,
    verbose: bool,
    digest: u64,
}

impl World {
    pub fn new(seed: u64, options: Options) -> Self {
        let mut rng = Rng::new(seed);
        let scn = Scenario::generate(
            &mut rng,
            seed,
            options.actions,
            options.encryption,
            options.groups,
        );
        let directory = scn.encryption && scn.directory;
        let relay = Relay::new(
            scn.mailbox,
            directory,
            scn.groups.as_ref().is_some_and(|g| g.relay_delivery),
            scn.peers.iter().map(|p| p.name.clone()),
        );
        let groups = scn
            .groups
            .iter()
            .flat_map(|w| &w.groups)
            .map(|g| GroupState::new(g.id.clone(), g.members.clone()))
            .collect();
        let peers = scn
            .peers
            .iter()
            .enumerate()
            .map(|(i, spec)| Peer {
                spec: spec.clone(),
                store: Store::default(),
                app: App::default(),
                run: None,
                incarnation: 0,
                has_ble: scn.ble_pairs.iter().any(|&(a, b)| a == i || b == i),
            })
            .collect();
        let in_range = scn
            .ble_pairs
            .iter()
            .copied()
            .filter(|_| rng.chance(500))
            .collect();
        Self {
            now: EPOCH,
            chaos_left: scn.chaos_actions,
            scn,
            rng,
            peers,
            relay,
            queue: BTreeMap::new(),
            qseq: 0,
            ledger: Ledger::default(),
            counts: Counts::default(),
            honest_since: None,
            probes: None,
            deadline: Millis::MAX,
            in_range,
            groups,
            conn_owner: BTreeMap::new(),
            fifo: BTreeMap::new(),
            next_id: 0,
            next_frame: 0,
            verbose: options.verbose,
            digest: 0xcbf2_9ce4_8422_2325,
        }
    }

    /// One line describing the seed's world.
    pub fn describe(&self) -> String {
        let peers: Vec<String> = self
            .peers
            .iter()
            .map(|p| {
                let c = &p.spec.config;
                format!(
                    "{}(hook:{} edge:{} ack:{}ms retries:{} inflight:{} outbox:{}/{} life:{}s)",
                    p.spec.alias,
                    p.spec.hook.is_some(),
                    c.edge_driven_unreachable_dm,
                    c.ack_timeout_ms,
                    c.max_retries,
                    c.max_pending_acks,
                    c.outbox_max_entries,
                    c.outbox_max_media_entries,
                    c.outbox_max_lifetime_ms / SEC,
                )
            })
            .collect();
        let e2e = match (self.scn.encryption, self.scn.directory) {
            (false, _) => "off",
            (true, true) => "sessions through the key-package directory",
            (true, false) => "sessions by the round trip",
        };
        let groups = match &self.scn.groups {
            None => "none".to_owned(),
            Some(w) => {
                let rosters: Vec<String> = w
                    .groups
                    .iter()
                    .map(|g| {
                        let members: Vec<&str> = g
                            .members
                            .iter()
                            .map(|&q| self.peers[q].spec.alias.as_str())
                            .collect();
                        format!("{}{{{}}}", g.id, members.join(","))
                    })
                    .collect();
                let broadcast: Vec<&str> = (0..self.peers.len())
                    .filter(|&q| w.broadcast[q])
                    .map(|q| self.peers[q].spec.alias.as_str())
                    .collect();
                let r = w.report;
                format!(
                    "{} relay delivery:{} broadcast by [{}] reports lost/late/after-wait/refused/disconnect/crash {}/{}/{}/{}/{}/{}‰ registration refused {}‰ roster lag {} s",
                    rosters.join(" "),
                    w.relay_delivery,
                    broadcast.join(","),
                    r.lost,
                    r.late,
                    r.after_wait,
                    r.refused,
                    r.disconnect,
                    r.crash,
                    w.registration_refused,
                    w.roster_lag_ms / SEC,
                )
            }
        };
        format!(
            "peers {} | mailbox {:?} | ble {:?} | {} actions | encryption: {e2e} | groups: {groups}",
            peers.join(" "),
            self.scn.mailbox.map(|m| m.max_messages),
            self.scn.ble_pairs,
            self.scn.chaos_actions
        )
    }

    /// `text` with every address replaced by its device's short name.
    pub fn shorten(&self, text: &str) -> String {
        self.scn.shorten(text)
    }

    pub fn run(mut self) -> Summary {
        self.counts.encrypted_worlds = u64::from(self.scn.encryption);
        self.counts.directory_worlds = u64::from(self.scn.encryption && self.scn.directory);
        self.counts.group_worlds = u64::from(self.scn.groups.is_some());
        self.sync_groups();
        for p in 0..self.peers.len() {
            self.restart(p);
        }
        let gap = self.chaos_gap();
        self.schedule(gap, Ev::Chaos);
        let mut flush_rounds = 0;
        let mut held_before = usize::MAX;
        loop {
            let Some(next) = self.next_time() else {
                let held = self.relay.held_frames().len();
                if self.honest() && held > 0 && held < held_before && flush_rounds < FLUSH_ROUNDS {
                    held_before = held;
                    flush_rounds += 1;
                    self.counts.flush_rounds += 1;
                    self.trace(|_| {
                        format!("quiet, but the relay holds {held} frames: reconnecting")
                    });
                    self.reconnect_all();
                    continue;
                }
                if self.honest() && self.probes.is_none() {
                    self.probes = Some(Vec::new());
                    for round in 0..PRIORITIES.len() {
                        self.schedule(round as Millis * PROBE_GAP, Ev::Probe { round });
                    }
                    let after = PRIORITIES.len() as Millis * PROBE_GAP;
                    for (round, (p, g)) in self.group_probes().into_iter().enumerate() {
                        let at = after + round as Millis * PROBE_GAP;
                        self.schedule(at, Ev::GroupProbe { peer: p, group: g });
                    }
                    continue;
                }
                break;
            };
            if self.honest() && next > self.deadline {
                violated(format!(
                    "not quiet {} s into the honest phase: {}",
                    (next - EPOCH) / SEC,
                    self.pending_work()
                ));
            }
            self.now = self.now.max(next);
            if let Some(entry) = self.queue.first_entry() {
                if entry.key().0 <= self.now {
                    let ev = entry.remove();
                    self.handle(ev);
                    continue;
                }
            }
            if let Some(p) = self.due_peer() {
                self.step(p);
            }
        }
        self.final_checks();
        self.counts.max_relay_journal = self.relay.counts.max_journal;
        self.counts.group_relay_broadcasts = self.relay.counts.broadcasts;
        self.counts.group_relay_dedup = self.relay.counts.broadcast_dedup;
        Summary {
            digest: self.digest,
            virtual_ms: self.now - EPOCH,
            peers: self.peers.len(),
            mailbox: self.scn.mailbox.is_some(),
            counts: self.counts,
        }
    }

    /// The chaos is over: no fault is injected any more.
    fn honest(&self) -> bool {
        self.honest_since.is_some()
    }

    // ---- the clock ----------------------------------------------------------------------

    fn schedule(&mut self, after: Millis, ev: Ev) {
        self.qseq += 1;
        self.queue.insert((self.now + after, self.qseq), ev);
        self.counts.max_in_flight = self.counts.max_in_flight.max(self.queue.len());
        if self.queue.len() > 200_000 {
            violated("over 200 000 frames and timers in flight: a feedback loop".into());
        }
    }

    fn next_time(&self) -> Option<Millis> {
        let queued = self.queue.keys().next().map(|(at, _)| *at);
        let peers = self.peers.iter().filter_map(|p| {
            let run = p.run.as_ref()?;
            [run.step_at, run.engine.next_deadline()]
                .into_iter()
                .flatten()
                .min()
        });
        queued.into_iter().chain(peers).min()
    }

    fn due_peer(&self) -> Option<usize> {
        let now = self.now;
        self.peers.iter().position(|p| {
            p.run.as_ref().is_some_and(|run| {
                run.step_at.is_some_and(|t| t <= now)
                    || run.engine.next_deadline().is_some_and(|t| t <= now)
            })
        })
    }

    fn chaos_gap(&mut self) -> Millis {
        self.rng.range(1, 2 * self.scn.chaos_gap_ms)
    }

    fn mix(&mut self, values: &[u64]) {
        for v in values {
            self.digest ^= v;
            self.digest = self.digest.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn trace(&self, line: impl FnOnce(&Self) -> String) {
        if self.verbose {
            let line = self.scn.shorten(&line(self));
            println!("{:>9.3} {line}", (self.now - EPOCH) as f64 / 1000.0);
        }
    }

    // ---- events -------------------------------------------------------------------------

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::GroupToRelay { conn, frame } => {
                if self.relay.up {
                    self.relay_group_frame(conn, frame);
                }
            }
            Ev::ToRelay { conn, frame } => {
                if self.relay.up {
                    // What a refusal of this frame would cost: (frame id, what, whose, of what).
                    let stake = match &frame {
                        ToRelay::Send { message, .. } => {
                            let id = message.id.clone();
                            match self.ledger.ack_for(message) {
                                Some(acked) => Some((
                                    id,
                                    Refused::Ack,
                                    message.recipient.clone(),
                                    acked.to_owned(),
                                )),
                                None => is_welcome(message).then(|| {
                                    let to = message.recipient.clone();
                                    (id, Refused::Welcome, message.sender.clone(), to)
                                }),
                            }
                        }
                        _ => None,
                    };
                    let writes = self.relay.receive(conn, frame, self.now);
                    if let Some((id, what, sender, of)) = stake {
                        let refused = writes.iter().any(|(_, w)| {
                            matches!(w, ToClient::Unreachable { message_id, .. } if *message_id == id)
                        });
                        if refused {
                            self.ledger.on_refused(what, &sender, &of, self.now);
                        }
                    }
                    self.relay_writes(writes);
                }
            }
            Ev::ToClient { peer, conn, frame } => self.client_frame(peer, conn, frame),
            Ev::Local { from, to, message } => {
                if self.link_active(from, to) {
                    self.counts.local_frames += 1;
                    let origin = InboundOrigin {
                        carrier: Carrier::Local(BLE.to_owned()),
                        stamped_sender: self.peers[from].name().to_owned(),
                        sender_account: None,
                        seq: None,
                        sealed_by: None,
                    };
                    let now = self.now;
                    self.peers[to].push(Input::Inbound { message, origin }, now);
                }
            }
            Ev::HookDone {
                peer,
                inc,
                batch_id,
                ok,
            } => {
                if self.peers[peer].incarnation == inc {
                    let result = if ok {
                        Ok(())
                    } else {
                        Err("the application refused the batch".to_owned())
                    };
                    let now = self.now;
                    self.peers[peer].push(Input::HookResult { batch_id, result }, now);
                }
            }
            Ev::Crash { peer, inc } => {
                if !self.honest() && self.peers[peer].incarnation == inc {
                    self.crash(peer);
                }
            }
            Ev::Restart { peer } => self.restart(peer),
            Ev::Connect { peer, inc } => self.connect(peer, inc),
            Ev::WriteAckTimeout {
                peer,
                inc,
                conn,
                id,
                send_seq,
            } => {
                if self.peers[peer].incarnation != inc {
                    return;
                }
                let answered = self.peers[peer]
                    .run
                    .as_mut()
                    .and_then(|run| run.session.as_mut())
                    .is_none_or(|s| {
                        s.conn != conn || !s.unanswered.remove(&(id.clone(), send_seq))
                    });
                if !answered {
                    self.send_failed(peer, id, send_seq, "no relay answer within 15 s");
                }
            }
            Ev::RelayUp => {
                self.relay.up = true;
                self.trace(|_| "relay up".into());
            }
            Ev::Chaos => self.chaos(),
            Ev::Probe { round } => self.probe(round),
            Ev::GroupReport {
                conn,
                peer,
                restarts,
                report,
            } => self.group_report_due(conn, peer, restarts, report),
            Ev::GroupSync { group } => self.group_sync(group),
            Ev::GroupProbe { peer, group } => self.app_group_send(peer, group, true),
        }
    }
}
