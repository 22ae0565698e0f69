//! Chat groups in the world (`docs/delivery.md#group-sends`): rosters that change between sends,
//! group messages sent by their members, the driver's side of the relay's group delivery
//! (registration per connection, broadcasts, reports and refusals), received group messages
//! opened before the engine sees them, the relay's roster lagging the real one, and the faults
//! of a broadcast's report.
//!
//! MLS is modelled minimally. A group's roster changes in epochs, instantly for every member
//! (the commits and Welcomes that carry them are tested elsewhere); a message is sealed for the
//! roster of the epoch it was sent in, which is what its sender hands the engine, and only a
//! member of that epoch can open it: a member added later, or one removed before, that the
//! relay's lagging roster still reaches drops it unopened. Sealing is a reversible transform
//! (the epoch and the content behind the `__MLS_GROUP__` prefix), the same in every world, so
//! the receivers' paths are the same as with real group crypto: a copy addressed to another
//! device is not opened, and an opened message is attributed to its sender as a sealed one is.

use courier_engine::step::Step;
use courier_engine::{GroupPath, GroupReport, GroupSendRequest, MemberState};
use courier_proto::message::{META_GROUP_COPY, META_GROUP_ID, META_GROUP_MESSAGE};
use courier_proto::{group_copy_id, wire_id};

use super::checks::OutboxView;
use crate::ledger::Ledger;
use crate::relay::Carried;
use crate::scenario::GroupWorld;
use crate::store::GroupRow;

use super::*;

/// What a sealed group message's content starts with (`docs/protocol.md#group-messages`).
const SEALED: &str = "__MLS_GROUP__";
/// Hops a group message may take (the engine's default for a direct message).
const TTL: u8 = 10;

/// One chat group: its roster at each epoch, the last being the current one.
pub(super) struct GroupState {
    pub id: String,
    epochs: Vec<BTreeSet<usize>>,
}

impl GroupState {
    pub(super) fn new(id: String, members: BTreeSet<usize>) -> Self {
        Self {
            id,
            epochs: vec![members],
        }
    }

    fn roster(&self) -> &BTreeSet<usize> {
        self.epochs.last().expect("a group has a first epoch")
    }
}

/// Seals `content` in `epoch` of a group.
fn seal(epoch: usize, content: &str) -> String {
    format!("{SEALED}{epoch}:{content}")
}

/// (epoch, content) of a sealed group message.
fn unseal(sealed: &str) -> Option<(usize, &str)> {
    let (epoch, content) = sealed.strip_prefix(SEALED)?.split_once(':')?;
    Some((epoch.parse().ok()?, content))
}

/// Whether `message` is a group message as carriers see it: a broadcast or a per-member copy.
pub(super) fn is_sealed_group(message: &Message) -> bool {
    message.metadata.contains_key(META_GROUP_ID) && message.content.starts_with(SEALED)
}

/// Whether an outbox row or frame is a group message's per-member copy.
pub(super) fn is_copy(message: &Message) -> bool {
    message.metadata.contains_key(META_GROUP_MESSAGE)
}

/// What the relay does with one broadcast's report (`scenario::ReportFaults`).
#[derive(Debug, Clone, Copy)]
enum Fate {
    OnTime,
    Lost,
    Late,
    AfterWait,
    Refused,
    Disconnect,
    Crash,
}

impl World {
    /// The roster of group `g` now, by address.
    fn roster_names(&self, g: usize) -> BTreeSet<String> {
        self.groups[g]
            .roster()
            .iter()
            .map(|&q| self.peers[q].name().to_owned())
            .collect()
    }

