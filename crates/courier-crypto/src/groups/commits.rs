//! What a member receives from the admin: the Welcome it joins by and the commits that follow,
//! each checked against the admin's rules before it is merged.

use std::collections::BTreeSet;

use courier_proto::Address;
use openmls::prelude::tls_codec::Deserialize as _;
use openmls::prelude::{
    ContentType, MlsGroup, MlsGroupJoinConfig, MlsMessageBodyIn, MlsMessageIn,
    ProcessedMessageContent, Proposal, ProtocolMessage, Sender, StagedCommit, StagedWelcome,
    Welcome,
};
use openmls_traits::crypto::OpenMlsCrypto as _;
use openmls_traits::types::HashType;

use super::{
    admin_leaf, malformed, members_of, mls, parse_as, ChatGroup, ChatId, CommitOutcome, GroupError,
    GroupJoined, GroupRecord, HeldKind, Membership, GROUP, GROUP_WELCOME, MAX_PAST_EPOCHS,
};
use crate::sessions::{bound_address, named, ratchet, Sessions};

fn join_config() -> MlsGroupJoinConfig {
    MlsGroupJoinConfig::builder()
        .use_ratchet_tree_extension(true)
        .sender_ratchet_configuration(ratchet())
        .max_past_epochs(MAX_PAST_EPOCHS as usize)
        .build()
}

/// Whether a commit was merged or removed this device.
#[derive(PartialEq, Eq)]
pub(super) enum Merged {
    Next,
    RemovedSelf,
}

impl Sessions {
    /// A Welcome from `from` (a verified control frame of that address) into a chat group whose
    /// admin it is.
    pub fn join_group(&mut self, from: Address, welcome: &[u8]) -> Result<GroupJoined, GroupError> {
        let digest = self.digest(welcome)?;
        // Its key package is spent once joined: a repeat is known by its bytes.
        if self
            .provider
            .store
            .get::<ChatId>(GROUP_WELCOME, &digest)?
            .is_some()
        {
            return Ok(GroupJoined::Already);
        }
        let MlsMessageBodyIn::Welcome(welcome) = MlsMessageIn::tls_deserialize_exact(welcome)
            .map_err(malformed("welcome"))?
            .extract()
        else {
            return Err(GroupError::Malformed {
                what: "welcome",
                detail: "another kind of MLS message".into(),
            });
        };
        self.provider.store.savepoint();
        let joined = self.join_now(from, welcome, &digest);
        // Staging alone writes (it spends the key package): an `Already` keeps nothing either.
        if matches!(joined, Ok(GroupJoined::Joined(_))) {
            self.provider.store.keep_savepoint();
        } else {
            self.provider.store.undo_savepoint();
        }
        joined
    }

