//! Address bindings (`docs/protocol.md#address-declaration`) in two buckets: `addresses` maps an
//! address to the account that last declared it (its age is its last declaration, and the
//! bucket's max age is the bindings' lifetime), `bindings` lists each account's addresses with
//! when it declared them, so a declaration past `max_per_account` drops the least recently
//! declared one.

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

use super::feed::{put, Feed};
use super::names::token;
use super::record::{change_record, put_record, read_record};
use super::{lost_race, request, ClusterError, JetStreamStore};

#[derive(Serialize, Deserialize)]
struct Binding {
    address: String,
    account: String,
    declared_ms: u64,
}

#[derive(Serialize, Deserialize, Clone)]
struct Declared {
    address: String,
    declared_ms: u64,
}

/// One change of one binding, as [`JetStreamStore::binding_changes`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingChange {
    Bound {
        /// The binding's key in the bucket, which a later `Unbound` names.
        key: String,
        address: String,
        account: String,
        declared_ms: u64,
    },
    /// The binding under `key` was deleted: its account dropped it past its limit.
    Unbound { key: String },
}

impl JetStreamStore {
    /// Follows every address binding from the start. A binding that expires (not declared
    /// again within the bindings' lifetime) goes without a change: its follower drops it by its
    /// `declared_ms`.
    pub async fn binding_changes(&self) -> Result<Feed<BindingChange>, ClusterError> {
        Feed::start(&self.inner.addresses, |entry| {
            if entry.operation != kv::Operation::Put {
                return Some(Ok(BindingChange::Unbound { key: entry.key }));
            }
            let key = entry.key.clone();
            put::<Binding>(&entry).map(|binding| {
                binding.map(|binding| BindingChange::Bound {
                    key,
                    address: binding.address,
                    account: binding.account,
                    declared_ms: binding.declared_ms,
                })
            })
        })
        .await
    }

    /// Binds `address` (canonical) to `account`, replacing any earlier binding (the latest
    /// declaration wins), and drops the account's least recently declared bindings past
    /// `max_per_account`.
    pub async fn bind_address(
        &self,
        address: &str,
        account: &str,
        max_per_account: u32,
        now_ms: u64,
    ) -> Result<(), ClusterError> {
        let binding = Binding {
            address: address.to_owned(),
            account: account.to_owned(),
            declared_ms: now_ms,
        };
        put_record(&self.inner.addresses, &token(&[address]), &binding).await?;
        for dropped in self
            .record_declaration(account, address, max_per_account, now_ms)
            .await?
        {
            self.unbind_if_held(&dropped, account).await?;
        }
        Ok(())
    }

    /// The account `address` (canonical) is bound to, if a declaration within the bindings'
    /// lifetime made one.
    pub async fn resolve_address(&self, address: &str) -> Result<Option<String>, ClusterError> {
        let binding = read_record::<Binding>(&self.inner.addresses, &token(&[address])).await?;
        Ok(binding.map(|binding| binding.account))
    }

    /// Adds `address` to the account's list (or refreshes it) with a compare-and-set on the
    /// list, so declarations through several nodes at once all count; answers the addresses
    /// dropped past `max_per_account`.
    async fn record_declaration(
        &self,
        account: &str,
        address: &str,
        max_per_account: u32,
        now_ms: u64,
    ) -> Result<Vec<String>, ClusterError> {
        let key = token(&[account]);
        change_record(
            &self.inner.bindings,
            &key,
            |declared: &mut Vec<Declared>| {
                declared.retain(|d| d.address != address);
                declared.push(Declared {
                    address: address.to_owned(),
                    declared_ms: now_ms,
                });
                declared.sort_by_key(|d| d.declared_ms);
                let excess = declared.len().saturating_sub(max_per_account as usize);
                let dropped: Vec<String> = declared.drain(..excess).map(|d| d.address).collect();
                (dropped, true)
            },
        )
        .await
    }

    /// Deletes the binding of `address` if `account` still holds it (a later declaration by
    /// another account keeps it).
    async fn unbind_if_held(&self, address: &str, account: &str) -> Result<(), ClusterError> {
        let key = token(&[address]);
        let Some(entry) = self
            .inner
            .addresses
            .entry(key.clone())
            .await
            .map_err(request)?
        else {
            return Ok(());
        };
        if entry.operation != kv::Operation::Put {
            return Ok(());
        }
        let binding: Binding = serde_json::from_slice(&entry.value)
            .map_err(|e| ClusterError::Corrupt(e.to_string()))?;
        if binding.account != account {
            return Ok(());
        }
        match self
            .inner
            .addresses
            .delete_expect_revision(&key, Some(entry.revision))
            .await
        {
            Ok(()) => Ok(()),
            // Declared again meanwhile: the newer binding stands.
            Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision || lost_race(&e) => Ok(()),
            Err(e) => Err(request(e)),
        }
    }
}
