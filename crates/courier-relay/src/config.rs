//! Relay configuration: what an operator chooses (`RelayConfig`) and the protocol's timing
//! constants (`Timings`), kept apart so tests can shorten the clocks without touching policy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use courier_proto::proof::CHALLENGE_LEN;

use crate::accept::DEFAULT_MAX_CONNECTIONS;
use crate::auth::new_challenge;
pub use crate::fanout::MAX_GROUP_MEMBERS_CEILING;
use crate::RelayError;

/// The shortest HS256 secret the relay and `issue_token` accept: the hash's output size, below
/// which the key is the weak point of the MAC (`docs/protocol.md#token`).
pub const MIN_SECRET_BYTES: usize = 32;

/// Members a group may have unless configured otherwise (`docs/protocol.md#group-registration`).
pub const DEFAULT_MAX_GROUP_MEMBERS: u32 = 1024;
const _: () = assert!(DEFAULT_MAX_GROUP_MEMBERS <= MAX_GROUP_MEMBERS_CEILING);

/// Where the relay keeps accounts and the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// A SQLite file, created if missing, in WAL mode.
    Path(PathBuf),
    /// A private in-memory database: nothing survives `stop()`.
    Memory,
    /// NATS JetStream, shared by every relay node of one deployment (`docs/cluster.md`).
    Cluster(ClusterStorage),
}

/// Where a relay node finds its deployment's NATS cluster (`docs/cluster.md#layout`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStorage {
    /// NATS server URLs (`nats://host:port`).
    pub servers: Vec<String>,
    /// The deployment's name, which prefixes its stream, subjects and buckets.
    pub name: String,
    /// Copies JetStream keeps of the journal and of every bucket (3 in production).
    pub replicas: usize,
    /// How long a node's connections stay present after its last heartbeat.
    pub presence_ttl: Duration,
}

impl ClusterStorage {
    /// A deployment on `servers` with the default name, three replicas and presence lifetime.
    pub fn new(servers: Vec<String>) -> Self {
        Self {
            servers,
            name: crate::cluster::ClusterConfig::DEFAULT_NAME.to_owned(),
            replicas: 3,
            presence_ttl: crate::cluster::ClusterConfig::DEFAULT_PRESENCE_TTL,
        }
    }
}

/// Mailbox limits (`docs/protocol.md#mailbox-limits`); the per-account ones are advertised in
/// `Authenticated.mailbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailboxLimits {
    pub max_messages: u64,
    /// Sum of the stored size of every unacked frame of the account: the whole journal row
    /// (content, identifiers, reply and group fields, and a fixed per-row overhead).
    pub max_bytes: u64,
    /// Frames older than this (from acceptance) are deleted undelivered.
    pub ttl_ms: u64,
    /// Percentage of `max_messages` and of `max_bytes` one sending account may hold in one
    /// mailbox, so no single sender can fill it.
    pub sender_share_percent: u8,
    /// Stored size of the whole journal, every mailbox together; past it every frame is
    /// refused as `mailbox_full` until frames are released or expire.
    pub max_journal_bytes: u64,
}

impl MailboxLimits {
    /// What one sending account may hold in one mailbox: frames and bytes, each at least one.
    pub fn sender_share(&self) -> (u64, u64) {
        let part = |of: u64| {
            let share = u128::from(of) * u128::from(self.sender_share_percent) / 100;
            u64::try_from(share).unwrap_or(u64::MAX).max(1)
        };
        (part(self.max_messages), part(self.max_bytes))
    }
}

impl Default for MailboxLimits {
    fn default() -> Self {
        Self {
            max_messages: 10_000,
            max_bytes: 67_108_864,
            ttl_ms: 604_800_000,
            sender_share_percent: 10,
            max_journal_bytes: 8 * 1024 * 1024 * 1024,
        }
    }
}

/// How many address bindings an account keeps, and for how long
/// (`docs/protocol.md#address-declaration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressLimits {
    /// Bindings one account holds; a declaration past it drops the account's least recently
    /// declared binding.
    pub max_per_account: u32,
    /// A binding not declared again for this long is deleted.
    pub ttl_ms: u64,
}

