//! The MLS state as key-value rows, with a journal of what changed since the last commit
//! (`docs/architecture.md#end-to-end-sessions`).
//!
//! openmls writes its group state through a storage provider. Ours keeps every row in memory
//! and remembers, per row touched since the last [`Store::mark_committed`], the value it had then.
//! The runtime writes the changes in the same SQLite transaction as the store ops they protect
//! (a message's dedup record, its buffered row, an outbox entry), so a kill leaves the ratchet
//! and what it decrypted or sealed in agreement; [`Store::rollback`] undoes a step whose effects
//! are not kept.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use openmls_traits::storage::{traits, StorageProvider, CURRENT_VERSION};
use serde::Serialize;

const V: u16 = CURRENT_VERSION;

/// A row's key: a label naming what it holds, then the JSON of the openmls key it is stored
/// under.
pub type RowKey = Vec<u8>;

/// One row as it is now: `None` when it was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: RowKey,
    pub value: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("MLS state does not encode or decode: {0}")]
    Codec(#[from] serde_json::Error),
}

#[derive(Debug, Default)]
struct Rows {
    values: HashMap<RowKey, Vec<u8>>,
    /// Every row touched since the last commit, with the value it had then.
    before: BTreeMap<RowKey, Option<Vec<u8>>>,
    /// Open savepoints, innermost last: what each touched since it was set.
    savepoints: Vec<BTreeMap<RowKey, Saved>>,
}

/// A row touched since the savepoint: its value then, and whether it was already journaled in
/// `Rows::before`.
type Saved = (Option<Vec<u8>>, bool);

impl Rows {
    fn set(&mut self, key: RowKey, value: Option<Vec<u8>>) {
        let old = match value {
            Some(value) => self.values.insert(key.clone(), value),
            None => self.values.remove(&key),
        };
        if let Some(savepoint) = self.savepoints.last_mut() {
            let journaled = self.before.contains_key(&key);
            savepoint
                .entry(key.clone())
                .or_insert_with(|| (old.clone(), journaled));
        }
        self.before.entry(key).or_insert(old);
    }
}

#[derive(Debug, Default)]
pub struct Store {
    rows: RefCell<Rows>,
}

impl Store {
    /// The rows as last committed.
    pub fn restore(rows: impl IntoIterator<Item = (RowKey, Vec<u8>)>) -> Self {
        let values = rows.into_iter().collect();
        Self {
            rows: RefCell::new(Rows {
                values,
                before: BTreeMap::new(),
                savepoints: Vec::new(),
            }),
        }
    }

    /// What changed since the last commit, each row once with its value now, without making
    /// them the committed ones.
    pub fn changes(&self) -> Vec<Change> {
        let rows = self.rows.borrow();
        rows.before
            .keys()
            .map(|key| Change {
                key: key.clone(),
                value: rows.values.get(key).cloned(),
            })
            .collect()
    }

    /// The rows as they are now are the committed ones (the runtime wrote [`Store::changes`]).
    pub fn mark_committed(&self) {
        let mut rows = self.rows.borrow_mut();
        rows.savepoints.clear();
        rows.before.clear();
    }

    /// From here on, changes can be undone alone ([`Store::undo_savepoint`]) while those before
    /// it stay. Savepoints nest: each is kept or undone, innermost first.
    pub(crate) fn savepoint(&self) {
        self.rows.borrow_mut().savepoints.push(BTreeMap::new());
    }

    /// Keeps what changed since the innermost savepoint, as part of the one around it (or of
    /// the step).
    pub(crate) fn keep_savepoint(&self) {
        let mut rows = self.rows.borrow_mut();
        let inner = rows.savepoints.pop().unwrap_or_default();
        if let Some(outer) = rows.savepoints.last_mut() {
            // A row the outer savepoint has not seen was, when the inner one first touched it,
            // as it was when the outer one was set.
            for (key, saved) in inner {
                outer.entry(key).or_insert(saved);
            }
        }
    }

