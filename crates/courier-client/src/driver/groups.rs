//! Chat groups in the driver (`docs/delivery.md#group-sends`, `docs/protocol.md#group-messages`):
//! membership through the group's MLS group, the relay's registration of each group this device
//! administers, and group messages sealed once and handed to the engine, which delivers them.
//!
//! The creator of a group is its admin and the only member that commits: adds (each new
//! member's key package comes from the relay's directory), removes, and the removal a leaving
//! member asks for. Welcomes and commits are signed control frames, one outbox entry per member,
//! with the whole delivery ladder. What a step changes here — the groups, the MLS state, the
//! registration the relay confirmed — commits with that step.

use std::collections::{BTreeMap, BTreeSet};

use courier_crypto::{
    CommitOutcome, GroupCommit, GroupError, GroupJoined, GroupOpened, GroupState, Released,
};
use courier_engine::io::GroupSendRequest;
use courier_engine::step::Step;
use courier_engine::{DiagnosticLevel, Engine, InboundOrigin, Input, Millis, SendRequest};
use courier_proto::message::{META_GROUP_COPY, META_GROUP_ID, META_GROUP_MESSAGE};
use courier_proto::{
    group_envelope, group_payload, wire_id, Address, ClientFrame, GroupFrame, IdentityKey, Message,
};
use tokio::sync::oneshot;

use super::e2e::E2e;
use crate::error::ClientError;
use crate::event::ClientEvent;
use crate::store::{GroupChange, GroupRow, Store, StoreError};

/// A member's request to its group's admin to be removed: `__GRP_LEAVE__` then the group id.
const LEAVE_PREFIX: &str = "__GRP_LEAVE__";
/// Members of a group, this device included (the relay's default bound).
pub const MAX_GROUP_MEMBERS: usize = 1024;
/// The name a group is created with: what its members are told in their Welcome.
pub const MAX_GROUP_NAME_BYTES: usize = 256;
const META_GROUP_NAME: &str = "group_name";
/// A group message's envelope must fit one relay frame with its JSON around it.
const MAX_GROUP_ENVELOPE_BYTES: usize = courier_proto::limits::MAX_FRAME_BYTES - 4096;
const TARGET: &str = "courier_client::groups";
/// Hops a group message may travel, as the engine gives a direct message.
const GROUP_MESSAGE_TTL: u8 = 10;

type Reply = oneshot::Sender<Result<String, ClientError>>;

/// What the app asked of its groups.
#[derive(Debug)]
pub enum GroupCommand {
    Create { name: String, members: Vec<String> },
    Add { group_id: String, member: String },
    Remove { group_id: String, member: String },
    Leave { group_id: String },
    Send(GroupSendInput),
}

/// A validated group message, before it is sealed.
#[derive(Debug)]
pub struct GroupSendInput {
    pub group_id: String,
    pub request: SendRequest,
}

/// A group as `listGroups()` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    pub group_id: String,
    pub name: String,
    pub admin: String,
    pub members: Vec<String>,
    /// The relay is ready to broadcast to it on the current connection.
    pub relay_synced: bool,
}

/// What the relay said about groups (`docs/protocol.md#group-frames`).
#[derive(Debug)]
pub enum GroupRelayReport {
    /// A relay connection came up; `group_delivery` when it advertised `group_delivery_v3`.
    Connected {
        group_delivery: bool,
    },
    Disconnected,
    Created {
        group_id: String,
    },
    MemberAdded {
        group_id: String,
        member: String,
    },
    MemberRemoved {
        group_id: String,
        member: String,
    },
    /// A `GroupError` that names no message: the group's registration failed.
    Refused {
        group_id: String,
        reason: String,
    },
}

/// A membership change waiting for key packages from the relay's directory.
struct Pending {
    group_id: String,
    /// `Some(name)`: creating the group.
    create: Option<String>,
    wanted: BTreeSet<Address>,
    packages: BTreeMap<Address, Vec<u8>>,
    unavailable: BTreeSet<Address>,
    reply: Reply,
}

/// Where the relay stands on a group this device administers.
#[derive(Debug, Default, Clone)]
struct Registration {
    /// Members the relay confirmed (persisted).
    confirmed: BTreeSet<String>,
    /// Answers awaited on this connection.
    awaiting: usize,
    created: bool,
    refused: bool,
}

pub struct Groups {
    identity: IdentityKey,
    address: Address,
    app_id: String,
    broadcast_enabled: bool,
    rows: BTreeMap<String, GroupRow>,
    registration: BTreeMap<String, Registration>,
    /// `Some(group_delivery)` while a relay is connected.
    relay: Option<bool>,
    /// Groups the engine was told are ready for a broadcast on this connection.
    ready: BTreeSet<String>,
    pending: Vec<Pending>,
    /// Frames for the relay, sent once the step that made them is committed.
    outgoing: Vec<ClientFrame>,
    changes: Vec<GroupChange>,
}

