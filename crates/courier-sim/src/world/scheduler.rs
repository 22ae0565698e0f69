//! The scheduler: the actions it takes between ordinary moments (app traffic, disconnects,
//! relay and device crashes, local-carrier range, group messages and membership), process
//! starts and crashes, and the turn to the honest phase.

use super::*;

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
    /// A member sends to one of its groups.
    GroupSend,
    /// A group gains or loses a member: a new epoch.
    GroupMembership,
    /// The relay's roster of a group drifts from the real one until the next sync.
    GroupDrift,
}

impl Action {
    pub const ALL: [Action; 12] = [
        Self::Send,
        Self::Resend,
        Self::Disconnect,
        Self::RelayRestart,
        Self::Crash,
        Self::CrashInStep,
        Self::BleRange,
        Self::BleToggle,
        Self::Idle,
        Self::GroupSend,
        Self::GroupMembership,
        Self::GroupDrift,
    ];

    /// A seed's mix of the actions before the group ones, in the order of `ALL` (the group
    /// actions' weights are the seed's `GroupWorld::weights`, zero without groups).
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

impl World {
    pub(super) fn chaos(&mut self) {
        if self.honest() {
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
            (Action::GroupSend, Some(p)) => self.group_send_action(p),
            (Action::GroupMembership, _) => self.group_membership_action(),
            (Action::GroupDrift, _) => self.group_drift_action(),
            (Action::BleToggle, Some(p)) if self.peers[p].has_ble => {
                let now = self.now;
                let peer = &mut self.peers[p];
                let run = peer.run.as_mut().expect("running");
                let carrier = Carrier::Local(BLE.to_owned());
                if run.ble {
                    run.ble = false;
                    run.neighbors.clear();
                    peer.push(Input::CarrierDown(carrier), now);
                } else {
                    run.ble = true;
                    peer.push(Input::CarrierUp(carrier), now);
                }
                self.sync_links();
            }
            _ => {}
        }
        let gap = self.chaos_gap();
        self.schedule(gap, Ev::Chaos);
    }

    pub(super) fn app_send(&mut self, p: usize) {
        let others: Vec<usize> = (0..self.peers.len()).filter(|&q| q != p).collect();
        let recipient = if self.rng.chance(30) {
            self.scn.ghost.clone()
        } else {
            self.peers[*self.rng.pick(&others)].name().to_owned()
        };
        let content_type = if self.rng.chance(100) {
            ContentType::FileChunk
        } else {
            ContentType::Text
        };
        let priority = *self.rng.pick(&PRIORITIES);
        // An app-chosen id half the time; otherwise one the runtime mints, as the client does.
        let app_chosen = self.rng.chance(500);
        self.next_id += 1;
        let tag = if app_chosen { "c" } else { "m" };
        let id = format!("{}-{tag}{}", self.peers[p].spec.alias, self.next_id);
        let len = self.rng.range(1, 120) as usize;
        let content = if self.rng.chance(20) {
            POISON.to_owned()
        } else {
            "x".repeat(len)
        };
        let req = SendRequest {
            id: id.clone(),
            settled: None,
            recipient,
            content,
            content_type,
            priority,
            metadata: BTreeMap::new(),
            binary_content: None,
            media: None,
            rich: Default::default(),
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
        if app_chosen {
            peer.app.owed.insert(id, req.clone());
        }
        peer.push(Input::Send(req), now);
    }

    /// Round `round` of the probes: every device sends one message of the round's priority, to
    /// the device `round + 1` places on (so each device gets one probe per round).
    pub(super) fn probe(&mut self, round: usize) {
        let n = self.peers.len();
        let shift = 1 + round % (n - 1);
        let priority = PRIORITIES[round];
        for p in 0..n {
            let id = format!("{}-probe-{round}", self.peers[p].spec.alias);
            let req = SendRequest {
                id: id.clone(),
                settled: None,
                recipient: self.peers[(p + shift) % n].name().to_owned(),
                content: format!("probe {priority:?}"),
                content_type: ContentType::Text,
                priority,
                metadata: BTreeMap::new(),
                binary_content: None,
                media: None,
                rich: Default::default(),
            };
            self.counts.sends += 1;
            self.trace(|w| format!("{} probes {} with {id}", w.peers[p].name(), req.recipient));
            let name = self.peers[p].name().to_owned();
            self.probes.get_or_insert_with(Vec::new).push((name, id));
            let now = self.now;
            self.peers[p].push(Input::Send(req), now);
        }
    }

    /// The app sends again under one of its own ids: a no-op while the message is in the
    /// outbox or once it was delivered, a new message after it failed.
    pub(super) fn app_resend(&mut self, p: usize) {
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
            id: id.clone(),
            settled: None,
            recipient,
            content: "again".to_owned(),
            content_type: ContentType::Text,
            priority: Priority::Medium,
            metadata: BTreeMap::new(),
            binary_content: None,
            media: None,
            rich: Default::default(),
        };
        self.trace(|_| format!("{name} app sends {id} again"));
        let now = self.now;
        let peer = &mut self.peers[p];
        peer.app.owed.insert(id, req.clone());
        peer.push(Input::Send(req), now);
    }