    /// The app of device `p` sends a message to group `g`, which it is a member of: sealed for
    /// the current epoch's roster, which it hands the engine without itself.
    pub(super) fn app_group_send(&mut self, p: usize, g: usize, probe: bool) {
        let Some(world) = self.scn.groups.as_ref() else {
            return;
        };
        let broadcast = world.broadcast[p];
        let name = self.peers[p].name().to_owned();
        let group = &self.groups[g];
        let epoch = group.epochs.len() - 1;
        let group_id = group.id.clone();
        let roster: BTreeSet<String> = group
            .roster()
            .iter()
            .filter(|&&q| q != p)
            .map(|&q| self.peers[q].name().to_owned())
            .collect();
        self.next_id += 1;
        let alias = &self.peers[p].spec.alias;
        let id = if probe {
            format!("{alias}-gprobe-{group_id}")
        } else {
            format!("{alias}-g{}", self.next_id)
        };
        let wire = wire_id(&id);
        let content = if !probe && self.rng.chance(20) {
            POISON.to_owned()
        } else {
            "g".repeat(self.rng.range(1, 120) as usize)
        };
        let metadata = BTreeMap::from([
            (META_GROUP_ID.to_owned(), group_id.clone()),
            (META_GROUP_MESSAGE.to_owned(), wire.clone()),
        ]);
        let message = Message {
            id: wire.clone(),
            sender: name.clone(),
            recipient: group_id.clone(),
            app_id: self.peers[p].spec.config.app_id.clone(),
            priority: *self.rng.pick(&PRIORITIES),
            ttl: TTL,
            hop_count: 0,
            timestamp: self.now,
            lamport_clock: 0,
            content_type: ContentType::Text,
            content: seal(epoch, &content),
            metadata,
            requires_ack: false,
            reply_to_msg: None,
            rich: None,
            binary_content: None,
            media_metadata: None,
            forwarded_from: None,
            reply_context: None,
            encrypted: None,
        };
        self.ledger
            .on_group_send(&name, &id, &group_id, &wire, roster.clone(), probe);
        self.counts.group_sends += 1;
        self.trace(|_| {
            format!("{name} app sends {id:?} to {group_id} (epoch {epoch}, {roster:?}, broadcast: {broadcast})")
        });
        let request = GroupSendRequest {
            id,
            group_id,
            members: roster.into_iter().collect(),
            message,
            broadcast,
        };
        let now = self.now;
        self.peers[p].push(Input::GroupSend(Box::new(request)), now);
    }

    /// A chaos action: device `p` sends to one of its groups.
    pub(super) fn group_send_action(&mut self, p: usize) {
        let mine: Vec<usize> = (0..self.groups.len())
            .filter(|&g| self.groups[g].roster().contains(&p))
            .collect();
        if !mine.is_empty() {
            let g = *self.rng.pick(&mine);
            self.app_group_send(p, g, false);
        }
    }

    /// A chaos action: a group gains a member or loses one (never below two), a new epoch; the
    /// relay's roster follows after a lag, and an added device registers on its connection.
    pub(super) fn group_membership_action(&mut self) {
        if self.groups.is_empty() {
            return;
        }
        let g = self.rng.index(self.groups.len());
        let mut roster = self.groups[g].roster().clone();
        let outside: Vec<usize> = (0..self.peers.len())
            .filter(|q| !roster.contains(q))
            .collect();
        let added = if outside.is_empty() || (roster.len() > 2 && self.rng.chance(500)) {
            let inside: Vec<usize> = roster.iter().copied().collect();
            if inside.len() <= 2 {
                return;
            }
            let q = *self.rng.pick(&inside);
            roster.remove(&q);
            None
        } else {
            let q = *self.rng.pick(&outside);
            roster.insert(q);
            Some(q)
        };
        self.groups[g].epochs.push(roster);
        self.counts.group_roster_changes += 1;
        self.trace(|w| {
            format!(
                "{} is now {:?} (epoch {})",
                w.groups[g].id,
                w.roster_names(g),
                w.groups[g].epochs.len() - 1
            )
        });
        if let Some(q) = added {
            let group_id = self.groups[g].id.clone();
            if let Some(conn) = self.group_session(q) {
                self.send_group_to_relay(conn, GroupFrame::Register { group_id });
            }
        }
        let lag = self.rng.range(0, self.group_world().roster_lag_ms);
        self.schedule(lag, Ev::GroupSync { group: g });
    }

