//! The network: relay connections as the client's relay task keeps them (connect with backoff,
//! `Authenticated`, answers correlated with the writes, loss of the connection), ordered relay
//! links with their faults, and local-carrier links between devices in range.

use super::*;

impl World {
    pub(super) fn schedule_connect(&mut self, p: usize, delay: Millis) {
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

    pub(super) fn connect(&mut self, p: usize, inc: u64) {
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
                groups: false,
                unanswered: BTreeSet::new(),
            });
        }
        self.trace(|_| format!("{name} connects as conn {conn}"));
        self.relay_writes(writes);
    }

    /// The client loses its connection: the carrier goes down, unanswered sends fail, and it
    /// reconnects with backoff. `tell_relay`: the relay sees the connection end too.
    pub(super) fn drop_session(&mut self, p: usize, tell_relay: bool) {
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
        if session.authenticated {
            if self.scn.encryption {
                let report = Command::Directory(DirectoryReport::Disconnected);
                self.peers[p].command(report, now);
            }
            self.peers[p].push(Input::CarrierDown(Carrier::Relay), now);
        }
        for (id, send_seq) in session.unanswered {
            self.send_failed(p, id, send_seq, "connection lost");
        }
        if tell_relay && self.relay.is_open(session.conn) {
            let writes = self.relay.disconnect(session.conn);
            self.relay_writes(writes);
        }
        let delay = if self.honest() {
            self.rng.range(0, 200)
        } else {
            backoff + self.rng.range(0, backoff / 4)
        };
        self.schedule_connect(p, delay);
    }

    /// Arrival times of one frame's copies (none when lost).
    pub(super) fn link_delays(&mut self, faults: LinkFaults, exempt: bool) -> Vec<Millis> {
        let base = self.rng.range(faults.latency.0, faults.latency.1);
        if self.honest() || exempt {
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

    pub(super) fn ordered(&mut self, conn: ConnId, to_relay: bool, exempt: bool, ev: Ev) {
        let delays = self.link_delays(self.scn.relay_link, exempt);
        for delay in delays {
            let last = self.fifo.entry((conn, to_relay)).or_insert(0);
            let at = (self.now + delay).max(*last);
            *last = at;
            self.schedule(at - self.now, ev.clone());
        }
    }

    pub(super) fn send_to_relay(&mut self, conn: ConnId, frame: ToRelay) {
        self.ordered(conn, true, false, Ev::ToRelay { conn, frame });
    }

    pub(super) fn send_group_to_relay(&mut self, conn: ConnId, frame: GroupFrame) {
        self.ordered(conn, true, false, Ev::GroupToRelay { conn, frame });
    }

    pub(super) fn relay_writes(&mut self, writes: Writes) {
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
    pub(super) fn client_frame(&mut self, p: usize, conn: ConnId, frame: ToClient) {
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
        let mut register = false;
        let encryption = self.scn.encryption;
        let directory = |report| directory_command(encryption, report);
        match frame {
            ToClient::Authenticated {
                mailbox,
                directory: offered,
                groups,
            } => {
                session.authenticated = true;
                session.groups = groups;
                register = groups;
                run.backoff_ms = SEC;
                if mailbox {
                    cmds.push(Input::DrainStarted(Carrier::Relay).into());
                }
                cmds.push(Input::CarrierUp(Carrier::Relay).into());
                cmds.extend(directory(DirectoryReport::Connected { directory: offered }));
                let list = run.engine.presence_watchlist();
                if !list.is_empty() {
                    watch = Some(list);
                }
            }
            ToClient::Published(held) => cmds.extend(directory(DirectoryReport::Published(held))),
            ToClient::KeyPackage { address, package } => {
                cmds.extend(directory(DirectoryReport::Package { address, package }))
            }
            ToClient::KeyPackageUnavailable { address } => {
                cmds.extend(directory(DirectoryReport::Unavailable { address }))
            }
            ToClient::Received {
                seq,
                sender,
                message,
            } => cmds.push(
                Input::Inbound {
                    message,
                    origin: InboundOrigin {
                        carrier: Carrier::Relay,
                        stamped_sender: sender.clone(),
                        sender_account: Some(sender),
                        seq,
                        sealed_by: None,
                    },
                }
                .into(),
            ),
            ToClient::Sent {
                message_id,
                tag: Some(send_seq),
                stored,
            } => {
                if session.unanswered.remove(&(message_id.clone(), send_seq)) {
                    let answer = if stored {
                        CarrierAnswer::Stored
                    } else {
                        CarrierAnswer::Live
                    };
                    cmds.push(
                        Input::Answer {
                            id: message_id,
                            send_seq,
                            answer,
                        }
                        .into(),
                    );
                }
            }
            ToClient::Unreachable {
                message_id,
                tag: Some(send_seq),
                cause,
            } => {
                if session.unanswered.remove(&(message_id.clone(), send_seq)) {
                    cmds.push(
                        Input::Answer {
                            id: message_id,
                            send_seq,
                            answer: CarrierAnswer::Unreachable(cause),
                        }
                        .into(),
                    );
                }
            }
            ToClient::Sent { tag: None, .. } | ToClient::Unreachable { tag: None, .. } => {}
            ToClient::DrainComplete { count } => cmds.push(
                Input::DrainComplete {
                    carrier: Carrier::Relay,
                    count,
                }
                .into(),
            ),
            ToClient::Presence { peer, online } => cmds.push(
                Input::Presence {
                    peer,
                    online,
                    last_seen_ms: None,
                }
                .into(),
            ),
            ToClient::GroupReady { group_id, ready } => {
                cmds.push(Input::GroupRelay { group_id, ready }.into())
            }
            ToClient::GroupError { message_id, reason } => {
                cmds.push(Input::GroupRefused { message_id, reason }.into())
            }
            ToClient::GroupReport(report) => cmds.push(Input::GroupReport(report).into()),
        }
        for cmd in cmds {
            peer.command(cmd, now);
        }
        if let Some(list) = watch {
            self.send_to_relay(conn, ToRelay::Watch(list));
        }
        if register {
            self.register_groups(p, conn);
        }
    }

    pub(super) fn link_active(&self, a: usize, b: usize) -> bool {
        let pair = (a.min(b), a.max(b));
        let up = |p: usize| self.peers[p].run.as_ref().is_some_and(|r| r.ble);
        self.in_range.contains(&pair) && up(a) && up(b)
    }

    /// Reports every change of the active links to the devices on both ends.
    pub(super) fn sync_links(&mut self) {
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
                    peer.push(
                        Input::NeighborDiscovered {
                            peer: name,
                            carrier: BLE.to_owned(),
                        },
                        now,
                    );
                } else if !active && known {
                    run.neighbors.remove(&y);
                    peer.push(
                        Input::NeighborLost {
                            peer: name,
                            carrier: BLE.to_owned(),
                        },
                        now,
                    );
                }
            }
        }
    }

    pub(super) fn send_local(&mut self, from: usize, to: usize, message: Message) {
        for delay in self.link_delays(self.scn.local_link, false) {
            let message = Box::new(message.clone());
            self.schedule(delay, Ev::Local { from, to, message });
        }
    }
}

/// A directory report for the driver, which only an encrypted world's driver listens to.
fn directory_command(encryption: bool, report: DirectoryReport) -> Option<Command> {
    encryption.then_some(Command::Directory(report))
}
