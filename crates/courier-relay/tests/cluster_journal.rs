//! The cluster mode's journal in JetStream (`docs/cluster.md`), against real `nats-server`
//! processes on loopback started by the tests (`common/nats.rs`).

mod common;

use std::collections::HashSet;
use std::time::Instant;

use async_nats::jetstream::{self, stream};
use common::nats::{NatsCluster, CLUSTER_DEADLINE};
use courier_relay::cluster::{
    Appended, Change, ClusterConfig, Feed, JetStreamStore, Presence, Record,
};
use courier_relay::{AddressLimits, Envelope, MailboxLimits, Named, Release};

/// The harness itself: a three-server cluster keeps serving a replicated stream with one server
/// SIGKILLed, and the server comes back and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_stream_keeps_serving_with_one_of_three_servers_killed() {
    let mut cluster = NatsCluster::start(3).await;
    let client = async_nats::connect(cluster.urls()).await.unwrap();
    let js = jetstream::new(client);
    // A cluster just started may time a request out while its servers are busy placing it.
    let deadline = Instant::now() + CLUSTER_DEADLINE;
    let stream = loop {
        let created = js
            .create_stream(stream::Config {
                name: "harness".into(),
                subjects: vec!["harness.>".into()],
                num_replicas: 3,
                ..Default::default()
            })
            .await;
        match created {
            Ok(stream) => break stream,
            Err(e) if Instant::now() >= deadline => panic!("creating the stream: {e}"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    };
    // A stream just created, or whose leader was just killed, serves nothing until its
    // replicas elect a leader.
    publish_until_stored(&js, "one").await;
    cluster.kill(1);
    publish_until_stored(&js, "two").await;
    cluster.restart(1).await;
    let last = stream
        .get_last_raw_message_by_subject("harness.a")
        .await
        .unwrap();
    assert_eq!(&last.payload[..], b"two");
    assert_eq!(last.sequence, 2);
}

/// Publishes `payload` on `harness.a` until JetStream acknowledges it, with the payload as its
/// message id, so a retry after a lost acknowledgement does not store it twice.
async fn publish_until_stored(js: &jetstream::Context, payload: &'static str) {
    let deadline = Instant::now() + CLUSTER_DEADLINE;
    loop {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, payload);
        let published = js
            .publish_with_headers("harness.a", headers, payload.into())
            .await;
        let stored = match published {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match stored {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "{payload}: {e}"),
        }
    }
}

/// A deployment on `servers` with `replicas` copies, its journal within the harness's stores.
fn deployment(servers: Vec<String>, replicas: usize) -> ClusterConfig {
    ClusterConfig {
        servers,
        name: ClusterConfig::DEFAULT_NAME.into(),
        replicas,
        mailbox: MailboxLimits {
            // The stream reserves its bytes on each server: within the harness's store.
            max_journal_bytes: 256 * 1024 * 1024,
            ..MailboxLimits::default()
        },
        addresses: AddressLimits::default(),
        presence_ttl: ClusterConfig::DEFAULT_PRESENCE_TTL,
    }
}

/// The store of a deployment on `cluster`, with `replicas` copies and the given mailbox size.
async fn open(cluster: &NatsCluster, replicas: usize, max_messages: u64) -> JetStreamStore {
    let mut config = deployment(cluster.urls(), replicas);
    config.mailbox.max_messages = max_messages;
    // Whole mailboxes to one sender: the share has a test of its own.
    config.mailbox.sender_share_percent = 100;
    config.addresses.max_per_account = 2;
    JetStreamStore::open(&config).await.unwrap()
}

fn envelope(sender: &str, message_id: &str) -> Envelope {
    Envelope {
        seq: None,
        sender: sender.into(),
        sender_account: sender.into(),
        message_id: message_id.into(),
        content: format!("content of {message_id}").into(),
        reply_to_msg: Some("earlier".into()),
        accepted_ms: 1_000,
        group: None,
    }
}

fn to(account: &str) -> Named {
    Named::Account(account.into())
}

async fn accepted(store: &JetStreamStore, account: &str, envelope: &Envelope) -> u64 {
    match store.append(to(account), envelope).await.unwrap() {
        Appended::Accepted { seq } => seq,
        other => panic!("{} not accepted: {other:?}", envelope.message_id),
    }
}

