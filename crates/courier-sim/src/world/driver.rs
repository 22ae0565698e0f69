//! One device's driver step: `courier_engine::step`, the very code the client driver runs, with
//! this world as its host. The commands are applied, then the step's stages are carried out in
//! the engine's order, and a crash can cut it between any two of them (`CrashPoint`). In an
//! encrypted world the driver's end-to-end layer (`e2e`) opens inbound copies as they are
//! applied, seals in the prepare stage, and commits its session rows with the step.

use std::ops::ControlFlow;

use courier_engine::step::{Host, Step};
use courier_engine::{HookBatch, Input, PresenceChange};

use super::checks::OutboxView;
use super::e2e::Frame;
use courier_proto::message::{META_GROUP_ID, META_GROUP_MESSAGE};

use super::groups::{is_copy, is_sealed_group, GroupChecks, GroupView};
use crate::ledger::Undecryptable;

use super::*;

impl From<Event> for AppEvent {
    fn from(event: Event) -> Self {
        Self::Engine(event)
    }
}

/// The world as one device's step host: each stage is the world's model of the runtime, and
/// the planned crash point ends the step there.
struct StepHost<'w> {
    world: &'w mut World,
    p: usize,
    crash: Option<CrashPoint>,
    /// The device's sessions, out of it for the step like its engine.
    e2e: Option<E2e>,
    /// Inputs for the next step: sends that could not be sealed.
    refeed: Vec<Input>,
    accepted: Accepted,
    /// The step's terminal events, held with the commit.
    held: Vec<String>,
    /// `message_received`s not dispatched yet: lost if the process dies before they are.
    undispatched: Vec<InboundKey>,
    /// (store ops, events) of the commit, for the world's reproducibility digest.
    sizes: (u64, u64),
}

/// The sends of a step, answered once it is durable.
#[derive(Default)]
struct Accepted {
    sends: Vec<String>,
    group_sends: Vec<String>,
}

impl StepHost<'_> {
    fn crash_if(&self, point: CrashPoint) -> ControlFlow<CrashPoint> {
        if self.crash == Some(point) {
            ControlFlow::Break(point)
        } else {
            ControlFlow::Continue(())
        }
    }

    fn dispatch_all(&mut self, events: Vec<AppEvent>) {
        for event in events {
            if let AppEvent::Engine(received) = &event {
                if let Some(key) = received.received_key() {
                    if let Some(i) = self.undispatched.iter().position(|k| *k == key) {
                        self.undispatched.remove(i);
                    }
                }
            }
            self.world.dispatch(self.p, event);
        }
    }
}