    /// Puts back every row touched since the innermost savepoint; earlier changes stay.
    pub(crate) fn undo_savepoint(&self) {
        let mut rows = self.rows.borrow_mut();
        for (key, (old, journaled)) in rows.savepoints.pop().unwrap_or_default() {
            match old {
                Some(value) => rows.values.insert(key.clone(), value),
                None => rows.values.remove(&key),
            };
            if !journaled {
                rows.before.remove(&key);
            }
        }
    }

    /// Puts back every row touched since the last commit.
    pub fn rollback(&self) {
        let mut rows = self.rows.borrow_mut();
        rows.savepoints.clear();
        let touched = std::mem::take(&mut rows.before);
        for (key, old) in touched {
            match old {
                Some(value) => rows.values.insert(key, value),
                None => rows.values.remove(&key),
            };
        }
    }

    fn key(label: &str, key: &impl Serialize) -> Result<RowKey, StoreError> {
        let mut out = Vec::with_capacity(label.len() + 48);
        out.extend_from_slice(label.as_bytes());
        out.push(b':');
        serde_json::to_writer(&mut out, key)?;
        Ok(out)
    }

    pub(crate) fn put(
        &self,
        label: &str,
        key: &impl Serialize,
        value: &impl Serialize,
    ) -> Result<(), StoreError> {
        let key = Self::key(label, key)?;
        let value = serde_json::to_vec(value)?;
        self.rows.borrow_mut().set(key, Some(value));
        Ok(())
    }

    pub(crate) fn get<T: serde::de::DeserializeOwned>(
        &self,
        label: &str,
        key: &impl Serialize,
    ) -> Result<Option<T>, StoreError> {
        let key = Self::key(label, key)?;
        let rows = self.rows.borrow();
        match rows.values.get(&key) {
            Some(bytes) => Ok(Some(serde_json::from_slice(bytes)?)),
            None => Ok(None),
        }
    }

    /// A row whose value is bytes as they are, not JSON (a held MLS message).
    pub(crate) fn put_bytes(
        &self,
        label: &str,
        key: &impl Serialize,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let key = Self::key(label, key)?;
        self.rows.borrow_mut().set(key, Some(bytes.to_vec()));
        Ok(())
    }

    pub(crate) fn get_bytes(
        &self,
        label: &str,
        key: &impl Serialize,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let key = Self::key(label, key)?;
        Ok(self.rows.borrow().values.get(&key).cloned())
    }

    pub(crate) fn delete(&self, label: &str, key: &impl Serialize) -> Result<(), StoreError> {
        let key = Self::key(label, key)?;
        let mut rows = self.rows.borrow_mut();
        if rows.values.contains_key(&key) {
            rows.set(key, None);
        }
        Ok(())
    }

    /// Every row of `label`, decoded.
    pub(crate) fn all<K: serde::de::DeserializeOwned, T: serde::de::DeserializeOwned>(
        &self,
        label: &str,
    ) -> Result<Vec<(K, T)>, StoreError> {
        let prefix = [label.as_bytes(), b":"].concat();
        let rows = self.rows.borrow();
        let mut out = Vec::new();
        for (key, value) in rows.values.iter() {
            if let Some(key) = key.strip_prefix(prefix.as_slice()) {
                out.push((serde_json::from_slice(key)?, serde_json::from_slice(value)?));
            }
        }
        Ok(out)
    }

    /// A list row: its elements as raw JSON, so any entity type can be appended or removed.
    fn list(
        &self,
        label: &str,
        key: &impl Serialize,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        Ok(self.get(label, key)?.unwrap_or_default())
    }

    fn set_list(
        &self,
        label: &str,
        key: &impl Serialize,
        list: &[serde_json::Value],
    ) -> Result<(), StoreError> {
        if list.is_empty() {
            self.delete(label, key)
        } else {
            self.put(label, key, &list)
        }
    }