    /// A chaos action: the relay's roster of a group drifts from the real one — a member
    /// missing, or a device that is not (or no longer) one — until the next sync.
    pub(super) fn group_drift_action(&mut self) {
        if self.groups.is_empty() {
            return;
        }
        let g = self.rng.index(self.groups.len());
        let group_id = self.groups[g].id.clone();
        let mut roster = self.relay.group_roster(&group_id);
        let q = self.rng.index(self.peers.len());
        let name = self.peers[q].name().to_owned();
        if !roster.remove(&name) {
            roster.insert(name);
        }
        self.counts.group_drifts += 1;
        self.trace(|_| format!("the relay's roster of {group_id} drifts to {roster:?}"));
        let writes = self.relay.set_group_roster(&group_id, roster);
        self.relay_writes(writes);
    }

    /// The relay's roster of group `g` catches up with the real one.
    pub(super) fn group_sync(&mut self, g: usize) {
        let names = self.roster_names(g);
        let writes = self.relay.set_group_roster(&self.groups[g].id, names);
        self.relay_writes(writes);
    }

    /// Every relay roster is the real one (as the world starts, and once it turns honest).
    pub(super) fn sync_groups(&mut self) {
        for g in 0..self.groups.len() {
            self.group_sync(g);
        }
    }

    fn group_world(&self) -> &GroupWorld {
        self.scn.groups.as_ref().expect("a world with groups")
    }

    /// Device `q`'s authenticated connection to a relay that offers group delivery.
    fn group_session(&self, q: usize) -> Option<ConnId> {
        self.peers[q]
            .run
            .as_ref()?
            .session
            .as_ref()
            .filter(|s| s.authenticated && s.groups)
            .map(|s| s.conn)
    }

    /// The relay offered group delivery on `conn`: device `p` asks about every group it is in.
    pub(super) fn register_groups(&mut self, p: usize, conn: ConnId) {
        let mine: Vec<String> = self
            .groups
            .iter()
            .filter(|g| g.roster().contains(&p))
            .map(|g| g.id.clone())
            .collect();
        for group_id in mine {
            self.send_group_to_relay(conn, GroupFrame::Register { group_id });
        }
    }

    /// A group frame reaches the relay: a registration, answered (refused now and then while
    /// the chaos lasts), or a broadcast, journaled and reported subject to the seed's faults.
    pub(super) fn relay_group_frame(&mut self, conn: ConnId, frame: GroupFrame) {
        let honest = self.honest();
        let faults = self
            .scn
            .groups
            .as_ref()
            .map(|w| (w.registration_refused, w.report));
        let Some((registration_refused, report)) = faults else {
            return;
        };
        match frame {
            GroupFrame::Register { group_id } => {
                let refused = !honest && self.rng.chance(registration_refused);
                if refused {
                    self.counts.group_registrations_refused += 1;
                }
                let writes = self.relay.group_register(conn, group_id, refused);
                self.relay_writes(writes);
            }
            GroupFrame::Send { group_id, message } => {
                let fate = if honest {
                    Fate::OnTime
                } else {
                    let fates = [
                        (Fate::Lost, report.lost),
                        (Fate::Late, report.late),
                        (Fate::AfterWait, report.after_wait),
                        (Fate::Refused, report.refused),
                        (Fate::Disconnect, report.disconnect),
                        (Fate::Crash, report.crash),
                    ];
                    let faulty: u32 = fates.iter().map(|(_, w)| w).sum();
                    let weights: Vec<u32> = fates
                        .iter()
                        .map(|(_, w)| *w)
                        .chain([1000u32.saturating_sub(faulty)])
                        .collect();
                    fates
                        .get(self.rng.weighted(&weights))
                        .map_or(Fate::OnTime, |(fate, _)| *fate)
                };
                let refused = matches!(fate, Fate::Refused);
                let id = message.id.clone();
                let (writes, report) = self
                    .relay
                    .group_send(conn, group_id, *message, refused, self.now);
                self.relay_writes(writes);
                self.trace(|_| format!("relay broadcasts {id}: {fate:?}, {report:?}"));
                let Some(report) = report else {
                    self.counts.group_refusals += u64::from(refused);
                    return;
                };
                let Some(owner) = self.conn_owner.get(&conn).copied() else {
                    return;
                };
                let delay = match fate {
                    Fate::Lost => {
                        self.counts.group_reports_lost += 1;
                        return;
                    }
                    Fate::Late => {
                        self.counts.group_reports_late += 1;
                        self.rng.range(2 * SEC, 45 * SEC)
                    }
                    Fate::AfterWait => {
                        self.counts.group_reports_after_wait += 1;
                        self.rng.range(61 * SEC, 150 * SEC)
                    }
                    Fate::OnTime | Fate::Refused | Fate::Disconnect | Fate::Crash => {
                        self.rng.range(5, 2 * SEC)
                    }
                };
                let restarts = self.counts.relay_restarts;
                self.schedule(
                    delay,
                    Ev::GroupReport {
                        conn,
                        peer: owner,
                        restarts,
                        report,
                    },
                );
                match fate {
                    Fate::Disconnect => {
                        self.counts.group_sender_disconnects += 1;
                        self.counts.disconnects += 1;
                        self.trace(|w| format!("{} disconnected", w.peers[owner].name()));
                        self.drop_session(owner, true);
                    }
                    Fate::Crash => {
                        self.counts.group_sender_crashes += 1;
                        self.crash(owner);
                    }
                    _ => {}
                }
            }
        }
    }

