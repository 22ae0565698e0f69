//! One list of scenarios, run against both kinds of [`Durable`]: the protocol's journal rules
//! (`docs/protocol.md#journal-and-seq`, `docs/protocol.md#frame-release`,
//! `docs/protocol.md#relay-side-dedup`, `docs/protocol.md#mailbox-limits`,
//! `docs/protocol.md#address-declaration`) hold alike in the single-file store and on a relay
//! node of a cluster (`docs/cluster.md#two-backends`).

use std::sync::Arc;

use prometheus_client::metrics::histogram::Histogram;

use super::Durable;
use crate::config::{AddressLimits, ClusterStorage, MailboxLimits};
use crate::mailbox::Envelope;
use crate::node::Node;
use crate::router::Router;
use crate::store::{AppendOutcome, Named, Release, Store};

use crate::nats_harness as nats;

/// A sender may hold two frames and 2 KiB of a mailbox.
const MAILBOX: MailboxLimits = MailboxLimits {
    max_messages: 4,
    max_bytes: 4 * 1024,
    ttl_ms: 7 * 24 * 60 * 60 * 1000,
    sender_share_percent: 50,
    max_journal_bytes: 64 * 1024 * 1024,
};

fn from(sender: &str, message_id: &str) -> Envelope {
    Envelope {
        seq: None,
        sender: sender.into(),
        sender_account: sender.into(),
        message_id: message_id.into(),
        content: format!("content of {message_id}").into(),
        reply_to_msg: None,
        accepted_ms: crate::now_ms(),
        group: None,
    }
}

fn to(account: &str) -> Named {
    Named::Account(account.into())
}

/// A store of either kind, with the router its relay would route through.
struct Subject {
    durable: Durable,
    router: Arc<Router>,
}

impl Subject {
    async fn append(&self, recipient: Named, envelope: Envelope) -> AppendOutcome {
        let pending = self
            .durable
            .queue_append(recipient, envelope, MAILBOX, &self.router)
            .await
            .unwrap();
        pending.answer().await.unwrap()
    }

    async fn accepted(&self, account: &str, envelope: Envelope) -> u64 {
        let id = envelope.message_id.clone();
        match self.append(to(account), envelope).await {
            AppendOutcome::Accepted { seq, .. } => seq,
            other => panic!("{id}: {other:?}"),
        }
    }

    async fn refused(&self, account: &str, envelope: Envelope) {
        let id = envelope.message_id.clone();
        let answer = self.append(to(account), envelope).await;
        assert!(
            matches!(answer, AppendOutcome::MailboxFull),
            "{id}: {answer:?}"
        );
    }

    async fn release(&self, account: &str, release: Release) {
        let pending = self.durable.queue_release(account, release).await.unwrap();
        pending.answer().await.unwrap();
    }

    async fn held(&self, account: &str) -> Vec<(u64, String)> {
        let up_to = self.durable.highest_seq(account).await.unwrap();
        let frames = self.durable.fetch(account, 0, up_to, 0).await.unwrap();
        frames
            .iter()
            .map(|f| (f.seq.unwrap(), f.message_id.clone()))
            .collect()
    }
}