impl Host<AppEvent> for StepHost<'_> {
    type Stop = CrashPoint;
    type Frame = Frame;

    fn prepare(&mut self, transmits: Vec<Transmit>) -> ControlFlow<CrashPoint, Vec<Frame>> {
        ControlFlow::Continue(match self.e2e.as_mut() {
            Some(e2e) => self.world.seal(self.p, e2e, transmits, &mut self.refeed),
            None => transmits.into_iter().map(Frame::Engine).collect(),
        })
    }

    fn commit(
        &mut self,
        ops: Vec<StoreOp>,
        events: &[AppEvent],
        after_transmits: &[AppEvent],
    ) -> ControlFlow<CrashPoint> {
        self.crash_if(CrashPoint::BeforeCommit)?;
        let p = self.p;
        let all = || events.iter().chain(after_transmits);
        let reports = Reports {
            held: all().filter_map(AppEvent::terminal).collect(),
            done: std::mem::take(&mut self.world.peers[p].run.as_mut().expect("running").reported),
        };
        self.held = reports.held.iter().map(|(id, _)| id.clone()).collect();
        self.undispatched = all()
            .filter_map(|event| match event {
                AppEvent::Engine(event) => event.received_key(),
                AppEvent::Replayed(_) => None,
            })
            .collect();
        self.sizes = (ops.len() as u64, events.len() as u64);
        let sessions = self.e2e.as_mut().map(E2e::commit).unwrap_or_default();
        self.world.commit(p, &ops, &reports, sessions);
        let engine_events: Vec<&Event> = all()
            .filter_map(|event| match event {
                AppEvent::Engine(event) => Some(event),
                AppEvent::Replayed(_) => None,
            })
            .collect();
        self.world.check_group_events(p, &ops, &engine_events);
        ControlFlow::Continue(())
    }

    fn resolve(&mut self, _: &Engine, _: &[PresenceChange]) -> ControlFlow<CrashPoint> {
        self.crash_if(CrashPoint::AfterCommit)?;
        let name = self.world.peers[self.p].name().to_owned();
        let accepted = std::mem::take(&mut self.accepted);
        for id in accepted.sends {
            let store = &self.world.peers[self.p].store;
            let durable = store.outbox.contains_key(&id) || store.settled.contains_key(&id);
            self.world.ledger.on_resolved(&name, &id, durable);
            self.world.peers[self.p].app.owed.remove(&id);
            self.world.counts.accepted += 1;
        }
        for id in accepted.group_sends {
            if !self.world.peers[self.p].store.group_sends.contains_key(&id) {
                violated(format!(
                    "{name}'s sendGroupMessage resolved {id} before it was durable"
                ));
            }
            self.world.counts.group_accepted += 1;
        }
        ControlFlow::Continue(())
    }

    fn dispatch(&mut self, events: Vec<AppEvent>) -> ControlFlow<CrashPoint> {
        self.crash_if(CrashPoint::AfterResolve)?;
        self.dispatch_all(events);
        let held = std::mem::take(&mut self.held);
        self.world.peers[self.p]
            .run
            .as_mut()
            .expect("running")
            .reported = held;
        ControlFlow::Continue(())
    }

    fn transmit(&mut self, frames: Vec<Frame>) -> ControlFlow<CrashPoint> {
        self.crash_if(CrashPoint::AfterEvents)?;
        let world = &mut *self.world;
        world.counts.max_transmits_per_step = world.counts.max_transmits_per_step.max(frames.len());
        let (ops, events) = self.sizes;
        world.mix(&[self.p as u64, world.now, ops, events, frames.len() as u64]);
        let cut = if self.crash == Some(CrashPoint::MidTransmits) {
            world.rng.index(frames.len() + 1)
        } else {
            usize::MAX
        };
        for (i, frame) in frames.into_iter().enumerate() {
            if i == cut {
                return ControlFlow::Break(CrashPoint::MidTransmits);
            }
            match frame {
                Frame::Engine(transmit) => world.transmit(self.p, transmit),
                Frame::Welcome { carrier, message } => world.carry(
                    self.p,
                    Transmit {
                        carrier,
                        peer: Some(message.recipient.clone()),
                        // Sent like an ACK: once, with no answer awaited.
                        kind: TransmitKind::DeliveryAck { message },
                    },
                ),
            }
        }
        self.crash_if(CrashPoint::MidTransmits)
    }

    fn dispatch_after_transmits(&mut self, events: Vec<AppEvent>) -> ControlFlow<CrashPoint> {
        self.crash_if(CrashPoint::AfterTransmits)?;
        self.dispatch_all(events);
        ControlFlow::Continue(())
    }

    fn offer_hook(&mut self, batch: HookBatch) -> ControlFlow<CrashPoint> {
        self.world.hook_gets(self.p, batch);
        ControlFlow::Continue(())
    }

    fn presence(&mut self, changes: Vec<PresenceChange>) -> ControlFlow<CrashPoint> {
        self.world.presence_changes(self.p, changes);
        ControlFlow::Continue(())
    }
}