async fn held(store: &JetStreamStore, account: &str) -> Vec<(u64, String)> {
    let up_to = store.highest_seq(account).await.unwrap();
    let mut frames = Vec::new();
    let mut after = 0;
    loop {
        let batch = store.fetch(account, after, up_to, 0).await.unwrap();
        let Some(last) = batch.last() else {
            return frames;
        };
        after = last.seq.unwrap();
        frames.extend(batch.iter().map(|e| (e.seq.unwrap(), e.message_id.clone())));
    }
}

/// `docs/protocol.md#journal-and-seq`: seq per account from 1, strictly increasing in
/// acceptance order, never reused after releases; `docs/protocol.md#frame-release`: Ack and
/// AckUpTo delete what they name and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accounts_frames_come_back_in_seq_order_and_releases_delete_only_what_they_name() {
    let cluster = NatsCluster::start(3).await;
    let store = open(&cluster, 3, 100).await;
    for account in ["bob", "carol"] {
        store.ensure_account(account, 1).await.unwrap();
    }
    let mut seqs = Vec::new();
    for i in 0..6 {
        seqs.push(accepted(&store, "bob", &envelope("alice", &format!("b{i}"))).await);
        // Another account's frames interleave in the shared stream.
        accepted(&store, "carol", &envelope("alice", &format!("c{i}"))).await;
    }
    assert_eq!(seqs[0], 1, "an account's first frame is seq 1");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let frames = store.fetch("bob", 0, u64::MAX, 0).await.unwrap();
    let first = &frames[0];
    assert_eq!(
        (
            first.seq,
            first.sender.as_str(),
            &*first.content,
            first.reply_to_msg.as_deref()
        ),
        (Some(1), "alice", "content of b0", Some("earlier"))
    );

    store.release("bob", Release::One(seqs[1])).await.unwrap();
    store.release("bob", Release::UpTo(seqs[3])).await.unwrap();
    let left: Vec<u64> = held(&store, "bob").await.iter().map(|f| f.0).collect();
    assert_eq!(left, seqs[4..]);
    assert_eq!(
        held(&store, "carol").await.len(),
        6,
        "carol's frames untouched"
    );

    store.release("bob", Release::UpTo(seqs[5])).await.unwrap();
    assert!(held(&store, "bob").await.is_empty());
    let next = accepted(&store, "bob", &envelope("alice", "b6")).await;
    assert!(
        next > seqs[5],
        "a seq is never reused after releases: {next}"
    );
    assert!(store.highest_seq("bob").await.unwrap() >= next);
}

/// An account's seqs map to stream sequences other accounts' frames also take: naming one of
/// those in an Ack or AckUpTo must not delete another account's frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_naming_a_seq_that_is_another_accounts_frame_deletes_nothing() {
    let cluster = NatsCluster::start(1).await;
    let store = open(&cluster, 1, 100).await;
    for account in ["bob", "carol"] {
        store.ensure_account(account, 1).await.unwrap();
    }
    let bob_first = accepted(&store, "bob", &envelope("alice", "b0")).await;
    accepted(&store, "carol", &envelope("alice", "c0")).await;
    let bob_third = accepted(&store, "bob", &envelope("alice", "b1")).await;
    assert_eq!(
        (bob_first, bob_third),
        (1, 3),
        "seq 2 of bob's is carol's frame"
    );
    store.release("bob", Release::One(2)).await.unwrap();
    assert_eq!(held(&store, "carol").await.len(), 1);
    store.release("bob", Release::UpTo(3)).await.unwrap();
    assert_eq!(held(&store, "carol").await.len(), 1);
    assert!(held(&store, "bob").await.is_empty());
}