    /// A broadcast's report is due at the relay: written to the sender's connection, or held
    /// for its next one; gone if the relay restarted since the broadcast (`restarts` then).
    pub(super) fn group_report_due(
        &mut self,
        conn: ConnId,
        peer: usize,
        restarts: u64,
        report: GroupReport,
    ) {
        if !self.relay.up || self.counts.relay_restarts != restarts {
            return;
        }
        let account = self.peers[peer].name().to_owned();
        let writes = self.relay.group_report(conn, &account, report);
        self.relay_writes(writes);
    }

    /// A group message from a carrier, opened before the engine sees it
    /// (`docs/delivery.md#received-group-messages`). A copy a neighbor hands over for another
    /// device is not this device's to open; a message of an epoch this device was not in does
    /// not open and is dropped (its relay frame released).
    pub(super) fn open_group(
        &mut self,
        p: usize,
        engine: &mut Engine,
        step: &mut Step<AppEvent>,
        message: Message,
        origin: InboundOrigin,
    ) {
        let now = self.now;
        let name = self.peers[p].name().to_owned();
        let inbound = |message: Message, origin: InboundOrigin| Input::Inbound {
            message: Box::new(message),
            origin,
        };
        let group_id = message.metadata.get(META_GROUP_ID).cloned();
        let logical = message.metadata.get(META_GROUP_MESSAGE).cloned();
        let (Some(group_id), Some(logical)) = (group_id, logical) else {
            step.apply(engine, inbound(message, origin), now);
            return;
        };
        let copy = message.id != logical;
        if copy && message.recipient != name {
            step.apply(engine, inbound(message, origin), now);
            return;
        }
        let member = unseal(&message.content).and_then(|(epoch, content)| {
            let group = self.groups.iter().find(|g| g.id == group_id)?;
            group
                .epochs
                .get(epoch)
                .is_some_and(|roster| roster.contains(&p))
                .then(|| content.to_owned())
        });
        let Some(content) = member else {
            self.counts.group_unreadable += 1;
            if let (Carrier::Relay, Some(seq)) = (&origin.carrier, origin.seq) {
                self.ledger.on_unopened(&name, seq);
            }
            let reason = format!(
                "dropped {} from {}: sealed in an epoch of {group_id} this device is not in",
                message.id, message.sender
            );
            step.apply(engine, Input::Discard { origin, reason }, now);
            return;
        };
        let mut opened = message;
        if copy {
            opened
                .metadata
                .insert(META_GROUP_COPY.to_owned(), opened.id.clone());
        }
        opened.metadata.remove(META_GROUP_MESSAGE);
        opened.id = logical;
        opened.recipient = group_id;
        opened.content = content;
        opened.requires_ack = copy;
        let origin = InboundOrigin {
            sealed_by: Some(opened.sender.clone()),
            ..origin
        };
        step.apply(engine, inbound(opened, origin), now);
    }

