//! One MLS group per chat group (`docs/architecture.md#end-to-end-sessions`).
//!
//! A chat group's MLS group id is `chat:` and its app-visible id, so it never meets a session's
//! random one. Its members are devices, with the same address-bound credentials as sessions:
//! every leaf is checked when it enters the tree (the Welcome's whole tree, each added key
//! package), so the MLS sender of a commit or message is an address.
//!
//! The creator is the group's admin and the only member whose commits count; receivers refuse
//! any other, so two members never commit the same epoch differently. The admin is the member at
//! leaf 0: the creator takes it when it creates the group, nobody else commits, and no commit
//! may remove leaf 0. A joiner therefore learns the admin from the Welcome itself, whose sender
//! must sit at leaf 0 and be the address that sent it.
//!
//! Commits and messages travel separately and may arrive out of order. One of a later epoch than
//! the group's is held, in the store (the runtime releases its carrier frame once the step that
//! received it commits), until the commits before it arrive; then they are applied and opened in
//! the order they came. Holding is bounded per group ([`MAX_HELD`], [`MAX_HELD_BYTES`]).
//!
//! Every operation here either succeeds or changes nothing.

mod admin;
mod commits;
mod error;
mod hold;
mod messages;

use std::collections::{BTreeMap, BTreeSet};

use courier_proto::{validate_identifier, Address};
use openmls::prelude::tls_codec::{Deserialize as _, Serialize as _};
use openmls::prelude::{
    ContentType, GroupId, LeafNodeIndex, MlsGroup, MlsMessageIn, MlsMessageOut, ProtocolMessage,
};
use serde::{Deserialize, Serialize};

use crate::sessions::{bound_address, SessionError, Sessions};
use crate::store::{Store, StoreError};
pub use error::{code, GroupError};
use error::{malformed, mls};
use hold::{drop_held, Held, HeldKind};
pub use hold::{MAX_HELD, MAX_HELD_BYTES};

/// What a chat group's MLS group id starts with.
const CHAT_PREFIX: &[u8] = b"chat:";
/// Our rows beside openmls's (and `hold`'s): a group's record, and which group a Welcome
/// joined.
const GROUP: &str = "group";
const GROUP_WELCOME: &str = "group_welcome";

/// The leaf of the admin (see the module's comment).
fn admin_leaf() -> LeafNodeIndex {
    LeafNodeIndex::new(0)
}

/// How many past epochs' keys a member keeps: a member that seals before a commit reaches it
/// seals in the epoch before, and its message must still open for those who applied the commit.
/// Kept low: a past epoch's keys are what forward secrecy deletes.
pub(crate) const MAX_PAST_EPOCHS: u64 = 8;

/// A chat group as this device holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    pub group_id: String,
    pub epoch: u64,
    pub admin: Address,
    /// Sorted, this device included.
    pub members: Vec<Address>,
}

/// A commit the admin made and merged: `commit` goes to every member the commit leaves in the
/// group but those it added (and to those it removed, so they learn it), `welcome` to those it
/// added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupCommit {
    /// The group's epoch after the commit.
    pub epoch: u64,
    pub commit: Vec<u8>,
    pub welcome: Option<Vec<u8>>,
    /// The members after the commit, sorted, this device included.
    pub members: Vec<Address>,
}

/// What a Welcome into a chat group did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupJoined {
    Joined(GroupState),
    /// A repeat of a Welcome this device joined by, or one into an epoch it is in or has passed.
    Already,
}

/// A group message opened: `sender` is the MLS sender's bound address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMessage {
    pub group_id: String,
    pub sender: Address,
    pub plaintext: Vec<u8>,
}

/// A held message a commit let through, in the order it came.
#[derive(Debug)]
pub enum Released {
    Opened(GroupMessage),
    /// It did not open; `from` is the address that carried it.
    Refused {
        from: Address,
        error: GroupError,
    },
}

/// What a commit did.
#[derive(Debug)]
pub enum CommitOutcome {
    /// Applied, with every held commit it made applicable; the group as it is now.
    Applied {
        state: GroupState,
        released: Vec<Released>,
    },
    /// A commit removed this device: the group is forgotten, and whatever comes for it later is
    /// refused ([`GroupError::NotMember`]).
    RemovedSelf {
        group_id: String,
        released: Vec<Released>,
    },
    /// Of a later epoch: held until the commits before it arrive.
    Buffered,
    /// Of an epoch the group has passed: ignored.
    Stale,
}

/// What became of a group message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupOpened {
    Opened(GroupMessage),
    /// Of a later epoch: held until its commit arrives ([`CommitOutcome::Applied`] releases it).
    Buffered,
}

/// A chat group's id, valid as an identifier.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
struct ChatId(String);

impl ChatId {
    fn parse(id: &str) -> Result<Self, GroupError> {
        validate_identifier(id).map_err(|reason| GroupError::InvalidGroupId {
            id: id.to_owned(),
            reason,
        })?;
        Ok(Self(id.to_owned()))
    }

