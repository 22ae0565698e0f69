//! The world: devices, the relay, the network between them and the virtual clock, driven by a
//! seeded scheduler. A run has two phases. In the *chaos* phase the scheduler injects faults
//! between ordinary traffic; then the world turns *honest* (no faults, every device up, every
//! hook committing) and runs until nothing is pending, and the ledger's end-of-run invariants
//! are checked.
//!
//! Each device's process is modelled as `courier-client`'s driver runs it: commands queue up
//! and one step applies them all, then commits the step's store ops in one batch, then resolves
//! the sends, dispatches the events, executes the transmits, dispatches what follows a hook
//! verdict, and hands the next batch to the durability hook. A crash can hit between any two of
//! these; the restarted process is rebuilt only from what the store committed.
//!
//! Relay connections are ordered (WebSocket over TCP): frames on one connection keep their
//! order, though the scheduler may lose or duplicate a frame (a lossy middlebox) and delay
//! spikes hold back the frames behind them. Local carriers are datagram-like: frames are lost,
//! duplicated and reordered freely.

use std::collections::{BTreeMap, BTreeSet};

use courier_engine::{
    Carrier, Engine, Event, FailReason, InboundKey, InboundOrigin, Millis, RelayAnswer,
    SendOutcome, SendRequest, Settlement, StoreOp, Transmit, TransmitKind,
};
use courier_proto::{ContentType, Message, Priority};

use crate::ledger::{violated, Ledger};
use crate::peer::{App, Cmd, CrashPoint, Peer, Running, Session};
use crate::relay::{ConnId, Relay, ToClient, ToRelay, Writes};
use crate::rng::Rng;
use crate::scenario::{LinkFaults, Scenario, BLE, GHOST, HOUR, POISON, SEC};
use crate::store::{key_of, Store};

/// The virtual clock starts here (a plausible epoch time, so timestamps look like real ones).
pub const EPOCH: Millis = 1_700_000_000_000;
/// The client's write-ack timeout (`relay-protocol.md` §6).
const WRITE_ACK_TIMEOUT: Millis = 15 * SEC;
const MAX_BACKOFF: Millis = 30 * SEC;
/// Steps of one device at one instant beyond which its engine is taken to spin.
const SPIN_LIMIT: u32 = 5000;
/// Reconnect rounds the honest phase may spend on frames the relay still holds. A message
/// refused over a full durability buffer is redelivered only on the next connection (by
/// design), so a backlog larger than the buffer takes several; each round must release some.
const FLUSH_ROUNDS: u32 = 500;

/// What the scheduler can do between two ordinary moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Send,
    /// Send again under an app-chosen id already used.
    Resend,
    Disconnect,
    RelayRestart,
    Crash,
    CrashInStep,
    BleRange,
    BleToggle,
    Idle,
}

impl Action {
    pub const ALL: [Action; 9] = [
        Self::Send,
        Self::Resend,
        Self::Disconnect,
        Self::RelayRestart,
        Self::Crash,
        Self::CrashInStep,
        Self::BleRange,
        Self::BleToggle,
        Self::Idle,
    ];

    /// A seed's mix of actions, in the order of `ALL`.
    pub fn weights(rng: &mut Rng) -> Vec<u32> {
        let mut draw = |lo: u64, hi: u64| rng.range(lo, hi) as u32;
        vec![
            draw(30, 60),
            draw(0, 6),
            draw(2, 10),
            draw(0, 4),
            draw(0, 6),
            draw(0, 10),
            draw(3, 12),
            draw(0, 2),
            draw(5, 30),
        ]
    }
}

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
    /// Terminal events a crash swallowed between the settlement's commit and its dispatch.
    pub terminal_lost: u64,
    /// Messages processed without a hook whose `message_received` a crash swallowed (the
    /// documented at-most-once of the default path), of those the sender saw delivered.
    pub at_most_once_losses: u64,
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
}

/// What one driver step owes once its writes are committed.
#[derive(Default)]
struct StepOut {
    accepted: Vec<String>,
    events: Vec<Event>,
    /// Events that follow the transmits (a hook verdict's `message_received`s and what came
    /// with them).
    after: Vec<Event>,
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
    honest: bool,
    /// The honest phase must be quiet by then.
    deadline: Millis,
    chaos_left: u32,
    in_range: BTreeSet<(usize, usize)>,
    conn_owner: BTreeMap<ConnId, usize>,
    /// Ordered links: the arrival time of the last frame per (connection, towards the relay).
    fifo: BTreeMap<(ConnId, bool), Millis>,
    next_id: u64,
    verbose: bool,
    digest: u64,
}

impl World {
    pub fn new(seed: u64, actions: Option<u32>, verbose: bool) -> Self {
        let mut rng = Rng::new(seed);
        let scn = Scenario::generate(&mut rng, actions);
        let relay = Relay::new(scn.mailbox, scn.peers.iter().map(|p| p.name.clone()));
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
            honest: false,
            deadline: Millis::MAX,
            in_range,
            conn_owner: BTreeMap::new(),
            fifo: BTreeMap::new(),
            next_id: 0,
            verbose,
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
                    p.name(),
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
        format!(
            "peers {} | mailbox {:?} | ble {:?} | {} actions",
            peers.join(" "),
            self.scn.mailbox.map(|m| m.max_messages),
            self.scn.ble_pairs,
            self.scn.chaos_actions
        )
    }

