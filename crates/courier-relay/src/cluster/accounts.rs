//! Accounts in the `accounts` bucket, and the base each account's `seq` counts from
//! (`docs/cluster.md#seq`).
//!
//! An account's frames are messages of one stream shared by every account, so their stream
//! sequences are strictly increasing in acceptance order and never reused, but not from 1. The
//! account's base is the stream's next sequence when the account was created; its frame at
//! stream sequence `n` has `seq = n - base + 1`. No frame of the account precedes its base:
//! a frame is journaled only for an account whose record exists, and the record is created
//! with the base read before it.

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

use super::names::token;
use super::record::read_record;
use super::{lost_race, request, ClusterError, JetStreamStore};

#[derive(Serialize, Deserialize)]
struct AccountRecord {
    name: String,
    created_ms: u64,
    base: u64,
}

impl JetStreamStore {
    /// Records the account at its first successful authentication.
    pub async fn ensure_account(&self, name: &str, now_ms: u64) -> Result<(), ClusterError> {
        if self.base(name).await?.is_some() {
            return Ok(());
        }
        let info = self.inner.journal.get_info().await.map_err(request)?;
        let record = AccountRecord {
            name: name.to_owned(),
            created_ms: now_ms,
            base: info.state.last_sequence + 1,
        };
        let value = serde_json::to_vec(&record).map_err(request)?;
        match self
            .inner
            .accounts
            .create(token(&[name]), value.into())
            .await
        {
            Ok(_) => {}
            // Another node created it meanwhile; its base stands.
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists || lost_race(&e) => {}
            Err(e) => return Err(request(e)),
        }
        Ok(())
    }

    pub async fn account_exists(&self, name: &str) -> Result<bool, ClusterError> {
        Ok(self.base(name).await?.is_some())
    }

    /// The account's base, `None` for an account never created.
    pub(super) async fn base(&self, name: &str) -> Result<Option<u64>, ClusterError> {
        if let Some(&base) = self.bases().get(name) {
            return Ok(Some(base));
        }
        let Some(record) =
            read_record::<AccountRecord>(&self.inner.accounts, &token(&[name])).await?
        else {
            return Ok(None);
        };
        self.bases().insert(name.to_owned(), record.base);
        Ok(Some(record.base))
    }

    fn bases(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u64>> {
        self.inner
            .bases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
