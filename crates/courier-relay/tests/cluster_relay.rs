//! Relay nodes serving from a cluster (`docs/cluster.md`): three relay nodes over a three-server
//! NATS cluster on loopback, clients of one account on one node and of another on another. The
//! protocol's rules hold across nodes: live delivery and the drain, releases, displacement and
//! presence.

mod common;

use std::time::Duration;

use common::nats::{NatsCluster, CLUSTER_DEADLINE};
use common::*;
use courier_proto::{ClientFrame, RelayFrame};
use courier_relay::{ClusterStorage, MailboxLimits, RelayConfig, RelayHandle, Storage};

struct Deployment {
    nats: NatsCluster,
    nodes: Vec<RelayHandle>,
}

impl Deployment {
    async fn start(nodes: usize) -> Self {
        Self::start_with(nodes, |_| {}).await
    }

    async fn start_with(nodes: usize, adjust: impl Fn(&mut RelayConfig)) -> Self {
        let nats = NatsCluster::start(3).await;
        let mut deployment = Self {
            nats,
            nodes: Vec::new(),
        };
        for _ in 0..nodes {
            let mut config = deployment.config();
            adjust(&mut config);
            let node = courier_relay::start(config)
                .await
                .expect("relay node starts");
            deployment.nodes.push(node);
        }
        deployment
    }