impl World {
    pub(super) fn step(&mut self, p: usize) {
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
        let commands = std::mem::take(&mut run.inbox);
        let refeed = std::mem::take(&mut run.refeed);
        let replays = std::mem::take(&mut run.replays);
        // The engine and the sessions leave the device for the step, so the world can host it.
        let placeholder = Engine::new(peer.spec.config.clone(), String::new());
        let mut engine = std::mem::replace(&mut run.engine, placeholder);
        let mut e2e = run.e2e.take();
        self.counts.steps += 1;
        let mut step = Step::default();
        let mut accepted = Accepted::default();
        for event in replays {
            step.emit(&mut engine, AppEvent::Replayed(event));
        }
        for input in refeed {
            step.apply(&mut engine, input, now);
        }
        for command in commands {
            self.apply(p, &mut engine, &mut e2e, &mut step, command, &mut accepted);
        }
        self.after_input(p, &mut engine, &mut e2e, &mut step);
        let mut host = StepHost {
            world: self,
            p,
            crash,
            e2e,
            refeed: Vec::new(),
            accepted,
            held: Vec::new(),
            undispatched: Vec::new(),
            sizes: (0, 0),
        };
        let flow = step.finish(&mut engine, now, &mut host);
        let undispatched = std::mem::take(&mut host.undispatched);
        let refeed = std::mem::take(&mut host.refeed);
        let mut e2e = host.e2e.take();
        let outgoing = e2e.as_mut().map(E2e::take_outgoing).unwrap_or_default();
        let run = self.peers[p].run.as_mut().expect("running");
        run.engine = engine;
        run.e2e = e2e;
        run.refeed = refeed;
        match flow {
            ControlFlow::Continue(()) => {
                // Key packages are published only once their private halves are committed.
                self.send_setup(p, outgoing);
                self.check_bounds(p);
            }
            ControlFlow::Break(point) => self.crash_in_step(p, point, undispatched),
        }
    }

    /// The process dies at `point` of a step: what the step had not dispatched yet is lost
    /// (after the commit, the store already holds its effects, and its terminal events with it).
    fn crash_in_step(&mut self, p: usize, point: CrashPoint, undispatched: Vec<InboundKey>) {
        self.counts.step_crashes[point as usize] += 1;
        self.trace(|w| format!("{} crashes inside a step, {point:?}", w.peers[p].name()));
        if point != CrashPoint::BeforeCommit {
            let name = self.peers[p].name().to_owned();
            for key in &undispatched {
                self.ledger.on_received_lost(&name, key);
            }
        }
        self.crash(p);
    }

    /// One command of the step. A send carries what the store remembers of its id, as the
    /// client driver adds it; a sealed inbound copy is opened first.
    fn apply(
        &mut self,
        p: usize,
        engine: &mut Engine,
        e2e: &mut Option<E2e>,
        step: &mut Step<AppEvent>,
        command: Command,
        accepted: &mut Accepted,
    ) {
        if self.verbose {
            let line = format!("{} <- {}", self.peers[p].name(), describe_command(&command));
            self.trace(|_| line);
        }
        match (command, e2e.as_mut()) {
            (Command::Engine(Input::Inbound { message, origin }), _)
                if is_sealed_group(&message) =>
            {
                self.open_group(p, engine, step, *message, origin)
            }
            (Command::Engine(Input::Inbound { message, origin }), Some(e2e)) => {
                self.open(p, e2e, engine, step, *message, origin)
            }
            (Command::Engine(mut input), _) => {
                if let Input::Written { id, send_seq }
                | Input::SendFailed { id, send_seq, .. }
                | Input::Answer { id, send_seq, .. } = &input
                {
                    let run = self.peers[p].run.as_mut().expect("running");
                    if run.unwritten.get(id) == Some(send_seq) {
                        run.unwritten.remove(id);
                    }
                }
                if let Input::Answer {
                    id,
                    answer: CarrierAnswer::Unreachable(_),
                    ..
                } = &input
                {
                    let name = self.peers[p].name().to_owned();
                    self.ledger
                        .on_refused(Refused::Attempt, &name, id, self.now);
                }
                match &mut input {
                    Input::Send(req) => {
                        req.settled = self.peers[p]
                            .store
                            .settled
                            .get(&req.id)
                            .map(|row| row.settlement.clone());
                        accepted.sends.push(req.id.clone());
                    }
                    Input::GroupSend(req) => accepted.group_sends.push(req.id.clone()),
                    _ => {}
                }
                step.apply(engine, input, self.now);
            }
            (Command::Directory(report), Some(e2e)) => self.directory(p, e2e, engine, step, report),
            (Command::Directory(_), None) => {}
        }
        self.after_input(p, engine, e2e, step);
    }

