//! Where the relay's durable facts live (`docs/cluster.md`): the single-file store (SQLite,
//! one process) or a cluster node's share of NATS JetStream. The relay's tasks reach either
//! through these calls, whose meaning is the same on both.

use std::sync::Arc;

use courier_proto::{Address, Disposition, KeyPackage, KeyPackageBatch};

use crate::cluster::{Appended, ClusterError};
use crate::config::MailboxLimits;
use crate::fanout::FannedOut;
use crate::group::{Actor, GroupRefusal};
use crate::mailbox::{Envelope, GroupTag};
use crate::node::{Attachment, Node};
use crate::router::{Peer, Router};
use crate::store::{
    AppendOutcome, KeyPackagesHeld, Named, Pending, Release, Store, StoreError, TakenKeyPackage,
};

#[cfg(test)]
mod conformance;

pub enum Durable {
    File(Store),
    Cluster(Node),
}

impl Durable {
    pub fn accounts(&self) -> u64 {
        match self {
            Self::File(store) => store.accounts(),
            Self::Cluster(node) => node.figures().accounts,
        }
    }

    pub fn stored_frames(&self) -> u64 {
        match self {
            Self::File(store) => store.stored_frames(),
            Self::Cluster(node) => node.figures().frames,
        }
    }

    pub fn stored_bytes(&self) -> u64 {
        match self {
            Self::File(store) => store.stored_bytes(),
            Self::Cluster(node) => node.figures().bytes,
        }
    }

    pub fn is_open(&self) -> bool {
        match self {
            Self::File(store) => store.is_open(),
            Self::Cluster(node) => node.is_connected(),
        }
    }

    pub async fn shutdown(&self) {
        match self {
            Self::File(store) => store.shutdown().await,
            Self::Cluster(node) => node.shutdown().await,
        }
    }

    pub async fn ensure_account(&self, name: &str, now_ms: u64) -> Result<(), StoreError> {
        match self {
            Self::File(store) => store.ensure_account(name, now_ms).await,
            Self::Cluster(node) => Ok(node.store().ensure_account(name, now_ms).await?),
        }
    }

    pub async fn account_exists(&self, name: &str) -> Result<bool, StoreError> {
        match self {
            Self::File(store) => store.account_exists(name).await,
            Self::Cluster(node) => Ok(node.store().account_exists(name).await?),
        }
    }

    /// Journals `envelope`; the answer comes once it is durable. The single-file store queues
    /// it behind the connection's earlier requests; a cluster node queues it behind the
    /// appends to the same recipient queued through it before (`docs/cluster.md#appends-on-a-node`).
    /// Either way one connection's frames to one recipient keep their order.
    pub async fn queue_append(
        &self,
        recipient: Named,
        envelope: Envelope,
        limits: MailboxLimits,
        router: &Arc<Router>,
    ) -> Result<Pending<AppendOutcome>, StoreError> {
        match self {
            Self::File(store) => store.queue_append(recipient, envelope, limits).await,
            Self::Cluster(node) => {
                let account = router.resolve(recipient.clone());
                let router = Arc::clone(router);
                let (answer, pending) = Pending::channel();
                let done = Box::new(move |appended: Result<Appended, ClusterError>| {
                    // Live when the recipient is present on any node: its node reads the frame
                    // from the journal on the notice (`docs/cluster.md#live-delivery`).
                    let disposition = match account {
                        Some(account) if router.status(&account).online => Disposition::Live,
                        _ => Disposition::Stored,
                    };
                    let outcome = appended.map_err(StoreError::from).map(|a| match a {
                        Appended::Accepted { seq } => AppendOutcome::Accepted { seq, disposition },
                        Appended::Duplicate => AppendOutcome::Duplicate { disposition },
                        Appended::UnknownRecipient => AppendOutcome::UnknownRecipient,
                        Appended::MailboxFull => AppendOutcome::MailboxFull,
                    });
                    // The connection may have stopped waiting (its deadline passed): the frame
                    // is journaled all the same, and its sender's resend is a duplicate.
                    let _ = answer.send(outcome);
                });
                node.queue_append(recipient, envelope, done).await;
                Ok(pending)
            }
        }
    }

