//! Presence across relay nodes (`docs/cluster.md#presence`): each account's latest connection, or
//! when its last one ended, in the `presence` bucket, and which nodes are alive, in the `nodes`
//! bucket, where each node's heartbeat expires after the presence lifetime. An account whose node
//! stopped beating is offline without anyone writing it: a dead node's connections go offline on
//! their own, and a live node writes only when a connection starts or ends.
//!
//! Every node follows both buckets whole ([`JetStreamStore::presence_changes`],
//! [`JetStreamStore::node_beats`]) and answers presence from that copy in memory, as the
//! single-file relay answers it from its own: one write per connection start or end reaches
//! every node once, whatever number of watches it has.

use std::time::Duration;

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};

use super::feed::{put, Feed};
use super::names::token;
use super::{lost_race, request, until_placed, ClusterError, JetStreamStore, SERVED_DEADLINE};

/// Where an account is connected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presence {
    /// The relay node holding the connection.
    pub node: String,
    /// The connection, unique within its node.
    pub connection: u64,
    pub since_ms: u64,
}

/// An account's presence record: its latest connection, or when its last one ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Record {
    Online(Presence),
    Offline { last_seen_ms: u64 },
}

#[derive(Serialize, Deserialize)]
struct Stored {
    account: String,
    #[serde(flatten)]
    record: Record,
}

/// One change of one account's presence record, as [`JetStreamStore::presence_changes`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub account: String,
    pub record: Record,
    /// The record's revision in the bucket: of two records of one account, the higher revision
    /// was written later.
    pub revision: u64,
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

impl JetStreamStore {
    /// Follows every account's presence record from the start. Records are never deleted,
    /// only overwritten.
    pub async fn presence_changes(&self) -> Result<Feed<Change>, ClusterError> {
        Feed::start(&self.inner.presence, |entry| {
            let revision = entry.revision;
            put::<Stored>(&entry).map(|stored| {
                stored.map(|stored| Change {
                    account: stored.account,
                    record: stored.record,
                    revision,
                })
            })
        })
        .await
    }

    /// Follows every relay node's heartbeat from the latest each node wrote: the node that beat,
    /// and how long ago by the server's clock (zero for a beat read as it comes, more for the
    /// ones the feed starts with).
    pub async fn node_beats(&self) -> Result<Feed<(String, Duration)>, ClusterError> {
        Feed::start(&self.inner.nodes, |entry| {
            if entry.operation != kv::Operation::Put {
                return None;
            }
            let written_ms = entry.created.unix_timestamp_nanos() / 1_000_000;
            let age_ms = i128::from(crate::now_ms()).saturating_sub(written_ms);
            let age = Duration::from_millis(u64::try_from(age_ms).unwrap_or(0));
            Some(
                String::from_utf8(entry.value.to_vec())
                    .map(|node| (node, age))
                    .map_err(|_| ClusterError::Corrupt(format!("heartbeat {}", entry.key))),
            )
        })
        .await
    }

    /// How long a node's connections stay present after its last heartbeat.
    pub fn presence_ttl(&self) -> Duration {
        self.inner.presence_ttl
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
        // A server restarted a moment ago may not serve the bucket yet: a node starting then
        // waits for it as it waits for its setup.
        until_placed(tokio::time::Instant::now() + SERVED_DEADLINE, &beat).await?;
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

    /// Records that `account` is connected on `presence.node` as `presence.connection` (the
    /// latest connection wins, as displacement says: `docs/protocol.md#session-displacement`);
    /// answers the record's revision.
    pub async fn connected(&self, account: &str, presence: Presence) -> Result<u64, ClusterError> {
        self.inner
            .presence
            .put(
                token(&[account]),
                stored(account, Record::Online(presence))?.into(),
            )
            .await
            .map_err(request)
    }

    /// Records that `connection` of `account` on `node` ended at `last_seen_ms`, unless a later
    /// connection replaced it meanwhile.
    pub async fn disconnected(
        &self,
        account: &str,
        node: &str,
        connection: u64,
        last_seen_ms: u64,
    ) -> Result<(), ClusterError> {
        let key = token(&[account]);
        let Some((Record::Online(presence), revision)) = self.presence_entry(&key).await? else {
            return Ok(());
        };
        if presence.node != node || presence.connection != connection {
            return Ok(());
        }
        let value = stored(account, Record::Offline { last_seen_ms })?;
        match self
            .inner
            .presence
            .update(&key, value.into(), revision)
            .await
        {
            Ok(_) => Ok(()),
            // Connected again meanwhile: the newer connection stands.
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision || lost_race(&e) => Ok(()),
            Err(e) => Err(request(e)),
        }
    }

    /// Where `account` is connected now: `None` when it is not, or when the node that held its
    /// connection stopped beating.
    pub async fn present(&self, account: &str) -> Result<Option<Presence>, ClusterError> {
        let Some((Record::Online(presence), _)) = self.presence_entry(&token(&[account])).await?
        else {
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

    async fn presence_entry(&self, key: &str) -> Result<Option<(Record, u64)>, ClusterError> {
        let Some(entry) = self.inner.presence.entry(key).await.map_err(request)? else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        let stored: Stored = serde_json::from_slice(&entry.value)
            .map_err(|e| ClusterError::Corrupt(e.to_string()))?;
        Ok(Some((stored.record, entry.revision)))
    }
}

fn stored(account: &str, record: Record) -> Result<Vec<u8>, ClusterError> {
    let stored = Stored {
        account: account.to_owned(),
        record,
    };
    serde_json::to_vec(&stored).map_err(request)
}