    fn config(&self) -> RelayConfig {
        let mut cluster = ClusterStorage::new(self.nats.urls());
        cluster.presence_ttl = Duration::from_secs(2);
        let mut config = RelayConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            Storage::Cluster(cluster),
            SECRET.to_vec(),
        );
        config.timings = fast_timings();
        // JetStream reserves the journal's bytes on every server holding a replica.
        config.mailbox = Some(MailboxLimits {
            max_journal_bytes: 256 * 1024 * 1024,
            ..MailboxLimits::default()
        });
        config
    }

    /// A client of `account` on node `node`, opted in, its drain read: the frames drained and
    /// the count.
    async fn connect(&self, node: usize, account: &str) -> (Client, Vec<Received>, u64) {
        let mut client = Client::connect(&self.nodes[node].url()).await;
        client.wait_up_to(CLUSTER_DEADLINE);
        client.authenticate(account, true).await;
        let (drained, count) = client.drain().await;
        (client, drained, count)
    }

    async fn online(&self, node: usize, account: &str) -> Client {
        let (client, drained, count) = self.connect(node, account).await;
        assert_eq!((drained, count), (Vec::new(), 0), "{account}'s mailbox");
        client
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_sent_through_one_node_reaches_its_recipient_on_another_live_and_by_the_drain() {
    let deployment = Deployment::start(3).await;
    let mut bob = deployment.online(1, "bob").await;
    let mut alice = deployment.online(0, "alice").await;

    // bob is connected to another node: live, written from the journal with its seq.
    let sent = alice.send_and_answer("bob", "m1", "hello").await;
    assert_sent(&sent, "m1", "bob", "live");
    let first = bob.received().await;
    assert_eq!(
        (first.message_id.as_str(), first.content.as_str()),
        ("m1", "hello")
    );
    let seq1 = first.seq.expect("journaled frames carry their seq");
    bob.ack(seq1).await;
    bob.sync().await;
    bob.close().await;

    // bob is offline: stored; his next connection, on the third node, drains it alone.
    deployment.wait_offline(&mut alice, "bob").await;
    let sent = alice.send_and_answer("bob", "m2", "later").await;
    assert_sent(&sent, "m2", "bob", "stored");
    let again = alice.send_and_answer("bob", "m2", "later").await;
    assert_sent(&again, "m2", "bob", "stored");
    let (mut bob, drained, count) = deployment.connect(2, "bob").await;
    let ids: Vec<&str> = drained.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(
        (ids, count),
        (vec!["m2"], 1),
        "m1 was released, m2 journaled once"
    );
    assert!(
        drained[0].seq.unwrap() > seq1,
        "seqs increase in acceptance order"
    );

    // Frames from two senders on two nodes arrive in the journal's order, each once.
    let mut carol = deployment.online(1, "carol").await;
    for i in 0..5 {
        let id = format!("a{i}");
        assert_sent(
            &alice.send_and_answer("bob", &id, "x").await,
            &id,
            "bob",
            "live",
        );
        let id = format!("c{i}");
        assert_sent(
            &carol.send_and_answer("bob", &id, "y").await,
            &id,
            "bob",
            "live",
        );
    }
    let mut seqs = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..10 {
        let frame = bob.received().await;
        seqs.push(frame.seq.unwrap());
        ids.push(frame.message_id);
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let expected: Vec<String> = (0..5)
        .flat_map(|i| [format!("a{i}"), format!("c{i}")])
        .collect();
    assert_eq!(
        ids, expected,
        "each sender's frames in order, interleaved as sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_through_another_node_displaces_the_old_one_and_its_unacked_frames_drain_there(
) {
    let deployment = Deployment::start(2).await;
    let mut alice = deployment.online(0, "alice").await;
    let mut old = deployment.online(0, "bob").await;
    assert_sent(
        &alice.send_and_answer("bob", "m1", "one").await,
        "m1",
        "bob",
        "live",
    );
    assert_eq!(old.received().await.message_id, "m1");

    // Not acked: the new connection on node 1 drains it after displacing the old one.
    let (_new, drained, count) = deployment.connect(1, "bob").await;
    let ids: Vec<&str> = drained.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!((ids, count), (vec!["m1"], 1));
    let (frames, ending) = old.frames_until_end().await;
    assert!(
        frames
            .iter()
            .any(|f| matches!(f, RelayFrame::SessionSuperseded { .. })),
        "{frames:?}"
    );
    assert!(matches!(ending, Ending::Close(4000)), "{ending:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_watches_follow_connections_on_other_nodes() {
    let deployment = Deployment::start(2).await;
    let mut carol = deployment.online(0, "carol").await;
    carol
        .send(&ClientFrame::WatchPresence {
            users: vec!["bob".into()],
        })
        .await;
    assert_eq!(next_status(&mut carol, "bob").await, (false, None));
    let bob = deployment.online(1, "bob").await;
    assert_eq!(next_status(&mut carol, "bob").await, (true, None));
    bob.close().await;
    let (online, last_seen) = next_status(&mut carol, "bob").await;
    assert!(!online && last_seen.is_some(), "offline with its last_seen");
}

impl Deployment {
    /// Waits until `watcher`'s node says `account` is offline.
    async fn wait_offline(&self, watcher: &mut Client, account: &str) {
        watcher
            .send(&ClientFrame::WatchPresence {
                users: vec![account.into()],
            })
            .await;
        while next_status(watcher, account).await.0 {}
        watcher
            .send(&ClientFrame::UnwatchPresence {
                users: vec![account.into()],
            })
            .await;
    }
}

/// `(online, last_seen)` of the next PresenceStatus for `user`.
async fn next_status(c: &mut Client, user: &str) -> (bool, Option<u64>) {
    match c
        .next_where(|f| matches!(f, RelayFrame::PresenceStatus { user_id, .. } if user_id == user))
        .await
    {
        RelayFrame::PresenceStatus {
            online, last_seen, ..
        } => (online, last_seen.and_then(|v| v.as_u64())),
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_contacts_visibility_an_exchange_through_one_node_is_seen_on_the_others() {
    let deployment = Deployment::start_with(3, |c| {
        c.presence_visibility = courier_relay::PresenceVisibility::Contacts;
    })
    .await;
    let mut bob = deployment.online(1, "bob").await;
    let mut alice = deployment.online(0, "alice").await;
    let mut mallory = deployment.online(2, "mallory").await;
    assert_eq!(check(&mut bob, "alice").await, (false, None), "strangers");
    assert_sent(
        &alice.send_and_answer("bob", "m1", "hi").await,
        "m1",
        "bob",
        "live",
    );
    // alice's node knows the pair at once, bob's a moment later.
    assert_eq!(check(&mut alice, "bob").await, (true, None));
    let deadline = std::time::Instant::now() + CLUSTER_DEADLINE;
    while check(&mut bob, "alice").await != (true, None) {
        assert!(
            std::time::Instant::now() < deadline,
            "bob's node never learned the pair"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        check(&mut mallory, "bob").await,
        (false, None),
        "still a stranger"
    );
}

async fn check(c: &mut Client, user: &str) -> (bool, Option<u64>) {
    c.send(&ClientFrame::CheckPresence {
        username: user.into(),
    })
    .await;
    next_status(c, user).await
}