impl Groups {
    pub fn restore(
        store: &Store,
        identity: IdentityKey,
        app_id: String,
        broadcast_enabled: bool,
    ) -> Result<Self, StoreError> {
        let mut groups = Self {
            address: identity.address(),
            identity,
            app_id,
            broadcast_enabled,
            rows: BTreeMap::new(),
            registration: BTreeMap::new(),
            relay: None,
            ready: BTreeSet::new(),
            pending: Vec::new(),
            outgoing: Vec::new(),
            changes: Vec::new(),
        };
        groups.reload(store)?;
        Ok(groups)
    }

    fn reload(&mut self, store: &Store) -> Result<(), StoreError> {
        self.rows.clear();
        self.registration.clear();
        for (row, confirmed) in store.load_groups()? {
            self.registration.insert(
                row.group_id.clone(),
                Registration {
                    confirmed: confirmed.into_iter().collect(),
                    ..Registration::default()
                },
            );
            self.rows.insert(row.group_id.clone(), row);
        }
        self.changes.clear();
        self.outgoing.clear();
        Ok(())
    }

    pub fn changes(&self) -> &[GroupChange] {
        &self.changes
    }

    pub fn committed(&mut self) {
        self.changes.clear();
    }

    /// The step failed: back to what storage holds; its frames never leave.
    pub fn rollback(&mut self, store: &Store) -> Result<(), StoreError> {
        self.reload(store)
    }

    /// The relay frames the committed step prepared.
    pub fn take_outgoing(&mut self) -> Vec<ClientFrame> {
        std::mem::take(&mut self.outgoing)
    }

    pub fn list(&self) -> Vec<GroupInfo> {
        self.rows
            .values()
            .map(|row| GroupInfo {
                group_id: row.group_id.clone(),
                name: row.name.clone(),
                admin: row.admin.clone(),
                members: row.members.clone(),
                relay_synced: self.ready.contains(&row.group_id),
            })
            .collect()
    }

    /// Carries out an app's command in the step; `Ok(Some(reply))` when its answer is owed
    /// after the step commits, `Ok(None)` when it waits for key packages (answered later).
    pub fn command(
        &mut self,
        command: GroupCommand,
        reply: Reply,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: Option<&mut E2e>,
        now: Millis,
    ) -> Option<(String, Reply)> {
        let Some(e2e) = e2e else {
            let _ = reply.send(Err(ClientError::EncryptionRequired));
            return None;
        };
        let result = match command {
            GroupCommand::Create { name, members } => {
                return self.create(name, members, reply, e2e);
            }
            GroupCommand::Add { group_id, member } => {
                return self.add(group_id, member, reply, e2e);
            }
            GroupCommand::Remove { group_id, member } => self
                .remove(&group_id, &member, engine, step, e2e, now)
                .map(|()| group_id),
            GroupCommand::Leave { group_id } => self
                .leave(&group_id, engine, step, e2e, now)
                .map(|()| group_id),
            GroupCommand::Send(input) => self.send(input, engine, step, e2e, now),
        };
        match result {
            Ok(id) => Some((id, reply)),
            Err(e) => {
                let _ = reply.send(Err(e));
                None
            }
        }
    }

    /// Whether this device is in group `group_id`.
    pub fn is_member(&self, group_id: &str) -> bool {
        self.rows.contains_key(group_id)
    }

    fn row(&self, group_id: &str) -> Result<&GroupRow, ClientError> {
        self.rows
            .get(group_id)
            .ok_or_else(|| ClientError::GroupNotFound(group_id.to_owned()))
    }

    fn admin_of(&self, group_id: &str) -> Result<&GroupRow, ClientError> {
        let row = self.row(group_id)?;
        if row.admin != self.address.to_string() {
            return Err(ClientError::GroupNotAdmin(group_id.to_owned()));
        }
        Ok(row)
    }

    fn member_address(&self, member: &str) -> Result<Address, ClientError> {
        let address = Address::parse(member).map_err(|e| {
            ClientError::InvalidArgument(format!("member {member:?} is not an address: {e}"))
        })?;
        if address == self.address {
            return Err(ClientError::InvalidArgument(
                "this device is a member of its groups already".into(),
            ));
        }
        Ok(address)
    }

