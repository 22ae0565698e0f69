//! Faults in cluster mode (`docs/cluster.md#what-each-failure-costs`): three relay nodes (child
//! processes) over three NATS servers on loopback, the sender on one node and the recipient on
//! another. A relay node SIGKILLed mid-stream (its clients fail over to another node), a NATS
//! server SIGKILLed, a NATS server partitioned (SIGSTOP: unreachable to its peers and clients,
//! its state kept, as in a network partition) and the whole cluster restarted: every frame
//! answered `MessageSent` is delivered, none is journaled twice (the recipient sees each
//! `message_id` under one `seq` only; seeing the same seq again after a failover is the
//! at-least-once its dedup key absorbs).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::nats::{NatsCluster, CLUSTER_DEADLINE};
use common::{RelayProcess, SECRET};
use courier_proto::{ClientFrame, RelayFrame};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// Messages per test run.
const MESSAGES: usize = 60;

struct Deployment {
    nats: NatsCluster,
    dir: tempfile::TempDir,
    secret: PathBuf,
    nodes: Vec<Option<RelayProcess>>,
}

impl Deployment {
    async fn start(nodes: usize) -> Self {
        let nats = NatsCluster::start(3).await;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, [SECRET, b"\n"].concat()).unwrap();
        let mut deployment = Self {
            nats,
            dir,
            secret,
            nodes: Vec::new(),
        };
        for node in 0..nodes {
            let process = deployment.spawn(node);
            deployment.nodes.push(Some(process));
        }
        deployment
    }

    fn spawn(&self, node: usize) -> RelayProcess {
        let log = self.dir.path().join(format!("node{node}.log"));
        RelayProcess::spawn_node(&self.nats.urls(), &self.secret, &log)
    }

    fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.as_ref().expect("node running").url.clone())
            .collect()
    }

    fn kill_node(&mut self, node: usize) {
        if let Some(mut process) = self.nodes[node].take() {
            process.kill9();
        }
    }

    /// Every node's log and the NATS servers', for a failure message.
    fn logs(&self) -> String {
        let mut logs = self.nats.logs();
        for node in 0..self.nodes.len() {
            let path = self.dir.path().join(format!("node{node}.log"));
            logs.push_str(&format!(
                "\n--- relay node {node} ---\n{}",
                std::fs::read_to_string(path).unwrap_or_default()
            ));
        }
        logs
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// An opted-in connection of `account` to the first node of `urls` (from `start`) that takes
/// it, as a client that fails over does.
async fn connect(urls: &[String], start: usize, account: &str) -> (Ws, usize) {
    let deadline = Instant::now() + CLUSTER_DEADLINE;
    let mut at = start;
    loop {
        let url = &urls[at % urls.len()];
        let attempt = tokio::time::timeout(Duration::from_secs(5), async {
            let (mut ws, _) = tokio_tungstenite::connect_async(url).await.ok()?;
            let auth = serde_json::json!({
                "type": "Authenticate",
                "token": common::token(account),
                "client_capabilities": ["mailbox_v1"],
            });
            ws.send(Message::text(auth.to_string())).await.ok()?;
            match next(&mut ws).await? {
                RelayFrame::Authenticated { .. } => Some(ws),
                _ => None,
            }
        })
        .await;
        if let Ok(Some(ws)) = attempt {
            return (ws, at % urls.len());
        }
        assert!(Instant::now() < deadline, "{account} found no node");
        at += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The next frame; `None` once the connection ended.
async fn next(ws: &mut Ws) -> Option<RelayFrame> {
    loop {
        match ws.next().await? {
            Ok(Message::Text(text)) => return RelayFrame::decode(&text).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// The recipient: reads and acks what it receives, failing over to the next node when its
/// connection ends. What it received: message id → the seqs it came under.
struct Recipient {
    received: Arc<Mutex<BTreeMap<String, BTreeSet<u64>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recipient {
    fn start(urls: Vec<String>, start: usize, account: &'static str) -> Self {
        let received: Arc<Mutex<BTreeMap<String, BTreeSet<u64>>>> = Arc::default();
        let record = Arc::clone(&received);
        let task = tokio::spawn(async move {
            let mut at = start;
            loop {
                let (mut ws, node) = connect(&urls, at, account).await;
                at = node + 1;
                while let Some(frame) = next(&mut ws).await {
                    if let RelayFrame::MessageReceived {
                        seq: Some(seq),
                        message_id,
                        ..
                    } = frame
                    {
                        record
                            .lock()
                            .unwrap()
                            .entry(message_id)
                            .or_default()
                            .insert(seq);
                        let ack = ClientFrame::Ack { seq }.encode();
                        if ws.send(Message::text(ack)).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Self { received, task }
    }

    /// Waits until every one of `ids` was received; panics with `logs` past the deadline.
    async fn wait_for(&self, ids: &BTreeSet<String>, logs: impl Fn() -> String) {
        let deadline = Instant::now() + 2 * CLUSTER_DEADLINE;
        loop {
            let missing: Vec<String> = {
                let received = self.received.lock().unwrap();
                ids.iter()
                    .filter(|id| !received.contains_key(*id))
                    .cloned()
                    .collect()
            };
            if missing.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "never received {missing:?}\n{}",
                logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// No message was journaled twice: each came under one seq.
    fn assert_each_journaled_once(&self) {
        let received = self.received.lock().unwrap();
        let twice: Vec<_> = received.iter().filter(|(_, seqs)| seqs.len() > 1).collect();
        assert!(twice.is_empty(), "journaled twice: {twice:?}");
    }
}

impl Drop for Recipient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The sender: sends one message at a time and resends it, through the next node if its
/// connection ended, until it is answered `MessageSent` (a client's outbox does the same).
struct Sender {
    urls: Vec<String>,
    at: usize,
    account: &'static str,
    ws: Option<Ws>,
}

impl Sender {
    fn new(urls: Vec<String>, start: usize, account: &'static str) -> Self {
        Self {
            urls,
            at: start,
            account,
            ws: None,
        }
    }

    /// Sends until answered `MessageSent`; `meanwhile` runs once, right after the first
    /// write of the frame (while it is in flight).
    async fn send(&mut self, recipient: &str, id: &str, meanwhile: impl FnOnce()) {
        let frame = ClientFrame::SendMessage {
            recipient: recipient.into(),
            content: format!("content of {id}"),
            message_id: id.into(),
            reply_to_msg: None,
        }
        .encode();
        let mut meanwhile = Some(meanwhile);
        let deadline = Instant::now() + 2 * CLUSTER_DEADLINE;
        loop {
            assert!(Instant::now() < deadline, "{id} never answered MessageSent");
            if self.ws.is_none() {
                let (ws, node) = connect(&self.urls, self.at, self.account).await;
                self.at = node;
                self.ws = Some(ws);
            }
            let ws = self.ws.as_mut().unwrap();
            let written = ws.send(Message::text(frame.clone())).await.is_ok();
            if let Some(run) = meanwhile.take() {
                run();
            }
            if written {
                loop {
                    match tokio::time::timeout(CLUSTER_DEADLINE, next(ws)).await {
                        Ok(Some(RelayFrame::MessageSent { message_id, .. }))
                            if message_id == id =>
                        {
                            return
                        }
                        Ok(Some(RelayFrame::Error { .. } | RelayFrame::DeliveryError { .. })) => {
                            // Refused for now (no journal leader yet): resend after a while.
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            break;
                        }
                        Ok(Some(_)) => continue,
                        Ok(None) | Err(_) => {
                            self.ws = None;
                            self.at += 1;
                            break;
                        }
                    }
                }
            } else {
                self.ws = None;
                self.at += 1;
            }
        }
    }
}

fn ids(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i:03}")).collect()
}

/// alice on node 0 sends [`MESSAGES`] to bob on node 1, one at a time, resending what was not
/// answered; `fault(i, deployment)` runs while message `i` is in flight. Then bob must have
/// every message, each under one seq.
async fn stream_through(mut deployment: Deployment, mut fault: impl FnMut(usize, &mut Deployment)) {
    let urls = deployment.urls();
    let bob = Recipient::start(urls.clone(), 1, "bob");
    let mut alice = Sender::new(urls, 0, "alice");
    let all = ids(0..MESSAGES);
    for (i, id) in all.iter().enumerate() {
        alice.send("bob", id, || fault(i, &mut deployment)).await;
    }
    bob.wait_for(&all.iter().cloned().collect(), || deployment.logs())
        .await;
    bob.assert_each_journaled_once();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_node_sigkilled_mid_stream_loses_nothing_and_its_clients_fail_over() {
    // Node 2 takes whoever fails over: bob when his node dies with a frame on its way to him,
    // alice when hers dies with her frame in flight.
    stream_through(Deployment::start(3).await, |i, deployment| {
        if i == MESSAGES / 3 {
            deployment.kill_node(1);
        }
        if i == 2 * MESSAGES / 3 {
            deployment.kill_node(0);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_sigkilled_mid_stream_loses_nothing() {
    let deployment = Deployment::start(2).await;
    let leader = deployment.nats.journal_leader().await;
    // The journal's leader dies with a frame in flight: an election mid-stream.
    stream_through(deployment, |i, deployment| {
        if i == MESSAGES / 2 {
            deployment.nats.kill(leader);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_nats_server_loses_nothing_and_rejoins() {
    let deployment = Deployment::start(2).await;
    let leader = deployment.nats.journal_leader().await;
    // The journal's leader is cut off with a frame in flight, and comes back behind the leader
    // elected meanwhile.
    stream_through(deployment, |i, deployment| {
        if i == MESSAGES / 3 {
            deployment.nats.partition(leader);
        }
        if i == 2 * MESSAGES / 3 {
            deployment.nats.heal(leader);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_restart_delivers_everything_journaled() {
    let mut deployment = Deployment::start(2).await;
    let urls = deployment.urls();
    // bob has an account and is offline: everything is journaled for his next connection.
    drop(connect(&urls, 1, "bob").await);
    let mut alice = Sender::new(urls, 0, "alice");
    let all = ids(0..MESSAGES / 2);
    for id in &all {
        alice.send("bob", id, || {}).await;
    }
    drop(alice);
    for node in 0..2 {
        deployment.kill_node(node);
    }
    deployment.nats.kill_all();
    deployment.nats.restart_all().await;
    for node in 0..2 {
        let process = deployment.spawn(node);
        deployment.nodes[node] = Some(process);
    }
    let bob = Recipient::start(deployment.urls(), 1, "bob");
    bob.wait_for(&all.iter().cloned().collect(), || deployment.logs())
        .await;
    bob.assert_each_journaled_once();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accounts_of_a_killed_relay_node_go_offline_on_the_other_nodes() {
    let mut deployment = Deployment::start(2).await;
    let urls = deployment.urls();
    let (_bob, _) = connect(&urls, 1, "bob").await;
    let (mut carol, _) = connect(&urls, 0, "carol").await;
    let watch = ClientFrame::WatchPresence {
        users: vec!["bob".into()],
    };
    carol.send(Message::text(watch.encode())).await.unwrap();
    assert_eq!(
        bob_status(&mut carol).await,
        (true, None),
        "bob is online on node 1"
    );
    // No connection of bob's ends in any record: his node's heartbeat stops.
    deployment.kill_node(1);
    let (online, last_seen) = bob_status(&mut carol).await;
    assert!(!online && last_seen.is_some(), "offline with a last_seen");
}

/// The next presence status of bob's that `ws` reads: `(online, last_seen)`.
async fn bob_status(ws: &mut Ws) -> (bool, Option<serde_json::Value>) {
    tokio::time::timeout(CLUSTER_DEADLINE, async {
        loop {
            match next(ws).await.expect("the watcher's connection stays") {
                RelayFrame::PresenceStatus {
                    user_id,
                    online,
                    last_seen,
                } if user_id == "bob" => return (online, last_seen),
                _ => continue,
            }
        }
    })
    .await
    .expect("a status within the deadline")
}
