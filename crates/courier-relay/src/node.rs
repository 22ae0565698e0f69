//! A relay node of a cluster (`docs/cluster.md`): it keeps nothing durable itself. It beats in
//! the `nodes` bucket, follows every presence record, every node's heartbeat and every address
//! binding (and, for contacts visibility, every contact) into the router (so presence is answered from memory, as the single-file relay
//! answers it), writes its connections' presence records, and hands each connection the notices
//! of frames appended to its account, which its writer then reads from the journal.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;
use tokio::task::JoinHandle;

use crate::cluster::{
    BindingChange, ClusterConfig, ClusterError, Copy, Feed, Figures, GroupChange, Heartbeat,
    JetStreamStore, Presence,
};
use crate::config::{AddressLimits, ClusterStorage, MailboxLimits};
use crate::fanout::{FannedOut, Outcome, Placement};
use crate::group::{Actor, GroupRefusal};
use crate::lanes::{Done, Lanes};
use crate::lock;
use crate::mailbox::{Envelope, GroupTag};
use crate::rosters::Rosters;
use crate::router::{Peer, Router};
use crate::store::Named;

/// After a feed from JetStream failed, the wait before it is started again.
const FEED_RETRY: Duration = Duration::from_millis(500);

/// How often the monitoring figures are read again.
const FIGURES_INTERVAL: Duration = Duration::from_secs(5);

pub struct Node {
    store: JetStreamStore,
    name: String,
    router: Arc<Router>,
    /// Every binding followed, by address: its account and when it was declared.
    bindings: Arc<Mutex<HashMap<String, (String, u64)>>>,
    figures: Arc<Mutex<Figures>>,
    /// Followed for presence visibility (`docs/protocol.md#presence-visibility`).
    rosters: Arc<Mutex<Rosters>>,
    /// Each broadcast's time, from its first read to JetStream's acknowledgement.
    commit_seconds: Histogram,
    lanes: Lanes,
    tasks: Vec<JoinHandle<()>>,
    _heartbeat: Heartbeat,
}

/// One connection's share of the node: the notices of its account's appended frames and held
/// reports, and the answers to other nodes asking whether it was written a frame.
pub struct Attachment {
    tasks: [JoinHandle<()>; 3],
}

impl Drop for Attachment {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A name no other node has: its heartbeat and its presence records are told apart by it.
fn node_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    // A fresh `RandomState` is randomly keyed: its hash of nothing is a random number.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{}-{random:016x}", std::process::id())
}