    fn create(
        &mut self,
        name: String,
        members: Vec<String>,
        reply: Reply,
        e2e: &mut E2e,
    ) -> Option<(String, Reply)> {
        let checked = (|| {
            let name = courier_proto::display_name(&name, MAX_GROUP_NAME_BYTES).map_err(|e| {
                ClientError::InvalidArgument(format!(
                    "a group name is 1 to {MAX_GROUP_NAME_BYTES} bytes of text: it {e}"
                ))
            })?;
            let wanted = members
                .iter()
                .map(|m| self.member_address(m))
                .collect::<Result<BTreeSet<_>, _>>()?;
            if wanted.len() != members.len() {
                return Err(ClientError::InvalidArgument(
                    "a member is named twice".into(),
                ));
            }
            if wanted.len() + 1 > MAX_GROUP_MEMBERS {
                return Err(ClientError::InvalidArgument(format!(
                    "a group has at most {MAX_GROUP_MEMBERS} members"
                )));
            }
            Ok((name, wanted))
        })();
        match checked {
            Ok((name, wanted)) => {
                let group_id = super::mint_id();
                self.wait_for_packages(group_id, Some(name), wanted, reply, e2e)
            }
            Err(e) => {
                let _ = reply.send(Err(e));
                None
            }
        }
    }

    fn add(
        &mut self,
        group_id: String,
        member: String,
        reply: Reply,
        e2e: &mut E2e,
    ) -> Option<(String, Reply)> {
        let checked = (|| {
            let row = self.admin_of(&group_id)?;
            if row.members.contains(&member) {
                return Err(ClientError::InvalidArgument(format!(
                    "{member} is a member of {group_id} already"
                )));
            }
            if row.members.len() >= MAX_GROUP_MEMBERS {
                return Err(ClientError::InvalidArgument(format!(
                    "a group has at most {MAX_GROUP_MEMBERS} members"
                )));
            }
            self.member_address(&member)
        })();
        match checked {
            Ok(address) => {
                let wanted = BTreeSet::from([address]);
                self.wait_for_packages(group_id, None, wanted, reply, e2e)
            }
            Err(e) => {
                let _ = reply.send(Err(e));
                None
            }
        }
    }

    /// Asks the relay's directory for a key package of each member to add; the change is made
    /// once every answer is in ([`Groups::package`]).
    fn wait_for_packages(
        &mut self,
        group_id: String,
        create: Option<String>,
        wanted: BTreeSet<Address>,
        reply: Reply,
        e2e: &mut E2e,
    ) -> Option<(String, Reply)> {
        if !wanted.is_empty() && !e2e.fetch_for_group(&wanted) {
            let _ = reply.send(Err(ClientError::NotConnected(
                "adding members takes their key packages from the relay's directory, and no \
                 relay offering one is connected"
                    .into(),
            )));
            return None;
        }
        self.pending.push(Pending {
            group_id,
            create,
            wanted,
            packages: BTreeMap::new(),
            unavailable: BTreeSet::new(),
            reply,
        });
        None
    }