/// `docs/protocol.md#mailbox-limits`: a full mailbox refuses the new frame (it never drops an
/// older one), and takes frames again once some are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_mailbox_refuses_the_next_frame_and_never_drops_an_older_one() {
    let cluster = NatsCluster::start(1).await;
    let store = open(&cluster, 1, 3).await;
    store.ensure_account("bob", 1).await.unwrap();
    let mut seqs = Vec::new();
    for i in 0..3 {
        seqs.push(accepted(&store, "bob", &envelope("alice", &format!("m{i}"))).await);
    }
    let refused = store
        .append(to("bob"), &envelope("alice", "m3"))
        .await
        .unwrap();
    assert_eq!(refused, Appended::MailboxFull);
    assert_eq!(held(&store, "bob").await.len(), 3);
    store.release("bob", Release::One(seqs[0])).await.unwrap();
    accepted(&store, "bob", &envelope("alice", "m3")).await;
    let ids: Vec<String> = held(&store, "bob").await.into_iter().map(|f| f.1).collect();
    assert_eq!(ids, ["m1", "m2", "m3"]);
}

/// `docs/protocol.md#relay-side-dedup`: a resend while the first copy is journaled stores
/// nothing; once the copy is released the same id is a new frame, also within JetStream's own
/// duplicate window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_while_journaled_is_a_duplicate_and_after_its_release_a_new_frame() {
    let cluster = NatsCluster::start(1).await;
    let store = open(&cluster, 1, 100).await;
    store.ensure_account("bob", 1).await.unwrap();
    let first = accepted(&store, "bob", &envelope("alice", "m")).await;
    let again = store
        .append(to("bob"), &envelope("alice", "m"))
        .await
        .unwrap();
    assert_eq!(again, Appended::Duplicate);
    // Another sender's frame with the same id is another frame.
    accepted(&store, "bob", &envelope("mallory", "m")).await;
    assert_eq!(held(&store, "bob").await.len(), 2);

    let mut copy = first;
    for round in 0..2 {
        store.release("bob", Release::One(copy)).await.unwrap();
        let anew = accepted(&store, "bob", &envelope("alice", "m")).await;
        assert!(anew > copy);
        let again = store
            .append(to("bob"), &envelope("alice", "m"))
            .await
            .unwrap();
        assert_eq!(again, Appended::Duplicate, "round {round}");
        copy = anew;
    }
    assert_eq!(held(&store, "bob").await.len(), 2);
}

/// `docs/cluster.md#relay-side-dedup`: a resend long after its copy, with frames from others
/// journaled since, through another node, is still a duplicate: the copy is the first frame
/// after its record's mark, whatever came after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_after_many_other_frames_through_another_node_is_a_duplicate() {
    let cluster = NatsCluster::start(1).await;
    let (node_a, node_b) = (open(&cluster, 1, 100).await, open(&cluster, 1, 100).await);
    node_a.ensure_account("bob", 1).await.unwrap();
    let copy = accepted(&node_a, "bob", &envelope("alice", "m")).await;
    for i in 0..40 {
        accepted(&node_a, "bob", &envelope("carol", &format!("c{i:02}"))).await;
    }
    let again = node_b
        .append(to("bob"), &envelope("alice", "m"))
        .await
        .unwrap();
    assert_eq!(again, Appended::Duplicate);
    node_b.release("bob", Release::One(copy)).await.unwrap();
    let anew = accepted(&node_b, "bob", &envelope("alice", "m")).await;
    assert!(anew > copy);
    assert_eq!(held(&node_a, "bob").await.len(), 41);
}

/// A frame for an account never created, or an address nobody declared, is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_for_an_unknown_account_or_unbound_address_is_refused_as_unknown() {
    let cluster = NatsCluster::start(1).await;
    let store = open(&cluster, 1, 100).await;
    let unknown = store
        .append(to("nobody"), &envelope("alice", "m"))
        .await
        .unwrap();
    assert_eq!(unknown, Appended::UnknownRecipient);
    let address = Named::Address("off1unbound".into());
    let unknown = store
        .append(address, &envelope("alice", "m"))
        .await
        .unwrap();
    assert_eq!(unknown, Appended::UnknownRecipient);
    assert!(!store.account_exists("nobody").await.unwrap());
}