impl Default for AddressLimits {
    fn default() -> Self {
        Self {
            max_per_account: 16,
            ttl_ms: 90 * 24 * 60 * 60 * 1000,
        }
    }
}

/// The per-account token bucket (`docs/protocol.md#rate-limiting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub burst: u32,
    pub per_sec: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            burst: 2000,
            per_sec: 1000,
        }
    }
}

/// At most `burst` events at once, then `per_minute` more each minute
/// (`docs/protocol.md#authentication-limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptLimit {
    pub burst: u32,
    pub per_minute: u32,
}

/// How the relay admits connections and tokens (`docs/protocol.md#token`,
/// `docs/protocol.md#authentication-limits`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthPolicy {
    /// The longest `exp − iat` a token may have.
    pub max_token_lifetime: Duration,
    /// When set, a token must carry this `aud` (a string, or an array holding it).
    pub audience: Option<String>,
    /// When set, a token must carry this `iss`.
    pub issuer: Option<String>,
    /// Deny list of `account not-before` lines, re-read when it changes
    /// (`docs/operating-the-relay.md#revoking-tokens`).
    pub revoked_tokens: Option<PathBuf>,
    /// `Authenticate` frames per source address (an IPv4 address, or an IPv6 /64).
    pub attempts_per_source: AttemptLimit,
    /// Authentications with a valid token, per account.
    pub attempts_per_account: AttemptLimit,
    /// Logins that displace the account's live connection, per account.
    pub supersedes_per_account: AttemptLimit,
    /// Connections per source address that are open but not yet authenticated; more are closed
    /// at accept.
    pub max_unauthenticated_per_source: u32,
    /// Whether loopback sources share the per-source limits. Off by default: behind a reverse
    /// proxy on the same host every client comes from loopback, and one limit would hold them
    /// all.
    pub limit_loopback: bool,
}

impl Default for AuthPolicy {
    fn default() -> Self {
        Self {
            max_token_lifetime: Duration::from_secs(86_400),
            audience: None,
            issuer: None,
            revoked_tokens: None,
            attempts_per_source: AttemptLimit {
                burst: 60,
                per_minute: 60,
            },
            attempts_per_account: AttemptLimit {
                burst: 20,
                per_minute: 20,
            },
            supersedes_per_account: AttemptLimit {
                burst: 5,
                per_minute: 5,
            },
            max_unauthenticated_per_source: 64,
            limit_loopback: false,
        }
    }
}

/// PEM texts (not paths) of the certificate chain and private key served on `wss://`.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsConfig {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for TlsConfig {
    // The key must never end up in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The protocol's clocks (`docs/protocol.md#constants`). Production uses the defaults; tests
/// shorten them so they never sleep for the real 2–30 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// TCP accept to `Authenticated`: TLS and WebSocket handshakes and `Authenticate` together.
    pub auth_timeout: Duration,
    /// How often the revocation file is checked for changes.
    pub revocation_poll: Duration,
    pub ping_interval: Duration,
    /// Silence (no Pong, no other message) after which a connection is dropped.
    pub dead_after: Duration,
    /// A write to a connection's socket that has not completed after this long ends the
    /// connection (`docs/protocol.md#transport`): a peer that sends but never reads is otherwise
    /// never silent, and would keep its queue and its senders waiting.
    pub write_stall: Duration,
    /// Drain start at the latest this long after `Authenticated` (rule (c) of
    /// `docs/protocol.md#drain`).
    pub drain_grace: Duration,
    pub purge_interval: Duration,
    /// How long a new connection waits for the one it displaces to close.
    pub supersede_wait: Duration,
    /// How long a closing connection keeps reading for the peer's Close reply.
    pub close_linger: Duration,
    /// Bound on the relay's own work for one SendMessage (`docs/protocol.md#sending`), well under
    /// the client's 15 s answer deadline.
    pub answer_deadline: Duration,
    /// From reading a SendGroupMessage to its report (`docs/protocol.md#group-report`): members
    /// whose copy is not placed by then are reported missed with `fanout_deadline`.
    pub fanout_deadline: Duration,
    /// Test hook (feature `test-hooks`): every connection gets these bytes as its
    /// `address_challenge` instead of 32 fresh CSPRNG bytes, so a test can replay pinned proof
    /// vectors (`docs/protocol.md#declaration-vectors`).
    #[cfg(feature = "test-hooks")]
    pub fixed_challenge: Option<[u8; CHALLENGE_LEN]>,
}

