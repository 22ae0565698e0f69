//! Commits and messages of a later epoch than a group's, held until the commits before them
//! arrive. Each is a row of its own, raw, beside the group's record that lists them in the order
//! they came, so they survive a restart once the step that received them commits.

use courier_proto::Address;
use openmls::prelude::ContentType;
use serde::{Deserialize, Serialize};

use super::commits::Merged;
use super::{parse_as, ChatId, GroupError, Released};
use crate::sessions::Sessions;
use crate::store::{Store, StoreError};

const GROUP_HELD: &str = "group_held";

/// How many commits and messages of later epochs a group holds, and their bytes at most.
pub const MAX_HELD: usize = 64;
pub const MAX_HELD_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum HeldKind {
    Commit,
    Message,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Held {
    seq: u64,
    kind: HeldKind,
    epoch: u64,
    /// The address that carried it.
    from: Address,
    len: usize,
}

/// Deletes the rows of what a group held.
pub(super) fn drop_held(store: &Store, id: &ChatId, held: &[Held]) -> Result<(), StoreError> {
    for h in held {
        store.delete(GROUP_HELD, &(id, h.seq))?;
    }
    Ok(())
}

impl Sessions {
    /// Holds a commit or message of a later epoch; a copy of one held already is held once.
    pub(super) fn hold(
        &mut self,
        id: &ChatId,
        kind: HeldKind,
        epoch: u64,
        from: Address,
        bytes: &[u8],
    ) -> Result<(), GroupError> {
        let store = &self.provider.store;
        let group = self.groups.touch(id)?;
        let held = &mut group.membership.held;
        for h in held.iter() {
            if h.kind == kind
                && h.epoch == epoch
                && h.len == bytes.len()
                && store.get_bytes(GROUP_HELD, &(id, h.seq))?.as_deref() == Some(bytes)
            {
                return Ok(());
            }
        }
        let total: usize = held.iter().map(|h| h.len).sum();
        if held.len() >= MAX_HELD || total + bytes.len() > MAX_HELD_BYTES {
            return Err(GroupError::HoldFull(id.0.clone()));
        }
        let seq = group.membership.next_held;
        group.membership.next_held += 1;
        group.membership.held.push(Held {
            seq,
            kind,
            epoch,
            from,
            len: bytes.len(),
        });
        store.put_bytes(GROUP_HELD, &(id, seq), bytes)?;
        group.save(store, id)?;
        Ok(())
    }

    /// Opens the held messages the group's epoch has reached and applies the held commit of
    /// that epoch, until none is left to do.
    pub(super) fn release(
        &mut self,
        id: &ChatId,
        released: &mut Vec<Released>,
    ) -> Result<Merged, GroupError> {
        loop {
            let group = self.groups.touch(id)?;
            let epoch = group.mls.epoch().as_u64();
            let (ready, later): (Vec<Held>, Vec<Held>) = std::mem::take(&mut group.membership.held)
                .into_iter()
                .partition(|h| h.epoch <= epoch);
            group.membership.held = later;
            group.save(&self.provider.store, id)?;
            let mut commits = Vec::new();
            for held in ready {
                let bytes = self
                    .provider
                    .store
                    .get_bytes(GROUP_HELD, &(id, held.seq))?
                    .ok_or_else(|| GroupError::Mls(format!("held row {} is gone", held.seq)))?;
                self.provider.store.delete(GROUP_HELD, &(id, held.seq))?;
                match held.kind {
                    HeldKind::Message => released.push(
                        match self.atomically(id, |this| this.open_bytes(id, &held.from, &bytes)) {
                            Ok(message) => Released::Opened(message),
                            Err(error) => Released::Refused {
                                from: held.from,
                                error,
                            },
                        },
                    ),
                    // One of a passed epoch is a stale copy.
                    HeldKind::Commit if held.epoch == epoch => commits.push((held.from, bytes)),
                    HeldKind::Commit => {}
                }
            }
            // The admin makes one commit per epoch; a second is a copy, stale once one applies.
            let mut merged = false;
            for (from, bytes) in commits {
                if merged {
                    continue;
                }
                let applied = self.atomically(id, |this| {
                    let (_, message) = parse_as(&bytes, ContentType::Commit, "commit")?;
                    this.merge_commit(id, &from, message)
                });
                match applied {
                    Ok(Merged::RemovedSelf) => return Ok(Merged::RemovedSelf),
                    Ok(Merged::Next) => merged = true,
                    Err(error) => released.push(Released::Refused { from, error }),
                }
            }
            if !merged {
                return Ok(Merged::Next);
            }
        }
    }
}