/// `docs/protocol.md#address-declaration`: the latest declaration wins, and an account past its
/// bindings drops the least recently declared one (but never another account's binding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_past_the_accounts_bindings_drops_its_least_recently_declared_one() {
    let cluster = NatsCluster::start(1).await;
    let store = open(&cluster, 1, 100).await;
    store.ensure_account("bob", 1).await.unwrap();
    store.bind_address("off1a", "bob", 2, 10).await.unwrap();
    store.bind_address("off1b", "bob", 2, 11).await.unwrap();
    // carol declares off1b later: hers now, and bob dropping it later must not remove it.
    store.bind_address("off1b", "carol", 2, 12).await.unwrap();
    store.bind_address("off1c", "bob", 2, 13).await.unwrap();
    store.bind_address("off1d", "bob", 2, 14).await.unwrap();
    let resolve = |address: &'static str| {
        let store = store.clone();
        async move { store.resolve_address(address).await.unwrap() }
    };
    assert_eq!(resolve("off1a").await, None);
    assert_eq!(resolve("off1b").await.as_deref(), Some("carol"));
    assert_eq!(resolve("off1c").await.as_deref(), Some("bob"));
    assert_eq!(resolve("off1d").await.as_deref(), Some("bob"));
    let seq = store
        .append(Named::Address("off1d".into()), &envelope("alice", "m"))
        .await
        .unwrap();
    assert_eq!(seq, Appended::Accepted { seq: 1 });
}

/// `MessageSent` means replicated and durable: frames sent while the journal stream's leader,
/// one of three servers, is SIGKILLed mid-stream, and resent by the sender when an answer
/// failed, are all journaled, in order, also after the server came back, and each exactly once:
/// a resend of a frame whose answer was lost in the election is a duplicate
/// (`docs/cluster.md#relay-side-dedup`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_sigkilled_mid_stream_loses_nothing_and_journals_no_frame_twice() {
    const FRAMES: usize = 120;
    let mut cluster = NatsCluster::start(3).await;
    let store = open(&cluster, 3, 10_000).await;
    store.ensure_account("bob", 1).await.unwrap();
    let (progress, mut sent) = tokio::sync::watch::channel(0usize);
    let sender = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut unanswered = HashSet::new();
            for i in 0..FRAMES {
                let frame = envelope("alice", &format!("m{i:03}"));
                // A sender resends until it has an answer, as a client does after a failed
                // send; the answer may be a duplicate of a copy whose answer was lost.
                let deadline = Instant::now() + CLUSTER_DEADLINE;
                loop {
                    match store.append(to("bob"), &frame).await {
                        Ok(Appended::Accepted { .. } | Appended::Duplicate) => break,
                        Ok(other) => panic!("m{i}: {other:?}"),
                        Err(e) => {
                            assert!(Instant::now() < deadline, "m{i}: {e}");
                            unanswered.insert(frame.message_id.clone());
                        }
                    }
                }
                progress.send_replace(i + 1);
            }
            unanswered
        })
    };
    within_cluster_deadline(sent.wait_for(|&n| n >= FRAMES / 3))
        .await
        .unwrap();
    // The journal stream's leader: the server whose loss costs an election mid-stream.
    let leader = cluster.journal_leader().await;
    cluster.kill(leader);
    within_cluster_deadline(sent.wait_for(|&n| n >= 2 * FRAMES / 3))
        .await
        .unwrap();
    cluster.restart(leader).await;
    let unanswered = within_cluster_deadline(sender).await.unwrap();

    let frames = held(&store, "bob").await;
    assert!(frames.windows(2).all(|w| w[0].0 < w[1].0));
    let ids: Vec<String> = frames.into_iter().map(|f| f.1).collect();
    let expected: Vec<String> = (0..FRAMES).map(|i| format!("m{i:03}")).collect();
    assert_eq!(
        ids, expected,
        "every frame once, in order; resent after a lost answer: {unanswered:?}"
    );
}