    /// What the engine handed the driver in an input: verified control frames (a Welcome
    /// joins its session, in this step) and the recipients it wants a session with.
    fn after_input(
        &mut self,
        p: usize,
        engine: &mut Engine,
        e2e: &mut Option<E2e>,
        step: &mut Step<AppEvent>,
    ) {
        let Some(e2e) = e2e.as_mut() else {
            while engine.poll_control().is_some() {}
            return;
        };
        while let Some(message) = engine.poll_control() {
            self.control(p, e2e, engine, step, message);
        }
        while let Some(recipient) = engine.poll_session_wanted() {
            self.want(p, e2e, engine, step, &recipient);
        }
    }

    /// The step's frames for the relay's key-package directory and session setup, sent once it
    /// is carried out; without a connection they are dropped (the next one asks again).
    fn send_setup(&mut self, p: usize, outgoing: Vec<ToRelay>) {
        let conn = self.peers[p]
            .run
            .as_ref()
            .and_then(|run| run.session.as_ref())
            .filter(|s| s.authenticated)
            .map(|s| s.conn);
        let Some(conn) = conn else {
            return;
        };
        for frame in outgoing {
            if self.verbose {
                let line = format!(
                    "{} -> relay {}",
                    self.peers[p].name(),
                    describe_setup(&frame)
                );
                self.trace(|_| line);
            }
            self.send_to_relay(conn, frame);
        }
    }

