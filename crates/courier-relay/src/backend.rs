//! The seam between the relay and where its journal, accounts and address bindings live
//! (`docs/cluster.md#two-backends`): the single-file store (SQLite, one process) or the
//! cluster's [`JetStreamStore`] (NATS JetStream, any number of relay nodes). Both answer these
//! calls with the same meaning, which the conformance scenarios below check on each.

use std::future::Future;
use std::sync::Arc;

use crate::cluster::{Appended, JetStreamStore};
use crate::config::MailboxLimits;
use crate::mailbox::Envelope;
use crate::store::{AppendOutcome, Named, Release, Store, StoreError};

/// Where the relay's durable facts live.
pub trait Backend: Clone + Send + Sync + 'static {
    /// Records the account at its first successful authentication.
    fn ensure_account(
        &self,
        name: &str,
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn account_exists(&self, name: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Journals `envelope` for the account `recipient` names; answers once the frame is
    /// durable. `limits` are the relay's mailbox limits; a cluster's are its stream's, set from
    /// the same configuration when the stream is opened.
    fn append(
        &self,
        recipient: Named,
        envelope: Envelope,
        limits: MailboxLimits,
    ) -> impl Future<Output = Result<Appended, StoreError>> + Send;

    /// The drain bound S.
    fn highest_seq(&self, account: &str) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Unexpired frames with `after < seq ≤ up_to`, in seq order, one bounded batch.
    fn fetch(
        &self,
        account: &str,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
    ) -> impl Future<Output = Result<Vec<Arc<Envelope>>, StoreError>> + Send;

    /// Deletes what an ack releases.
    fn release(
        &self,
        account: &str,
        release: Release,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn bind_address(
        &self,
        address: &str,
        account: &str,
        max_per_account: u32,
        now_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn resolve_address(
        &self,
        address: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;
}

impl Backend for Store {
    async fn ensure_account(&self, name: &str, now_ms: u64) -> Result<(), StoreError> {
        Store::ensure_account(self, name, now_ms).await
    }

    async fn account_exists(&self, name: &str) -> Result<bool, StoreError> {
        Store::account_exists(self, name).await
    }

    async fn append(
        &self,
        recipient: Named,
        envelope: Envelope,
        limits: MailboxLimits,
    ) -> Result<Appended, StoreError> {
        let outcome = self
            .queue_append(recipient, envelope, limits)
            .await?
            .answer()
            .await?;
        Ok(match outcome {
            AppendOutcome::Accepted { seq, .. } => Appended::Accepted { seq },
            AppendOutcome::Duplicate { .. } => Appended::Duplicate,
            AppendOutcome::UnknownRecipient => Appended::UnknownRecipient,
            AppendOutcome::MailboxFull => Appended::MailboxFull,
        })
    }

    async fn highest_seq(&self, account: &str) -> Result<u64, StoreError> {
        Store::highest_seq(self, account).await
    }

    async fn fetch(
        &self,
        account: &str,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
    ) -> Result<Vec<Arc<Envelope>>, StoreError> {
        Store::fetch(self, account, after, up_to, not_before_ms).await
    }

    async fn release(&self, account: &str, release: Release) -> Result<(), StoreError> {
        self.queue_release(account, release).await?.answer().await
    }

    async fn bind_address(
        &self,
        address: &str,
        account: &str,
        max_per_account: u32,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        Store::bind_address(self, address, account, max_per_account, now_ms).await
    }

    async fn resolve_address(&self, address: &str) -> Result<Option<String>, StoreError> {
        Store::resolve_address(self, address).await
    }
}

impl Backend for JetStreamStore {
    async fn ensure_account(&self, name: &str, now_ms: u64) -> Result<(), StoreError> {
        Ok(JetStreamStore::ensure_account(self, name, now_ms).await?)
    }

    async fn account_exists(&self, name: &str) -> Result<bool, StoreError> {
        Ok(JetStreamStore::account_exists(self, name).await?)
    }

    async fn append(
        &self,
        recipient: Named,
        envelope: Envelope,
        _limits: MailboxLimits,
    ) -> Result<Appended, StoreError> {
        Ok(JetStreamStore::append(self, recipient, &envelope).await?)
    }

    async fn highest_seq(&self, account: &str) -> Result<u64, StoreError> {
        Ok(JetStreamStore::highest_seq(self, account).await?)
    }

    async fn fetch(
        &self,
        account: &str,
        after: u64,
        up_to: u64,
        not_before_ms: u64,
    ) -> Result<Vec<Arc<Envelope>>, StoreError> {
        Ok(JetStreamStore::fetch(self, account, after, up_to, not_before_ms).await?)
    }

    async fn release(&self, account: &str, release: Release) -> Result<(), StoreError> {
        Ok(JetStreamStore::release(self, account, release).await?)
    }

    async fn bind_address(
        &self,
        address: &str,
        account: &str,
        max_per_account: u32,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        Ok(JetStreamStore::bind_address(self, address, account, max_per_account, now_ms).await?)
    }

    async fn resolve_address(&self, address: &str) -> Result<Option<String>, StoreError> {
        Ok(JetStreamStore::resolve_address(self, address).await?)
    }
}

#[cfg(test)]
#[path = "../tests/common/nats.rs"]
#[allow(dead_code)]
mod nats;

/// One list of scenarios, run against each backend: the protocol's journal rules
/// (`docs/protocol.md#journal-and-seq`, `docs/protocol.md#frame-release`,
/// `docs/protocol.md#relay-side-dedup`, `docs/protocol.md#mailbox-limits`,
/// `docs/protocol.md#address-declaration`) hold alike on both.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterConfig;
    use crate::config::AddressLimits;
    use crate::router::Router;
    use prometheus_client::metrics::histogram::Histogram;

    const MAILBOX: MailboxLimits = MailboxLimits {
        max_messages: 4,
        max_bytes: 1024 * 1024,
        ttl_ms: 7 * 24 * 60 * 60 * 1000,
        // The cluster does not enforce the sender share yet (`docs/cluster.md#status`).
        sender_share_percent: 100,
        max_journal_bytes: 64 * 1024 * 1024,
    };

    fn envelope(sender: &str, message_id: &str) -> Envelope {
        Envelope {
            seq: None,
            sender: sender.into(),
            sender_account: sender.into(),
            message_id: message_id.into(),
            content: format!("content of {message_id}").into(),
            reply_to_msg: None,
            accepted_ms: 1_000,
            group: None,
        }
    }

    fn to(account: &str) -> Named {
        Named::Account(account.into())
    }

    async fn accepted(backend: &impl Backend, account: &str, message_id: &str) -> u64 {
        match backend
            .append(to(account), envelope("alice", message_id), MAILBOX)
            .await
            .unwrap()
        {
            Appended::Accepted { seq } => seq,
            other => panic!("{message_id}: {other:?}"),
        }
    }

    async fn held(backend: &impl Backend, account: &str) -> Vec<(u64, String)> {
        let up_to = backend.highest_seq(account).await.unwrap();
        let frames = backend.fetch(account, 0, up_to, 0).await.unwrap();
        frames
            .iter()
            .map(|f| (f.seq.unwrap(), f.message_id.clone()))
            .collect()
    }

    async fn conforms(backend: impl Backend) {
        // Unknown recipients.
        let unknown = backend
            .append(to("bob"), envelope("alice", "m"), MAILBOX)
            .await
            .unwrap();
        assert_eq!(unknown, Appended::UnknownRecipient);
        assert!(!backend.account_exists("bob").await.unwrap());
        backend.ensure_account("bob", 1).await.unwrap();
        backend.ensure_account("bob", 2).await.unwrap();
        assert!(backend.account_exists("bob").await.unwrap());

        // Seq from 1, in order; releases delete what they name.
        let seqs = [
            accepted(&backend, "bob", "m0").await,
            accepted(&backend, "bob", "m1").await,
            accepted(&backend, "bob", "m2").await,
        ];
        assert_eq!(seqs[0], 1);
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        assert!(backend.highest_seq("bob").await.unwrap() >= seqs[2]);
        let ids: Vec<String> = held(&backend, "bob")
            .await
            .into_iter()
            .map(|f| f.1)
            .collect();
        assert_eq!(ids, ["m0", "m1", "m2"]);

        // A resend while journaled stores nothing.
        let again = backend
            .append(to("bob"), envelope("alice", "m1"), MAILBOX)
            .await
            .unwrap();
        assert_eq!(again, Appended::Duplicate);

        // The mailbox holds 4: the fifth is refused, no older frame dropped.
        let fourth = accepted(&backend, "bob", "m3").await;
        let full = backend
            .append(to("bob"), envelope("alice", "m4"), MAILBOX)
            .await
            .unwrap();
        assert_eq!(full, Appended::MailboxFull);

        backend.release("bob", Release::One(seqs[1])).await.unwrap();
        backend
            .release("bob", Release::UpTo(seqs[0]))
            .await
            .unwrap();
        let left: Vec<u64> = held(&backend, "bob")
            .await
            .into_iter()
            .map(|f| f.0)
            .collect();
        assert_eq!(left, [seqs[2], fourth]);

        // Released, the same id is a new frame, with a seq never used before.
        let anew = accepted(&backend, "bob", "m1").await;
        assert!(anew > fourth);
        backend.release("bob", Release::UpTo(anew)).await.unwrap();
        assert!(held(&backend, "bob").await.is_empty());
        assert!(accepted(&backend, "bob", "m5").await > anew);

        // Bindings: the latest declaration wins; past the account's bindings the least
        // recently declared one goes; a frame to an address reaches the account it names.
        backend.ensure_account("carol", 1).await.unwrap();
        backend.bind_address("off1a", "carol", 2, 10).await.unwrap();
        backend.bind_address("off1b", "carol", 2, 11).await.unwrap();
        backend.bind_address("off1c", "carol", 2, 12).await.unwrap();
        assert_eq!(backend.resolve_address("off1a").await.unwrap(), None);
        assert_eq!(
            backend.resolve_address("off1c").await.unwrap().as_deref(),
            Some("carol")
        );
        let by_address = backend
            .append(
                Named::Address("off1b".into()),
                envelope("alice", "m"),
                MAILBOX,
            )
            .await
            .unwrap();
        assert_eq!(by_address, Appended::Accepted { seq: 1 });
        let nobody = backend
            .append(
                Named::Address("off1a".into()),
                envelope("alice", "n"),
                MAILBOX,
            )
            .await
            .unwrap();
        assert_eq!(nobody, Appended::UnknownRecipient);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_single_file_store_keeps_the_journal_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db");
        let store = tokio::task::spawn_blocking(move || {
            Store::open(
                Some(&path),
                Arc::new(Router::default()),
                Histogram::new([1.0]),
            )
        })
        .await
        .unwrap()
        .unwrap();
        conforms(store.clone()).await;
        store.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_jetstream_store_keeps_the_journal_rules() {
        let cluster = nats::NatsCluster::start(1).await;
        let store = JetStreamStore::open(&ClusterConfig {
            servers: cluster.urls(),
            name: ClusterConfig::DEFAULT_NAME.into(),
            replicas: 1,
            mailbox: MAILBOX,
            addresses: AddressLimits::default(),
            presence_ttl: ClusterConfig::DEFAULT_PRESENCE_TTL,
        })
        .await
        .unwrap();
        conforms(store).await;
    }
}