    pub fn run(mut self) -> Summary {
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
                if self.honest && held > 0 && held < held_before && flush_rounds < FLUSH_ROUNDS {
                    held_before = held;
                    flush_rounds += 1;
                    self.counts.flush_rounds += 1;
                    self.trace(|_| {
                        format!("quiet, but the relay holds {held} frames: reconnecting")
                    });
                    self.reconnect_all();
                    continue;
                }
                break;
            };
            if self.honest && next > self.deadline {
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
        Summary {
            digest: self.digest,
            virtual_ms: self.now - EPOCH,
            peers: self.peers.len(),
            mailbox: self.scn.mailbox.is_some(),
            counts: self.counts,
        }
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
            [
                run.step_at,
                run.engine.next_deadline(),
                run.hook.map(|(_, deadline)| deadline),
            ]
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
                    || run.hook.is_some_and(|(_, t)| t <= now)
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
            println!("{:>9.3} {}", (self.now - EPOCH) as f64 / 1000.0, line(self));
        }
    }

    // ---- events -------------------------------------------------------------------------

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::ToRelay { conn, frame } => {
                if self.relay.up {
                    let writes = self.relay.receive(conn, frame, self.now);
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
                    };
                    let now = self.now;
                    self.peers[to].push(Cmd::Inbound { message, origin }, now);
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
                    self.peers[peer].push(Cmd::HookResult { batch_id, result }, now);
                }
            }
            Ev::Crash { peer, inc } => {
                if !self.honest && self.peers[peer].incarnation == inc {
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
                let now = self.now;
                let p = &mut self.peers[peer];
                let answered = p
                    .run
                    .as_mut()
                    .and_then(|run| run.session.as_mut())
                    .is_none_or(|s| {
                        s.conn != conn || !s.unanswered.remove(&(id.clone(), send_seq))
                    });
                if !answered {
                    let reason = "no relay answer within 15 s";
                    p.push(
                        Cmd::SendFailed {
                            id,
                            send_seq,
                            reason,
                        },
                        now,
                    );
                }
            }
            Ev::RelayUp => {
                self.relay.up = true;
                self.trace(|_| "relay up".into());
            }
            Ev::Chaos => self.chaos(),
        }
    }

    fn chaos(&mut self) {
        if self.honest {
            return;
        }
        if self.chaos_left == 0 {
            self.turn_honest();
            return;
        }
        self.chaos_left -= 1;
        let action = Action::ALL[self.rng.weighted(&self.scn.weights)];
        let running: Vec<usize> = (0..self.peers.len())
            .filter(|&p| self.peers[p].run.is_some())
            .collect();
        let some = (!running.is_empty()).then(|| *self.rng.pick(&running));
        match (action, some) {
            (Action::Send, Some(p)) => self.app_send(p),
            (Action::Resend, Some(p)) => self.app_resend(p),
            (Action::Disconnect, Some(p))
                if self.peers[p]
                    .run
                    .as_ref()
                    .is_some_and(|r| r.session.is_some()) =>
            {
                self.counts.disconnects += 1;
                self.trace(|w| format!("{} disconnected", w.peers[p].name()));
                self.drop_session(p, true);
            }
            (Action::RelayRestart, _) if self.relay.up => {
                self.counts.relay_restarts += 1;
                self.trace(|_| "relay crashes".into());
                for conn in self.relay.crash() {
                    if let Some(owner) = self.conn_owner.get(&conn).copied() {
                        self.drop_session(owner, false);
                    }
                }
                let down = self.rng.range(100, 20 * SEC);
                self.schedule(down, Ev::RelayUp);
            }
            (Action::Crash, Some(p)) => self.crash(p),
            (Action::CrashInStep, Some(p)) => {
                let point = *self.rng.pick(&CrashPoint::ALL);
                if let Some(run) = self.peers[p].run.as_mut() {
                    run.crash_at = Some(point);
                }
            }
            (Action::BleRange, _) if !self.scn.ble_pairs.is_empty() => {
                let pair = *self.rng.pick(&self.scn.ble_pairs);
                if !self.in_range.remove(&pair) {
                    self.in_range.insert(pair);
                }
                self.trace(|w| format!("ble {pair:?} in range: {}", w.in_range.contains(&pair)));
                self.sync_links();
            }
            (Action::BleToggle, Some(p)) if self.peers[p].has_ble => {
                let now = self.now;
                let peer = &mut self.peers[p];
                let run = peer.run.as_mut().expect("running");
                let carrier = Carrier::Local(BLE.to_owned());
                if run.ble {
                    run.ble = false;
                    run.neighbors.clear();
                    peer.push(Cmd::CarrierDown(carrier), now);
                } else {
                    run.ble = true;
                    peer.push(Cmd::CarrierUp(carrier), now);
                }
                self.sync_links();
            }
            _ => {}
        }
        let gap = self.chaos_gap();
        self.schedule(gap, Ev::Chaos);
    }

    fn app_send(&mut self, p: usize) {
        let others: Vec<usize> = (0..self.peers.len()).filter(|&q| q != p).collect();
        let recipient = if self.rng.chance(30) {
            GHOST.to_owned()
        } else {
            self.peers[*self.rng.pick(&others)].name().to_owned()
        };
        let content_type = if self.rng.chance(100) {
            ContentType::FileChunk
        } else {
            ContentType::Text
        };
        let priority = *self.rng.pick(&[
            Priority::Low,
            Priority::Medium,
            Priority::High,
            Priority::Critical,
        ]);
        let id = self.rng.chance(500).then(|| {
            self.next_id += 1;
            format!("{}-c{}", self.peers[p].name(), self.next_id)
        });
        let len = self.rng.range(1, 120) as usize;
        let content = if self.rng.chance(20) {
            POISON.to_owned()
        } else {
            "x".repeat(len)
        };
        let req = SendRequest {
            id: id.clone(),
            recipient,
            content,
            content_type,
            priority,
            metadata: BTreeMap::new(),
            binary_content: None,
        };
        self.counts.sends += 1;
        self.trace(|w| {
            format!(
                "{} app sends {:?} to {}",
                w.peers[p].name(),
                id,
                req.recipient
            )
        });
        let now = self.now;
        let peer = &mut self.peers[p];
        if let Some(id) = id {
            peer.app.owed.insert(id, req.clone());
        }
        peer.push(Cmd::Send(req), now);
    }

    /// The app sends again under one of its own ids: a no-op while the message is in the
    /// outbox or once it was delivered, a new message after it failed.
    fn app_resend(&mut self, p: usize) {
        let name = self.peers[p].name().to_owned();
        let mine: Vec<(String, String)> = self
            .ledger
            .outbound
            .iter()
            .filter(|((sender, id), rec)| *sender == name && id.contains("-c") && rec.resolved)
            .map(|((_, id), rec)| (id.clone(), rec.recipient.clone()))
            .collect();
        if mine.is_empty() {
            return;
        }
        let (id, recipient) = self.rng.pick(&mine).clone();
        let req = SendRequest {
            id: Some(id.clone()),
            recipient,
            content: "again".to_owned(),
            content_type: ContentType::Text,
            priority: Priority::Medium,
            metadata: BTreeMap::new(),
            binary_content: None,
        };
        self.trace(|_| format!("{name} app sends {id} again"));
        let now = self.now;
        let peer = &mut self.peers[p];
        peer.app.owed.insert(id, req.clone());
        peer.push(Cmd::Send(req), now);
    }

    // ---- processes ----------------------------------------------------------------------

    /// Starts the device's process from its store (also the first start, from an empty one).
    fn restart(&mut self, p: usize) {
        if self.peers[p].run.is_some() {
            return;
        }
        let now = self.now;
        let peer = &mut self.peers[p];
        let config = peer.spec.config.clone();
        let mut engine = Engine::new(config.clone(), peer.spec.name.clone());
        let processed =
            peer.store
                .load_processed(now, config.dedup_retention_ms(), config.dedup_max_entries);
        engine.restore(peer.store.load_outbox(), processed, now);
        engine.restore_inbound(peer.store.load_pending(), now);
        let mut run = Running {
            engine,
            inbox: Vec::new(),
            step_at: Some(now),
            hook: None,
            session: None,
            connecting: false,
            backoff_ms: SEC,
            ble: false,
            neighbors: BTreeSet::new(),
            crash_at: None,
            steps_at: (now, 0),
        };
        if peer.has_ble {
            run.ble = true;
            run.inbox
                .push(Cmd::CarrierUp(Carrier::Local(BLE.to_owned())));
        }
        peer.run = Some(run);
        let owed: Vec<SendRequest> = peer.app.owed.values().cloned().collect();
        for req in owed {
            if self.honest || self.rng.chance(700) {
                self.peers[p].push(Cmd::Send(req), now);
            } else if let Some(id) = &req.id {
                self.peers[p].app.owed.remove(id);
            }
        }
        self.trace(|w| format!("{} starts", w.peers[p].name()));
        self.sync_links();
        let delay = self.rng.range(0, 300);
        self.schedule_connect(p, delay);
    }

    fn crash(&mut self, p: usize) {
        let Some(run) = self.peers[p].run.take() else {
            return;
        };
        self.peers[p].incarnation += 1;
        self.counts.crashes += 1;
        self.trace(|w| format!("{} crashes", w.peers[p].name()));
        if let Some(session) = run.session {
            self.conn_owner.remove(&session.conn);
            if self.relay.is_open(session.conn) {
                let writes = self.relay.disconnect(session.conn);
                self.relay_writes(writes);
            }
        }
        self.sync_links();
        if self.honest {
            self.restart(p);
        } else {
            let down = self.rng.range(50, 60 * SEC);
            self.schedule(down, Ev::Restart { peer: p });
        }
    }

    fn turn_honest(&mut self) {
        self.honest = true;
        self.trace(|_| "the world turns honest".into());
        self.relay.up = true;
        for p in 0..self.peers.len() {
            self.restart(p);
            let now = self.now;
            let peer = &mut self.peers[p];
            let run = peer.run.as_mut().expect("restarted");
            run.crash_at = None;
            if peer.has_ble && !run.ble {
                run.ble = true;
                peer.push(Cmd::CarrierUp(Carrier::Local(BLE.to_owned())), now);
            }
        }
        self.sync_links();
        self.reconnect_all();
        let longest = self
            .peers
            .iter()
            .map(|p| {
                let c = &p.spec.config;
                let retention = c.durable_inbound.as_ref().map_or(0, |d| d.retention_ms);
                c.absolute_lifetime_ms().max(retention.min(HOUR))
            })
            .max()
            .unwrap_or(0);
        self.deadline = self.now + longest + 2 * HOUR;
    }

    /// Every connection is cut and made again: what a frame lost on a connection left
    /// behind is redelivered on the next one.
    fn reconnect_all(&mut self) {
        for p in 0..self.peers.len() {
            if let Some(run) = self.peers[p].run.as_mut() {
                run.backoff_ms = SEC;
                if run.session.is_some() {
                    self.drop_session(p, true);
                }
            }
        }
    }

    // ---- relay connections --------------------------------------------------------------

    fn schedule_connect(&mut self, p: usize, delay: Millis) {
        let inc = self.peers[p].incarnation;
        let Some(run) = self.peers[p].run.as_mut() else {
            return;
        };
        if run.connecting || run.session.is_some() {
            return;
        }
        run.connecting = true;
        self.schedule(delay, Ev::Connect { peer: p, inc });
    }

    fn connect(&mut self, p: usize, inc: u64) {
        if self.peers[p].incarnation != inc {
            return;
        }
        let Some(run) = self.peers[p].run.as_mut() else {
            return;
        };
        run.connecting = false;
        if run.session.is_some() {
            return;
        }
        if !self.relay.up {
            let backoff = run.backoff_ms;
            run.backoff_ms = (backoff * 2).min(MAX_BACKOFF);
            let jitter = self.rng.range(0, backoff / 4);
            self.schedule_connect(p, backoff + jitter);
            return;
        }
        let name = self.peers[p].name().to_owned();
        let (conn, displaced, writes) = self.relay.accept(&name, self.now);
        if let Some(old) = displaced {
            if let Some(owner) = self.conn_owner.get(&old).copied() {
                self.drop_session(owner, false);
            }
        }
        self.conn_owner.insert(conn, p);
        if let Some(run) = self.peers[p].run.as_mut() {
            run.session = Some(Session {
                conn,
                authenticated: false,
                unanswered: BTreeSet::new(),
            });
        }
        self.trace(|_| format!("{name} connects as conn {conn}"));
        self.relay_writes(writes);
    }

    /// The client loses its connection: the carrier goes down, unanswered sends fail, and it
    /// reconnects with backoff. `tell_relay`: the relay sees the connection end too.
    fn drop_session(&mut self, p: usize, tell_relay: bool) {
        let now = self.now;
        let Some(run) = self.peers[p].run.as_mut() else {
            return;
        };
        let Some(session) = run.session.take() else {
            return;
        };
        let backoff = run.backoff_ms;
        run.backoff_ms = (backoff * 2).min(MAX_BACKOFF);
        self.conn_owner.remove(&session.conn);
        let peer = &mut self.peers[p];
        if session.authenticated {
            peer.push(Cmd::CarrierDown(Carrier::Internet), now);
        }
        for (id, send_seq) in session.unanswered {
            let reason = "connection lost";
            peer.push(
                Cmd::SendFailed {
                    id,
                    send_seq,
                    reason,
                },
                now,
            );
        }
        if tell_relay && self.relay.is_open(session.conn) {
            let writes = self.relay.disconnect(session.conn);
            self.relay_writes(writes);
        }
        let delay = if self.honest {
            self.rng.range(0, 200)
        } else {
            backoff + self.rng.range(0, backoff / 4)
        };
        self.schedule_connect(p, delay);
    }

    /// Arrival times of one frame's copies (none when lost).
    fn link_delays(&mut self, faults: LinkFaults, exempt: bool) -> Vec<Millis> {
        let base = self.rng.range(faults.latency.0, faults.latency.1);
        if self.honest || exempt {
            return vec![base];
        }
        if self.rng.chance(faults.loss) {
            self.counts.frames_lost += 1;
            return Vec::new();
        }
        let mut delay = base;
        if self.rng.chance(faults.spike) {
            delay += self.rng.range(0, faults.spike_ms);
        }
        let mut delays = vec![delay];
        if self.rng.chance(faults.duplicate) {
            self.counts.frames_duplicated += 1;
            delays.push(delay + self.rng.range(0, 500));
        }
        delays
    }

    fn ordered(&mut self, conn: ConnId, to_relay: bool, exempt: bool, ev: Ev) {
        let delays = self.link_delays(self.scn.relay_link, exempt);
        for delay in delays {
            let last = self.fifo.entry((conn, to_relay)).or_insert(0);
            let at = (self.now + delay).max(*last);
            *last = at;
            self.schedule(at - self.now, ev.clone());
        }
    }

    fn send_to_relay(&mut self, conn: ConnId, frame: ToRelay) {
        self.ordered(conn, true, false, Ev::ToRelay { conn, frame });
    }

    fn relay_writes(&mut self, writes: Writes) {
        for (conn, frame) in writes {
            let Some(owner) = self.conn_owner.get(&conn).copied() else {
                continue;
            };
            if let ToClient::Received {
                seq: Some(seq),
                message,
                ..
            } = &frame
            {
                let account = self.peers[owner].name().to_owned();
                self.ledger.note_seq(&account, *seq, message);
            }
            let exempt = matches!(frame, ToClient::Authenticated { .. });
            self.ordered(
                conn,
                false,
                exempt,
                Ev::ToClient {
                    peer: owner,
                    conn,
                    frame,
                },
            );
        }
    }

    /// A relay frame reaches the client's relay task, which turns it into driver commands.
    fn client_frame(&mut self, p: usize, conn: ConnId, frame: ToClient) {
        let now = self.now;
        let peer = &mut self.peers[p];
        let Some(run) = peer.run.as_mut() else {
            return;
        };
        let Some(session) = run.session.as_mut().filter(|s| s.conn == conn) else {
            return;
        };
        let mut cmds = Vec::new();
        let mut watch = None;
        match frame {
            ToClient::Authenticated { mailbox } => {
                session.authenticated = true;
                run.backoff_ms = SEC;
                if mailbox {
                    cmds.push(Cmd::DrainStarted);
                }
                cmds.push(Cmd::CarrierUp(Carrier::Internet));
                let list = run.engine.presence_watchlist();
                if !list.is_empty() {
                    watch = Some(list);
                }
            }
            ToClient::Received {
                seq,
                sender,
                message,
            } => cmds.push(Cmd::Inbound {
                message,
                origin: InboundOrigin {
                    carrier: Carrier::Internet,
                    stamped_sender: sender.clone(),
                    sender_account: Some(sender),
                    seq,
                },
            }),
            ToClient::Sent {
                message_id,
                tag: Some(send_seq),
                stored,
            } => {
                if session.unanswered.remove(&(message_id.clone(), send_seq)) {
                    let answer = if stored {
                        RelayAnswer::Stored
                    } else {
                        RelayAnswer::Live
                    };
                    cmds.push(Cmd::RelayAnswer {
                        id: message_id,
                        send_seq,
                        answer,
                    });
                }
            }
            ToClient::Unreachable {
                message_id,
                tag: Some(send_seq),
            } => {
                if session.unanswered.remove(&(message_id.clone(), send_seq)) {
                    cmds.push(Cmd::RelayAnswer {
                        id: message_id,
                        send_seq,
                        answer: RelayAnswer::Unreachable,
                    });
                }
            }
            ToClient::Sent { tag: None, .. } | ToClient::Unreachable { tag: None, .. } => {}
            ToClient::DrainComplete { count } => cmds.push(Cmd::DrainComplete { count }),
            ToClient::Presence { peer, online } => cmds.push(Cmd::Presence { peer, online }),
        }
        for cmd in cmds {
            peer.push(cmd, now);
        }
        if let Some(list) = watch {
            self.send_to_relay(conn, ToRelay::Watch(list));
        }
    }

    // ---- local carrier ------------------------------------------------------------------

    fn link_active(&self, a: usize, b: usize) -> bool {
        let pair = (a.min(b), a.max(b));
        let up = |p: usize| self.peers[p].run.as_ref().is_some_and(|r| r.ble);
        self.in_range.contains(&pair) && up(a) && up(b)
    }

    /// Reports every change of the active links to the devices on both ends.
    fn sync_links(&mut self) {
        let now = self.now;
        for (a, b) in self.scn.ble_pairs.clone() {
            let active = self.link_active(a, b);
            for (x, y) in [(a, b), (b, a)] {
                let name = self.peers[y].name().to_owned();
                let peer = &mut self.peers[x];
                let Some(run) = peer.run.as_mut() else {
                    continue;
                };
                let known = run.neighbors.contains(&y);
                if active && !known {
                    run.neighbors.insert(y);
                    peer.push(Cmd::NeighborDiscovered(name), now);
                } else if !active && known {
                    run.neighbors.remove(&y);
                    peer.push(Cmd::NeighborLost(name), now);
                }
            }
        }
    }

    fn send_local(&mut self, from: usize, to: usize, message: Message) {
        for delay in self.link_delays(self.scn.local_link, false) {
            let message = Box::new(message.clone());
            self.schedule(delay, Ev::Local { from, to, message });
        }
    }

    // ---- the driver step ----------------------------------------------------------------

    fn step(&mut self, p: usize) {
        let now = self.now;
        let peer = &mut self.peers[p];
        let run = peer.run.as_mut().expect("a due peer runs");
        if run.steps_at.0 == now {
            run.steps_at.1 += 1;
            if run.steps_at.1 > SPIN_LIMIT {
                violated(format!(
                    "{} steps over {SPIN_LIMIT} times at one instant: the engine spins (next deadline {:?})",
                    peer.spec.name,
                    run.engine.next_deadline().map(|d| d as i64 - now as i64)
                ));
            }
        } else {
            run.steps_at = (now, 1);
        }
        run.step_at = None;
        let crash = run.crash_at.take();
        let cmds = std::mem::take(&mut run.inbox);
        self.counts.steps += 1;
        let mut out = StepOut::default();
        for cmd in cmds {
            self.apply(p, cmd, &mut out);
        }
        let run = self.peers[p].run.as_mut().expect("running");
        if let Some((batch, deadline)) = run.hook {
            if deadline <= now {
                run.hook = None;
                let reason = "the hook did not settle in time".to_owned();
                self.hook_result(p, batch, Err(reason), &mut out);
            }
        }
        let run = self.peers[p].run.as_mut().expect("running");
        run.engine.handle_timeout(now);
        while let Some(event) = run.engine.poll_event() {
            out.events.push(event);
        }
        if crash == Some(CrashPoint::BeforeCommit) {
            return self.crash_in_step(p, CrashPoint::BeforeCommit, out);
        }
        let ops: Vec<StoreOp> = std::iter::from_fn(|| run.engine.poll_store()).collect();
        self.commit(p, &ops);
        if crash == Some(CrashPoint::AfterCommit) {
            return self.crash_in_step(p, CrashPoint::AfterCommit, out);
        }
        let name = self.peers[p].name().to_owned();
        for id in std::mem::take(&mut out.accepted) {
            let store = &self.peers[p].store;
            let durable = store.outbox.contains_key(&id) || store.settled.contains_key(&id);
            self.ledger.on_resolved(&name, &id, durable);
            self.peers[p].app.owed.remove(&id);
            self.counts.accepted += 1;
        }
        if crash == Some(CrashPoint::AfterResolve) {
            return self.crash_in_step(p, CrashPoint::AfterResolve, out);
        }
        let events = std::mem::take(&mut out.events);
        let event_count = events.len();
        for event in events {
            self.dispatch(p, event);
        }
        if crash == Some(CrashPoint::AfterEvents) {
            return self.crash_in_step(p, CrashPoint::AfterEvents, out);
        }
        let run = self.peers[p].run.as_mut().expect("running");
        let transmits: Vec<Transmit> = std::iter::from_fn(|| run.engine.poll_transmit()).collect();
        self.counts.max_transmits_per_step =
            self.counts.max_transmits_per_step.max(transmits.len());
        self.mix(&[
            p as u64,
            now,
            ops.len() as u64,
            event_count as u64,
            transmits.len() as u64,
        ]);
        let cut = if crash == Some(CrashPoint::MidTransmits) {
            self.rng.index(transmits.len() + 1)
        } else {
            usize::MAX
        };
        for (i, transmit) in transmits.into_iter().enumerate() {
            if i == cut {
                return self.crash_in_step(p, CrashPoint::MidTransmits, out);
            }
            self.transmit(p, transmit);
        }
        if matches!(
            crash,
            Some(CrashPoint::MidTransmits | CrashPoint::AfterTransmits)
        ) {
            return self.crash_in_step(p, crash.expect("matched"), out);
        }
        for event in std::mem::take(&mut out.after) {
            self.dispatch(p, event);
        }
        self.offer_hook(p);
        self.presence_changes(p);
        self.check_bounds(p);
    }

    /// The process dies at `point` of a step: what the step had not dispatched yet is lost
    /// (after the commit, the store already holds its effects).
    fn crash_in_step(&mut self, p: usize, point: CrashPoint, out: StepOut) {
        self.counts.step_crashes[point as usize] += 1;
        self.trace(|w| format!("{} crashes inside a step, {point:?}", w.peers[p].name()));
        if point != CrashPoint::BeforeCommit {
            let name = self.peers[p].name().to_owned();
            for event in out.events.iter().chain(&out.after) {
                match event {
                    Event::MessageDelivered { message_id, .. }
                    | Event::MessageFailed { message_id, .. } => {
                        self.ledger.on_terminal_lost(&name, message_id);
                    }
                    Event::MessageReceived {
                        message,
                        chat,
                        sender,
                        ..
                    } => {
                        let key = InboundKey {
                            chat: chat.clone(),
                            sender: sender.clone(),
                            message_id: message.id.clone(),
                        };
                        self.ledger.on_received_lost(&name, &key);
                    }
                    _ => {}
                }
            }
        }
        self.crash(p);
    }

    fn apply(&mut self, p: usize, cmd: Cmd, out: &mut StepOut) {
        let now = self.now;
        self.next_id += 1;
        let minted = format!("{}-m{}", self.peers[p].name(), self.next_id);
        if self.verbose {
            let line = format!("{} <- {}", self.peers[p].name(), describe_cmd(&cmd));
            self.trace(|_| line);
        }
        let peer = &mut self.peers[p];
        let run = peer.run.as_mut().expect("running");
        let engine = &mut run.engine;
        match cmd {
            Cmd::Send(req) => {
                let delivered = req
                    .id
                    .as_ref()
                    .filter(|id| peer.store.settled.get(*id) == Some(&Settlement::Delivered));
                if let Some(id) = delivered {
                    // An id already delivered is a no-op returning that id (delivery.md 2).
                    out.accepted.push(id.clone());
                } else {
                    match engine.send(req, || minted, now) {
                        SendOutcome::Accepted(id) | SendOutcome::Duplicate(id) => {
                            out.accepted.push(id)
                        }
                    }
                }
            }
            Cmd::CarrierUp(carrier) => engine.handle_carrier_up(carrier, now),
            Cmd::CarrierDown(carrier) => engine.handle_carrier_down(carrier, now),
            Cmd::Written { id, send_seq } => engine.handle_written(&id, send_seq, now),
            Cmd::SendFailed {
                id,
                send_seq,
                reason,
            } => engine.handle_send_failed(&id, send_seq, reason, now),
            Cmd::RelayAnswer {
                id,
                send_seq,
                answer,
            } => engine.handle_relay_answer(&id, send_seq, answer, now),
            Cmd::Inbound { message, origin } => engine.handle_inbound(*message, origin, now),
            Cmd::DrainStarted => engine.handle_drain_started(Carrier::Internet, now),
            Cmd::DrainComplete { count } => {
                engine.handle_drain_complete(Carrier::Internet, count, now)
            }
            Cmd::HookResult { batch_id, result } => {
                if run.hook.is_some_and(|(id, _)| id == batch_id) {
                    run.hook = None;
                }
                self.hook_result(p, batch_id, result, out);
            }
            Cmd::Presence { peer, online } => engine.handle_presence(&peer, online, now),
            Cmd::NeighborDiscovered(peer) => {
                engine.handle_neighbor_discovered(&peer, Carrier::Local(BLE.to_owned()), now)
            }
            Cmd::NeighborLost(peer) => {
                engine.handle_neighbor_lost(&peer, Carrier::Local(BLE.to_owned()), now)
            }
        }
        let run = self.peers[p].run.as_mut().expect("running");
        while let Some(event) = run.engine.poll_event() {
            out.events.push(event);
        }
    }

    /// The hook's verdict: what the engine reports with it follows the step's transmits.
    fn hook_result(
        &mut self,
        p: usize,
        batch_id: u64,
        result: Result<(), String>,
        out: &mut StepOut,
    ) {
        let now = self.now;
        let run = self.peers[p].run.as_mut().expect("running");
        while let Some(event) = run.engine.poll_event() {
            out.events.push(event);
        }
        for m in run.engine.handle_hook_result(batch_id, result, now) {
            out.after.push(Event::MessageReceived {
                chat: m.key.chat,
                sender: m.key.sender,
                transport: m.transport,
                message: m.message,
            });
        }
        while let Some(event) = run.engine.poll_event() {
            out.after.push(event);
        }
    }

    /// Checks the step's ops against the ledger, then applies them to the store.
    fn commit(&mut self, p: usize, ops: &[StoreOp]) {
        let name = self.peers[p].name().to_owned();
        let mut put_now = BTreeSet::new();
        for op in ops {
            match op {
                StoreOp::Put(record) => {
                    self.ledger
                        .on_put(&name, &record.message.id, &record.message.recipient);
                    put_now.insert(record.message.id.clone());
                }
                StoreOp::Settle { id, settlement, .. } => {
                    let had_row =
                        self.peers[p].store.outbox.contains_key(id) || put_now.contains(id);
                    self.ledger.on_settle(&name, id, settlement, had_row);
                    if *settlement == Settlement::Delivered {
                        self.check_delivered(&name, id);
                    }
                }
                StoreOp::CommitInbound { keys, .. } => {
                    let peer = &self.peers[p];
                    if peer.spec.hook.is_some() {
                        for key in keys {
                            if !peer.store.is_processed(key) && !peer.app.hook_store.contains(key) {
                                violated(format!(
                                    "{name} committed {key:?} as processed, but its application never committed it"
                                ));
                            }
                        }
                    }
                }
                StoreOp::ExpireInbound { keys } => {
                    for key in keys {
                        self.ledger.on_expired(&name, key);
                        self.counts.expired_rows += 1;
                    }
                }
                StoreOp::MarkProcessed(_) | StoreOp::BufferInbound(_) => {}
            }
        }
        self.peers[p].store.commit(ops);
    }

    /// The sender just settled `id` as delivered: its recipient has processed it, durably, and
    /// with a hook its application has committed it.
    fn check_delivered(&self, sender: &str, id: &str) {
        let recipient = self
            .ledger
            .outbound
            .get(&(sender.to_owned(), id.to_owned()))
            .map(|rec| rec.recipient.clone())
            .unwrap_or_default();
        let Some(q) = self.scn.index_of(&recipient) else {
            violated(format!(
                "{sender} saw {id} delivered to {recipient}, who does not exist"
            ));
        };
        let key = key_of(sender, id);
        let peer = &self.peers[q];
        if !peer.store.is_processed(&key) {
            violated(format!(
                "{sender} saw {id} delivered, but {recipient} has not processed it"
            ));
        }
        if peer.spec.hook.is_some() && !peer.app.hook_store.contains(&key) {
            violated(format!(
                "{sender} saw {id} delivered, but {recipient}'s application never committed it"
            ));
        }
    }

    fn dispatch(&mut self, p: usize, event: Event) {
        let name = self.peers[p].name().to_owned();
        if self.verbose {
            let line = format!("{name} event {}", describe_event(&event));
            self.trace(|_| line);
        }
        match &event {
            Event::MessageDelivered { message_id, .. } => {
                self.counts.delivered += 1;
                self.ledger.on_terminal_event(&name, message_id, true);
            }
            Event::MessageFailed {
                message_id, reason, ..
            } => {
                match reason {
                    FailReason::MaxRetriesExceeded => self.counts.failed_max_retries += 1,
                    FailReason::OutboxLifetimeExceeded => self.counts.failed_lifetime += 1,
                    FailReason::OutboxCapacityExceeded => self.counts.failed_capacity += 1,
                }
                self.ledger.on_terminal_event(&name, message_id, false);
            }
            Event::MessageReceived {
                message,
                chat,
                sender,
                ..
            } => {
                self.counts.received += 1;
                let key = InboundKey {
                    chat: chat.clone(),
                    sender: sender.clone(),
                    message_id: message.id.clone(),
                };
                self.ledger.on_received(&name, &key, message);
            }
            Event::MessageStored { .. } => self.counts.stored += 1,
            Event::MessageUndeliverable { .. } => self.counts.undeliverable += 1,
            Event::MessageRetrying { .. } => self.counts.retrying += 1,
            Event::MessageDeferred { .. } => self.counts.deferred += 1,
            Event::InboundDrainCompleted { .. } => self.counts.drains_completed += 1,
            _ => {}
        }
    }

    /// Hands one transmit to its carrier, after checking that an acknowledgement it carries
    /// follows the processing it acknowledges.
    fn transmit(&mut self, p: usize, transmit: Transmit) {
        self.check_ack(p, &transmit);
        if self.verbose {
            let line = format!(
                "{} -> {}",
                self.peers[p].name(),
                describe_transmit(&transmit)
            );
            self.trace(|_| line);
        }
        let now = self.now;
        let inc = self.peers[p].incarnation;
        let Transmit {
            carrier,
            peer: neighbor,
            kind,
        } = transmit;
        match carrier {
            Carrier::Internet => {
                let run = self.peers[p].run.as_mut().expect("running");
                let conn = run
                    .session
                    .as_ref()
                    .filter(|s| s.authenticated)
                    .map(|s| s.conn);
                match (kind, conn) {
                    (TransmitKind::Outbox { message, send_seq }, Some(conn)) => {
                        let id = message.id.clone();
                        if let Some(session) = run.session.as_mut() {
                            session.unanswered.insert((id.clone(), send_seq));
                        }
                        self.peers[p].push(
                            Cmd::Written {
                                id: id.clone(),
                                send_seq,
                            },
                            now,
                        );
                        self.schedule(
                            WRITE_ACK_TIMEOUT,
                            Ev::WriteAckTimeout {
                                peer: p,
                                inc,
                                conn,
                                id,
                                send_seq,
                            },
                        );
                        let tag = Some(send_seq);
                        self.send_to_relay(
                            conn,
                            ToRelay::Send {
                                message: Box::new(message),
                                tag,
                            },
                        );
                    }
                    (TransmitKind::Outbox { message, send_seq }, None) => {
                        let reason = "relay not connected";
                        let id = message.id;
                        self.peers[p].push(
                            Cmd::SendFailed {
                                id,
                                send_seq,
                                reason,
                            },
                            now,
                        );
                    }
                    (TransmitKind::Ack { message }, Some(conn)) => self.send_to_relay(
                        conn,
                        ToRelay::Send {
                            message: Box::new(message),
                            tag: None,
                        },
                    ),
                    (TransmitKind::HopAck { seq }, Some(conn)) => {
                        self.send_to_relay(conn, ToRelay::Ack { seq })
                    }
                    (_, None) => {}
                }
            }
            Carrier::Local(name) if name == BLE => {
                let to = neighbor
                    .as_deref()
                    .and_then(|n| self.scn.index_of(n))
                    .filter(|&q| self.link_active(p, q));
                match (kind, to) {
                    (TransmitKind::Outbox { message, send_seq }, Some(q)) => {
                        let id = message.id.clone();
                        self.peers[p].push(Cmd::Written { id, send_seq }, now);
                        self.send_local(p, q, message);
                    }
                    (TransmitKind::Outbox { message, send_seq }, None) => {
                        let reason = "neighbor out of range";
                        let id = message.id;
                        self.peers[p].push(
                            Cmd::SendFailed {
                                id,
                                send_seq,
                                reason,
                            },
                            now,
                        );
                    }
                    (TransmitKind::Ack { message }, Some(q)) => self.send_local(p, q, message),
                    _ => {}
                }
            }
            _ => {
                if let TransmitKind::Outbox { message, send_seq } = kind {
                    let reason = "carrier not simulated";
                    let id = message.id;
                    self.peers[p].push(
                        Cmd::SendFailed {
                            id,
                            send_seq,
                            reason,
                        },
                        now,
                    );
                }
            }
        }
    }

    /// No end-to-end ACK and no relay hop ack of a data message before it is processed: in the
    /// committed store, and with a hook in the application's own store.
    fn check_ack(&self, p: usize, transmit: &Transmit) {
        let peer = &self.peers[p];
        let name = peer.name();
        // A hop ack may also release a frame whose buffered row expired (a drop, with a trace).
        let check = |key: &InboundKey, what: &str, drop_allowed: bool| {
            let processed = peer.store.is_processed(key);
            let dropped = drop_allowed
                && self
                    .ledger
                    .inbound(name, key)
                    .is_some_and(|rec| rec.expired);
            if !(processed || dropped) {
                violated(format!(
                    "{name} sent the {what} of {key:?} before processing it"
                ));
            }
            if processed && peer.spec.hook.is_some() && !peer.app.hook_store.contains(key) {
                violated(format!(
                    "{name} sent the {what} of {key:?}, which its application never committed"
                ));
            }
        };
        match &transmit.kind {
            TransmitKind::Ack { message } => {
                let acked = message.ack_for().unwrap_or_default();
                check(&key_of(&message.recipient, acked), "end-to-end ACK", false);
            }
            TransmitKind::HopAck { seq } => {
                if let Some(key) = self
                    .ledger
                    .seq(name, *seq)
                    .and_then(|info| info.key.as_ref())
                {
                    check(key, "relay ack", true);
                }
            }
            TransmitKind::Outbox { .. } => {}
        }
    }

    /// Hands the next batch to the application's durability hook, which answers at random.
    fn offer_hook(&mut self, p: usize) {
        let now = self.now;
        let inc = self.peers[p].incarnation;
        let name = self.peers[p].name().to_owned();
        let peer = &mut self.peers[p];
        let Some(profile) = peer.spec.hook else {
            return;
        };
        let run = peer.run.as_mut().expect("running");
        if run.hook.is_some() {
            return;
        }
        let Some(batch) = run.engine.poll_hook() else {
            return;
        };
        run.hook = Some((batch.id, now + peer.spec.hook_timeout_ms));
        let max = peer
            .spec
            .config
            .durable_inbound
            .as_ref()
            .map_or(usize::MAX, |d| d.batch_max_messages.max(1));
        if batch.messages.is_empty() || batch.messages.len() > max {
            violated(format!(
                "{name} offered a batch of {} to its hook (at most {max})",
                batch.messages.len()
            ));
        }
        for m in &batch.messages {
            if peer.store.is_processed(&m.key) {
                violated(format!(
                    "{name} offered {:?} to its hook after its commit was durable",
                    m.key
                ));
            }
            if m.message.recipient != name {
                violated(format!(
                    "{}'s message {} for {} was offered to the hook of {name}",
                    m.message.sender, m.message.id, m.message.recipient
                ));
            }
            self.ledger.on_offered(&name, &m.key);
        }
        self.counts.hook_batches += 1;
        let keys: Vec<InboundKey> = batch.messages.iter().map(|m| m.key.clone()).collect();
        let poisoned = batch.messages.iter().any(|m| m.message.content == POISON);
        let choice = if self.honest {
            0
        } else if poisoned {
            1
        } else {
            self.rng.weighted(&[
                profile.commit,
                profile.refuse,
                profile.hang,
                profile.crash_before_commit,
                profile.crash_after_commit,
            ])
        };
        let delay = if self.honest {
            self.rng.range(1, 50)
        } else {
            self.rng.range(1, profile.max_delay)
        };
        self.trace(|_| {
            format!(
                "{name} hook gets batch {} ({} messages), choice {choice}",
                batch.id,
                keys.len()
            )
        });
        let batch_id = batch.id;
        match choice {
            0 | 4 => {
                let app = &mut self.peers[p].app;
                for key in keys {
                    if !app.hook_store.insert(key) {
                        self.counts.hook_redeliveries += 1;
                    }
                }
                if choice == 0 {
                    self.counts.hook_commits += 1;
                    let ev = Ev::HookDone {
                        peer: p,
                        inc,
                        batch_id,
                        ok: true,
                    };
                    self.schedule(delay, ev);
                } else {
                    self.counts.hook_crashes += 1;
                    self.schedule(delay, Ev::Crash { peer: p, inc });
                }
            }
            1 => {
                self.counts.hook_refusals += 1;
                let ev = Ev::HookDone {
                    peer: p,
                    inc,
                    batch_id,
                    ok: false,
                };
                self.schedule(delay, ev);
            }
            2 => self.counts.hook_hangs += 1,
            _ => {
                self.counts.hook_crashes += 1;
                self.schedule(delay, Ev::Crash { peer: p, inc });
            }
        }
    }

    fn presence_changes(&mut self, p: usize) {
        let run = self.peers[p].run.as_mut().expect("running");
        let conn = run
            .session
            .as_ref()
            .filter(|s| s.authenticated)
            .map(|s| s.conn);
        let mut frames = Vec::new();
        while let Some(change) = run.engine.poll_presence() {
            frames.push(match change {
                courier_engine::PresenceChange::Watch(peer) => ToRelay::Watch(vec![peer]),
                courier_engine::PresenceChange::Unwatch(peer) => ToRelay::Unwatch(vec![peer]),
            });
        }
        if let Some(conn) = conn {
            for frame in frames {
                self.send_to_relay(conn, frame);
            }
        }
    }

    /// Every queue of the engine stays within its configured bound.
    fn check_bounds(&mut self, p: usize) {
        let peer = &self.peers[p];
        let run = peer.run.as_ref().expect("running");
        let config = &peer.spec.config;
        let stats = run.engine.stats();
        let name = peer.name();
        if stats.outbox_regular > config.outbox_max_entries
            || stats.outbox_media > config.outbox_max_media_entries
        {
            violated(format!(
                "{name}'s outbox holds {} + {} entries (bounds {} + {})",
                stats.outbox_regular,
                stats.outbox_media,
                config.outbox_max_entries,
                config.outbox_max_media_entries
            ));
        }
        if stats.pending_acks > config.max_pending_acks.max(1) {
            violated(format!(
                "{name} has {} entries in flight (bound {})",
                stats.pending_acks, config.max_pending_acks
            ));
        }
        let buffered = run.engine.inbound_buffered();
        if let Some(durable) = &config.durable_inbound {
            if buffered > durable.max_buffered_messages
                || peer.store.pending.len() > durable.max_buffered_messages
            {
                violated(format!(
                    "{name} buffers {buffered} inbound messages, {} in its store (bound {})",
                    peer.store.pending.len(),
                    durable.max_buffered_messages
                ));
            }
        }
        if peer.store.outbox.len() > config.outbox_max_entries + config.outbox_max_media_entries {
            violated(format!(
                "{name}'s store holds {} outbox rows",
                peer.store.outbox.len()
            ));
        }
        let watchlist = run.engine.presence_watchlist().len();
        if watchlist > self.peers.len() {
            violated(format!("{name} watches {watchlist} peers"));
        }
        let c = &mut self.counts;
        c.max_outbox = c.max_outbox.max(stats.outbox_regular + stats.outbox_media);
        c.max_pending_acks = c.max_pending_acks.max(stats.pending_acks);
        c.max_buffered = c.max_buffered.max(buffered);
        c.max_watchlist = c.max_watchlist.max(watchlist);
    }

    // ---- the end ------------------------------------------------------------------------

    fn pending_work(&self) -> String {
        let mut parts = Vec::new();
        for p in &self.peers {
            let Some(run) = &p.run else {
                parts.push(format!("{} down", p.name()));
                continue;
            };
            parts.push(format!(
                "{}: outbox {:?}, buffered {}, next deadline {:?}",
                p.name(),
                p.store.outbox.keys().collect::<Vec<_>>(),
                run.engine.inbound_buffered(),
                run.engine
                    .next_deadline()
                    .map(|d| d.saturating_sub(self.now))
            ));
        }
        parts.push(format!("relay holds {:?}", self.relay.held_frames()));
        parts.join("; ")
    }

    fn final_checks(&mut self) {
        for p in &self.peers {
            let name = p.name();
            let Some(run) = &p.run else {
                violated(format!("{name} is down at the end"));
            };
            if !p.store.outbox.is_empty() {
                violated(format!(
                    "{name}'s outbox never settled: {:?}",
                    p.store.outbox.keys().collect::<Vec<_>>()
                ));
            }
            if !p.store.pending.is_empty() || run.engine.inbound_buffered() != 0 {
                violated(format!(
                    "{name} still buffers inbound messages: {:?}",
                    p.store.pending.keys().collect::<Vec<_>>()
                ));
            }
            if let Some(deadline) = run.engine.next_deadline() {
                violated(format!(
                    "{name}'s idle engine still wants a wake-up in {} ms",
                    deadline as i64 - self.now as i64
                ));
            }
        }
        let held = self.relay.held_frames();
        if !held.is_empty() {
            violated(format!("the relay never released {held:?}"));
        }
        let unsettled = self.ledger.unsettled();
        if let Some((sender, id)) = unsettled.first() {
            violated(format!("{sender}'s {id} never settled"));
        }
        for ((sender, id), rec) in &self.ledger.outbound {
            if !rec.durable {
                continue;
            }
            if rec.terminal_events == 0 {
                if !rec.terminal_lost {
                    violated(format!("{sender}'s {id} settled without a terminal event"));
                }
                self.counts.terminal_lost += 1;
            }
            if rec.settled != Some(Settlement::Delivered) {
                continue;
            }
            let key = key_of(sender, id);
            let Some(q) = self.scn.index_of(&rec.recipient) else {
                continue;
            };
            let recipient = &self.peers[q];
            if recipient.spec.hook.is_some() {
                if !recipient.app.hook_store.contains(&key) {
                    violated(format!(
                        "{sender}'s {id} was delivered, but {}'s application does not have it",
                        rec.recipient
                    ));
                }
                continue;
            }
            match self.ledger.inbound(&rec.recipient, &key) {
                Some(seen) if seen.dispatched == 1 => {}
                Some(seen) if seen.dispatch_lost => self.counts.at_most_once_losses += 1,
                _ => violated(format!(
                    "{sender}'s {id} was delivered, but never reached {}'s application",
                    rec.recipient
                )),
            }
        }
    }
}

