//! One device's driver step, in `courier-client`'s order: apply the queued commands, commit the
//! store ops with the step's terminal events held and the previous step's recorded as
//! dispatched, resolve the sends, dispatch the events, execute the transmits, dispatch what
//! follows a hook verdict, hand the next batch to the hook, pass on watchlist changes. A crash
//! can cut it anywhere.

use super::*;

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
        let cmds = std::mem::take(&mut run.inbox);
        self.counts.steps += 1;
        let mut out = StepOut::default();
        out.events
            .extend(run.replays.drain(..).map(AppEvent::Replayed));
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
            out.events.push(AppEvent::Engine(event));
        }
        if crash == Some(CrashPoint::BeforeCommit) {
            return self.crash_in_step(p, CrashPoint::BeforeCommit, out);
        }
        let ops: Vec<StoreOp> = std::iter::from_fn(|| run.engine.poll_store()).collect();
        let reports = Reports {
            held: out.events.iter().filter_map(AppEvent::terminal).collect(),
            done: std::mem::take(&mut run.reported),
        };
        self.commit(p, &ops, &reports);
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
        let run = self.peers[p].run.as_mut().expect("running");
        run.reported = reports.held.into_iter().map(|(id, _)| id).collect();
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
            self.dispatch(p, AppEvent::Engine(event));
        }
        self.offer_hook(p);
        self.presence_changes(p);
        self.check_bounds(p);
    }

    /// The process dies at `point` of a step: what the step had not dispatched yet is lost
    /// (after the commit, the store already holds its effects, and its terminal events with it).
    pub(super) fn crash_in_step(&mut self, p: usize, point: CrashPoint, out: StepOut) {
        self.counts.step_crashes[point as usize] += 1;
        self.trace(|w| format!("{} crashes inside a step, {point:?}", w.peers[p].name()));
        if point != CrashPoint::BeforeCommit {
            let name = self.peers[p].name().to_owned();
            let engine_events = out.events.iter().filter_map(|e| match e {
                AppEvent::Engine(event) => Some(event),
                AppEvent::Replayed(_) => None,
            });
            for event in engine_events.chain(&out.after) {
                if let Event::MessageReceived {
                    message,
                    chat,
                    sender,
                    ..
                } = event
                {
                    let key = InboundKey {
                        chat: chat.clone(),
                        sender: sender.clone(),
                        message_id: message.id.clone(),
                    };
                    self.ledger.on_received_lost(&name, &key);
                }
            }
        }
        self.crash(p);
    }

    pub(super) fn apply(&mut self, p: usize, cmd: Cmd, out: &mut StepOut) {
        let now = self.now;
        self.next_id += 1;
        let minted = format!("{}-m{}", self.peers[p].spec.alias, self.next_id);
        if self.verbose {
            let line = format!("{} <- {}", self.peers[p].name(), describe_cmd(&cmd));
            self.trace(|_| line);
        }
        let peer = &mut self.peers[p];
        let run = peer.run.as_mut().expect("running");
        let engine = &mut run.engine;
        match cmd {
            Cmd::Send(req) => {
                let delivered = req.id.as_ref().filter(|id| {
                    peer.store
                        .settled
                        .get(*id)
                        .is_some_and(|row| row.settlement == Settlement::Delivered)
                });
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
            Cmd::CarrierAnswer {
                id,
                send_seq,
                answer,
            } => engine.handle_relay_answer(&id, send_seq, answer, now),
            Cmd::Inbound { message, origin } => engine.handle_inbound(*message, origin, now),
            Cmd::DrainStarted => engine.handle_drain_started(Carrier::Relay, now),
            Cmd::DrainComplete { count } => {
                engine.handle_drain_complete(Carrier::Relay, count, now)
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
            out.events.push(AppEvent::Engine(event));
        }
    }

    /// The hook's verdict: what the engine reports with it follows the step's transmits.
    pub(super) fn hook_result(
        &mut self,
        p: usize,
        batch_id: u64,
        result: Result<(), String>,
        out: &mut StepOut,
    ) {
        let now = self.now;
        let run = self.peers[p].run.as_mut().expect("running");
        while let Some(event) = run.engine.poll_event() {
            out.events.push(AppEvent::Engine(event));
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

    /// Checks the step's ops against the ledger, then applies them and the terminal-event
    /// bookkeeping to the store.
    pub(super) fn commit(&mut self, p: usize, ops: &[StoreOp], reports: &Reports) {
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
        self.peers[p].store.commit(ops, reports);
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
                        FailReason::OutboxLifetimeExceeded => self.counts.failed_lifetime += 1,
                        FailReason::OutboxCapacityExceeded => self.counts.failed_capacity += 1,
                    }
                }
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

    /// Hands the next batch to the application's durability hook, which answers at random.
    pub(super) fn offer_hook(&mut self, p: usize) {
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

    pub(super) fn presence_changes(&mut self, p: usize) {
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

    /// The carrier could not take an outbox frame: the driver hears of it in its next step.
    pub(super) fn send_failed(
        &mut self,
        p: usize,
        id: String,
        send_seq: u64,
        reason: &'static str,
    ) {
        let now = self.now;
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
        TransmitKind::DeliveryAck { message } => format!(
            "ack of {} to {}",
            message.ack_for().unwrap_or_default(),
            message.recipient
        ),
        TransmitKind::ReleaseFrame { seq } => format!("hop ack {seq}"),
    };
    format!("{} {kind} (peer {:?})", t.carrier, t.peer)
}