    /// The group probes of the quiet honest world, after the direct ones: (member, group) for
    /// every member of every group.
    pub(super) fn group_probes(&self) -> Vec<(usize, usize)> {
        (0..self.groups.len())
            .flat_map(|g| self.groups[g].roster().iter().map(move |&p| (p, g)))
            .collect()
    }
}

/// The group tracker rows of one device as a commit's ops leave them so far.
pub(super) struct GroupView<'s> {
    store: &'s BTreeMap<String, GroupRow>,
    rows: BTreeMap<String, ViewRow>,
}

/// A tracker row in the view.
struct ViewRow {
    members: BTreeMap<String, MemberState>,
    /// A broadcast awaiting its report.
    awaiting: bool,
    done: bool,
}

impl ViewRow {
    fn of(row: &GroupRow) -> Self {
        Self {
            members: row.record.members.clone(),
            awaiting: awaiting(&row.record.path),
            done: row.done,
        }
    }
}

fn awaiting(path: &GroupPath) -> bool {
    matches!(path, GroupPath::Broadcast { .. })
}

impl<'s> GroupView<'s> {
    pub(super) fn new(store: &'s BTreeMap<String, GroupRow>) -> Self {
        Self {
            store,
            rows: BTreeMap::new(),
        }
    }

    /// Row `id`, loaded into the view.
    fn row(&mut self, id: &str) -> Option<&mut ViewRow> {
        if !self.rows.contains_key(id) {
            let row = ViewRow::of(self.store.get(id)?);
            self.rows.insert(id.to_owned(), row);
        }
        self.rows.get_mut(id)
    }

    /// Group messages not done, each one regular entry against the outbox bound: those the
    /// commit found and those it put. A done mark of the commit does not count yet: an evicted
    /// group message is marked done before its last copy's settlement.
    pub(super) fn active(&self) -> usize {
        let stored = self.store.values().filter(|row| !row.done).count();
        let new = self
            .rows
            .keys()
            .filter(|id| !self.store.contains_key(*id))
            .count();
        stored + new
    }

    fn awaiting_reports(&self) -> usize {
        let stored = self
            .store
            .iter()
            .filter(|(id, row)| {
                !row.done && !self.rows.contains_key(*id) && awaiting(&row.record.path)
            })
            .count();
        let viewed = self.rows.values().filter(|r| r.awaiting && !r.done).count();
        stored + viewed
    }
}

/// Messages awaiting a relay report at once, at most (`docs/delivery.md#report-and-backstop`).
const MAX_PENDING_REPORTS: usize = 64;

/// The checks of a device's group ops as its commit applies them, with what they need of the
/// world (the device's own store is borrowed by the views meanwhile).
pub(super) struct GroupChecks<'w> {
    pub ledger: &'w mut Ledger,
    pub counts: &'w mut Counts,
    pub relay: &'w Relay,
    /// The committing device.
    pub name: &'w str,
}