impl Timings {
    /// A connection's `address_challenge`; `None` when the system random generator fails.
    pub(crate) fn challenge(&self) -> Option<[u8; CHALLENGE_LEN]> {
        #[cfg(feature = "test-hooks")]
        if self.fixed_challenge.is_some() {
            return self.fixed_challenge;
        }
        new_challenge()
    }
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            auth_timeout: Duration::from_secs(10),
            revocation_poll: Duration::from_secs(1),
            ping_interval: Duration::from_secs(10),
            dead_after: Duration::from_secs(30),
            write_stall: Duration::from_secs(30),
            drain_grace: Duration::from_secs(2),
            purge_interval: Duration::from_secs(60),
            supersede_wait: Duration::from_secs(5),
            close_linger: Duration::from_secs(2),
            answer_deadline: Duration::from_secs(8),
            fanout_deadline: Duration::from_secs(45),
            #[cfg(feature = "test-hooks")]
            fixed_challenge: None,
        }
    }
}

/// `--presence-visibility` (`docs/protocol.md#presence-visibility`): whose presence an account
/// may see.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PresenceVisibility {
    // Plain comments: doc comments would list the values apart in `--help`.
    // Any account sees any identifier's presence (the published contract).
    #[default]
    Everyone,
    // Only accounts that exchanged a message through this relay, or share a group.
    Contacts,
}

#[derive(Clone)]
pub struct RelayConfig {
    /// `127.0.0.1:0` binds an ephemeral port; `RelayHandle::port` tells which.
    pub listen: SocketAddr,
    pub storage: Storage,
    /// HS256 key shared with whoever issues tokens, at least [`MIN_SECRET_BYTES`] long.
    pub jwt_secret: Vec<u8>,
    pub auth: AuthPolicy,
    /// `None` runs without a mailbox (`--no-mailbox`): nothing journaled, offline recipients
    /// are unreachable.
    pub mailbox: Option<MailboxLimits>,
    pub rate_limit: RateLimit,
    pub addresses: AddressLimits,
    pub tls: Option<TlsConfig>,
    /// Who may see an account's presence (`--presence-visibility`,
    /// `docs/protocol.md#presence-visibility`).
    pub presence_visibility: PresenceVisibility,
    /// Offer the key-package directory (`key_directory_v1`); `false` with `--no-key-directory`:
    /// clients then set sessions up by the round trip through the peer.
    pub key_directory: bool,
    /// Connections served at once, authenticated or not; beyond it new ones are closed at
    /// accept. Each holds a file descriptor, so `ulimit -n` must leave room for it.
    pub max_connections: usize,
    /// Members a group may have, its creator included (`group_full` beyond it). At most
    /// [`MAX_GROUP_MEMBERS_CEILING`], so that a report naming every member fits in one frame.
    pub max_group_members: u32,
    /// Where to serve `/healthz`, `/readyz` and `/metrics` over plain HTTP
    /// (`docs/operating-the-relay.md#metrics`); `None` opens no port. `127.0.0.1:0` binds an
    /// ephemeral one, `RelayHandle::metrics_addr` tells which.
    pub metrics_listen: Option<SocketAddr>,
    #[doc(hidden)]
    pub timings: Timings,
}