    /// The chat group whose MLS group this is, if it is one.
    fn of(group_id: &GroupId) -> Option<Self> {
        let id = group_id.as_slice().strip_prefix(CHAT_PREFIX)?;
        Self::parse(std::str::from_utf8(id).ok()?).ok()
    }

    fn mls_id(&self) -> GroupId {
        GroupId::from_slice(&[CHAT_PREFIX, self.0.as_bytes()].concat())
    }
}

pub(crate) fn is_chat_group(group_id: &GroupId) -> bool {
    group_id.as_slice().starts_with(CHAT_PREFIX)
}

/// The group id and epoch of a chat group's commit or message, read without processing it.
pub fn group_of(bytes: &[u8]) -> Result<(String, u64), GroupError> {
    let message = protocol_message(bytes)?;
    let id = chat_id(&message)?;
    Ok((id.0, message.epoch().as_u64()))
}

fn protocol_message(bytes: &[u8]) -> Result<ProtocolMessage, GroupError> {
    MlsMessageIn::tls_deserialize_exact(bytes)
        .map_err(malformed("group message"))?
        .try_into_protocol_message()
        .map_err(|e| GroupError::Malformed {
            what: "group message",
            detail: e.to_string(),
        })
}

fn chat_id(message: &ProtocolMessage) -> Result<ChatId, GroupError> {
    ChatId::of(message.group_id()).ok_or(GroupError::Malformed {
        what: "group message",
        detail: "not of a chat group".into(),
    })
}

/// `bytes` as a commit or an application message of a chat group.
fn parse_as(
    bytes: &[u8],
    kind: ContentType,
    what: &'static str,
) -> Result<(ChatId, ProtocolMessage), GroupError> {
    let message = protocol_message(bytes)?;
    if message.content_type() != kind {
        return Err(GroupError::Malformed {
            what,
            detail: format!("a {:?} message", message.content_type()),
        });
    }
    Ok((chat_id(&message)?, message))
}

fn serialize(message: MlsMessageOut, what: &'static str) -> Result<Vec<u8>, GroupError> {
    message.tls_serialize_detached().map_err(malformed(what))
}

fn members_of(group: &MlsGroup) -> Vec<Address> {
    let mut members: Vec<_> = group
        .members()
        .filter_map(|m| bound_address(&m.credential, &m.signature_key))
        .collect();
    members.sort();
    members
}