impl GroupChecks<'_> {
    /// One group op of the commit, checked against what the relay did, then applied to the
    /// view. `settles`: every settlement of the commit, by id (a copy's settles in the same
    /// commit as its member's state, in either order); `done_now`: the group messages the
    /// commit marks done.
    pub(super) fn op(
        &mut self,
        op: &StoreOp,
        settles: &BTreeMap<&str, &Settlement>,
        done_now: &BTreeSet<&str>,
        view: &mut GroupView<'_>,
    ) {
        let name = self.name.to_owned();
        match op {
            StoreOp::PutGroupSend(record) => {
                self.ledger.on_group_put(&name, record);
                match view.row(&record.id) {
                    Some(row) => {
                        row.members.extend(record.members.clone());
                        row.awaiting = awaiting(&record.path);
                    }
                    None => {
                        let row = ViewRow {
                            members: record.members.clone(),
                            awaiting: awaiting(&record.path),
                            done: false,
                        };
                        view.rows.insert(record.id.clone(), row);
                    }
                }
                if view.awaiting_reports() > MAX_PENDING_REPORTS {
                    violated(format!(
                        "{name} has {} broadcasts awaiting a report (at most {MAX_PENDING_REPORTS})",
                        view.awaiting_reports()
                    ));
                }
            }
            StoreOp::GroupMember { id, member, state } => {
                let Some(row) = view.row(id) else {
                    violated(format!("{name} set {member} of {id}, which has no row"));
                };
                let Some(before) = row.members.get(member).copied() else {
                    violated(format!(
                        "{name} set {member} of {id}, who is not in its roster"
                    ));
                };
                let legal = matches!(
                    (before, state),
                    (MemberState::Pending, _)
                        | (
                            MemberState::Stored,
                            MemberState::Delivered | MemberState::Failed
                        )
                );
                if !legal {
                    violated(format!(
                        "{name} moved {member} of {id} from {before:?} to {state:?}"
                    ));
                }
                row.members.insert(member.clone(), *state);
                self.member(id, member, *state, settles, done_now);
            }
            StoreOp::GroupSendDone { id } => {
                self.ledger.on_group_done(&name, id);
                let Some(row) = view.row(id) else {
                    violated(format!("{name} marked {id} done, which has no row"));
                };
                let pending: Vec<&String> = row
                    .members
                    .iter()
                    .filter(|(_, s)| **s == MemberState::Pending)
                    .map(|(m, _)| m)
                    .collect();
                if !pending.is_empty() {
                    violated(format!(
                        "{name} marked {id} done with {pending:?} still pending"
                    ));
                }
                row.done = true;
            }
            _ => {}
        }
    }

    /// After the commit: a group message marked done has no copy left in the outbox (a copy's
    /// settlement may follow its message's done mark among the commit's ops).
    pub(super) fn done(&self, done_now: &BTreeSet<&str>, outbox: &OutboxView<'_>) {
        for id in done_now {
            let Some(sent) = self
                .ledger
                .groups
                .get(&(self.name.to_owned(), (*id).to_owned()))
            else {
                continue;
            };
            let copies: Vec<&str> = outbox
                .rows()
                .filter(|r| r.message.metadata.get(META_GROUP_MESSAGE) == Some(&sent.wire_id))
                .map(|r| r.message.id.as_str())
                .collect();
            if !copies.is_empty() {
                violated(format!(
                    "{} marked {id} done with copies {copies:?} still in its outbox",
                    self.name
                ));
            }
        }
    }

    /// A member's new state: delivered by its copy's ACK (it processed the message) or by the
    /// relay's report (the relay wrote it to its live connection); stored by the relay's custody
    /// of its copy or the report (the relay journaled it for it); failed by its copy's failure
    /// or with its whole group message.
    fn member(
        &mut self,
        id: &str,
        member: &str,
        state: MemberState,
        settles: &BTreeMap<&str, &Settlement>,
        done_now: &BTreeSet<&str>,
    ) {
        let name = self.name.to_owned();
        let Some(sent) = self.ledger.groups.get(&(name.clone(), id.to_owned())) else {
            violated(format!("{name} set {member} of {id}, which it never sent"));
        };
        let key = InboundKey {
            chat: sent.group.clone(),
            sender: name.clone(),
            message_id: sent.wire_id.clone(),
        };
        let copy_id = group_copy_id(&sent.wire_id, member);
        let settled = settles.get(copy_id.as_str()).copied();
        let log = &self.relay.group_log;
        match state {
            MemberState::Delivered if settled == Some(&Settlement::Delivered) => {
                self.counts.group_members_acked += 1;
            }
            MemberState::Delivered => {
                if !log.did(member, &key, Carried::Live) {
                    violated(format!(
                        "{name} marked {member} delivered for {id} without its copy's ACK, but the relay never wrote it to {member}'s connection"
                    ));
                }
                self.counts.group_members_reported += 1;
            }
            MemberState::Stored => {
                if !log.did(member, &key, Carried::Journaled) {
                    violated(format!(
                        "{name} marked {member} stored for {id}, but the relay never journaled it for {member}"
                    ));
                }
                self.counts.group_members_stored += 1;
            }
            MemberState::Failed => {
                let copy_failed = matches!(settled, Some(Settlement::Failed(_)));
                if !copy_failed && !done_now.contains(id) {
                    violated(format!(
                        "{name} marked {member} failed for {id}, though its copy did not fail and the message was not evicted"
                    ));
                }
                self.counts.group_members_failed += 1;
            }
            MemberState::Pending => {
                violated(format!("{name} set {member} of {id} back to pending"))
            }
        }
    }
}