    /// Membership changes whose key packages are all in, made now: returns the replies owed
    /// after the step commits.
    pub fn ready_changes(
        &mut self,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) -> Vec<(String, Reply)> {
        let (done, waiting): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.packages.len() + p.unavailable.len() == p.wanted.len());
        self.pending = waiting;
        let mut owed = Vec::new();
        for pending in done {
            if !pending.unavailable.is_empty() {
                let names: Vec<String> = pending
                    .unavailable
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                let _ = pending
                    .reply
                    .send(Err(ClientError::KeyPackageUnavailable(names.join(", "))));
                continue;
            }
            match self.apply_change(&pending, engine, step, e2e, now) {
                Ok(()) => owed.push((pending.group_id, pending.reply)),
                Err(e) => {
                    let _ = pending.reply.send(Err(e));
                }
            }
        }
        owed
    }

    /// The directory's answer for `address`: a key package, or none.
    pub fn package(&mut self, address: Address, package: Option<Vec<u8>>) {
        if let Some(pending) = self
            .pending
            .iter_mut()
            .find(|p| p.wanted.contains(&address) && !p.packages.contains_key(&address))
        {
            match package {
                Some(package) => {
                    pending.packages.insert(address, package);
                }
                None => {
                    pending.unavailable.insert(address);
                }
            }
        }
    }

    fn apply_change(
        &mut self,
        pending: &Pending,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) -> Result<(), ClientError> {
        let group_id = &pending.group_id;
        let sessions = e2e.sessions_mut();
        if let Some(name) = &pending.create {
            let state = sessions.create_group(group_id).map_err(group_error)?;
            let row = GroupRow {
                group_id: group_id.clone(),
                name: name.clone(),
                admin: self.address.to_string(),
                members: addresses(&state.members),
                created_at: now,
            };
            self.upsert(row.clone());
            self.registration
                .insert(group_id.clone(), Registration::default());
            step.emit(
                engine,
                ClientEvent::GroupCreated {
                    group_id: group_id.clone(),
                    name: name.clone(),
                    admin: row.admin.clone(),
                    members: row.members.clone(),
                },
            );
        }
        if pending.packages.is_empty() {
            // A group of one: registered now; otherwise the commit below registers it.
            self.register(group_id);
            return Ok(());
        }
        let before = self.row(group_id)?.members.clone();
        let members: Vec<(Address, Vec<u8>)> = pending
            .packages
            .iter()
            .map(|(a, p)| (*a, p.clone()))
            .collect();
        let commit = e2e
            .sessions_mut()
            .add_members(group_id, &members)
            .map_err(group_error)?;
        let added: Vec<Address> = pending.packages.keys().copied().collect();
        self.committed_change(group_id, &before, &commit, &added, engine, step, now);
        let me = self.address.to_string();
        for member in &added {
            step.emit(
                engine,
                ClientEvent::GroupMemberAdded {
                    group_id: group_id.clone(),
                    member: member.to_string(),
                    added_by: me.clone(),
                },
            );
        }
        Ok(())
    }

    /// A commit this device made: the Welcome to each added member, the commit to every other
    /// member before it (the removed included), the new roster stored and registered.
    #[allow(clippy::too_many_arguments)]
    fn committed_change(
        &mut self,
        group_id: &str,
        before: &[String],
        commit: &GroupCommit,
        added: &[Address],
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let me = self.address.to_string();
        let Some(mut row) = self.rows.get(group_id).cloned() else {
            return;
        };
        row.members = addresses(&commit.members);
        if let Some(welcome) = &commit.welcome {
            // Encoded once: the same Welcome goes to every added member.
            let content = GroupFrame::Welcome.content(welcome);
            let metadata = BTreeMap::from([(META_GROUP_NAME.to_owned(), row.name.clone())]);
            for member in added {
                self.submit(content.clone(), metadata.clone(), member, engine, step, now);
            }
        }
        let content = GroupFrame::Commit.content(&commit.commit);
        for member in before.iter().filter(|m| **m != me) {
            let Ok(address) = Address::parse(member) else {
                continue;
            };
            self.submit(
                content.clone(),
                BTreeMap::new(),
                &address,
                engine,
                step,
                now,
            );
        }
        self.upsert(row);
        self.register(group_id);
    }

    /// A signed control frame with `content` into the outbox for `peer`.
    fn submit(
        &self,
        content: String,
        metadata: BTreeMap<String, String>,
        peer: &Address,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let send = super::signed::control_request(
            &self.identity,
            &self.app_id,
            &peer.to_string(),
            content,
            metadata,
            now,
        );
        step.apply(engine, Input::Send(send), now);
    }

    fn remove(
        &mut self,
        group_id: &str,
        member: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) -> Result<(), ClientError> {
        let row = self.admin_of(group_id)?;
        let address = self.member_address(member)?;
        if !row.members.iter().any(|m| m == member) {
            return Err(ClientError::InvalidArgument(format!(
                "{member} is no member of {group_id}"
            )));
        }
        let me = self.address.to_string();
        self.remove_member(group_id, address, &me, engine, step, e2e, now)
    }

    #[allow(clippy::too_many_arguments)]
    fn remove_member(
        &mut self,
        group_id: &str,
        address: Address,
        removed_by: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) -> Result<(), ClientError> {
        let before = self.row(group_id)?.members.clone();
        let commit = e2e
            .sessions_mut()
            .remove_members(group_id, &[address])
            .map_err(group_error)?;
        self.committed_change(group_id, &before, &commit, &[], engine, step, now);
        step.emit(
            engine,
            ClientEvent::GroupMemberRemoved {
                group_id: group_id.to_owned(),
                member: address.to_string(),
                removed_by: removed_by.to_owned(),
            },
        );
        Ok(())
    }

    /// This device leaves: it asks the admin to remove it, tells the relay, and forgets the
    /// group (it reads nothing of it from now on). The admin cannot leave its own group.
    fn leave(
        &mut self,
        group_id: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) -> Result<(), ClientError> {
        let row = self.row(group_id)?.clone();
        let me = self.address.to_string();
        if row.admin == me {
            return Err(ClientError::InvalidArgument(format!(
                "this device administers {group_id}: it removes the others instead of leaving"
            )));
        }
        e2e.sessions_mut()
            .leave_group(group_id)
            .map_err(group_error)?;
        if let Ok(admin) = Address::parse(&row.admin) {
            let content = format!("{LEAVE_PREFIX}{group_id}");
            self.submit(content, BTreeMap::new(), &admin, engine, step, now);
        }
        if self.relay == Some(true) {
            self.outgoing.push(ClientFrame::LeaveGroup {
                group_id: group_id.to_owned(),
            });
        }
        self.gone(group_id, &me, &me, engine, step, now);
        Ok(())
    }

    /// This device is out of `group_id`: forgotten, reported.
    fn gone(
        &mut self,
        group_id: &str,
        member: &str,
        removed_by: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        self.rows.remove(group_id);
        self.registration.remove(group_id);
        self.unready(group_id, engine, step, now);
        self.changes.push(GroupChange::Gone {
            group_id: group_id.to_owned(),
        });
        step.emit(
            engine,
            ClientEvent::GroupMemberRemoved {
                group_id: group_id.to_owned(),
                member: member.to_owned(),
                removed_by: removed_by.to_owned(),
            },
        );
    }

    fn upsert(&mut self, row: GroupRow) {
        self.changes.push(GroupChange::Upsert(row.clone()));
        self.rows.insert(row.group_id.clone(), row);
    }

    /// Seals the message once for the group's current roster and hands it to the engine.
    fn send(
        &mut self,
        input: GroupSendInput,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) -> Result<String, ClientError> {
        let GroupSendInput { group_id, request } = input;
        let row = self.row(&group_id)?.clone();
        let me = self.address.to_string();
        let wire = wire_id(&request.id);
        let mut inner = Message {
            id: wire.clone(),
            sender: me.clone(),
            recipient: group_id.clone(),
            app_id: self.app_id.clone(),
            priority: request.priority,
            ttl: GROUP_MESSAGE_TTL,
            hop_count: 0,
            timestamp: now,
            lamport_clock: 0,
            content_type: request.content_type,
            content: request.content,
            metadata: request.metadata,
            requires_ack: false,
            reply_to_msg: None,
            rich: None,
            binary_content: request.binary_content.map(serde_json::Value::String),
            media_metadata: None,
            forwarded_from: None,
            reply_context: None,
            encrypted: None,
        };
        request.rich.write_to(&mut inner);
        let sealed = e2e
            .sessions_mut()
            .seal_group(&group_id, inner.encode().as_bytes())
            .map_err(group_error)?;
        let mut envelope = group_envelope(&inner, &self.address, &sealed);
        envelope
            .metadata
            .insert(META_GROUP_ID.to_owned(), group_id.clone());
        envelope
            .metadata
            .insert(META_GROUP_MESSAGE.to_owned(), wire);
        let size = envelope.encode().len();
        if size > MAX_GROUP_ENVELOPE_BYTES {
            return Err(ClientError::InvalidArgument(format!(
                "the sealed group message is {size} bytes; one frame holds \
                 {MAX_GROUP_ENVELOPE_BYTES} (send large content as media)"
            )));
        }
        let members = row.members.into_iter().filter(|m| *m != me).collect();
        let send = GroupSendRequest {
            id: request.id.clone(),
            group_id,
            members,
            message: envelope,
            broadcast: self.broadcast_enabled,
        };
        step.apply(engine, Input::GroupSend(Box::new(send)), now);
        Ok(request.id)
    }

    /// A verified group control frame the engine handed over; false when it is none.
    pub fn control(
        &mut self,
        message: &Message,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) -> bool {
        let Ok(from) = Address::parse(&message.sender) else {
            return false;
        };
        if let Some(group_id) = message.content.strip_prefix(LEAVE_PREFIX) {
            self.leave_asked(group_id, from, engine, step, e2e, now);
            return true;
        }
        let Some((kind, bytes)) = GroupFrame::parse(&message.content) else {
            return false;
        };
        let bytes = match bytes {
            Ok(bytes) => bytes,
            Err(e) => {
                self.warn(engine, step, format!("{} from {from}: {e}", kind.prefix()));
                return true;
            }
        };
        match kind {
            GroupFrame::Welcome => {
                // The creator's own device refused these characters, so a name that holds
                // them comes from a device that wants it to read as something else.
                let name = message
                    .metadata
                    .get(META_GROUP_NAME)
                    .map(|name| courier_proto::received_display_name(name))
                    .unwrap_or_default();
                self.welcome(from, &bytes, name, engine, step, e2e, now);
            }
            GroupFrame::Commit => self.commit(from, &bytes, engine, step, e2e, now),
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn welcome(
        &mut self,
        from: Address,
        bytes: &[u8],
        name: String,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) {
        match e2e.sessions_mut().join_group(from, bytes) {
            Ok(GroupJoined::Joined(state)) => {
                let row = GroupRow {
                    group_id: state.group_id.clone(),
                    name,
                    admin: state.admin.to_string(),
                    members: addresses(&state.members),
                    created_at: now,
                };
                self.upsert(row.clone());
                step.emit(
                    engine,
                    ClientEvent::GroupCreated {
                        group_id: row.group_id.clone(),
                        name: row.name.clone(),
                        admin: row.admin.clone(),
                        members: row.members.clone(),
                    },
                );
                if self.relay == Some(true) {
                    self.set_ready(&row.group_id, true, engine, step, now);
                }
            }
            Ok(GroupJoined::Already) => {}
            Err(e) => self.warn(engine, step, format!("group Welcome from {from}: {e}")),
        }
    }

    fn commit(
        &mut self,
        from: Address,
        bytes: &[u8],
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) {
        match e2e.sessions_mut().apply_commit(&from, bytes) {
            Ok(CommitOutcome::Applied { state, released }) => {
                self.roster_changed(&state, &from, engine, step);
                self.released(released, engine, step, now);
            }
            Ok(CommitOutcome::RemovedSelf { group_id, released }) => {
                self.released(released, engine, step, now);
                let me = self.address.to_string();
                self.gone(&group_id, &me, &from.to_string(), engine, step, now);
            }
            Ok(CommitOutcome::Buffered | CommitOutcome::Stale) => {}
            Err(e) => self.warn(engine, step, format!("group commit from {from}: {e}")),
        }
    }

    /// The roster after a commit another device made: stored, and each change reported.
    fn roster_changed(
        &mut self,
        state: &GroupState,
        by: &Address,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
    ) {
        let Some(mut row) = self.rows.get(&state.group_id).cloned() else {
            return;
        };
        let after = addresses(&state.members);
        let before: BTreeSet<&String> = row.members.iter().collect();
        let now: BTreeSet<&String> = after.iter().collect();
        let by = by.to_string();
        let mut events = Vec::new();
        for added in now.difference(&before) {
            events.push(ClientEvent::GroupMemberAdded {
                group_id: state.group_id.clone(),
                member: (*added).clone(),
                added_by: by.clone(),
            });
        }
        for removed in before.difference(&now) {
            events.push(ClientEvent::GroupMemberRemoved {
                group_id: state.group_id.clone(),
                member: (*removed).clone(),
                removed_by: by.clone(),
            });
        }
        row.members = after;
        self.upsert(row);
        for event in events {
            step.emit(engine, event);
        }
    }

    /// Held group messages a commit let through: to the engine, as if they arrived now (their
    /// frames were released when they were held).
    fn released(
        &mut self,
        released: Vec<Released>,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        for item in released {
            match item {
                Released::Opened(opened) => {
                    let origin = InboundOrigin {
                        carrier: courier_engine::Carrier::Relay,
                        stamped_sender: opened.sender.to_string(),
                        sender_account: None,
                        seq: None,
                        sealed_by: Some(opened.sender.to_string()),
                    };
                    match inner_message(&opened.plaintext, &opened.group_id, &opened.sender) {
                        Ok(inner) => step.apply(
                            engine,
                            Input::Inbound {
                                message: Box::new(inner),
                                origin,
                            },
                            now,
                        ),
                        Err(reason) => self.warn(engine, step, reason),
                    }
                }
                Released::Refused { from, error } => self.warn(
                    engine,
                    step,
                    format!("a held group message from {from} did not open: {error}"),
                ),
            }
        }
    }

    /// A member asks to be removed: the admin commits it.
    fn leave_asked(
        &mut self,
        group_id: &str,
        from: Address,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        e2e: &mut E2e,
        now: Millis,
    ) {
        let member = from.to_string();
        let is_member = self.rows.get(group_id).is_some_and(|row| {
            row.admin == self.address.to_string() && row.members.contains(&member)
        });
        if !is_member {
            return;
        }
        if let Err(e) = self.remove_member(group_id, from, &member, engine, step, e2e, now) {
            self.warn(engine, step, format!("{member} left {group_id}: {e}"));
        }
    }

    /// A group message from a carrier (a broadcast copy or a per-member copy): opened once and
    /// handed to the engine, or the input that drops or re-acknowledges it.
    pub fn inbound(
        &mut self,
        envelope: Message,
        origin: InboundOrigin,
        engine: &mut Engine,
        e2e: &mut E2e,
        now: Millis,
    ) -> Input {
        let (Some(group_id), Some(logical)) = (
            envelope.metadata.get(META_GROUP_ID).cloned(),
            envelope.metadata.get(META_GROUP_MESSAGE).cloned(),
        ) else {
            return undecryptable(
                &envelope,
                origin,
                "a group message without its group markers",
            );
        };
        let (from, ciphertext) = match group_payload(&envelope) {
            Some(Ok(payload)) => payload,
            Some(Err(e)) => return undecryptable(&envelope, origin, &e.to_string()),
            None => return undecryptable(&envelope, origin, "not a group message"),
        };
        let sender = from.to_string();
        let origin = InboundOrigin {
            sealed_by: Some(sender.clone()),
            ..origin
        };
        let copy = envelope.requires_ack.then(|| envelope.id.clone());
        if engine.knows_group_inbound(&group_id, &sender, &logical, now) {
            // Processed or buffered already: its ratchet key is spent, and the engine only
            // needs its key to acknowledge a copy again.
            let mut known = envelope;
            known.id = logical;
            known.recipient = group_id;
            mark_copy(&mut known, copy);
            return Input::Inbound {
                message: Box::new(known),
                origin,
            };
        }
        match e2e.sessions_mut().open_group(&from, &ciphertext) {
            Ok(GroupOpened::Opened(opened)) => {
                match inner_message(&opened.plaintext, &opened.group_id, &opened.sender) {
                    Ok(mut inner) if inner.id == logical && opened.group_id == group_id => {
                        inner.hop_count = envelope.hop_count;
                        inner.requires_ack = copy.is_some();
                        mark_copy(&mut inner, copy);
                        Input::Inbound {
                            message: Box::new(inner),
                            origin,
                        }
                    }
                    Ok(_) => undecryptable(
                        &envelope,
                        origin,
                        "the group message inside differs from its envelope",
                    ),
                    Err(reason) => undecryptable(&envelope, origin, &reason),
                }
            }
            Ok(GroupOpened::Buffered) => Input::Discard {
                origin,
                reason: format!(
                    "group message {} from {sender} held until its epoch's commit arrives",
                    envelope.id
                ),
            },
            Err(GroupError::Spent { .. }) => Input::Discard {
                origin,
                reason: format!(
                    "dropped {} from {sender}: a repeat of a group message already opened",
                    envelope.id
                ),
            },
            Err(e) => Input::Undecryptable {
                message_id: envelope.id.clone(),
                sender,
                origin,
                code: e.code(),
                reason: e.to_string(),
            },
        }
    }

    /// What the relay said about groups.
    pub fn relay_report(
        &mut self,
        report: GroupRelayReport,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        match report {
            GroupRelayReport::Connected { group_delivery } => {
                self.relay = Some(group_delivery);
                if !group_delivery {
                    return;
                }
                let me = self.address.to_string();
                let ids: Vec<String> = self.rows.keys().cloned().collect();
                for group_id in ids {
                    if self.rows[&group_id].admin == me {
                        if let Some(registration) = self.registration.get_mut(&group_id) {
                            registration.created = false;
                            registration.refused = false;
                        }
                        self.register(&group_id);
                    } else {
                        // A member's broadcast needs no registration of its own: a relay that
                        // does not know the group refuses it, and the message goes as copies.
                        self.set_ready(&group_id, true, engine, step, now);
                    }
                }
            }
            GroupRelayReport::Disconnected => {
                self.relay = None;
                self.pending_lost();
                for group_id in std::mem::take(&mut self.ready) {
                    step.emit(
                        engine,
                        ClientEvent::GroupRelaySyncChanged {
                            group_id,
                            synced: false,
                        },
                    );
                }
                for registration in self.registration.values_mut() {
                    registration.awaiting = 0;
                }
            }
            GroupRelayReport::Created { group_id } => {
                if let Some(registration) = self.registration.get_mut(&group_id) {
                    registration.created = true;
                    registration.awaiting = registration.awaiting.saturating_sub(1);
                }
                self.check_synced(&group_id, engine, step, now);
            }
            GroupRelayReport::MemberAdded { group_id, member } => {
                self.confirmed(&group_id, member, true);
                self.check_synced(&group_id, engine, step, now);
            }
            GroupRelayReport::MemberRemoved { group_id, member } => {
                self.confirmed(&group_id, member, false);
                self.check_synced(&group_id, engine, step, now);
            }
            GroupRelayReport::Refused { group_id, reason } => {
                if let Some(registration) = self.registration.get_mut(&group_id) {
                    registration.refused = true;
                }
                self.warn(
                    engine,
                    step,
                    format!(
                        "the relay refused group {group_id} ({reason}): its messages go as copies"
                    ),
                );
                self.unready(&group_id, engine, step, now);
            }
        }
    }

    fn confirmed(&mut self, group_id: &str, member: String, registered: bool) {
        let Some(registration) = self.registration.get_mut(group_id) else {
            return;
        };
        registration.awaiting = registration.awaiting.saturating_sub(1);
        let changed = if registered {
            registration.confirmed.insert(member.clone())
        } else {
            registration.confirmed.remove(&member)
        };
        if changed {
            self.changes.push(GroupChange::Registered {
                group_id: group_id.to_owned(),
                member,
                registered,
            });
        }
    }

    /// Registers a group this device administers with the connected relay: `CreateGroup`
    /// (idempotent for its creator), then the sorted differences between the roster and what
    /// the relay confirmed.
    fn register(&mut self, group_id: &str) {
        if self.relay != Some(true) {
            return;
        }
        let Some(row) = self.rows.get(group_id) else {
            return;
        };
        let me = self.address.to_string();
        if row.admin != me {
            return;
        }
        let registration = self.registration.entry(group_id.to_owned()).or_default();
        let mut frames = Vec::new();
        if !registration.created {
            frames.push(ClientFrame::CreateGroup {
                group_id: group_id.to_owned(),
                name: row.name.clone(),
            });
        }
        let roster: BTreeSet<&String> = row.members.iter().filter(|m| **m != me).collect();
        for member in roster
            .iter()
            .filter(|m| !registration.confirmed.contains(**m))
        {
            frames.push(ClientFrame::AddGroupMember {
                group_id: group_id.to_owned(),
                username: (*member).clone(),
            });
        }
        for member in registration
            .confirmed
            .iter()
            .filter(|m| !roster.contains(m) && **m != me)
        {
            frames.push(ClientFrame::RemoveGroupMember {
                group_id: group_id.to_owned(),
                username: member.clone(),
            });
        }
        registration.awaiting += frames.len();
        self.outgoing.extend(frames);
    }

    fn check_synced(
        &mut self,
        group_id: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let synced = self
            .registration
            .get(group_id)
            .is_some_and(|r| r.created && !r.refused && r.awaiting == 0);
        if synced {
            self.set_ready(group_id, true, engine, step, now);
        }
    }

    fn set_ready(
        &mut self,
        group_id: &str,
        ready: bool,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        let changed = if ready {
            self.ready.insert(group_id.to_owned())
        } else {
            self.ready.remove(group_id)
        };
        if !changed {
            return;
        }
        step.apply(
            engine,
            Input::GroupRelay {
                group_id: group_id.to_owned(),
                ready,
            },
            now,
        );
        step.emit(
            engine,
            ClientEvent::GroupRelaySyncChanged {
                group_id: group_id.to_owned(),
                synced: ready,
            },
        );
    }

    fn unready(
        &mut self,
        group_id: &str,
        engine: &mut Engine,
        step: &mut Step<ClientEvent>,
        now: Millis,
    ) {
        if self.ready.remove(group_id) {
            step.apply(
                engine,
                Input::GroupRelay {
                    group_id: group_id.to_owned(),
                    ready: false,
                },
                now,
            );
            step.emit(
                engine,
                ClientEvent::GroupRelaySyncChanged {
                    group_id: group_id.to_owned(),
                    synced: false,
                },
            );
        }
    }

    /// The relay connection ended while key packages were awaited: those changes are refused.
    fn pending_lost(&mut self) {
        for pending in std::mem::take(&mut self.pending) {
            let _ = pending.reply.send(Err(ClientError::NotConnected(
                "the relay connection ended while the members' key packages were awaited".into(),
            )));
        }
    }

    fn warn(&self, engine: &mut Engine, step: &mut Step<ClientEvent>, message: String) {
        step.emit(
            engine,
            ClientEvent::Diagnostic {
                level: DiagnosticLevel::Warn,
                message,
                target: TARGET,
            },
        );
    }
}

/// A roster as the app sees it: addresses as strings, sorted as strings.
fn addresses(members: &[Address]) -> Vec<String> {
    let mut members: Vec<String> = members.iter().map(ToString::to_string).collect();
    members.sort();
    members
}

fn group_error(e: GroupError) -> ClientError {
    ClientError::Internal(format!("group state: {e} ({})", e.code()))
}

/// Marks `message` as a group copy to acknowledge by `copy`'s id, when it came as one.
fn mark_copy(message: &mut Message, copy: Option<String>) {
    message.requires_ack = copy.is_some();
    if let Some(copy) = copy {
        message.metadata.insert(META_GROUP_COPY.to_owned(), copy);
    }
}

/// The group message `plaintext` holds, bound to the group and sender that sealed it.
fn inner_message(plaintext: &[u8], group_id: &str, sender: &Address) -> Result<Message, String> {
    let text = std::str::from_utf8(plaintext).map_err(|e| e.to_string())?;
    let mut inner = Message::decode(text).map_err(|e| e.to_string())?;
    if inner.recipient != group_id || inner.sender != sender.to_string() {
        return Err(format!(
            "a group message of {group_id} from {sender} names another group or sender"
        ));
    }
    // The markers are the runtime's to set, whatever the sender put there.
    inner.metadata.remove(META_GROUP_COPY);
    inner.metadata.remove(META_GROUP_MESSAGE);
    inner
        .metadata
        .insert(META_GROUP_ID.to_owned(), group_id.to_owned());
    Ok(inner)
}

fn undecryptable(envelope: &Message, origin: InboundOrigin, reason: &str) -> Input {
    Input::undecryptable(
        envelope,
        origin,
        courier_crypto::code::MALFORMED,
        reason.to_owned(),
    )
}
