//! Presence across relay nodes (`docs/cluster.md#presence`): which node holds each account's
//! connection, in the `presence` bucket, and which nodes are alive, in the `nodes` bucket, where
//! each node's heartbeat expires after the presence lifetime. An account whose node stopped
//! beating is offline without anyone writing it: a dead node's connections go offline on their
//! own, and a live node writes only when a connection starts or ends.

use std::time::Duration;

use async_nats::jetstream::kv;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::names::token;
use super::{request, ClusterError, JetStreamStore};

/// Where an account is connected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presence {
    /// The relay node holding the connection.
    pub node: String,
    /// The connection, unique within its node.
    pub connection: u64,
    pub since_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct PresenceRecord {
    account: String,
    #[serde(flatten)]
    presence: Presence,
}

/// A node's heartbeat, beating until dropped.
pub struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The changes of one account's presence record, as they are stored, from about the moment the
/// watch started (it may begin with the record as it stood then): what a node holding the
/// account's connection follows to learn that a newer connection displaced it
/// (`docs/protocol.md#session-displacement`), and what presence watches on other nodes follow.
/// A change is a state, not an event: reading the same record twice changes nothing.
pub struct PresenceChanges {
    watch: kv::Watch,
}

impl PresenceChanges {
    /// The next change: `Some(presence)` for a connection that started, `None` for the record
    /// removed (the connection ended). `Err` when the watch failed; the watcher starts a new
    /// one and reads [`JetStreamStore::present`], since changes meanwhile are not replayed.
    pub async fn next(&mut self) -> Option<Result<Option<Presence>, ClusterError>> {
        let entry = match self.watch.next().await? {
            Ok(entry) => entry,
            Err(e) => return Some(Err(request(e))),
        };
        Some(match entry.operation {
            kv::Operation::Put => serde_json::from_slice::<PresenceRecord>(&entry.value)
                .map(|record| Some(record.presence))
                .map_err(|e| ClusterError::Corrupt(e.to_string())),
            kv::Operation::Delete | kv::Operation::Purge => Ok(None),
        })
    }
}

impl JetStreamStore {
    /// Watches `account`'s presence record; the watch is in place when this answers.
    pub async fn watch_presence(&self, account: &str) -> Result<PresenceChanges, ClusterError> {
        let watch = self
            .inner
            .presence
            .watch(token(&[account]))
            .await
            .map_err(request)?;
        Ok(PresenceChanges { watch })
    }

    /// Starts `node`'s heartbeat: its record in the `nodes` bucket, written again every third
    /// of the presence lifetime, so one lost write does not take the node's connections offline.
    /// Answers once the first beat is stored.
    pub async fn start_heartbeat(&self, node: &str) -> Result<Heartbeat, ClusterError> {
        let key = token(&[node]);
        let beat = {
            let nodes = self.inner.nodes.clone();
            let key = key.clone();
            let node = node.to_owned();
            move || {
                let (nodes, key, node) = (nodes.clone(), key.clone(), node.clone());
                async move { nodes.put(key, node.into_bytes().into()).await }
            }
        };
        beat().await.map_err(request)?;
        let interval = self.inner.presence_ttl / 3;
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = beat().await {
                    tracing::warn!(error = %e, "a relay node's heartbeat was not stored");
                }
            }
        });
        Ok(Heartbeat { task })
    }

    /// Records that `account` is connected on `node` as `connection` (the latest connection
    /// wins, as displacement says: `docs/protocol.md#session-displacement`).
    pub async fn connected(&self, account: &str, presence: Presence) -> Result<(), ClusterError> {
        let record = PresenceRecord {
            account: account.to_owned(),
            presence,
        };
        let value = serde_json::to_vec(&record).map_err(request)?;
        self.inner
            .presence
            .put(token(&[account]), value.into())
            .await
            .map_err(request)?;
        Ok(())
    }

    /// Records that `connection` of `account` on `node` ended, unless a later connection
    /// replaced it meanwhile.
    pub async fn disconnected(
        &self,
        account: &str,
        node: &str,
        connection: u64,
    ) -> Result<(), ClusterError> {
        let key = token(&[account]);
        let Some((presence, revision)) = self.presence_entry(&key).await? else {
            return Ok(());
        };
        if presence.node != node || presence.connection != connection {
            return Ok(());
        }
        match self
            .inner
            .presence
            .delete_expect_revision(&key, Some(revision))
            .await
        {
            Ok(()) => Ok(()),
            // Connected again meanwhile: the newer connection stands.
            Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision => Ok(()),
            Err(e) => Err(request(e)),
        }
    }

    /// Where `account` is connected now: `None` when it is not, or when the node that held its
    /// connection stopped beating.
    pub async fn present(&self, account: &str) -> Result<Option<Presence>, ClusterError> {
        let Some((presence, _)) = self.presence_entry(&token(&[account])).await? else {
            return Ok(None);
        };
        let alive = self
            .inner
            .nodes
            .get(token(&[&presence.node]))
            .await
            .map_err(request)?
            .is_some();
        Ok(alive.then_some(presence))
    }

    async fn presence_entry(&self, key: &str) -> Result<Option<(Presence, u64)>, ClusterError> {
        let Some(entry) = self.inner.presence.entry(key).await.map_err(request)? else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        let record: PresenceRecord = serde_json::from_slice(&entry.value)
            .map_err(|e| ClusterError::Corrupt(e.to_string()))?;
        Ok(Some((record.presence, entry.revision)))
    }
}