#[derive(Debug, Clone, Serialize, Deserialize)]
enum GroupRecord {
    Member(Membership),
    /// Removed or left, when the group was in `epoch`.
    Gone {
        admin: Address,
        epoch: u64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Membership {
    admin: Address,
    /// The epoch this device joined in: it has no keys of an earlier one.
    joined: u64,
    /// In the order they came; their bytes are rows of their own.
    held: Vec<Held>,
    next_held: u64,
}

struct ChatGroup {
    mls: MlsGroup,
    membership: Membership,
}

impl ChatGroup {
    fn state(&self, id: &ChatId) -> GroupState {
        GroupState {
            group_id: id.0.clone(),
            epoch: self.mls.epoch().as_u64(),
            admin: self.membership.admin,
            members: members_of(&self.mls),
        }
    }

    fn save(&self, store: &Store, id: &ChatId) -> Result<(), StoreError> {
        store.put(GROUP, id, &GroupRecord::Member(self.membership.clone()))
    }
}

/// The chat groups this device is a member of, in memory.
#[derive(Default)]
pub(crate) struct Groups {
    active: BTreeMap<ChatId, ChatGroup>,
    /// Groups changed in memory since the last commit (reloaded on rollback).
    touched: BTreeSet<ChatId>,
}

impl Groups {
    pub(crate) fn committed(&mut self) {
        self.touched.clear();
    }

    /// The group, to change.
    fn touch(&mut self, id: &ChatId) -> Result<&mut ChatGroup, GroupError> {
        let group = self
            .active
            .get_mut(id)
            .ok_or_else(|| GroupError::UnknownGroup(id.0.clone()))?;
        self.touched.insert(id.clone());
        Ok(group)
    }
}

impl Sessions {
    /// Loads the groups of the committed state.
    pub(crate) fn load_groups(&mut self) -> Result<(), SessionError> {
        for (id, record) in self.provider.store.all::<ChatId, GroupRecord>(GROUP)? {
            if let Some(group) = self.load_group(&id, record)? {
                self.groups.active.insert(id, group);
            }
        }
        Ok(())
    }

    fn load_group(
        &self,
        id: &ChatId,
        record: GroupRecord,
    ) -> Result<Option<ChatGroup>, SessionError> {
        let GroupRecord::Member(membership) = record else {
            return Ok(None);
        };
        let mls = MlsGroup::load(&self.provider.store, &id.mls_id())?
            .ok_or_else(|| SessionError::Mls(format!("group {} is not in storage", id.0)))?;
        Ok(Some(ChatGroup { mls, membership }))
    }

    /// Puts a group back in memory as the store has it.
    fn reload_group(&mut self, id: &ChatId) -> Result<(), SessionError> {
        self.groups.active.remove(id);
        if let Some(record) = self.provider.store.get(GROUP, id)? {
            if let Some(group) = self.load_group(id, record)? {
                self.groups.active.insert(id.clone(), group);
            }
        }
        Ok(())
    }

    pub(crate) fn reload_touched_groups(&mut self) -> Result<(), SessionError> {
        for id in std::mem::take(&mut self.groups.touched) {
            self.reload_group(&id)?;
        }
        Ok(())
    }

    /// Runs `op` on group `id` so that, when it fails, the group is as it was, in storage and
    /// in memory. Nests.
    fn atomically<T>(
        &mut self,
        id: &ChatId,
        op: impl FnOnce(&mut Self) -> Result<T, GroupError>,
    ) -> Result<T, GroupError> {
        self.provider.store.savepoint();
        let done = op(self);
        if done.is_ok() {
            self.provider.store.keep_savepoint();
        } else {
            self.provider.store.undo_savepoint();
            self.reload_group(id)?;
        }
        done
    }

    pub fn group_state(&self, group_id: &str) -> Option<GroupState> {
        let id = ChatId::parse(group_id).ok()?;
        Some(self.groups.active.get(&id)?.state(&id))
    }

    /// The chat groups this device is a member of.
    pub fn groups(&self) -> impl Iterator<Item = GroupState> + '_ {
        self.groups.active.iter().map(|(id, group)| group.state(id))
    }

    /// Keeps `group` as group `id`, in memory and in the store.
    fn install(&mut self, id: &ChatId, group: ChatGroup) -> Result<GroupState, GroupError> {
        group.save(&self.provider.store, id)?;
        let state = group.state(id);
        self.groups.active.insert(id.clone(), group);
        self.groups.touched.insert(id.clone());
        Ok(state)
    }

    /// A group this device is a member of.
    fn member_of(&self, id: &ChatId) -> Result<&ChatGroup, GroupError> {
        if let Some(group) = self.groups.active.get(id) {
            return Ok(group);
        }
        Err(match self.gone(id)? {
            Some(_) => GroupError::NotMember(id.0.clone()),
            None => GroupError::UnknownGroup(id.0.clone()),
        })
    }

    /// The epoch a group this device is no longer in was in when it left.
    fn gone(&self, id: &ChatId) -> Result<Option<u64>, GroupError> {
        Ok(match self.provider.store.get(GROUP, id)? {
            Some(GroupRecord::Gone { epoch, .. }) => Some(epoch),
            _ => None,
        })
    }

    fn admin_of(&self, id: &ChatId) -> Result<&ChatGroup, GroupError> {
        let group = self.member_of(id)?;
        if group.membership.admin != self.me {
            return Err(GroupError::NotAdmin {
                group_id: id.0.clone(),
                from: self.me,
            });
        }
        Ok(group)
    }

    /// Forgets a group this device is no longer in; what comes for it later is refused.
    fn forget(&mut self, id: &ChatId) -> Result<(), GroupError> {
        let Some(mut group) = self.groups.active.remove(id) else {
            return Ok(());
        };
        self.groups.touched.insert(id.clone());
        let store = &self.provider.store;
        group.mls.delete(store)?;
        drop_held(store, id, &group.membership.held)?;
        store.put(
            GROUP,
            id,
            &GroupRecord::Gone {
                admin: group.membership.admin,
                epoch: group.mls.epoch().as_u64(),
            },
        )?;
        Ok(())
    }

    /// Forgets group `group_id` here; telling the others is the caller's.
    pub fn leave_group(&mut self, group_id: &str) -> Result<(), GroupError> {
        let id = ChatId::parse(group_id)?;
        self.member_of(&id)?;
        self.atomically(&id, |this| this.forget(&id))
    }
}

#[cfg(test)]
impl Sessions {
    /// A commit removing `member` made by this device, admin or not, and not merged: what a
    /// member that commits against the rules would send.
    pub(crate) fn forge_removal(&mut self, group_id: &str, member: Address) -> Vec<u8> {
        let id = ChatId::parse(group_id).unwrap();
        let group = self.groups.touch(&id).unwrap();
        let leaf = group
            .mls
            .members()
            .find(|m| bound_address(&m.credential, &m.signature_key) == Some(member))
            .unwrap()
            .index;
        let (commit, _, _) = group
            .mls
            .remove_members(&self.provider, &self.signer, &[leaf])
            .unwrap();
        group
            .mls
            .clear_pending_commit(&self.provider.store)
            .unwrap();
        serialize(commit, "commit").unwrap()
    }
}