    pub async fn highest_seq(&self, account: &str) -> Result<u64, StoreError> {
        match self {
            Self::File(store) => store.highest_seq(account).await,
            Self::Cluster(node) => Ok(node.store().highest_seq(account).await?),
        }
    }

    pub async fn fetch(
        &self,
        account: &str,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
    ) -> Result<Vec<Arc<Envelope>>, StoreError> {
        match self {
            Self::File(store) => store.fetch(account, after, up_to, not_before_ms).await,
            Self::Cluster(node) => Ok(node
                .store()
                .fetch(account, after, up_to, not_before_ms)
                .await?),
        }
    }

    pub async fn queue_release(
        &self,
        account: &str,
        release: Release,
    ) -> Result<Pending<()>, StoreError> {
        match self {
            Self::File(store) => store.queue_release(account, release).await,
            Self::Cluster(node) => {
                let released = node.store().release(account, release).await;
                Ok(Pending::ready(released.map_err(StoreError::from)))
            }
        }
    }

    pub async fn purge(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        match self {
            Self::File(store) => store.purge(older_than_ms).await,
            // The journal stream's max age deletes expired frames itself.
            Self::Cluster(_) => Ok(0),
        }
    }

    /// In a cluster, makes `peer` its account's presence on every node and has its writer told
    /// of frames appended through any node; called between its registration here and its
    /// drain. Held until the connection ends.
    pub async fn attach(&self, peer: &Arc<Peer>) -> Result<Option<Attachment>, StoreError> {
        match self {
            Self::File(_) => Ok(None),
            Self::Cluster(node) => Ok(Some(node.attach(peer).await?)),
        }
    }

    /// The account's connection `peer` ended at `ms`.
    pub async fn record_last_seen(&self, peer: &Peer, ms: u64) -> Result<(), StoreError> {
        match self {
            Self::File(store) => store.record_last_seen(&peer.account, ms).await,
            Self::Cluster(node) => Ok(node.detach(peer, ms).await?),
        }
    }

    pub async fn record_contact(&self, a: &str, b: &str) -> Result<(), StoreError> {
        match self {
            Self::File(store) => store.record_contact(a, b).await,
            Self::Cluster(node) => Ok(node.store().record_contact(a, b).await?),
        }
    }

    pub async fn group_peers(&self, identities: Vec<String>) -> Result<Vec<String>, StoreError> {
        match self {
            Self::File(store) => store.group_peers(identities).await,
            Self::Cluster(node) => Ok(node.group_peers(&identities)),
        }
    }

    pub async fn bind_address(
        &self,
        address: &str,
        account: &str,
        max_per_account: u32,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        match self {
            Self::File(store) => {
                store
                    .bind_address(address, account, max_per_account, now_ms)
                    .await
            }
            Self::Cluster(node) => Ok(node
                .bind_address(address, account, max_per_account, now_ms)
                .await?),
        }
    }

    pub async fn purge_addresses(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        match self {
            Self::File(store) => store.purge_addresses(older_than_ms).await,
            Self::Cluster(node) => Ok(node.forget_bindings(older_than_ms)),
        }
    }

    pub async fn resolve_address(&self, address: &str) -> Result<Option<String>, StoreError> {
        match self {
            Self::File(store) => store.resolve_address(address).await,
            Self::Cluster(node) => Ok(node.store().resolve_address(address).await?),
        }
    }

    pub async fn publish_key_packages(
        &self,
        address: &Address,
        packages: KeyPackageBatch,
        last_resort: Option<KeyPackage>,
        now_ms: u64,
    ) -> Result<KeyPackagesHeld, StoreError> {
        match self {
            Self::File(store) => {
                store
                    .publish_key_packages(address, packages, last_resort, now_ms)
                    .await
            }
            Self::Cluster(node) => Ok(node
                .store()
                .publish_key_packages(address, packages, last_resort, now_ms)
                .await?),
        }
    }