    fn append(
        &self,
        label: &str,
        key: &impl Serialize,
        value: &impl Serialize,
    ) -> Result<(), StoreError> {
        let mut list = self.list(label, key)?;
        list.push(serde_json::to_value(value)?);
        self.set_list(label, key, &list)
    }
}

const JOIN_CONFIG: &str = "join_config";
const OWN_LEAF_NODES: &str = "own_leaf_nodes";
const PROPOSAL: &str = "proposal";
const PROPOSAL_QUEUE: &str = "proposal_queue";
const TREE: &str = "tree";
const INTERIM_TRANSCRIPT_HASH: &str = "interim_transcript_hash";
const CONTEXT: &str = "context";
const CONFIRMATION_TAG: &str = "confirmation_tag";
const GROUP_STATE: &str = "group_state";
const MESSAGE_SECRETS: &str = "message_secrets";
const RESUMPTION_PSK_STORE: &str = "resumption_psk_store";
const OWN_LEAF_INDEX: &str = "own_leaf_index";
const EPOCH_SECRETS: &str = "epoch_secrets";
const SIGNATURE_KEY_PAIR: &str = "signature_key_pair";
const ENCRYPTION_KEY_PAIR: &str = "encryption_key_pair";
const EPOCH_KEY_PAIRS: &str = "epoch_key_pairs";
const KEY_PACKAGE: &str = "key_package";
const PSK: &str = "psk";

/// The write, read and delete of a value kept once per group.
macro_rules! per_group {
    ($label:ident, $write:ident, $read:ident, $delete:ident, $Bound:ident) => {
        fn $write<GroupId: traits::GroupId<V>, T: traits::$Bound<V>>(
            &self,
            group_id: &GroupId,
            value: &T,
        ) -> Result<(), StoreError> {
            self.put($label, group_id, value)
        }

        fn $read<GroupId: traits::GroupId<V>, T: traits::$Bound<V>>(
            &self,
            group_id: &GroupId,
        ) -> Result<Option<T>, StoreError> {
            self.get($label, group_id)
        }

        fn $delete<GroupId: traits::GroupId<V>>(
            &self,
            group_id: &GroupId,
        ) -> Result<(), StoreError> {
            self.delete($label, group_id)
        }
    };
}

impl StorageProvider<V> for Store {
    type Error = StoreError;

    per_group!(
        JOIN_CONFIG,
        write_mls_join_config,
        mls_group_join_config,
        delete_group_config,
        MlsGroupJoinConfig
    );
    per_group!(TREE, write_tree, tree, delete_tree, TreeSync);
    per_group!(
        INTERIM_TRANSCRIPT_HASH,
        write_interim_transcript_hash,
        interim_transcript_hash,
        delete_interim_transcript_hash,
        InterimTranscriptHash
    );
    per_group!(
        CONTEXT,
        write_context,
        group_context,
        delete_context,
        GroupContext
    );
    per_group!(
        CONFIRMATION_TAG,
        write_confirmation_tag,
        confirmation_tag,
        delete_confirmation_tag,
        ConfirmationTag
    );
    per_group!(
        MESSAGE_SECRETS,
        write_message_secrets,
        message_secrets,
        delete_message_secrets,
        MessageSecrets
    );
    per_group!(
        RESUMPTION_PSK_STORE,
        write_resumption_psk_store,
        resumption_psk_store,
        delete_all_resumption_psk_secrets,
        ResumptionPskStore
    );
    per_group!(
        OWN_LEAF_INDEX,
        write_own_leaf_index,
        own_leaf_index,
        delete_own_leaf_index,
        LeafNodeIndex
    );
    per_group!(
        EPOCH_SECRETS,
        write_group_epoch_secrets,
        group_epoch_secrets,
        delete_group_epoch_secrets,
        GroupEpochSecrets
    );

    fn write_group_state<GroupState: traits::GroupState<V>, GroupId: traits::GroupId<V>>(
        &self,
        group_id: &GroupId,
        group_state: &GroupState,
    ) -> Result<(), StoreError> {
        self.put(GROUP_STATE, group_id, group_state)
    }