impl Node {
    /// Connects to the deployment's NATS, starts beating and following, and answers once the
    /// node can serve.
    pub async fn start(
        storage: &ClusterStorage,
        mailbox: Option<MailboxLimits>,
        addresses: AddressLimits,
        router: Arc<Router>,
        commit_seconds: Histogram,
    ) -> Result<Self, ClusterError> {
        let store = JetStreamStore::open(&ClusterConfig {
            servers: storage.servers.clone(),
            name: storage.name.clone(),
            replicas: storage.replicas,
            mailbox: mailbox.unwrap_or_default(),
            addresses,
            presence_ttl: storage.presence_ttl,
        })
        .await?;
        let name = node_name();
        router.serve_as(&name);
        let heartbeat = store.start_heartbeat(&name).await?;
        let bindings = Arc::new(Mutex::new(HashMap::new()));
        // Figures only feed metrics: a node starting while a server is restarted serves without
        // them until `read_figures` reads them.
        let figures = store.figures().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the cluster's figures are not readable yet");
            Figures::default()
        });
        let figures = Arc::new(Mutex::new(figures));
        let rosters = Arc::new(Mutex::new(Rosters::default()));
        let tasks = vec![
            tokio::spawn(follow_groups(store.clone(), Arc::clone(&rosters))),
            tokio::spawn(follow_presence(store.clone(), Arc::clone(&router))),
            tokio::spawn(follow_nodes(
                store.clone(),
                Arc::clone(&router),
                name.clone(),
            )),
            tokio::spawn(follow_bindings(
                store.clone(),
                Arc::clone(&router),
                Arc::clone(&bindings),
            )),
            tokio::spawn(follow_contacts(store.clone(), Arc::clone(&router))),
            tokio::spawn(read_figures(store.clone(), Arc::clone(&figures))),
        ];
        tracing::info!(node = %name, "relay node joined its cluster");
        Ok(Self {
            lanes: Lanes::new(store.clone(), commit_seconds.clone()),
            store,
            name,
            router,
            bindings,
            figures,
            rosters,
            commit_seconds,
            tasks,
            _heartbeat: heartbeat,
        })
    }

    pub fn store(&self) -> &JetStreamStore {
        &self.store
    }

    /// Queues `envelope` for the account `recipient` names behind the appends queued for it
    /// through this node before (`lanes.rs`); `done` gets the outcome. Its time is observed as
    /// the node's commit time (`docs/operating-the-relay.md#metrics`).
    pub async fn queue_append(&self, recipient: Named, envelope: Envelope, done: Done) {
        self.lanes.queue(recipient, envelope, done).await;
    }

    pub fn figures(&self) -> Figures {
        *lock(&self.figures)
    }

    pub fn is_connected(&self) -> bool {
        self.store.is_connected()
    }

    pub async fn shutdown(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }

    /// Makes `peer` its account's presence across the cluster and has its writer told of
    /// frames appended to the account through any node. Called once the connection is
    /// registered here and before its drain bound is fixed: a frame is then either under the
    /// bound or announced after the subscription is in place.
    pub async fn attach(&self, peer: &Arc<Peer>) -> Result<Attachment, ClusterError> {
        let mut appends = self.store.appended(&peer.account).await?;
        let mut reports = self.store.reports_held(&peer.account).await?;
        let mut queries = self.store.written_queries(&peer.account).await?;
        // One round trip puts the three in place.
        self.store.subscriptions_in_place().await?;
        let presence = Presence {
            node: self.name.clone(),
            connection: peer.id,
            since_ms: crate::now_ms(),
        };
        let revision = self.store.connected(&peer.account, presence).await?;
        if self.router.settle(peer, revision) {
            // A newer connection through another node was recorded first.
            let _ = peer.supersede();
        }
        let notified = Arc::clone(peer);
        let notices = tokio::spawn(async move {
            while let Some(seq) = appends.next().await {
                notified.queue.journal_grew(seq);
            }
        });
        let told = Arc::clone(peer);
        let held = tokio::spawn(async move {
            while reports.next().await.is_some() {
                told.reports.notify_one();
            }
        });
        let asked = Arc::clone(peer);
        let answers = tokio::spawn(async move {
            while let Some(query) = queries.next().await {
                let mut flushed = asked.queue.flushed();
                tokio::spawn(async move {
                    let seq = query.seq;
                    let waited = tokio::time::timeout(query.wait, async {
                        flushed.wait_for(|w| *w >= seq).await.is_ok()
                    })
                    .await;
                    // Not written within the asker's wait, which has ended too: no answer.
                    // Else written, or the connection ended and its next one drains the frame.
                    if let Ok(written) = waited {
                        query.answer(written).await;
                    }
                });
            }
        });
        Ok(Attachment {
            tasks: [notices, held, answers],
        })
    }

    /// Journals a copy of `message` for every member of the group `tag` names but the sender
    /// (`cluster/groups.rs`), and tells where each copy stands: queued to a connection here,
    /// with a connection on another node, or in the member's mailbox.
    pub async fn broadcast(
        &self,
        actor: &Actor,
        message: Envelope,
        tag: GroupTag,
        dedup_since_ms: u64,
    ) -> Result<Result<FannedOut, GroupRefusal>, ClusterError> {
        let started = Instant::now();
        let copies = match self
            .store
            .broadcast(actor, message, tag, dedup_since_ms)
            .await?
        {
            Ok(copies) => copies,
            Err(why) => return Ok(Err(why)),
        };
        let mut journaled = 0;
        let members = copies
            .into_iter()
            .map(|(member, copy)| {
                let placement = match copy {
                    Copy::New { account, seq } => {
                        journaled += 1;
                        self.placement(account, seq)
                    }
                    Copy::Held { account, seq } => self.placement(account, seq),
                    Copy::Released => Placement::Settled(Outcome::Delivered),
                    Copy::Missed(miss) => Placement::Settled(Outcome::Missed(miss)),
                };
                (member, placement)
            })
            .collect();
        if journaled > 0 {
            self.commit_seconds.observe(started.elapsed().as_secs_f64());
        }
        Ok(Ok(FannedOut { members, journaled }))
    }

    /// Where the copy journaled as `account`'s `seq` stands. A connection here is told of it by
    /// the append's notice, as of any frame.
    fn placement(&self, account: String, seq: u64) -> Placement {
        match self.router.get(&account) {
            Some(peer) => Placement::Queued {
                flushed: peer.queue.flushed(),
                seq,
            },
            None if self.router.status(&account).online => Placement::Elsewhere {
                store: self.store.clone(),
                account,
                seq,
            },
            None => Placement::Settled(Outcome::Pushed),
        }
    }

    /// The members of every group one of `identities` is a member of, as this node follows
    /// them: a change through another node shows here a moment later.
    pub fn group_peers(&self, identities: &[String]) -> Vec<String> {
        lock(&self.rosters).peers(identities)
    }

    /// `peer`'s connection ended at `ms`, when it was still its account's connection here.
    pub async fn detach(&self, peer: &Peer, ms: u64) -> Result<(), ClusterError> {
        self.store
            .disconnected(&peer.account, &self.name, peer.id, ms)
            .await
    }

    /// Binds `address` to `account` and applies it here at once: the declaring connection's
    /// next frame may rely on it before the binding's change comes back from JetStream.
    pub async fn bind_address(
        &self,
        address: &str,
        account: &str,
        max_per_account: u32,
        now_ms: u64,
    ) -> Result<(), ClusterError> {
        self.store
            .bind_address(address, account, max_per_account, now_ms)
            .await?;
        lock(&self.bindings).insert(address.to_owned(), (account.to_owned(), now_ms));
        self.router.rebind(address, account);
        Ok(())
    }

    /// Forgets bindings last declared before `older_than_ms`, which JetStream expired without
    /// a change to follow; answers how many.
    pub fn forget_bindings(&self, older_than_ms: u64) -> u64 {
        let expired: Vec<(String, String)> = {
            let mut bindings = lock(&self.bindings);
            let expired: Vec<(String, String)> = bindings
                .iter()
                .filter(|(_, (_, declared))| *declared < older_than_ms)
                .map(|(address, (account, _))| (address.clone(), account.clone()))
                .collect();
            for (address, _) in &expired {
                bindings.remove(address);
            }
            expired
        };
        for (address, account) in &expired {
            self.router.unbind(address, account);
        }
        expired.len() as u64
    }
}