impl World {
    /// The sender settled copy `copy_id` as delivered: its member processed the group message
    /// (durably, and with a hook its application committed it).
    pub(super) fn check_copy_delivered(&self, sender: &str, copy_id: &str) {
        let copy = self.ledger.copy(sender, copy_id).expect("a copy");
        let key = self
            .ledger
            .copy_key(copy_id)
            .cloned()
            .expect("a copy's key");
        let Some(q) = self.scn.index_of(&copy.member) else {
            violated(format!(
                "{sender}'s copy {copy_id} went to {}, who does not exist",
                copy.member
            ));
        };
        let peer = &self.peers[q];
        if !peer.store.is_processed(&key) {
            violated(format!(
                "{sender} saw its copy of {} delivered to {}, who has not processed it",
                copy.group_message, copy.member
            ));
        }
        if peer.spec.hook.is_some() && !peer.app.hook_store.contains(&key) {
            violated(format!(
                "{sender} saw its copy of {} delivered to {}, whose application never committed it",
                copy.group_message, copy.member
            ));
        }
    }

    /// Exactly one member event per copy settlement: a copy's settlement is reported as its
    /// member's state, never as `message_delivered` / `message_failed`, and no event of the app
    /// names a copy.
    pub(super) fn check_group_events(&self, p: usize, ops: &[StoreOp], events: &[&Event]) {
        let name = self.peers[p].name();
        let mut expected: BTreeMap<(String, String), MemberState> = BTreeMap::new();
        for op in ops {
            if let StoreOp::Settle { id, settlement, .. } = op {
                if let Some(copy) = self.ledger.copy(name, id) {
                    let state = match settlement {
                        Settlement::Delivered => MemberState::Delivered,
                        Settlement::Failed(_) => MemberState::Failed,
                    };
                    expected.insert((copy.group_message.clone(), copy.member.clone()), state);
                }
            }
        }
        let written: Vec<(&str, &str, MemberState)> = ops
            .iter()
            .filter_map(|op| match op {
                StoreOp::GroupMember { id, member, state } => {
                    Some((id.as_str(), member.as_str(), *state))
                }
                _ => None,
            })
            .collect();
        let mut seen: BTreeMap<(String, String), u32> = BTreeMap::new();
        for event in events {
            match event {
                Event::GroupMemberStatus {
                    message_id,
                    member,
                    state,
                    ..
                } => {
                    if !written.contains(&(message_id.as_str(), member.as_str(), *state)) {
                        violated(format!(
                            "{name} reported {member} {state:?} for {message_id} without committing it"
                        ));
                    }
                    let key = (message_id.clone(), member.clone());
                    if expected.get(&key) == Some(state) {
                        *seen.entry(key).or_default() += 1;
                    }
                }
                Event::MessageSent { message_id, .. }
                | Event::MessageDeferred { message_id, .. }
                | Event::MessageStored { message_id, .. }
                | Event::MessageUndeliverable { message_id, .. }
                | Event::MessageRetrying { message_id, .. }
                | Event::MessageDelivered { message_id, .. }
                | Event::MessageFailed { message_id, .. }
                    if self.ledger.copy(name, message_id).is_some() =>
                {
                    violated(format!(
                        "{name}'s application saw an event of copy {message_id}: {event:?}"
                    ));
                }
                _ => {}
            }
        }
        for (key, state) in expected {
            let count = seen.get(&key).copied().unwrap_or(0);
            if count != 1 {
                violated(format!(
                    "{name} settled its copy of {} for {} as {state:?} with {count} member events",
                    key.0, key.1
                ));
            }
        }
    }