    pub async fn take_key_package(
        &self,
        address: &Address,
    ) -> Result<Option<TakenKeyPackage>, StoreError> {
        match self {
            Self::File(store) => store.take_key_package(address).await,
            Self::Cluster(node) => Ok(node.store().take_key_package(address).await?),
        }
    }

    pub async fn create_group(
        &self,
        group_id: &str,
        name: &str,
        actor: Actor,
        now_ms: u64,
    ) -> Result<Result<(), GroupRefusal>, StoreError> {
        match self {
            Self::File(store) => store.create_group(group_id, name, actor, now_ms).await,
            Self::Cluster(node) => Ok(node
                .store()
                .create_group(group_id, name, &actor, now_ms)
                .await?),
        }
    }

    pub async fn add_group_member(
        &self,
        group_id: &str,
        member: &str,
        actor: Actor,
        max_members: u32,
        now_ms: u64,
    ) -> Result<Result<(), GroupRefusal>, StoreError> {
        match self {
            Self::File(store) => {
                store
                    .add_group_member(group_id, member, actor, max_members, now_ms)
                    .await
            }
            Self::Cluster(node) => Ok(node
                .store()
                .add_group_member(group_id, member, &actor, max_members, now_ms)
                .await?),
        }
    }

    pub async fn remove_group_member(
        &self,
        group_id: &str,
        member: &str,
        actor: Actor,
    ) -> Result<Result<(), GroupRefusal>, StoreError> {
        match self {
            Self::File(store) => store.remove_group_member(group_id, member, actor).await,
            Self::Cluster(node) => Ok(node
                .store()
                .remove_group_member(group_id, member, &actor)
                .await?),
        }
    }

    pub async fn leave_group(
        &self,
        group_id: &str,
        actor: Actor,
    ) -> Result<Result<String, GroupRefusal>, StoreError> {
        match self {
            Self::File(store) => store.leave_group(group_id, actor).await,
            Self::Cluster(node) => Ok(node.store().leave_group(group_id, &actor).await?),
        }
    }

    pub async fn broadcast(
        &self,
        actor: Actor,
        message: Envelope,
        tag: GroupTag,
        mailbox: Option<MailboxLimits>,
        dedup_since_ms: u64,
    ) -> Result<Result<FannedOut, GroupRefusal>, StoreError> {
        match self {
            Self::File(store) => {
                store
                    .broadcast(actor, message, tag, mailbox, dedup_since_ms)
                    .await
            }
            // A cluster node always keeps a mailbox (`docs/cluster.md#relay-nodes`).
            Self::Cluster(node) => Ok(node.broadcast(&actor, message, tag, dedup_since_ms).await?),
        }
    }

    pub async fn hold_report(
        &self,
        account: &str,
        report: String,
        now_ms: u64,
        keep: u32,
    ) -> Result<(), StoreError> {
        match self {
            Self::File(store) => store.hold_report(account, report, now_ms, keep).await,
            Self::Cluster(node) => Ok(node
                .store()
                .hold_report(account, &report, now_ms, keep)
                .await?),
        }
    }

    pub async fn held_reports(
        &self,
        account: &str,
        not_before_ms: u64,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        match self {
            Self::File(store) => store.held_reports(account, not_before_ms).await,
            Self::Cluster(node) => Ok(node.store().held_reports(account, not_before_ms).await?),
        }
    }

    /// Forgets the account's reports `ids` once written.
    pub async fn drop_held_reports(&self, account: &str, ids: Vec<i64>) -> Result<(), StoreError> {
        match self {
            Self::File(store) => store.drop_held_reports(ids).await,
            Self::Cluster(node) => Ok(node.store().drop_held_reports(account, &ids).await?),
        }
    }

    pub async fn purge_groups(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        match self {
            Self::File(store) => store.purge_groups(older_than_ms).await,
            // The buckets' max age forgets copy records and held reports.
            Self::Cluster(_) => Ok(0),
        }
    }
}