/// Follows the feed `start` opens, applying each record, and opens it again after a failure:
/// a new feed begins with every record again, which applying twice leaves as it was.
async fn follow<T, Fut>(what: &'static str, start: impl Fn() -> Fut, mut apply: impl FnMut(T))
where
    Fut: Future<Output = Result<Feed<T>, ClusterError>>,
{
    loop {
        match start().await {
            Ok(mut feed) => {
                let failure = loop {
                    match feed.next().await {
                        Some(Ok(item)) => apply(item),
                        Some(Err(e)) => break e,
                        None => break ClusterError::Request("the feed ended".into()),
                    }
                };
                tracing::warn!(what, error = %failure, "following a bucket failed; following it again");
            }
            Err(e) => tracing::warn!(what, error = %e, "following a bucket could not start"),
        }
        tokio::time::sleep(FEED_RETRY).await;
    }
}

async fn follow_presence(store: JetStreamStore, router: Arc<Router>) {
    follow(
        "presence",
        || store.presence_changes(),
        |change| {
            if let Some(displaced) = router.observe(&change) {
                let _ = displaced.supersede();
            }
        },
    )
    .await;
}

/// Marks nodes alive as their heartbeats come, and dead once none came within the presence
/// lifetime (by this node's clock: heartbeats are told by when they were read).
async fn follow_nodes(store: JetStreamStore, router: Arc<Router>, own: String) {
    let ttl = store.presence_ttl();
    let beats: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let sweep = {
        let (beats, router) = (Arc::clone(&beats), Arc::clone(&router));
        async move {
            let mut tick = tokio::time::interval((ttl / 3).max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let dead: Vec<String> = {
                    let mut beats = lock(&beats);
                    let dead: Vec<String> = beats
                        .iter()
                        .filter(|(_, at)| at.elapsed() >= ttl)
                        .map(|(node, _)| node.clone())
                        .collect();
                    for node in &dead {
                        beats.remove(node);
                    }
                    dead
                };
                for node in dead {
                    tracing::info!(%node, "a relay node stopped beating: its connections are offline");
                    router.node_down(&node, crate::now_ms());
                }
            }
        }
    };
    let beat = |(node, age): (String, Duration)| {
        if node == own || age >= ttl {
            return;
        }
        let at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        lock(&beats).insert(node.clone(), at);
        router.node_up(&node);
    };
    tokio::join!(sweep, follow("heartbeats", || store.node_beats(), beat));
}

async fn follow_bindings(
    store: JetStreamStore,
    router: Arc<Router>,
    bindings: Arc<Mutex<HashMap<String, (String, u64)>>>,
) {
    let mut keys: HashMap<String, String> = HashMap::new();
    follow(
        "address bindings",
        || store.binding_changes(),
        |change| match change {
            BindingChange::Bound {
                key,
                address,
                account,
                declared_ms,
            } => {
                keys.insert(key, address.clone());
                lock(&bindings).insert(address.clone(), (account.clone(), declared_ms));
                router.rebind(&address, &account);
            }
            BindingChange::Unbound { key } => {
                let Some(address) = keys.remove(&key) else {
                    return;
                };
                let removed = lock(&bindings).remove(&address);
                if let Some((account, _)) = removed {
                    router.unbind(&address, &account);
                }
            }
        },
    )
    .await;
}

async fn follow_groups(store: JetStreamStore, rosters: Arc<Mutex<Rosters>>) {
    follow(
        "groups",
        || store.group_changes(),
        |GroupChange { key, group }| {
            let members = group.map(|group| group.members.into_keys().collect());
            lock(&rosters).set(key, members);
        },
    )
    .await;
}

async fn follow_contacts(store: JetStreamStore, router: Arc<Router>) {
    follow(
        "contacts",
        || store.contact_changes(),
        |(a, b)| {
            router.contacts.insert(&a, &b);
        },
    )
    .await;
}

async fn read_figures(store: JetStreamStore, figures: Arc<Mutex<Figures>>) {
    let mut tick = tokio::time::interval(FIGURES_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match store.figures().await {
            Ok(read) => *lock(&figures) = read,
            Err(e) => tracing::debug!(error = %e, "reading the cluster's figures failed"),
        }
    }
}