    /// Starts the device's process from its store (also the first start, from an empty one),
    /// which emits the terminal events still held there again.
    pub(super) fn restart(&mut self, p: usize) {
        if self.peers[p].run.is_some() {
            return;
        }
        let now = self.now;
        let peer = &mut self.peers[p];
        let config = peer.spec.config.clone();
        let mut engine = Engine::new(config.clone(), peer.spec.name.clone());
        let restore = Restore {
            processed: peer.store.load_processed(
                now,
                config.dedup_retention_ms(),
                config.dedup_max_entries,
            ),
            controls: peer.store.load_controls(now),
            outbox: peer.store.load_outbox(),
            inbound: peer.store.load_pending(),
            group_sends: peer.store.load_group_sends(),
        };
        engine.handle(Input::Restore(restore), now);
        let e2e = peer.spec.identity.clone().map(|identity| {
            let e2e = E2e::restore(identity, &peer.store, &config.app_id);
            for recipient in e2e.ready() {
                engine.handle(Input::SessionReady { recipient }, now);
            }
            e2e
        });
        let mut run = Running {
            engine,
            e2e,
            inbox: Vec::new(),
            refeed: Vec::new(),
            step_at: Some(now),
            session: None,
            connecting: false,
            backoff_ms: SEC,
            ble: false,
            neighbors: BTreeSet::new(),
            crash_at: None,
            steps_at: (now, 0),
            replays: peer
                .store
                .unreported()
                .into_iter()
                .map(|(_, e)| e)
                .collect(),
            reported: Vec::new(),
            unwritten: BTreeMap::new(),
        };
        if peer.has_ble {
            run.ble = true;
            run.inbox
                .push(Input::CarrierUp(Carrier::Local(BLE.to_owned())).into());
        }
        peer.run = Some(run);
        let owed: Vec<SendRequest> = peer.app.owed.values().cloned().collect();
        for req in owed {
            if self.honest() || self.rng.chance(700) {
                self.peers[p].push(Input::Send(req), now);
            } else {
                self.peers[p].app.owed.remove(&req.id);
            }
        }
        self.trace(|w| format!("{} starts", w.peers[p].name()));
        self.sync_links();
        let delay = self.rng.range(0, 300);
        self.schedule_connect(p, delay);
    }

    pub(super) fn crash(&mut self, p: usize) {
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
        if self.honest() {
            self.restart(p);
        } else {
            let down = self.rng.range(50, 60 * SEC);
            self.schedule(down, Ev::Restart { peer: p });
        }
    }

    pub(super) fn turn_honest(&mut self) {
        self.honest_since = Some(self.now);
        self.trace(|_| "the world turns honest".into());
        self.relay.up = true;
        self.sync_groups();
        for p in 0..self.peers.len() {
            self.restart(p);
            let now = self.now;
            let peer = &mut self.peers[p];
            let run = peer.run.as_mut().expect("restarted");
            run.crash_at = None;
            if peer.has_ble && !run.ble {
                run.ble = true;
                peer.push(Input::CarrierUp(Carrier::Local(BLE.to_owned())), now);
            }
        }
        self.sync_links();
        self.reconnect_all();
        let longest = self
            .peers
            .iter()
            .map(|p| {
                let c = &p.spec.config;
                let retention = c.durability_hook.as_ref().map_or(0, |d| d.retention_ms);
                let pending = if c.encryption {
                    c.pending_session_max_lifetime_ms
                } else {
                    0
                };
                c.absolute_lifetime_ms()
                    .max(retention.min(HOUR))
                    .max(pending)
            })
            .max()
            .unwrap_or(0);
        self.deadline = self.now + longest + 2 * HOUR;
    }

    /// Every connection is cut and made again: what a frame lost on a connection left
    /// behind is redelivered on the next one. A device still backing off from a failed connect
    /// of the chaos connects now too: the honest world keeps nobody off the relay.
    pub(super) fn reconnect_all(&mut self) {
        for p in 0..self.peers.len() {
            let inc = self.peers[p].incarnation;
            if let Some(run) = self.peers[p].run.as_mut() {
                run.backoff_ms = SEC;
                if run.session.is_some() {
                    self.drop_session(p, true);
                } else if run.connecting {
                    let delay = self.rng.range(0, 200);
                    self.schedule(delay, Ev::Connect { peer: p, inc });
                }
            }
        }
    }
}
