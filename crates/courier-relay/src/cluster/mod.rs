//! The relay's durable facts in NATS JetStream instead of one SQLite file (`docs/cluster.md`):
//! each account's journal in one replicated stream with a subject per account, accounts, address
//! bindings and the relay-side dedup in key-value buckets. A [`JetStreamStore`] holds nothing
//! durable itself, so any number of relay nodes can share one.
//!
//! Owned here: the layout (`names.rs`), accounts and the base their `seq` counts from
//! (`accounts.rs`), the journal (`journal.rs`), the notices of appended frames that reach the
//! recipient's node (`appended.rs`), presence across nodes (`presence.rs`) and the address
//! bindings (`addresses.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};

use crate::config::{AddressLimits, MailboxLimits};

mod accounts;
mod addresses;
mod appended;
mod contacts;
mod feed;
mod figures;
mod groups;
mod journal;
mod key_packages;
mod names;
mod presence;
mod record;
mod usage;
mod written;

pub use addresses::BindingChange;
pub use appended::Appends;
pub use feed::Feed;
pub use figures::Figures;
pub use groups::{Copy, GroupChange, ReportNotices};
pub use journal::Appended;
use names::Names;
pub use presence::{Change, Heartbeat, Presence, Record};
pub use written::{Written, WrittenQueries};

/// What one relay deployment's store in NATS is.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// NATS server URLs (`nats://host:port`); the client connects to one and moves to another
    /// when it fails.
    pub servers: Vec<String>,
    /// Prefix of the stream, its subjects and the buckets, so deployments sharing one NATS stay
    /// apart: ASCII letters, digits, `-` and `_`.
    pub name: String,
    /// Copies JetStream keeps of the stream and of every bucket: 3 survives the loss of one
    /// server of three, 1 is for development.
    pub replicas: usize,
    pub mailbox: MailboxLimits,
    pub addresses: AddressLimits,
    /// How long a relay node's connections stay present after its last heartbeat
    /// (`docs/cluster.md#presence`).
    pub presence_ttl: Duration,
}

impl ClusterConfig {
    /// The default deployment name.
    pub const DEFAULT_NAME: &'static str = "courier";
    /// The default presence lifetime: a dead node's accounts go offline within it.
    pub const DEFAULT_PRESENCE_TTL: Duration = Duration::from_secs(15);
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    #[error("the cluster name {0:?} may hold only ASCII letters, digits, '-' and '_'")]
    InvalidName(String),
    #[error("JetStream keeps 1 to 5 replicas, not {0}")]
    InvalidReplicas(usize),
    #[error("no NATS server given")]
    NoServers,
    #[error("the presence lifetime must be at least 1 s, not {0:?}")]
    InvalidPresenceTtl(Duration),
    #[error("connecting to NATS: {0}")]
    Connect(String),
    #[error("setting up the JetStream stream or buckets: {0}")]
    Setup(String),
    #[error("a JetStream request failed: {0}")]
    Request(String),
    #[error("other appends to the account kept taking its next sequence first, {0} times")]
    Contended(u32),
    #[error("a record in JetStream does not decode: {0}")]
    Corrupt(String),
}

impl ClusterError {
    /// A stable code for logs and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidName(_) => "cluster_invalid_name",
            Self::InvalidReplicas(_) => "cluster_invalid_replicas",
            Self::NoServers => "cluster_no_servers",
            Self::InvalidPresenceTtl(_) => "cluster_invalid_presence_ttl",
            Self::Connect(_) => "cluster_connect",
            Self::Setup(_) => "cluster_setup",
            Self::Request(_) => "cluster_request",
            Self::Contended(_) => "cluster_contended",
            Self::Corrupt(_) => "cluster_corrupt",
        }
    }
}

/// Whether `error`, or what caused it, is JetStream refusing a conditional write because the
/// subject (a journal subject, or a bucket's key) no longer ends where the writer read it: another
/// write came first. Servers answer it with one of two codes, and the client library names only
/// one of them.
fn lost_race(error: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::ErrorCode;
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(refusal) = e.downcast_ref::<async_nats::jetstream::Error>() {
            return [
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE,
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT,
            ]
            .contains(&refusal.error_code());
        }
        cause = e.source();
    }
    false
}

/// Shorthand for a failed JetStream request.
fn request(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Request(e.to_string())
}

