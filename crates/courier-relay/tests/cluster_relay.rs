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
    until_online(&mut bob, "alice", true, "bob's node never learned the pair").await;
    assert_eq!(
        check(&mut mallory, "bob").await,
        (false, None),
        "still a stranger"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_contacts_visibility_a_group_made_through_one_node_is_seen_on_the_others() {
    let deployment = Deployment::start_with(3, |c| {
        c.presence_visibility = courier_relay::PresenceVisibility::Contacts;
    })
    .await;
    let mut alice = deployment.online(0, "alice").await;
    let mut carol = deployment.online(1, "carol").await;
    let mut mallory = deployment.online(2, "mallory").await;
    assert_eq!(check(&mut carol, "alice").await, (false, None), "strangers");
    let answer = ask(&mut alice, creating("g1")).await;
    assert!(
        matches!(answer, RelayFrame::GroupCreated { .. }),
        "{answer:?}"
    );
    let answer = ask(&mut alice, adding("g1", "carol")).await;
    assert!(
        matches!(answer, RelayFrame::GroupMemberAdded { .. }),
        "{answer:?}"
    );
    // carol's node follows the group a moment later.
    until_online(
        &mut carol,
        "alice",
        true,
        "carol's node never learned the group",
    )
    .await;
    assert_eq!(
        check(&mut mallory, "carol").await,
        (false, None),
        "still a stranger"
    );
}

fn creating(group: &str) -> ClientFrame {
    ClientFrame::CreateGroup {
        group_id: group.into(),
        name: group.into(),
    }
}

fn adding(group: &str, member: &str) -> ClientFrame {
    ClientFrame::AddGroupMember {
        group_id: group.into(),
        username: member.into(),
    }
}

/// The group answer to `frame`.
async fn ask(c: &mut Client, frame: ClientFrame) -> RelayFrame {
    c.send(&frame).await;
    c.next_where(|f| {
        matches!(
            f,
            RelayFrame::GroupCreated { .. }
                | RelayFrame::GroupMemberAdded { .. }
                | RelayFrame::GroupError { .. }
                | RelayFrame::Error { .. }
        )
    })
    .await
}

/// The members a report names as delivered, as pushed and as missed.
fn report_lists(report: &RelayFrame) -> (Vec<String>, Vec<String>, Vec<String>) {
    let RelayFrame::GroupMessageSent {
        delivered,
        pushed,
        missed,
        ..
    } = report
    else {
        panic!("not a report: {report:?}")
    };
    let missed = missed
        .iter()
        .map(|m| format!("{} {}", m.username, m.reason));
    (delivered.clone(), pushed.clone(), missed.collect())
}

fn group_message(id: &str) -> ClientFrame {
    ClientFrame::SendGroupMessage {
        group_id: "g1".into(),
        content: "hi".into(),
        message_id: id.into(),
        reply_to_msg: None,
        forward_info: None,
    }
}

// A member connected to another node is reported delivered once that node wrote the copy; one
// whose connection ended is reported pushed, and drains the copy through any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_broadcast_reports_members_on_other_nodes_by_what_their_nodes_wrote() {
    let deployment = Deployment::start(3).await;
    let mut alice = deployment.online(0, "alice").await;
    let mut bob = deployment.online(1, "bob").await;
    let mut carol = deployment.online(2, "carol").await;
    ask(&mut alice, creating("g1")).await;
    for member in ["bob", "carol"] {
        ask(&mut alice, adding("g1", member)).await;
    }
    alice.send(&group_message("m1")).await;
    let report = alice
        .next_where(|f| matches!(f, RelayFrame::GroupMessageSent { .. }))
        .await;
    assert_eq!(
        report_lists(&report),
        (vec!["bob".into(), "carol".into()], vec![], vec![])
    );
    for member in [&mut bob, &mut carol] {
        let copy = member
            .next_where(|f| matches!(f, RelayFrame::GroupMessageReceived { .. }))
            .await;
        assert!(
            matches!(&copy, RelayFrame::GroupMessageReceived { message_id, .. } if message_id == "m1"),
            "{copy:?}"
        );
    }

    carol.close().await;
    until_online(&mut alice, "carol", false, "carol stays online").await;
    alice.send(&group_message("m2")).await;
    let report = alice
        .next_where(|f| matches!(f, RelayFrame::GroupMessageSent { .. }))
        .await;
    assert_eq!(
        report_lists(&report),
        (vec!["bob".into()], vec!["carol".into()], vec![])
    );
    let (mut carol, _, count) = deployment.connect(1, "carol").await;
    assert_eq!(count, 2, "m1 was never released");
    for id in ["m1", "m2"] {
        let copy = carol
            .next_where(|f| matches!(f, RelayFrame::GroupMessageReceived { .. }))
            .await;
        assert!(
            matches!(&copy, RelayFrame::GroupMessageReceived { message_id, .. } if message_id == id),
            "{copy:?}"
        );
    }
}

/// Checks `user`'s presence from `c` until it reads `online`, within the cluster's deadline.
async fn until_online(c: &mut Client, user: &str, online: bool, what: &str) {
    let deadline = std::time::Instant::now() + CLUSTER_DEADLINE;
    loop {
        if check(c, user).await.0 == online {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn check(c: &mut Client, user: &str) -> (bool, Option<u64>) {
    c.send(&ClientFrame::CheckPresence {
        username: user.into(),
    })
    .await;
    next_status(c, user).await
}

/// `docs/protocol.md#relay-checks`: a declaration the relay verified but could not bind (the
/// NATS cluster is gone) is answered `Error{internal}` and the connection closes with 1011,
/// rather than going on stamping the client's frames with its account name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_whose_binding_cannot_be_stored_closes_the_connection() {
    // No drain before the declaration is answered: the journal is gone too, and a drain
    // failing on it would close the connection first.
    let mut deployment =
        Deployment::start_with(1, |c| c.timings.drain_grace = CLUSTER_DEADLINE).await;
    let mut client = Client::connect(&deployment.nodes[0].url()).await;
    client.wait_up_to(CLUSTER_DEADLINE);
    let RelayFrame::Authenticated {
        address_challenge, ..
    } = client.authenticate("alice", true).await
    else {
        unreachable!()
    };
    deployment.nats.kill_all();
    let key = courier_proto::IdentityKey::from_seed([7; 32]);
    let declaration =
        courier_proto::declare_address_frame(&key, Some("alice"), address_challenge.as_deref())
            .unwrap();
    client.send(&declaration).await;
    let (frames, ending) = client.frames_until_end().await;
    assert!(
        frames.iter().any(|f| matches!(f,
            RelayFrame::Error { code, frame_type: Some(t), .. }
                if code == "internal" && t == "DeclareAddress")),
        "{frames:?} {ending:?}"
    );
    assert!(
        !frames
            .iter()
            .any(|f| matches!(f, RelayFrame::AddressDeclared { .. })),
        "{frames:?}"
    );
    assert_eq!(ending, Ending::Close(1011));
}