    fn group_state<GroupState: traits::GroupState<V>, GroupId: traits::GroupId<V>>(
        &self,
        group_id: &GroupId,
    ) -> Result<Option<GroupState>, StoreError> {
        self.get(GROUP_STATE, group_id)
    }

    fn delete_group_state<GroupId: traits::GroupId<V>>(
        &self,
        group_id: &GroupId,
    ) -> Result<(), StoreError> {
        self.delete(GROUP_STATE, group_id)
    }

    fn append_own_leaf_node<GroupId: traits::GroupId<V>, LeafNode: traits::LeafNode<V>>(
        &self,
        group_id: &GroupId,
        leaf_node: &LeafNode,
    ) -> Result<(), StoreError> {
        self.append(OWN_LEAF_NODES, group_id, leaf_node)
    }

    fn own_leaf_nodes<GroupId: traits::GroupId<V>, LeafNode: traits::LeafNode<V>>(
        &self,
        group_id: &GroupId,
    ) -> Result<Vec<LeafNode>, StoreError> {
        Ok(self.get(OWN_LEAF_NODES, group_id)?.unwrap_or_default())
    }

    fn delete_own_leaf_nodes<GroupId: traits::GroupId<V>>(
        &self,
        group_id: &GroupId,
    ) -> Result<(), StoreError> {
        self.delete(OWN_LEAF_NODES, group_id)
    }

    fn queue_proposal<
        GroupId: traits::GroupId<V>,
        ProposalRef: traits::ProposalRef<V>,
        QueuedProposal: traits::QueuedProposal<V>,
    >(
        &self,
        group_id: &GroupId,
        proposal_ref: &ProposalRef,
        proposal: &QueuedProposal,
    ) -> Result<(), StoreError> {
        self.put(PROPOSAL, &(group_id, proposal_ref), proposal)?;
        self.append(PROPOSAL_QUEUE, group_id, proposal_ref)
    }

    fn queued_proposal_refs<GroupId: traits::GroupId<V>, ProposalRef: traits::ProposalRef<V>>(
        &self,
        group_id: &GroupId,
    ) -> Result<Vec<ProposalRef>, StoreError> {
        Ok(self.get(PROPOSAL_QUEUE, group_id)?.unwrap_or_default())
    }

    fn queued_proposals<
        GroupId: traits::GroupId<V>,
        ProposalRef: traits::ProposalRef<V>,
        QueuedProposal: traits::QueuedProposal<V>,
    >(
        &self,
        group_id: &GroupId,
    ) -> Result<Vec<(ProposalRef, QueuedProposal)>, StoreError> {
        let refs: Vec<ProposalRef> = self.queued_proposal_refs(group_id)?;
        let mut out = Vec::with_capacity(refs.len());
        for proposal_ref in refs {
            if let Some(proposal) = self.get(PROPOSAL, &(group_id, &proposal_ref))? {
                out.push((proposal_ref, proposal));
            }
        }
        Ok(out)
    }

    fn remove_proposal<GroupId: traits::GroupId<V>, ProposalRef: traits::ProposalRef<V>>(
        &self,
        group_id: &GroupId,
        proposal_ref: &ProposalRef,
    ) -> Result<(), StoreError> {
        let target = serde_json::to_value(proposal_ref)?;
        let mut queue = self.list(PROPOSAL_QUEUE, group_id)?;
        queue.retain(|queued| *queued != target);
        self.set_list(PROPOSAL_QUEUE, group_id, &queue)?;
        self.delete(PROPOSAL, &(group_id, proposal_ref))
    }

    fn clear_proposal_queue<GroupId: traits::GroupId<V>, ProposalRef: traits::ProposalRef<V>>(
        &self,
        group_id: &GroupId,
    ) -> Result<(), StoreError> {
        let refs: Vec<ProposalRef> = self.queued_proposal_refs(group_id)?;
        for proposal_ref in &refs {
            self.delete(PROPOSAL, &(group_id, proposal_ref))?;
        }
        self.delete(PROPOSAL_QUEUE, group_id)
    }