impl JetStreamStore {
    /// Subscribes to `subject`. The server has the subscription, and what is published after
    /// reaches it, once [`JetStreamStore::subscriptions_in_place`] answered.
    async fn subscribe(&self, subject: String) -> Result<async_nats::Subscriber, ClusterError> {
        self.inner.client.subscribe(subject).await.map_err(request)
    }

    /// Answers once the server has every subscription made before (a flush round trip).
    pub async fn subscriptions_in_place(&self) -> Result<(), ClusterError> {
        self.inner.client.flush().await.map_err(request)
    }
}

/// Handle to the deployment's stream and buckets. Cheap to clone.
#[derive(Clone)]
pub struct JetStreamStore {
    inner: Arc<Inner>,
}

struct Inner {
    names: Names,
    client: async_nats::Client,
    js: jetstream::Context,
    journal: stream::Stream,
    accounts: kv::Store,
    dedup: kv::Store,
    addresses: kv::Store,
    bindings: kv::Store,
    presence: kv::Store,
    nodes: kv::Store,
    contacts: kv::Store,
    key_packages: kv::Store,
    groups: kv::Store,
    group_copies: kv::Store,
    held_reports: kv::Store,
    presence_ttl: Duration,
    limits: MailboxLimits,
    /// What this node knows each account's frames weigh (`usage.rs`).
    tallies: usage::Tallies,
    /// Each account's base (`accounts.rs`), which never changes once set.
    bases: Mutex<HashMap<String, u64>>,
}

/// Between two pings of the NATS server a node is connected to (`docs/cluster.md#what-each-failure-costs`).
const SERVER_PING: Duration = Duration::from_secs(2);

/// How long one request of the setup waits for its answer before it is made again.
const SETUP_REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);

/// How long opening waits for the stream and buckets to be created and served.
const SERVED_DEADLINE: Duration = Duration::from_secs(30);

/// Between two probes of a stream or bucket not served yet.
const SERVED_POLL: Duration = Duration::from_millis(50);

/// Waits until the stream and every bucket answer a read: replicated ones answer no request
/// until their replicas have elected a leader, which follows their creation.
async fn wait_until_served(
    deadline: tokio::time::Instant,
    journal: &stream::Stream,
    buckets: &[kv::Store],
) -> Result<(), ClusterError> {
    loop {
        let mut failure = journal.get_info().await.err().map(|e| e.to_string());
        for bucket in buckets {
            if failure.is_none() {
                // Any key: an absent one is an answer too.
                failure = bucket.get("served").await.err().map(|e| e.to_string());
            }
        }
        let Some(failure) = failure else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(ClusterError::Setup(format!(
                "not served within {SERVED_DEADLINE:?}: {failure}"
            )));
        }
        tokio::time::sleep(SERVED_POLL).await;
    }
}

/// Runs `setup` (creating, updating or looking up a stream or bucket, or a node's first write)
/// until it succeeds or `deadline` passes: a cluster that is starting, or has just lost or
/// restarted a server, cannot place replicas or serve a stream for a moment ("no suitable
/// peers", "no stream found"), and a relay started with it waits rather than fails. A setup that
/// can never succeed fails at the deadline with its last error.
async fn until_placed<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    deadline: tokio::time::Instant,
    mut setup: impl FnMut() -> F,
) -> Result<T, ClusterError> {
    loop {
        match setup().await {
            Ok(done) => return Ok(done),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(ClusterError::Setup(e.to_string()))
            }
            Err(_) => tokio::time::sleep(SERVED_POLL).await,
        }
    }
}

/// JetStream's own duplicate window, which may not exceed the frames' lifetime. The relay
/// publishes no `Nats-Msg-Id`: its dedup is the conditional publish and the read that settles
/// it (`docs/cluster.md#relay-side-dedup`), exact across leader elections, where the window is
/// not.
const PUBLISH_DEDUP_WINDOW: Duration = Duration::from_secs(120);