/// Two relay nodes appending to the same account at once race for the subject's next sequence:
/// every frame is journaled once with its own seq, none lost, none doubled, also when both
/// nodes take the same frame (`docs/cluster.md#relay-side-dedup`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_appending_to_one_account_at_once_journal_every_frame_once() {
    const FRAMES: usize = 60;
    let cluster = NatsCluster::start(3).await;
    let (node_a, node_b) = (
        open(&cluster, 3, 10_000).await,
        open(&cluster, 3, 10_000).await,
    );
    node_a.ensure_account("bob", 1).await.unwrap();
    let send = |node: JetStreamStore, sender: &'static str| {
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in 0..FRAMES {
                // Both nodes also take the shared frames, as after a client's resend to
                // another node.
                for frame in [
                    envelope(sender, &format!("m{i:03}")),
                    envelope("both", &format!("s{i:03}")),
                ] {
                    let answer = node.append(to("bob"), &frame).await.unwrap();
                    answers.push((frame.sender, frame.message_id, answer));
                }
            }
            answers
        })
    };
    let (a, b) = (send(node_a.clone(), "alice"), send(node_b, "carol"));
    let mut answers = within_cluster_deadline(a).await.unwrap();
    answers.extend(within_cluster_deadline(b).await.unwrap());

    let mut seqs = HashSet::new();
    let mut shared_accepted = HashSet::new();
    for (sender, id, answer) in &answers {
        match answer {
            Appended::Accepted { seq } => {
                assert!(seqs.insert(*seq), "seq {seq} answered twice");
                if sender == "both" {
                    assert!(shared_accepted.insert(id.clone()), "{id} accepted twice");
                }
            }
            Appended::Duplicate => assert_eq!(sender, "both", "{id} of {sender}"),
            other => panic!("{sender} {id}: {other:?}"),
        }
    }
    assert_eq!(
        shared_accepted.len(),
        FRAMES,
        "each shared frame accepted once"
    );
    let mut journaled: Vec<(u64, String)> = Vec::new();
    let mut after = 0;
    loop {
        let batch = node_a.fetch("bob", after, u64::MAX, 0).await.unwrap();
        let Some(last) = batch.last() else { break };
        after = last.seq.unwrap();
        journaled.extend(
            batch
                .iter()
                .map(|e| (e.seq.unwrap(), format!("{}/{}", e.sender, e.message_id))),
        );
    }
    assert_eq!(journaled.len(), 3 * FRAMES, "none lost, none doubled");
    let distinct: HashSet<&String> = journaled.iter().map(|f| &f.1).collect();
    assert_eq!(distinct.len(), 3 * FRAMES);
    let journaled_seqs: HashSet<u64> = journaled.iter().map(|f| f.0).collect();
    assert_eq!(journaled_seqs, seqs, "every accepted seq names its frame");
}

/// `docs/cluster.md#mailbox-limits`: the account's bytes are counted across nodes, so appends
/// through two nodes at once never hold more than its byte limit, and a release through either
/// node gives the room back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_through_two_nodes_at_once_keep_to_the_byte_limit_and_releases_give_room_back() {
    let cluster = NatsCluster::start(3).await;
    let mut config = deployment(cluster.urls(), 3);
    // Each frame below is a 100-byte row: 15 of content, 5 + 5 of sender, 4 of id, 7 of reply
    // and 64 of overhead. Ten fit.
    config.mailbox.max_bytes = 1_000;
    config.mailbox.sender_share_percent = 100;
    let node_a = JetStreamStore::open(&config).await.unwrap();
    let node_b = JetStreamStore::open(&config).await.unwrap();
    node_a.ensure_account("bob", 1).await.unwrap();
    let send = |node: JetStreamStore, sender: &'static str, round: usize| {
        tokio::spawn(async move {
            let mut stored = 0;
            for i in 0..8 {
                let frame = envelope(sender, &format!("m{round}{i:02}"));
                match node.append(to("bob"), &frame).await.unwrap() {
                    Appended::Accepted { .. } => stored += 1,
                    Appended::MailboxFull => {}
                    other => panic!("{sender} {i}: {other:?}"),
                }
            }
            stored
        })
    };
    for round in 0..3 {
        let (a, b) = (
            send(node_a.clone(), "alice", round),
            send(node_b.clone(), "carol", round),
        );
        let stored =
            within_cluster_deadline(a).await.unwrap() + within_cluster_deadline(b).await.unwrap();
        assert_eq!(
            stored, 10,
            "round {round}: ten 100-byte frames fit in 1 000 bytes"
        );
        assert_eq!(held(&node_a, "bob").await.len(), 10);
        // bob releases everything through one node, alternately; both find the room again.
        let releasing = if round % 2 == 0 { &node_b } else { &node_a };
        let highest = releasing.highest_seq("bob").await.unwrap();
        releasing
            .release("bob", Release::UpTo(highest))
            .await
            .unwrap();
        assert!(held(&node_a, "bob").await.is_empty());
    }
}