    fn write_signature_key_pair<
        SignaturePublicKey: traits::SignaturePublicKey<V>,
        SignatureKeyPair: traits::SignatureKeyPair<V>,
    >(
        &self,
        public_key: &SignaturePublicKey,
        signature_key_pair: &SignatureKeyPair,
    ) -> Result<(), StoreError> {
        self.put(SIGNATURE_KEY_PAIR, public_key, signature_key_pair)
    }

    fn signature_key_pair<
        SignaturePublicKey: traits::SignaturePublicKey<V>,
        SignatureKeyPair: traits::SignatureKeyPair<V>,
    >(
        &self,
        public_key: &SignaturePublicKey,
    ) -> Result<Option<SignatureKeyPair>, StoreError> {
        self.get(SIGNATURE_KEY_PAIR, public_key)
    }

    fn delete_signature_key_pair<SignaturePublicKey: traits::SignaturePublicKey<V>>(
        &self,
        public_key: &SignaturePublicKey,
    ) -> Result<(), StoreError> {
        self.delete(SIGNATURE_KEY_PAIR, public_key)
    }

    fn write_encryption_key_pair<
        EncryptionKey: traits::EncryptionKey<V>,
        HpkeKeyPair: traits::HpkeKeyPair<V>,
    >(
        &self,
        public_key: &EncryptionKey,
        key_pair: &HpkeKeyPair,
    ) -> Result<(), StoreError> {
        self.put(ENCRYPTION_KEY_PAIR, public_key, key_pair)
    }

    fn encryption_key_pair<
        HpkeKeyPair: traits::HpkeKeyPair<V>,
        EncryptionKey: traits::EncryptionKey<V>,
    >(
        &self,
        public_key: &EncryptionKey,
    ) -> Result<Option<HpkeKeyPair>, StoreError> {
        self.get(ENCRYPTION_KEY_PAIR, public_key)
    }

    fn delete_encryption_key_pair<EncryptionKey: traits::EncryptionKey<V>>(
        &self,
        public_key: &EncryptionKey,
    ) -> Result<(), StoreError> {
        self.delete(ENCRYPTION_KEY_PAIR, public_key)
    }

    fn write_encryption_epoch_key_pairs<
        GroupId: traits::GroupId<V>,
        EpochKey: traits::EpochKey<V>,
        HpkeKeyPair: traits::HpkeKeyPair<V>,
    >(
        &self,
        group_id: &GroupId,
        epoch: &EpochKey,
        leaf_index: u32,
        key_pairs: &[HpkeKeyPair],
    ) -> Result<(), StoreError> {
        self.put(EPOCH_KEY_PAIRS, &(group_id, epoch, leaf_index), &key_pairs)
    }

    fn encryption_epoch_key_pairs<
        GroupId: traits::GroupId<V>,
        EpochKey: traits::EpochKey<V>,
        HpkeKeyPair: traits::HpkeKeyPair<V>,
    >(
        &self,
        group_id: &GroupId,
        epoch: &EpochKey,
        leaf_index: u32,
    ) -> Result<Vec<HpkeKeyPair>, StoreError> {
        Ok(self
            .get(EPOCH_KEY_PAIRS, &(group_id, epoch, leaf_index))?
            .unwrap_or_default())
    }

    fn delete_encryption_epoch_key_pairs<
        GroupId: traits::GroupId<V>,
        EpochKey: traits::EpochKey<V>,
    >(
        &self,
        group_id: &GroupId,
        epoch: &EpochKey,
        leaf_index: u32,
    ) -> Result<(), StoreError> {
        self.delete(EPOCH_KEY_PAIRS, &(group_id, epoch, leaf_index))
    }