impl JetStreamStore {
    /// Connects and creates the stream and buckets, or brings their limits to `config`'s.
    pub async fn open(config: &ClusterConfig) -> Result<Self, ClusterError> {
        let names = Names::new(&config.name)?;
        if !(1..=5).contains(&config.replicas) {
            return Err(ClusterError::InvalidReplicas(config.replicas));
        }
        if config.servers.is_empty() {
            return Err(ClusterError::NoServers);
        }
        // JetStream's ages have a resolution of a second.
        if config.presence_ttl < Duration::from_secs(1) {
            return Err(ClusterError::InvalidPresenceTtl(config.presence_ttl));
        }
        let client = async_nats::ConnectOptions::new()
            .name(format!("courier-relay {}", config.name))
            // A server cut off by a partition answers nothing and resets nothing: the client
            // learns it is gone from two unanswered pings, and moves to another server.
            .ping_interval(SERVER_PING)
            .retry_on_initial_connect()
            .connect(config.servers.clone())
            .await
            .map_err(|e| ClusterError::Connect(e.to_string()))?;
        let js = jetstream::new(client.clone());
        let limits = &config.mailbox;
        let ttl = Duration::from_millis(limits.ttl_ms);
        let journal_config = stream::Config {
            name: names.stream(),
            subjects: vec![names.journal_subjects()],
            storage: stream::StorageType::File,
            num_replicas: config.replicas,
            retention: stream::RetentionPolicy::Limits,
            // The mailbox limits (`docs/protocol.md#mailbox-limits`) as the stream's: per
            // account its subject's message count, for all of them the stream's bytes, and the
            // frames' lifetime. A frame past a limit is refused, never an older one dropped.
            max_messages_per_subject: i64::try_from(limits.max_messages).unwrap_or(i64::MAX),
            max_bytes: i64::try_from(limits.max_journal_bytes).unwrap_or(i64::MAX),
            max_age: ttl,
            discard: stream::DiscardPolicy::New,
            discard_new_per_subject: true,
            duplicate_window: PUBLISH_DEDUP_WINDOW.min(ttl),
            allow_direct: true,
            ..Default::default()
        };
        let deadline = tokio::time::Instant::now() + SERVED_DEADLINE;
        // Nodes starting together race to create the same stream and buckets, and JetStream
        // may leave the losing request of such a race unanswered: setup asks again after a
        // short wait rather than the usual request timeout.
        let mut setup = js.clone();
        setup.set_timeout(SETUP_REQUEST_TIMEOUT);
        until_placed(deadline, || {
            setup.create_or_update_stream(journal_config.clone())
        })
        .await?;
        // Bound through the usual context: the short timeout is for setup alone.
        let journal = until_placed(deadline, || js.get_stream(names.stream())).await?;
        let bucket = |name: String, max_age: Duration| kv::Config {
            bucket: name,
            history: 1,
            max_age,
            storage: stream::StorageType::File,
            num_replicas: config.replicas,
            ..Default::default()
        };
        let forever = Duration::ZERO;
        let group_memory = Duration::from_millis(crate::fanout::GROUP_MEMORY_MS);
        let mut buckets = Vec::new();
        for (name, max_age) in [
            (names.bucket("accounts"), forever),
            // A dedup record outlives no frame: the journal's frames expire at the same age.
            (names.bucket("dedup"), ttl),
            // A binding not declared again within its lifetime goes
            // (`docs/protocol.md#address-declaration`).
            (
                names.bucket("addresses"),
                Duration::from_millis(config.addresses.ttl_ms),
            ),
            (names.bucket("bindings"), forever),
            (names.bucket("presence"), forever),
            // A heartbeat not written again within the presence lifetime goes, and with it
            // the presence of the node's connections.
            (names.bucket("nodes"), config.presence_ttl),
            (names.bucket("contacts"), forever),
            (names.bucket("key-packages"), forever),
            (names.bucket("groups"), forever),
            // A broadcast's copy records and the reports held for a sender are kept for as long
            // as a repeat or the sender's next connection may need them.
            (names.bucket("group-copies"), group_memory),
            (names.bucket("held-reports"), group_memory),
        ] {
            let config = bucket(name, max_age);
            until_placed(deadline, || {
                setup.create_or_update_key_value(config.clone())
            })
            .await?;
            buckets.push(until_placed(deadline, || js.get_key_value(config.bucket.clone())).await?);
        }
        wait_until_served(deadline, &journal, &buckets).await?;
        let [accounts, dedup, addresses, bindings, presence, nodes, contacts, key_packages, groups, group_copies, held_reports]: [kv::Store;
            11] = buckets
            .try_into()
            .unwrap_or_else(|_| unreachable!("eleven buckets were created"));
        Ok(Self {
            inner: Arc::new(Inner {
                names,
                client,
                js,
                journal,
                accounts,
                dedup,
                addresses,
                bindings,
                presence,
                nodes,
                contacts,
                key_packages,
                groups,
                group_copies,
                held_reports,
                presence_ttl: config.presence_ttl,
                limits: config.mailbox,
                tallies: usage::Tallies::default(),
                bases: Mutex::new(HashMap::new()),
            }),
        })
    }
}