impl std::fmt::Debug for RelayConfig {
    // The secret must never end up in a log line. Destructured, so a new field cannot be
    // forgotten here.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            listen,
            storage,
            jwt_secret,
            auth,
            mailbox,
            addresses,
            rate_limit,
            tls,
            presence_visibility,
            key_directory,
            max_connections,
            max_group_members,
            metrics_listen,
            timings,
        } = self;
        f.debug_struct("RelayConfig")
            .field("listen", listen)
            .field("storage", storage)
            .field(
                "jwt_secret",
                &format_args!("<redacted, {} bytes>", jwt_secret.len()),
            )
            .field("auth", auth)
            .field("mailbox", mailbox)
            .field("addresses", addresses)
            .field("rate_limit", rate_limit)
            .field("tls", tls)
            .field("presence_visibility", presence_visibility)
            .field("key_directory", key_directory)
            .field("max_connections", max_connections)
            .field("max_group_members", max_group_members)
            .field("metrics_listen", metrics_listen)
            .field("timings", timings)
            .finish()
    }
}

impl RelayConfig {
    /// Mailbox on with default limits, default rate limit, plain `ws://`.
    pub fn new(listen: SocketAddr, storage: Storage, jwt_secret: Vec<u8>) -> Self {
        Self {
            listen,
            storage,
            jwt_secret,
            auth: AuthPolicy::default(),
            mailbox: Some(MailboxLimits::default()),
            rate_limit: RateLimit::default(),
            addresses: AddressLimits::default(),
            tls: None,
            presence_visibility: PresenceVisibility::default(),
            key_directory: true,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_group_members: DEFAULT_MAX_GROUP_MEMBERS,
            metrics_listen: None,
            timings: Timings::default(),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), RelayError> {
        let fail = |msg: &str| Err(RelayError::Config(msg.to_owned()));
        if self.jwt_secret.len() < MIN_SECRET_BYTES {
            return Err(RelayError::Config(format!(
                "jwt_secret must be at least {MIN_SECRET_BYTES} bytes"
            )));
        }
        if self.auth.max_token_lifetime.as_secs() == 0 {
            return fail("max_token_lifetime must be at least 1 s");
        }
        let limits = [
            self.auth.attempts_per_source,
            self.auth.attempts_per_account,
            self.auth.supersedes_per_account,
        ];
        if limits.iter().any(|l| l.burst == 0 || l.per_minute == 0) {
            return fail("authentication limits must be at least 1");
        }
        if self.auth.max_unauthenticated_per_source == 0 {
            return fail("max_unauthenticated_per_source must be at least 1");
        }
        if self.max_connections == 0 {
            return fail("max_connections must be at least 1");
        }
        // A frame crosses nodes only through the journal (`docs/cluster.md#live-delivery`).
        if matches!(self.storage, Storage::Cluster(_)) && self.mailbox.is_none() {
            return fail(
                "a cluster node keeps a mailbox: --no-mailbox needs the single-file relay",
            );
        }
        if self.max_group_members == 0 || self.max_group_members > MAX_GROUP_MEMBERS_CEILING {
            return Err(RelayError::Config(format!(
                "max_group_members must be between 1 and {MAX_GROUP_MEMBERS_CEILING}"
            )));
        }
        if self.rate_limit.burst == 0 || self.rate_limit.per_sec == 0 {
            return fail("rate_limit.burst and rate_limit.per_sec must be at least 1");
        }
        if self.addresses.max_per_account == 0 || self.addresses.ttl_ms == 0 {
            return fail("address limits must be at least 1");
        }
        if self.addresses.ttl_ms > i64::MAX as u64 {
            return fail("the address binding lifetime must fit in a signed 64-bit integer");
        }
        if let Some(m) = &self.mailbox {
            if m.max_messages == 0 || m.max_bytes == 0 || m.ttl_ms == 0 || m.max_journal_bytes == 0
            {
                return fail("mailbox limits must be at least 1");
            }
            if m.sender_share_percent == 0 || m.sender_share_percent > 100 {
                return fail("the sender share must be between 1 and 100 percent");
            }
            // The journal stores counts and times as SQLite integers (i64).
            if m.max_messages > i64::MAX as u64
                || m.max_bytes > i64::MAX as u64
                || m.ttl_ms > i64::MAX as u64
                || m.max_journal_bytes > i64::MAX as u64
            {
                return fail("mailbox limits must fit in a signed 64-bit integer");
            }
        }
        Ok(())
    }
}