async fn conforms(s: Subject) {
    let durable = &s.durable;
    // Unknown recipients.
    let unknown = s.append(to("bob"), from("alice", "m")).await;
    assert!(
        matches!(unknown, AppendOutcome::UnknownRecipient),
        "{unknown:?}"
    );
    assert!(!durable.account_exists("bob").await.unwrap());
    durable.ensure_account("bob", 1).await.unwrap();
    durable.ensure_account("bob", 2).await.unwrap();
    assert!(durable.account_exists("bob").await.unwrap());

    // Seq from 1, in order; releases delete what they name.
    let seqs = [
        s.accepted("bob", from("alice", "m0")).await,
        s.accepted("bob", from("alice", "m1")).await,
        s.accepted("bob", from("carol", "m2")).await,
    ];
    assert_eq!(seqs[0], 1);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(durable.highest_seq("bob").await.unwrap() >= seqs[2]);
    let ids: Vec<String> = s.held("bob").await.into_iter().map(|f| f.1).collect();
    assert_eq!(ids, ["m0", "m1", "m2"]);

    // A resend while journaled stores nothing, and is a duplicate even with the sender's
    // share full.
    let again = s.append(to("bob"), from("alice", "m1")).await;
    assert!(
        matches!(again, AppendOutcome::Duplicate { .. }),
        "{again:?}"
    );

    // alice holds her share of frames; carol's frame takes the mailbox's fourth place, then
    // it is full for everyone. No older frame is dropped.
    s.refused("bob", from("alice", "m3")).await;
    let fourth = s.accepted("bob", from("carol", "m3")).await;
    s.refused("bob", from("dave", "m4")).await;

    s.release("bob", Release::One(seqs[1])).await;
    s.release("bob", Release::UpTo(seqs[0])).await;
    let left: Vec<u64> = s.held("bob").await.into_iter().map(|f| f.0).collect();
    assert_eq!(left, [seqs[2], fourth]);

    // Released, the same id is a new frame, with a seq never used before, in the room the
    // releases gave back.
    let anew = s.accepted("bob", from("alice", "m1")).await;
    assert!(anew > fourth);
    s.release("bob", Release::UpTo(anew)).await;
    assert!(s.held("bob").await.is_empty());
    assert!(s.accepted("bob", from("alice", "m5")).await > anew);

    // Bytes: a frame is counted at its whole size, within the sender's 2 KiB and the mailbox's
    // 4 KiB.
    let sized = |sender: &str, id: &str, content_bytes: usize| Envelope {
        content: "x".repeat(content_bytes).into(),
        ..from(sender, id)
    };
    s.refused("bob", sized("alice", "big", 2048)).await;
    s.accepted("bob", sized("carol", "c1", 1800)).await;
    s.accepted("bob", sized("dave", "d1", 1800)).await;
    s.refused("bob", sized("erin", "e1", 400)).await;

    // Bindings: the latest declaration wins; past the account's bindings the least recently
    // declared one goes; a frame to an address reaches the account it names.
    durable.ensure_account("carol", 1).await.unwrap();
    durable.bind_address("off1a", "carol", 2, 10).await.unwrap();
    durable.bind_address("off1b", "carol", 2, 11).await.unwrap();
    durable.bind_address("off1c", "carol", 2, 12).await.unwrap();
    assert_eq!(durable.resolve_address("off1a").await.unwrap(), None);
    assert_eq!(
        durable.resolve_address("off1c").await.unwrap().as_deref(),
        Some("carol")
    );
    let by_address = s
        .append(Named::Address("off1b".into()), from("alice", "m"))
        .await;
    assert!(
        matches!(by_address, AppendOutcome::Accepted { seq: 1, .. }),
        "{by_address:?}"
    );
    let nobody = s
        .append(Named::Address("off1a".into()), from("alice", "n"))
        .await;
    assert!(
        matches!(nobody, AppendOutcome::UnknownRecipient),
        "{nobody:?}"
    );
    durable.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_file_store_keeps_the_journal_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.db");
    let router = Arc::new(Router::default());
    let opened = Arc::clone(&router);
    let store = tokio::task::spawn_blocking(move || {
        Store::open(Some(&path), opened, Histogram::new([1.0]))
    })
    .await
    .unwrap()
    .unwrap();
    conforms(Subject {
        durable: Durable::File(store),
        router,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_node_keeps_the_journal_rules() {
    let cluster = nats::NatsCluster::start(1).await;
    let mut storage = ClusterStorage::new(cluster.urls());
    storage.replicas = 1;
    let router = Arc::new(Router::default());
    let node = Node::start(
        &storage,
        Some(MAILBOX),
        AddressLimits::default(),
        Arc::clone(&router),
        Histogram::new([1.0]),
    )
    .await
    .unwrap();
    conforms(Subject {
        durable: Durable::Cluster(node),
        router,
    })
    .await;
}