    /// Whether device `q`'s application has the group message `key` (without a hook: it was
    /// dispatched, or processed and its dispatch lost in a crash, counted).
    fn group_received(&mut self, q: usize, key: &InboundKey) -> bool {
        let peer = &self.peers[q];
        if peer.spec.hook.is_some() {
            return peer.app.hook_store.contains(key);
        }
        match self.ledger.inbound(peer.name(), key) {
            Some(seen) if seen.dispatched == 1 => true,
            Some(seen) if seen.dispatch_lost => {
                self.counts.at_most_once_losses += 1;
                true
            }
            _ => false,
        }
    }

    /// At the end: every group message's tracker is done with no member pending and no
    /// tracker active in an engine; every member the matrix says was reached has the message
    /// (what the relay reported delivered or stored, what acknowledged its copy) unless the
    /// model allows its loss — a frame the relay wrote live without a mailbox (lost on the
    /// link, nothing journaled it), a journaled one the mailbox TTL deleted, or one its
    /// durability hook's buffer let expire — and every member of a group probe was reached.
    pub(super) fn final_group_checks(&mut self) {
        for peer in &self.peers {
            let name = peer.name();
            let active = peer
                .run
                .as_ref()
                .map_or(0, |r| r.engine.stats().group_sends);
            if active > 0 {
                violated(format!(
                    "{name}'s engine still tracks {active} group messages"
                ));
            }
            for (id, row) in &peer.store.group_sends {
                if !row.done {
                    violated(format!(
                        "{name}'s group message {id} never finished: {:?} {:?}",
                        row.record.path, row.record.members
                    ));
                }
            }
        }
        let sent: Vec<(String, String)> = self.ledger.groups.keys().cloned().collect();
        for (sender, id) in sent {
            self.check_group_matrix(&sender, &id);
        }
    }

    /// `sender`'s group message `id` at the end: every member its tracker says was reached
    /// has it, as far as the model lets it be lost; every member of a probe has it.
    fn check_group_matrix(&mut self, sender: &str, id: &str) {
        let sent = &self.ledger.groups[&(sender.to_owned(), id.to_owned())];
        let (probe, roster, wire) = (sent.probe, sent.roster.clone(), sent.wire_id.clone());
        let key = InboundKey {
            chat: sent.group.clone(),
            sender: sender.to_owned(),
            message_id: wire.clone(),
        };
        let members = self
            .scn
            .index_of(sender)
            .and_then(|s| self.peers[s].store.group_sends.get(id))
            .filter(|_| sent.durable)
            .map(|row| row.record.members.clone());
        let Some(members) = members else {
            if probe {
                violated(format!("{sender}'s group probe {id} was never accepted"));
            }
            return;
        };
        for member in &roster {
            let state = members.get(member).copied().unwrap_or(MemberState::Pending);
            let Some(q) = self.scn.index_of(member) else {
                continue;
            };
            let copy = group_copy_id(&wire, member);
            let acked = self
                .ledger
                .copy(sender, &copy)
                .is_some_and(|c| c.settled == Some(Settlement::Delivered));
            let received = self.group_received(q, &key);
            if probe && !(received && matches!(state, MemberState::Delivered | MemberState::Stored))
            {
                violated(format!(
                        "{sender}'s group probe {id}, sent into the quiet honest world, ended {state:?} for {member} (received: {received})"
                    ));
            }
            if received || !matches!(state, MemberState::Delivered | MemberState::Stored) {
                continue;
            }
            let log = &self.relay.group_log;
            let expired = self
                .ledger
                .inbound(member, &key)
                .is_some_and(|rec| rec.expired);
            if !acked && log.did(member, &key, Carried::Purged) {
                self.counts.group_purged += 1;
            } else if expired {
                self.counts.group_expired += 1;
            } else if !acked
                && state == MemberState::Delivered
                && !log.did(member, &key, Carried::Journaled)
            {
                self.counts.group_live_losses += 1;
            } else {
                violated(format!(
                        "{sender}'s group message {id} is {state:?} for {member}{}, but never reached {member}'s application",
                        if acked { " by its copy's ACK" } else { " by the relay's report" }
                    ));
            }
        }
    }
}