/// `docs/cluster.md#mailbox-limits`: a sender's share is counted whichever nodes its frames
/// entered by, a node that never saw the account counts it from the journal (more frames than
/// it reads one by one), and a single release makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_senders_share_holds_across_nodes_and_a_new_node_counts_it_from_the_journal() {
    let cluster = NatsCluster::start(3).await;
    let mut config = deployment(cluster.urls(), 3);
    // 100-byte frames (as above): the mailbox holds 80, a sender 40.
    config.mailbox.max_bytes = 8_000;
    config.mailbox.sender_share_percent = 50;
    let node_a = JetStreamStore::open(&config).await.unwrap();
    let node_b = JetStreamStore::open(&config).await.unwrap();
    node_a.ensure_account("bob", 1).await.unwrap();
    let mut answers = Vec::new();
    for i in 0..44 {
        let node = if i % 2 == 0 { &node_a } else { &node_b };
        answers.push(
            node.append(to("bob"), &envelope("alice", &format!("a{i:03}")))
                .await
                .unwrap(),
        );
    }
    let stored = answers
        .iter()
        .filter(|a| matches!(a, Appended::Accepted { .. }))
        .count();
    assert_eq!(stored, 40, "alice's share is 40 frames: {answers:?}");
    assert!(answers[40..].iter().all(|a| *a == Appended::MailboxFull));

    let node_c = JetStreamStore::open(&config).await.unwrap();
    let refused = node_c
        .append(to("bob"), &envelope("alice", "late"))
        .await
        .unwrap();
    assert_eq!(
        refused,
        Appended::MailboxFull,
        "a new node counts alice's 40"
    );
    accepted(&node_c, "bob", &envelope("carol", "c000")).await;

    let first = held(&node_c, "bob").await[0].0;
    node_c.release("bob", Release::One(first)).await.unwrap();
    accepted(&node_a, "bob", &envelope("alice", "aft1")).await;
    let again = node_b
        .append(to("bob"), &envelope("alice", "aft2"))
        .await
        .unwrap();
    assert_eq!(
        again,
        Appended::MailboxFull,
        "the released frame's room is taken"
    );
}

async fn within_cluster_deadline<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(CLUSTER_DEADLINE, f)
        .await
        .expect("within the cluster deadline")
}

/// `docs/cluster.md#live-delivery`: a frame appended through one relay node, connected to one
/// NATS server, is announced to another node connected to another server, which reads it from the
/// journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_appended_through_one_node_is_announced_to_a_node_on_another_server() {
    let cluster = NatsCluster::start(3).await;
    let on_server = |server: usize| {
        let url = cluster.url(server);
        async move {
            JetStreamStore::open(&deployment(vec![url], 3))
                .await
                .unwrap()
        }
    };
    let (node_a, node_b) = (on_server(0).await, on_server(2).await);
    node_a.ensure_account("bob", 1).await.unwrap();
    let mut appends = node_b.appended("bob").await.unwrap();
    node_b.subscriptions_in_place().await.unwrap();
    let seq = accepted(&node_a, "bob", &envelope("alice", "m0")).await;
    let announced = within_cluster_deadline(appends.next()).await;
    assert_eq!(announced, Some(seq));
    let frames = node_b.fetch("bob", 0, seq, 0).await.unwrap();
    assert_eq!(frames.len(), 1);
    assert_eq!(
        (frames[0].seq, frames[0].message_id.as_str()),
        (Some(seq), "m0")
    );
    // A duplicate is not announced again: the next notice is the next frame's.
    node_a
        .append(to("bob"), &envelope("alice", "m0"))
        .await
        .unwrap();
    let next = accepted(&node_a, "bob", &envelope("alice", "m1")).await;
    assert_eq!(within_cluster_deadline(appends.next()).await, Some(next));
}