    /// Checks the step's ops against the ledger, then applies them, the terminal-event
    /// bookkeeping and the session rows to the store.
    pub(super) fn commit(
        &mut self,
        p: usize,
        ops: &[StoreOp],
        reports: &Reports,
        sessions: Vec<courier_crypto::Change>,
    ) {
        let name = self.peers[p].name().to_owned();
        let store = &self.peers[p].store;
        let mut outbox = OutboxView::new(&store.outbox);
        let mut groups = GroupView::new(&store.group_sends);
        let settles: BTreeMap<&str, &Settlement> = ops
            .iter()
            .filter_map(|op| match op {
                StoreOp::Settle { id, settlement, .. } => Some((id.as_str(), settlement)),
                _ => None,
            })
            .collect();
        let done_now: BTreeSet<&str> = ops
            .iter()
            .filter_map(|op| match op {
                StoreOp::GroupSendDone { id } => Some(id.as_str()),
                _ => None,
            })
            .collect();
        for op in ops {
            match op {
                StoreOp::Put(record) if is_copy(&record.message) => {
                    let wire = &record.message.metadata[META_GROUP_MESSAGE];
                    let (id, member) = (&record.message.id, &record.message.recipient);
                    self.ledger.on_copy_put(&name, id, member, wire);
                    outbox.put(record);
                }
                StoreOp::Put(record) => {
                    self.ledger
                        .on_put(&name, &record.message.id, &record.message.recipient);
                    outbox.put(record);
                }
                StoreOp::Settle { id, settlement, .. } if self.ledger.copy(&name, id).is_some() => {
                    let Some(row) = outbox.row(id) else {
                        violated(format!("{name} settled copy {id}, which has no outbox row"));
                    };
                    self.ledger.on_copy_settle(&name, id, settlement);
                    match settlement {
                        Settlement::Delivered => self.check_copy_delivered(&name, id),
                        Settlement::Failed(reason) => {
                            self.check_failed(p, row, *reason, &outbox, groups.active())
                        }
                    }
                    outbox.settle(id);
                }
                StoreOp::Settle { id, settlement, .. } => {
                    let row = outbox.row(id);
                    self.ledger.on_settle(&name, id, settlement, row.is_some());
                    match (settlement, row) {
                        (Settlement::Delivered, _) => self.check_delivered(&name, id),
                        (Settlement::Failed(reason), Some(row)) => {
                            self.check_failed(p, row, *reason, &outbox, groups.active())
                        }
                        (Settlement::Failed(_), None) => {}
                    }
                    outbox.settle(id);
                }
                StoreOp::CommitInbound { keys, .. } => {
                    if self.peers[p].spec.hook.is_some() {
                        for key in keys {
                            let app = &self.peers[p].app;
                            if !store.is_processed(key) && !app.hook_store.contains(key) {
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
                StoreOp::PutGroupSend(_)
                | StoreOp::GroupMember { .. }
                | StoreOp::GroupSendDone { .. } => {
                    let mut checks = GroupChecks {
                        ledger: &mut self.ledger,
                        counts: &mut self.counts,
                        relay: &self.relay,
                        name: &name,
                    };
                    checks.op(op, &settles, &done_now, &mut groups);
                }
                StoreOp::MarkProcessed(_) | StoreOp::MarkControl(_) | StoreOp::BufferInbound(_) => {
                }
            }
        }
        let checks = GroupChecks {
            ledger: &mut self.ledger,
            counts: &mut self.counts,
            relay: &self.relay,
            name: &name,
        };
        checks.done(&done_now, &outbox);
        self.peers[p].store.commit(ops, reports, sessions);
    }

    pub(super) fn dispatch(&mut self, p: usize, event: AppEvent) {
        let name = self.peers[p].name().to_owned();
        let (event, replayed) = match event {
            AppEvent::Engine(event) => (event, false),
            AppEvent::Replayed(event) => (event, true),
        };
        if self.verbose {
            let flag = if replayed { " (replayed)" } else { "" };
            let line = format!("{name} event {}{flag}", describe_event(&event));
            self.trace(|_| line);
        }
        if replayed {
            self.counts.replays += 1;
        }
        match &event {
            Event::MessageDelivered { message_id, .. } => {
                self.terminal_event(&name, message_id, Settlement::Delivered, replayed);
                if !replayed {
                    self.counts.delivered += 1;
                }
            }
            Event::MessageFailed {
                message_id, reason, ..
            } => {
                self.terminal_event(&name, message_id, Settlement::Failed(*reason), replayed);
                if !replayed {
                    match reason {
                        FailReason::MaxRetriesExceeded => self.counts.failed_max_retries += 1,
                        FailReason::OutboxLifetimeExceeded
                        | FailReason::PendingSessionLifetimeExceeded
                        | FailReason::ControlSignatureExpired => self.counts.failed_lifetime += 1,
                        FailReason::ConnectionRequestUndeliverable => {
                            violated(format!("{message_id}: the simulated apps send no requests"))
                        }
                        FailReason::TransferAborted => {
                            violated(format!("{message_id}: the simulated apps send no files"))
                        }
                        FailReason::OutboxCapacityExceeded
                        | FailReason::PendingSessionCapacityExceeded => {
                            self.counts.failed_capacity += 1
                        }
                    }
                }
            }
            Event::MessageReceived {
                message,
                chat,
                sender,
                encrypted,
                ..
            } => {
                if self.scn.encryption && !encrypted {
                    violated(format!(
                        "{name} received {} from {sender} in the clear in an encrypted world",
                        message.id
                    ));
                }
                self.counts.received += 1;
                if message.metadata.contains_key(META_GROUP_ID) {
                    self.counts.group_received += 1;
                }
                let key = InboundKey {
                    chat: chat.clone(),
                    sender: sender.clone(),
                    message_id: message.id.clone(),
                };
                self.ledger.on_received(&name, &key, message);
            }
            Event::GroupMessageSent { path, .. } => match *path {
                "relay" => self.counts.group_broadcast_path += 1,
                _ => self.counts.group_fanout_path += 1,
            },
            Event::GroupMessageDeliveryReport {
                missed_reissued, ..
            } => {
                self.counts.group_reports += 1;
                self.counts.group_reissued += missed_reissued.len() as u64;
            }
            Event::SecurityWarning {
                peer_id,
                reason_code,
                ..
            } => {
                // Nobody forges anything here: only the retention of the durability buffer
                // has cause to warn.
                if *reason_code != "INBOUND_RETENTION_EXPIRED" {
                    violated(format!(
                        "{name} warned of {reason_code} from {peer_id} in a world that forges nothing"
                    ));
                }
                self.counts.security_warnings += 1;
            }
            Event::MessageStored { .. } => self.counts.stored += 1,
            Event::MessageUndeliverable { .. } => self.counts.undeliverable += 1,
            Event::MessageRetrying { .. } => self.counts.retrying += 1,
            Event::MessageDeferred { .. } => self.counts.deferred += 1,
            Event::InboundDrainCompleted { .. } => self.counts.drains_completed += 1,
            Event::MessageDecryptionFailed {
                message_id, sender, ..
            } => {
                self.counts.decryption_failures += 1;
                let what = self
                    .ledger
                    .on_decryption_failed(&name, sender, message_id, self.now);
                if what == Undecryptable::Carried {
                    self.counts.carried_undecryptable += 1;
                }
            }
            _ => {}
        }
    }

    fn terminal_event(&mut self, name: &str, id: &str, reported: Settlement, replayed: bool) {
        let first = self.ledger.on_terminal_event(name, id, &reported, replayed);
        if replayed && first {
            self.counts.replays_after_loss += 1;
        }
    }

    /// Hands one transmit to its carrier, after checking that an acknowledgement it carries
    /// follows the processing it acknowledges.
    pub(super) fn transmit(&mut self, p: usize, transmit: Transmit) {
        self.check_ack(p, &transmit);
        self.carry(p, transmit);
    }

    /// Puts one frame on its carrier.
    fn carry(&mut self, p: usize, transmit: Transmit) {
        if self.verbose {
            let line = format!(
                "{} -> {}",
                self.peers[p].name(),
                describe_transmit(&self.ledger, &transmit)
            );
            self.trace(|_| line);
        }
        let now = self.now;
        let inc = self.peers[p].incarnation;
        // Every relay frame of a group copy is an attempt of its ladder (offers go to
        // neighbors and gateways, and may reach the recipient itself beside an attempt).
        if let (TransmitKind::Outbox { message, send_seq }, Carrier::Relay) =
            (&transmit.kind, &transmit.carrier)
        {
            if is_copy(message) {
                self.check_written(p, &message.id, *send_seq);
            }
        }
        let Transmit {
            carrier,
            peer: neighbor,
            kind,
        } = transmit;
        match carrier {
            Carrier::Relay => {
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
                            Input::Written {
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
                        self.send_failed(p, message.id, send_seq, "relay not connected");
                    }
                    (TransmitKind::DeliveryAck { message }, Some(conn)) => self.send_to_relay(
                        conn,
                        ToRelay::Send {
                            message: Box::new(message),
                            tag: None,
                        },
                    ),
                    (TransmitKind::ReleaseFrame { seq }, Some(conn)) => {
                        self.send_to_relay(conn, ToRelay::Ack { seq })
                    }
                    (TransmitKind::GroupBroadcast { group_id, message }, Some(conn)) => {
                        let message = Box::new(message);
                        self.send_group_to_relay(conn, GroupFrame::Send { group_id, message })
                    }
                    // The connection is gone: the engine downgrades the broadcast when it
                    // hears (`CarrierDown`).
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
                        self.peers[p].push(Input::Written { id, send_seq }, now);
                        self.send_local(p, q, message);
                    }
                    (TransmitKind::Outbox { message, send_seq }, None) => {
                        self.send_failed(p, message.id, send_seq, "neighbor out of range");
                    }
                    (TransmitKind::DeliveryAck { message }, Some(q)) => {
                        self.send_local(p, q, message)
                    }
                    _ => {}
                }
            }
            _ => {
                if let TransmitKind::Outbox { message, send_seq } = kind {
                    self.send_failed(p, message.id, send_seq, "carrier not simulated");
                }
            }
        }
    }

    /// Attempt `send_seq` of group copy `id` goes to the relay: the attempt before it must have
    /// been reported written or failed to the engine first, since its ACK timer starts on the
    /// write (`docs/delivery.md#large-groups`). This world writes a frame as it is handed over,
    /// so an attempt that came too early is one handed out twice before the engine heard of
    /// the first. (A direct message may be: a change of its end-to-end session sends again
    /// what was handed before it, even in the same step, before that was sealed.)
    fn check_written(&mut self, p: usize, id: &str, send_seq: u64) {
        let run = self.peers[p].run.as_mut().expect("running");
        if let Some(before) = run.unwritten.insert(id.to_owned(), send_seq) {
            violated(format!(
                "{} sent {id} again (attempt {send_seq}) before attempt {before} was written",
                self.peers[p].name()
            ));
        }
    }

    /// The application's durability hook gets `batch`, and answers at random.
    fn hook_gets(&mut self, p: usize, batch: HookBatch) {
        let inc = self.peers[p].incarnation;
        let name = self.peers[p].name().to_owned();
        let peer = &mut self.peers[p];
        let Some(profile) = peer.spec.hook else {
            violated(format!("{name} offered a batch without a hook"));
        };
        let max = peer
            .spec
            .config
            .durability_hook
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
            self.ledger.check_addressee(&name, &m.message);
            self.ledger.on_offered(&name, &m.key);
        }
        self.counts.hook_batches += 1;
        let keys: Vec<InboundKey> = batch.messages.iter().map(|m| m.key.clone()).collect();
        let poisoned = batch.messages.iter().any(|m| m.message.content == POISON);
        let choice = if self.honest() {
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
        let delay = if self.honest() {
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
        // The choices, in the order of the profile's weights: commit, refuse, hang (the
        // driver's timeout refuses), crash before the app's commit, crash after it.
        if matches!(choice, 0 | 4) {
            let app = &mut self.peers[p].app;
            for key in keys {
                if !app.hook_store.insert(key) {
                    self.counts.hook_redeliveries += 1;
                }
            }
        }
        let answer = match choice {
            0 | 1 => {
                let ok = choice == 0;
                if ok {
                    self.counts.hook_commits += 1;
                } else {
                    self.counts.hook_refusals += 1;
                }
                Some(Ev::HookDone {
                    peer: p,
                    inc,
                    batch_id,
                    ok,
                })
            }
            2 => {
                self.counts.hook_hangs += 1;
                None
            }
            _ => {
                self.counts.hook_crashes += 1;
                Some(Ev::Crash { peer: p, inc })
            }
        };
        if let Some(ev) = answer {
            self.schedule(delay, ev);
        }
    }

    /// The step's watchlist changes go to the relay, when connected.
    fn presence_changes(&mut self, p: usize, changes: Vec<PresenceChange>) {
        let run = self.peers[p].run.as_mut().expect("running");
        let conn = run
            .session
            .as_ref()
            .filter(|s| s.authenticated)
            .map(|s| s.conn);
        if let Some(conn) = conn {
            for change in changes {
                let frame = match change {
                    PresenceChange::Watch(peer) => ToRelay::Watch(vec![peer]),
                    PresenceChange::Unwatch(peer) => ToRelay::Unwatch(vec![peer]),
                };
                self.send_to_relay(conn, frame);
            }
        }
    }

    /// The carrier could not take an outbox frame: the driver hears of it in its next step.
    pub(super) fn send_failed(
        &mut self,
        p: usize,
        id: String,
        send_seq: u64,
        reason: &'static str,
    ) {
        let now = self.now;
        let reason = reason.to_owned();
        self.peers[p].push(
            Input::SendFailed {
                id,
                send_seq,
                reason,
            },
            now,
        );
    }
}

fn describe_command(command: &Command) -> String {
    let input = match command {
        Command::Engine(input) => input,
        Command::Directory(report) => return format!("directory: {}", describe_report(report)),
    };
    match input {
        Input::Send(req) => format!("send {:?} to {}", req.id, req.recipient),
        Input::GroupSend(req) => format!(
            "group send {:?} ({}) to {} for {:?}, broadcast: {}",
            req.id, req.message.id, req.group_id, req.members, req.broadcast
        ),
        Input::Inbound { message, origin } => format!(
            "inbound {} from {} via {} seq {:?}{}",
            message.id,
            origin.stamped_sender,
            origin.carrier,
            origin.seq,
            describe_content(message)
        ),
        other => format!("{other:?}"),
    }
}

fn describe_report(report: &DirectoryReport) -> String {
    match report {
        DirectoryReport::Package { address, package } => {
            format!("key package of {address} ({} bytes)", package.len())
        }
        other => format!("{other:?}"),
    }
}

/// What a message is, as far as its content shows.
fn describe_content(message: &Message) -> String {
    if let Some(id) = message.ack_for() {
        return format!(" (ack of {id})");
    }
    let kinds = [
        (courier_proto::MLS_ENC_PREFIX, " (sealed)"),
        ("__MLS_GROUP__", " (group)"),
        (courier_proto::SessionFrame::Welcome.prefix(), " (welcome)"),
        (
            courier_proto::SessionFrame::KeyPackage.prefix(),
            " (key package)",
        ),
    ];
    kinds
        .into_iter()
        .find(|(prefix, _)| message.content.starts_with(prefix))
        .map_or_else(String::new, |(_, kind)| kind.to_owned())
}

fn describe_setup(frame: &ToRelay) -> String {
    match frame {
        ToRelay::Send { message, .. } => {
            format!(
                "{}{} to {}",
                message.id,
                describe_content(message),
                message.recipient
            )
        }
        ToRelay::Publish {
            packages,
            last_resort,
        } => format!(
            "publish {} key packages{}",
            packages.len(),
            if last_resort.is_some() {
                " and a last-resort one"
            } else {
                ""
            }
        ),
        ToRelay::Fetch { address } => format!("fetch a key package of {address}"),
        other => format!("{other:?}"),
    }
}

fn describe_event(event: &Event) -> String {
    match event {
        Event::MessageReceived {
            message,
            sender,
            encrypted,
            ..
        } => format!(
            "message_received {} from {sender}{}",
            message.id,
            if *encrypted { " (sealed)" } else { "" }
        ),
        other => format!("{other:?}"),
    }
}

fn describe_transmit(ledger: &Ledger, t: &Transmit) -> String {
    let kind = match &t.kind {
        TransmitKind::Outbox { message, send_seq } => format!(
            "send {}#{send_seq} to {}{}",
            message.id,
            message.recipient,
            describe_content(message)
        ),
        TransmitKind::DeliveryAck { message } => match ledger.ack_for(message) {
            Some(acked) => format!(
                "ack of {acked} to {}{}",
                message.recipient,
                describe_content(message)
            ),
            None => format!(
                "{} to {}{}",
                message.id,
                message.recipient,
                describe_content(message)
            ),
        },
        TransmitKind::ReleaseFrame { seq } => format!("release {seq}"),
        TransmitKind::GroupBroadcast { group_id, message } => {
            format!("broadcast {} to group {group_id}", message.id)
        }
    };
    format!("{} {kind} (peer {:?})", t.carrier, t.peer)
}
