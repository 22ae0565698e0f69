//! What only a group's admin does: create it, and add and remove members, each change one
//! commit merged at once.

use std::collections::BTreeSet;

use courier_proto::Address;
use openmls::prelude::{MlsGroup, MlsGroupCreateConfig, MlsMessageOut};

use super::{
    members_of, mls, serialize, ChatGroup, ChatId, GroupCommit, GroupError, GroupRecord,
    GroupState, Membership, GROUP, MAX_PAST_EPOCHS,
};
use crate::sessions::{bound_address, ratchet, IdentitySigner, Provider, Sessions, CIPHERSUITE};

impl Sessions {
    /// A new chat group with this device as its admin and only member. A group id is used
    /// once: not again after this device left the group or was removed, since members may
    /// still hold the old group under it.
    pub fn create_group(&mut self, group_id: &str) -> Result<GroupState, GroupError> {
        let id = ChatId::parse(group_id)?;
        if self
            .provider
            .store
            .get::<GroupRecord>(GROUP, &id)?
            .is_some()
        {
            return Err(GroupError::Exists(id.0));
        }
        self.atomically(&id, |this| {
            let config = MlsGroupCreateConfig::builder()
                .ciphersuite(CIPHERSUITE)
                .use_ratchet_tree_extension(true)
                .sender_ratchet_configuration(ratchet())
                .max_past_epochs(MAX_PAST_EPOCHS as usize)
                .build();
            let mls = MlsGroup::new_with_group_id(
                &this.provider,
                &this.signer,
                &config,
                id.mls_id(),
                this.credential.clone(),
            )
            .map_err(mls)?;
            let membership = Membership {
                admin: this.me,
                joined: mls.epoch().as_u64(),
                held: Vec::new(),
                next_held: 0,
            };
            this.install(&id, ChatGroup { mls, membership })
        })
    }

    /// Adds devices by one key package each (as [`Sessions::key_package`] makes them), each
    /// bound to the address it is given with, in one commit, merged at once. Admin only.
    pub fn add_members(
        &mut self,
        group_id: &str,
        members: &[(Address, Vec<u8>)],
    ) -> Result<GroupCommit, GroupError> {
        let id = ChatId::parse(group_id)?;
        let current: BTreeSet<_> = members_of(&self.admin_of(&id)?.mls).into_iter().collect();
        if members.is_empty() {
            return Err(GroupError::NoMembers);
        }
        let mut named = BTreeSet::new();
        let mut packages = Vec::with_capacity(members.len());
        for (address, package) in members {
            if current.contains(address) || !named.insert(*address) {
                return Err(GroupError::AlreadyMember(*address));
            }
            packages.push(self.bound_key_package(*address, package)?);
        }
        self.commit_as_admin(&id, |group, provider, signer| {
            // Without a path: joiners get the tree in the Welcome, and an add needs no new
            // secrets from the admin, so the commit stays small however many join.
            let (commit, welcome, _) = group
                .add_members_without_update(provider, signer, &packages)
                .map_err(mls)?;
            Ok((commit, Some(welcome)))
        })
    }

    /// Removes members in one commit, merged at once. Admin only; the admin stays.
    pub fn remove_members(
        &mut self,
        group_id: &str,
        members: &[Address],
    ) -> Result<GroupCommit, GroupError> {
        let id = ChatId::parse(group_id)?;
        let group = self.admin_of(&id)?;
        if members.is_empty() {
            return Err(GroupError::NoMembers);
        }
        let mut leaves = BTreeSet::new();
        for address in members {
            if *address == self.me {
                return Err(GroupError::AdminStays);
            }
            let leaf = group
                .mls
                .members()
                .find(|m| bound_address(&m.credential, &m.signature_key) == Some(*address))
                .ok_or(GroupError::NoSuchMember(*address))?;
            leaves.insert(leaf.index);
        }
        let leaves: Vec<_> = leaves.into_iter().collect();
        self.commit_as_admin(&id, |group, provider, signer| {
            let (commit, _, _) = group
                .remove_members(provider, signer, &leaves)
                .map_err(mls)?;
            Ok((commit, None))
        })
    }

    /// The commit `make` makes (and its Welcome), merged at once.
    fn commit_as_admin(
        &mut self,
        id: &ChatId,
        make: impl FnOnce(
            &mut MlsGroup,
            &Provider,
            &IdentitySigner,
        ) -> Result<(MlsMessageOut, Option<MlsMessageOut>), GroupError>,
    ) -> Result<GroupCommit, GroupError> {
        self.atomically(id, |this| {
            let group = this.groups.touch(id)?;
            let (commit, welcome) = make(&mut group.mls, &this.provider, &this.signer)?;
            group
                .mls
                .merge_pending_commit(&this.provider)
                .map_err(mls)?;
            group.save(&this.provider.store, id)?;
            Ok(GroupCommit {
                epoch: group.mls.epoch().as_u64(),
                commit: serialize(commit, "commit")?,
                welcome: welcome.map(|w| serialize(w, "welcome")).transpose()?,
                members: members_of(&group.mls),
            })
        })
    }
}