/// `docs/cluster.md#presence`: the latest connection of an account is its presence, an older
/// connection ending does not remove a newer one, and the accounts of a node that stopped
/// beating (a node killed) go offline on their own, while a live node's stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accounts_of_a_node_that_stops_beating_go_offline_on_their_own() {
    let cluster = NatsCluster::start(1).await;
    let store = JetStreamStore::open(&ClusterConfig {
        presence_ttl: std::time::Duration::from_secs(2),
        ..deployment(cluster.urls(), 1)
    })
    .await
    .unwrap();
    let node_a = store.start_heartbeat("node-a").await.unwrap();
    let _node_b = store.start_heartbeat("node-b").await.unwrap();
    let on = |node: &str, connection: u64| Presence {
        node: node.into(),
        connection,
        since_ms: connection * 10,
    };
    store.connected("bob", on("node-a", 1)).await.unwrap();
    assert_eq!(store.present("bob").await.unwrap(), Some(on("node-a", 1)));
    // bob connects again through node B, then its old connection on node A ends.
    store.connected("bob", on("node-b", 2)).await.unwrap();
    store.disconnected("bob", "node-a", 1, 15).await.unwrap();
    assert_eq!(store.present("bob").await.unwrap(), Some(on("node-b", 2)));
    store.connected("carol", on("node-a", 3)).await.unwrap();
    assert!(store.present("dave").await.unwrap().is_none());

    drop(node_a);
    let deadline = Instant::now() + CLUSTER_DEADLINE;
    while store.present("carol").await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "carol still present on a dead node"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(store.present("bob").await.unwrap(), Some(on("node-b", 2)));
    store.disconnected("bob", "node-b", 2, 25).await.unwrap();
    assert!(store.present("bob").await.unwrap().is_none());
}

/// `docs/cluster.md#presence`: the node holding an account's connection learns from the
/// presence record that a connection through another node displaced it, and when the account's
/// connection ends, whatever node each store runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_following_presence_sees_a_connection_through_another_node_displace_it() {
    let cluster = NatsCluster::start(3).await;
    let on_server = |server: usize| {
        let url = cluster.url(server);
        async move {
            JetStreamStore::open(&deployment(vec![url], 3))
                .await
                .unwrap()
        }
    };
    let (node_a, node_b) = (on_server(0).await, on_server(1).await);
    let on = |node: &str, connection: u64| Presence {
        node: node.into(),
        connection,
        since_ms: connection,
    };
    node_a.connected("bob", on("node-a", 1)).await.unwrap();
    let mut changes = node_a.presence_changes().await.unwrap();
    node_b.connected("bob", on("node-b", 2)).await.unwrap();
    // The feed starts with every record as it stood (node A's own connection): node A reads
    // on until a record names another connection.
    let own = Record::Online(on("node-a", 1));
    let change = within_cluster_deadline(next_record(&mut changes, "bob", &own)).await;
    assert_eq!(
        change.record,
        Record::Online(on("node-b", 2)),
        "node A learns it was displaced"
    );
    let displacing = change.revision;
    node_b.disconnected("bob", "node-b", 2, 99).await.unwrap();
    let change = within_cluster_deadline(next_record(&mut changes, "bob", &own)).await;
    assert_eq!(change.record, Record::Offline { last_seen_ms: 99 });
    assert!(
        change.revision > displacing,
        "later records have higher revisions"
    );
}

/// The next record of `account` the feed yields that is not `skip`.
async fn next_record(changes: &mut Feed<Change>, account: &str, skip: &Record) -> Change {
    loop {
        let change = changes.next().await.unwrap().unwrap();
        if change.account == account && &change.record != skip {
            return change;
        }
    }
}

/// Relay nodes started at the same moment against a new deployment all create its stream and
/// buckets: every one of them opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_opening_a_new_deployment_at_once_all_open() {
    let cluster = NatsCluster::start(3).await;
    let config = deployment(cluster.urls(), 3);
    let (a, b) = tokio::join!(JetStreamStore::open(&config), JetStreamStore::open(&config));
    if let Err(e) = a.as_ref().and(b.as_ref()) {
        panic!("{e}\n{}", cluster.logs());
    }
}