    fn write_key_package<
        HashReference: traits::HashReference<V>,
        KeyPackage: traits::KeyPackage<V>,
    >(
        &self,
        hash_ref: &HashReference,
        key_package: &KeyPackage,
    ) -> Result<(), StoreError> {
        self.put(KEY_PACKAGE, hash_ref, key_package)
    }

    fn key_package<KeyPackageRef: traits::HashReference<V>, KeyPackage: traits::KeyPackage<V>>(
        &self,
        hash_ref: &KeyPackageRef,
    ) -> Result<Option<KeyPackage>, StoreError> {
        self.get(KEY_PACKAGE, hash_ref)
    }

    fn delete_key_package<KeyPackageRef: traits::HashReference<V>>(
        &self,
        hash_ref: &KeyPackageRef,
    ) -> Result<(), StoreError> {
        self.delete(KEY_PACKAGE, hash_ref)
    }

    fn write_psk<PskId: traits::PskId<V>, PskBundle: traits::PskBundle<V>>(
        &self,
        psk_id: &PskId,
        psk: &PskBundle,
    ) -> Result<(), StoreError> {
        self.put(PSK, psk_id, psk)
    }

    fn psk<PskBundle: traits::PskBundle<V>, PskId: traits::PskId<V>>(
        &self,
        psk_id: &PskId,
    ) -> Result<Option<PskBundle>, StoreError> {
        self.get(PSK, psk_id)
    }

    fn delete_psk<PskKey: traits::PskId<V>>(&self, psk_id: &PskKey) -> Result<(), StoreError> {
        self.delete(PSK, psk_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_each_row_once_with_its_value_now_and_rollback_restores() {
        let store = Store::default();
        store.put("l", &1, &"a").unwrap();
        store.put("l", &1, &"b").unwrap();
        store.put("l", &2, &"c").unwrap();
        store.delete("l", &2).unwrap();
        let changes = store.changes();
        store.mark_committed();
        assert_eq!(
            changes,
            [
                Change {
                    key: b"l:1".to_vec(),
                    value: Some(b"\"b\"".to_vec())
                },
                Change {
                    key: b"l:2".to_vec(),
                    value: None
                },
            ]
        );

        store.put("l", &1, &"x").unwrap();
        store.put("l", &3, &"y").unwrap();
        store.rollback();
        assert_eq!(store.get::<String>("l", &1).unwrap().as_deref(), Some("b"));
        assert_eq!(store.get::<String>("l", &3).unwrap(), None);
        assert!(store.changes().is_empty());
    }

    #[test]
    fn savepoints_nest_and_an_inner_one_kept_is_undone_with_the_outer() {
        let store = Store::default();
        store.put("l", &1, &"committed").unwrap();
        store.mark_committed();
        store.put("l", &2, &"step").unwrap();

        store.savepoint();
        store.put("l", &1, &"outer").unwrap();
        store.savepoint();
        store.put("l", &3, &"inner, undone").unwrap();
        store.undo_savepoint();
        store.savepoint();
        store.put("l", &1, &"inner, kept").unwrap();
        store.put("l", &4, &"inner, kept").unwrap();
        store.keep_savepoint();
        assert_eq!(
            store.get::<String>("l", &1).unwrap().as_deref(),
            Some("inner, kept")
        );
        assert_eq!(store.get::<String>("l", &3).unwrap(), None);
        store.undo_savepoint();

        assert_eq!(
            store.get::<String>("l", &1).unwrap().as_deref(),
            Some("committed")
        );
        assert_eq!(store.get::<String>("l", &4).unwrap(), None);
        assert_eq!(
            store.changes(),
            [Change {
                key: b"l:2".to_vec(),
                value: Some(b"\"step\"".to_vec())
            }],
            "only the step's own change is left to write"
        );
    }

    #[test]
    fn restored_rows_read_back() {
        let store = Store::restore([(b"l:1".to_vec(), b"\"b\"".to_vec())]);
        assert_eq!(store.get::<String>("l", &1).unwrap().as_deref(), Some("b"));
    }
}