fn describe_cmd(cmd: &Cmd) -> String {
    match cmd {
        Cmd::Send(req) => format!("send {:?} to {}", req.id, req.recipient),
        Cmd::Inbound { message, origin } => format!(
            "inbound {} from {} via {} seq {:?}{}",
            message.id,
            origin.stamped_sender,
            origin.carrier,
            origin.seq,
            message
                .ack_for()
                .map(|id| format!(" (ack of {id})"))
                .unwrap_or_default()
        ),
        other => format!("{other:?}"),
    }
}

fn describe_event(event: &Event) -> String {
    match event {
        Event::MessageReceived {
            message, sender, ..
        } => format!("message_received {} from {sender}", message.id),
        other => format!("{other:?}"),
    }
}

fn describe_transmit(t: &Transmit) -> String {
    let kind = match &t.kind {
        TransmitKind::Outbox { message, send_seq } => {
            format!("send {}#{send_seq} to {}", message.id, message.recipient)
        }
        TransmitKind::Ack { message } => format!(
            "ack of {} to {}",
            message.ack_for().unwrap_or_default(),
            message.recipient
        ),
        TransmitKind::HopAck { seq } => format!("hop ack {seq}"),
    };
    format!("{} {kind} (peer {:?})", t.carrier, t.peer)
}