    fn digest(&self, bytes: &[u8]) -> Result<String, GroupError> {
        let hash = self
            .provider
            .crypto
            .hash(HashType::Sha2_256, bytes)
            .map_err(mls)?;
        Ok(hash.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Joins, changing memory only once nothing can fail any more.
    fn join_now(
        &mut self,
        from: Address,
        welcome: Welcome,
        digest: &str,
    ) -> Result<GroupJoined, GroupError> {
        let staged = StagedWelcome::new_from_welcome(&self.provider, &join_config(), welcome, None)
            .map_err(mls)?;
        let context = staged.group_context();
        let id = ChatId::of(context.group_id()).ok_or(GroupError::Malformed {
            what: "welcome",
            detail: "not into a chat group".into(),
        })?;
        let epoch = context.epoch().as_u64();
        let sender = staged.welcome_sender().map_err(mls)?;
        if staged.welcome_sender_index() != admin_leaf()
            || bound_address(sender.credential(), sender.signature_key().as_slice()) != Some(from)
        {
            return Err(GroupError::NotAdmin {
                group_id: id.0,
                from,
            });
        }
        if staged
            .members()
            .any(|m| bound_address(&m.credential, &m.signature_key).is_none())
        {
            return Err(GroupError::NotBound {
                what: "welcome",
                peer: from,
            });
        }
        match (
            self.groups.active.get(&id),
            self.provider.store.get(GROUP, &id)?,
        ) {
            (Some(ours), _) if ours.membership.admin != from => {
                return Err(GroupError::NotAdmin {
                    group_id: id.0,
                    from,
                })
            }
            (Some(ours), _) if ours.mls.epoch().as_u64() >= epoch => {
                return Ok(GroupJoined::Already)
            }
            (None, Some(GroupRecord::Gone { admin, epoch: left }))
                if admin == from && left >= epoch =>
            {
                return Ok(GroupJoined::Already)
            }
            _ => {}
        }
        // A Welcome into a later epoch of a group held here: this device was removed and added
        // again without learning it. The old state goes first: the new one has the same id.
        self.atomically(&id.clone(), |this| {
            this.forget(&id)?;
            let mls = staged.into_group(&this.provider).map_err(mls)?;
            this.provider.store.put(GROUP_WELCOME, &digest, &id)?;
            let membership = Membership {
                admin: from,
                joined: epoch,
                held: Vec::new(),
                next_held: 0,
            };
            Ok(GroupJoined::Joined(
                this.install(&id, ChatGroup { mls, membership })?,
            ))
        })
    }

    /// A commit `from` sent (a verified control frame of that address).
    pub fn apply_commit(
        &mut self,
        from: &Address,
        commit: &[u8],
    ) -> Result<CommitOutcome, GroupError> {
        let (id, message) = parse_as(commit, ContentType::Commit, "commit")?;
        let epoch = message.epoch().as_u64();
        let Some(group) = self.groups.active.get(&id) else {
            return match self.gone(&id)? {
                Some(left) if epoch <= left => Ok(CommitOutcome::Stale),
                Some(_) => Err(GroupError::NotMember(id.0)),
                None => Err(GroupError::UnknownGroup(id.0)),
            };
        };
        if *from != group.membership.admin {
            return Err(GroupError::NotAdmin {
                group_id: id.0,
                from: *from,
            });
        }
        let current = group.mls.epoch().as_u64();
        if epoch < current {
            return Ok(CommitOutcome::Stale);
        }
        self.atomically(&id, |this| {
            if epoch > current {
                this.hold(&id, HeldKind::Commit, epoch, *from, commit)?;
                return Ok(CommitOutcome::Buffered);
            }
            let mut released = Vec::new();
            let removed = this.merge_commit(&id, from, message)? == Merged::RemovedSelf
                || this.release(&id, &mut released)? == Merged::RemovedSelf;
            Ok(match this.groups.active.get(&id) {
                Some(group) if !removed => CommitOutcome::Applied {
                    state: group.state(&id),
                    released,
                },
                _ => CommitOutcome::RemovedSelf {
                    group_id: id.0.clone(),
                    released,
                },
            })
        })
    }

    /// Processes a commit of the group's epoch and merges it, or forgets the group when it
    /// removes this device.
    pub(super) fn merge_commit(
        &mut self,
        id: &ChatId,
        from: &Address,
        message: ProtocolMessage,
    ) -> Result<Merged, GroupError> {
        let group = self.groups.touch(id)?;
        let processed = group
            .mls
            .process_message(&self.provider, message)
            .map_err(mls)?;
        let admin = group.membership.admin;
        let by_admin = *processed.sender() == Sender::Member(admin_leaf())
            && named(processed.credential()) == Some(admin)
            && *from == admin;
        if !by_admin {
            return Err(GroupError::NotAdmin {
                group_id: id.0.clone(),
                from: *from,
            });
        }
        let ProcessedMessageContent::StagedCommitMessage(staged) = processed.into_content() else {
            return Err(GroupError::Malformed {
                what: "commit",
                detail: "not a commit".into(),
            });
        };
        check_commit(&group.mls, &staged, admin)?;
        if staged.self_removed() {
            self.forget(id)?;
            return Ok(Merged::RemovedSelf);
        }
        group
            .mls
            .merge_staged_commit(&self.provider, *staged)
            .map_err(mls)?;
        group.save(&self.provider.store, id)?;
        Ok(Merged::Next)
    }
}

/// A commit of the admin may add devices bound to their addresses that are not members yet,
/// and remove anyone but the admin; its own new leaf, if any, stays the admin's.
fn check_commit(group: &MlsGroup, staged: &StagedCommit, admin: Address) -> Result<(), GroupError> {
    let members: BTreeSet<_> = members_of(group).into_iter().collect();
    let mut added = BTreeSet::new();
    for queued in staged.queued_proposals() {
        match queued.proposal() {
            Proposal::Add(add) => {
                let leaf = add.key_package().leaf_node();
                match bound_address(leaf.credential(), leaf.signature_key().as_slice()) {
                    Some(address) if !members.contains(&address) && added.insert(address) => {}
                    _ => {
                        return Err(GroupError::Refused(
                            "it adds a device not bound to its address, or one twice",
                        ))
                    }
                }
            }
            Proposal::Remove(remove) if remove.removed() != admin_leaf() => {}
            Proposal::Remove(_) => return Err(GroupError::Refused("it removes the admin")),
            _ => return Err(GroupError::Refused("it does more than add and remove")),
        }
    }
    if let Some(leaf) = staged.update_path_leaf_node() {
        if bound_address(leaf.credential(), leaf.signature_key().as_slice()) != Some(admin) {
            return Err(GroupError::NotBound {
                what: "commit",
                peer: admin,
            });
        }
    }
    Ok(())
}
