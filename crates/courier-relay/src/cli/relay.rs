//! The relay's settings: one field each, named alike as a flag (`--mailbox-ttl-ms`), an
//! environment variable (`COURIER_RELAY_MAILBOX_TTL_MS`) and a config-file key
//! (`mailbox-ttl-ms`), and how they make a [`RelayConfig`].

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use clap::builder::BoolishValueParser;

use super::{positive, read_file, socket_addr, UsageError};
use crate::logging::{LogFormat, LogLevel, Logging};
use crate::{
    AttemptLimit, ClusterStorage, MailboxLimits, PresenceVisibility, RelayConfig, Storage,
    TlsConfig, MIN_SECRET_BYTES,
};

/// How the secret file spells the secret.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum SecretEncoding {
    // Plain comments: doc comments would list the values apart in `--help`, which `-h` must
    // match. Raw: the file's bytes are the secret; base64 is the standard alphabet, padded or
    // not.
    #[default]
    Raw,
    Hex,
    Base64,
}

/// Flags and environment variables come to clap; the config file to serde, which refuses any
/// key not named here. Unset is `None` (or `false`) on both, so the layers can be merged.
#[derive(Debug, Default, clap::Args, serde::Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RelaySettings {
    /// Address clients connect to [default: 127.0.0.1:8080]
    #[arg(long, env = "COURIER_RELAY_LISTEN", value_name = "ADDR", value_parser = socket_addr)]
    listen: Option<SocketAddr>,

    /// SQLite database file (created if missing, WAL mode)
    #[arg(
        long,
        env = "COURIER_RELAY_DB",
        value_name = "PATH",
        help_heading = "Storage"
    )]
    db: Option<PathBuf>,

    /// Keep everything in memory; nothing survives a restart
    #[arg(long, env = "COURIER_RELAY_MEMORY", value_parser = BoolishValueParser::new(), help_heading = "Storage")]
    memory: bool,

    /// Run as a node of a cluster: the deployment's NATS servers, comma-separated
    /// (nats://host:port); every durable fact lives in their JetStream (docs/cluster.md)
    #[arg(
        long,
        env = "COURIER_RELAY_CLUSTER",
        value_name = "URLS",
        value_delimiter = ',',
        help_heading = "Storage"
    )]
    cluster: Option<Vec<String>>,

    /// The deployment's name in NATS: its stream, subjects and buckets [default: courier]
    #[arg(
        long,
        env = "COURIER_RELAY_CLUSTER_NAME",
        value_name = "NAME",
        help_heading = "Storage"
    )]
    cluster_name: Option<String>,

    /// Copies JetStream keeps of the journal and every bucket, 1 to 5 [default: 3]
    #[arg(
        long,
        env = "COURIER_RELAY_CLUSTER_REPLICAS",
        value_name = "N",
        help_heading = "Storage"
    )]
    cluster_replicas: Option<usize>,

    /// How long a node's connections stay present after its last heartbeat: a node that dies
    /// takes its accounts offline within it [default: 15000]
    #[arg(
        long,
        env = "COURIER_RELAY_CLUSTER_PRESENCE_TTL_MS",
        value_name = "MS",
        help_heading = "Storage"
    )]
    cluster_presence_ttl_ms: Option<u64>,

    /// File holding the HS256 token secret, at least 32 bytes (trailing newline ignored)
    #[arg(long, env = "COURIER_RELAY_JWT_SECRET_FILE", value_name = "FILE")]
    jwt_secret_file: Option<PathBuf>,

    /// How the secret file spells the secret [default: raw]
    #[arg(
        long,
        env = "COURIER_RELAY_JWT_SECRET_ENCODING",
        value_name = "ENCODING"
    )]
    jwt_secret_encoding: Option<SecretEncoding>,

    /// Longest token lifetime (exp − iat) accepted, in seconds [default: 86400]
    #[arg(long, env = "COURIER_RELAY_MAX_TOKEN_LIFETIME_SEC", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Authentication")]
    max_token_lifetime_sec: Option<NonZeroU64>,

    /// Require tokens to carry this `aud` [default: aud not checked]
    #[arg(
        long,
        env = "COURIER_RELAY_TOKEN_AUDIENCE",
        value_name = "AUD",
        help_heading = "Authentication"
    )]
    token_audience: Option<String>,

    /// Require tokens to carry this `iss` [default: iss not checked]
    #[arg(
        long,
        env = "COURIER_RELAY_TOKEN_ISSUER",
        value_name = "ISS",
        help_heading = "Authentication"
    )]
    token_issuer: Option<String>,

    /// Deny list of `account not-before` lines, re-read when it changes [default: none]
    #[arg(
        long,
        env = "COURIER_RELAY_REVOKED_TOKENS",
        value_name = "FILE",
        help_heading = "Authentication"
    )]
    revoked_tokens: Option<PathBuf>,

    /// Authenticate frames per source address: N at once, N more a minute [default: 60]
    #[arg(long, env = "COURIER_RELAY_AUTH_ATTEMPTS_PER_SOURCE", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Authentication")]
    auth_attempts_per_source: Option<NonZeroU32>,

    /// Authentications per account: N at once, N more a minute [default: 20]
    #[arg(long, env = "COURIER_RELAY_AUTH_ATTEMPTS_PER_ACCOUNT", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Authentication")]
    auth_attempts_per_account: Option<NonZeroU32>,

    /// Logins displacing a live connection, per account: N at once, N more a minute [default: 5]
    #[arg(long, env = "COURIER_RELAY_DISPLACEMENTS_PER_ACCOUNT", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Authentication")]
    displacements_per_account: Option<NonZeroU32>,

    /// Connections per source address not yet authenticated [default: 64]
    #[arg(long, env = "COURIER_RELAY_MAX_UNAUTHENTICATED_PER_SOURCE", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Authentication")]
    max_unauthenticated_per_source: Option<NonZeroU32>,

    /// Apply the per-source limits to loopback clients too (off: a local proxy's clients all share loopback)
    #[arg(long, env = "COURIER_RELAY_LIMIT_LOOPBACK", value_parser = BoolishValueParser::new(), help_heading = "Authentication")]
    limit_loopback: bool,

    /// No store-and-forward: offline recipients are unreachable
    #[arg(long, env = "COURIER_RELAY_NO_MAILBOX", value_parser = BoolishValueParser::new(), help_heading = "Mailbox")]
    no_mailbox: bool,

    /// Unacked frames kept per account [default: 10000]
    #[arg(long, env = "COURIER_RELAY_MAILBOX_MAX_MESSAGES", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Mailbox")]
    mailbox_max_messages: Option<NonZeroU64>,

    /// Stored bytes (whole journal rows) kept per account [default: 67108864]
    #[arg(long, env = "COURIER_RELAY_MAILBOX_MAX_BYTES", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Mailbox")]
    mailbox_max_bytes: Option<NonZeroU64>,

    /// Percent of a mailbox's frames and bytes one sender may hold, 1-100 [default: 10]
    #[arg(long, env = "COURIER_RELAY_MAILBOX_SENDER_SHARE_PERCENT", value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100), help_heading = "Mailbox")]
    mailbox_sender_share_percent: Option<u8>,

    /// Stored bytes of the whole journal, every mailbox together [default: 8589934592]
    #[arg(long, env = "COURIER_RELAY_JOURNAL_MAX_BYTES", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Mailbox")]
    journal_max_bytes: Option<NonZeroU64>,

    /// Age at which undelivered frames are deleted [default: 604800000]
    #[arg(long, env = "COURIER_RELAY_MAILBOX_TTL_MS", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Mailbox")]
    mailbox_ttl_ms: Option<NonZeroU64>,

    /// Address bindings one account keeps; a new one drops the least recently declared [default: 16]
    #[arg(long, env = "COURIER_RELAY_ADDRESS_MAX_PER_ACCOUNT", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    address_max_per_account: Option<NonZeroU32>,

    /// Age at which a binding not declared again is deleted [default: 7776000000 (90 days)]
    #[arg(long, env = "COURIER_RELAY_ADDRESS_TTL_MS", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Limits")]
    address_ttl_ms: Option<NonZeroU64>,

    /// Whose presence an account may see: everyone, or only contacts (a message exchanged or a
    /// group shared) [default: everyone]
    #[arg(long, env = "COURIER_RELAY_PRESENCE_VISIBILITY", value_name = "WHO")]
    presence_visibility: Option<PresenceVisibility>,

    /// No key-package directory: sessions are set up through the peer
    #[arg(long, env = "COURIER_RELAY_NO_KEY_DIRECTORY", value_parser = BoolishValueParser::new())]
    no_key_directory: bool,

    /// Token bucket capacity per account [default: 2000]
    #[arg(long, env = "COURIER_RELAY_RATE_BURST", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    rate_burst: Option<NonZeroU32>,

    /// Token bucket refill per second [default: 1000]
    #[arg(long, env = "COURIER_RELAY_RATE_PER_SEC", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    rate_per_sec: Option<NonZeroU32>,

    /// Connections served at once; more are refused at accept [default: 16384]
    #[arg(long, env = "COURIER_RELAY_MAX_CONNECTIONS", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    max_connections: Option<NonZeroU32>,

    /// PEM certificate chain; serves wss:// (needs --tls-key)
    #[arg(
        long,
        env = "COURIER_RELAY_TLS_CERT",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    tls_cert: Option<PathBuf>,

    /// PEM private key (needs --tls-cert)
    #[arg(
        long,
        env = "COURIER_RELAY_TLS_KEY",
        value_name = "FILE",
        help_heading = "TLS"
    )]
    tls_key: Option<PathBuf>,

    /// Serve /healthz, /readyz and /metrics over HTTP on this address [default: off]
    #[arg(long, env = "COURIER_RELAY_METRICS_LISTEN", value_name = "ADDR", value_parser = socket_addr, help_heading = "Operations")]
    metrics_listen: Option<SocketAddr>,

    /// Least severe events logged [default: RUST_LOG, else info]
    #[arg(
        long,
        env = "COURIER_RELAY_LOG_LEVEL",
        value_name = "LEVEL",
        help_heading = "Operations"
    )]
    log_level: Option<LogLevel>,

    /// How log lines are written to stderr [default: text]
    #[arg(
        long,
        env = "COURIER_RELAY_LOG_FORMAT",
        value_name = "FORMAT",
        help_heading = "Operations"
    )]
    log_format: Option<LogFormat>,
}

impl RelaySettings {
    /// These settings (the command line and environment) over `file`'s: each one set here
    /// wins. `given` tells whether a switch was set here, as `false` is also its unset value.
    pub(super) fn over(self, file: Self, given: impl Fn(&str) -> bool) -> Self {
        let switch = |id: &str, here: bool, there: bool| if given(id) { here } else { there };
        Self {
            listen: self.listen.or(file.listen),
            db: self.db.or(file.db),
            memory: switch("memory", self.memory, file.memory),
            cluster: self.cluster.or(file.cluster),
            cluster_name: self.cluster_name.or(file.cluster_name),
            cluster_replicas: self.cluster_replicas.or(file.cluster_replicas),
            cluster_presence_ttl_ms: self
                .cluster_presence_ttl_ms
                .or(file.cluster_presence_ttl_ms),
            jwt_secret_file: self.jwt_secret_file.or(file.jwt_secret_file),
            jwt_secret_encoding: self.jwt_secret_encoding.or(file.jwt_secret_encoding),
            max_token_lifetime_sec: self.max_token_lifetime_sec.or(file.max_token_lifetime_sec),
            token_audience: self.token_audience.or(file.token_audience),
            token_issuer: self.token_issuer.or(file.token_issuer),
            revoked_tokens: self.revoked_tokens.or(file.revoked_tokens),
            auth_attempts_per_source: self
                .auth_attempts_per_source
                .or(file.auth_attempts_per_source),
            auth_attempts_per_account: self
                .auth_attempts_per_account
                .or(file.auth_attempts_per_account),
            displacements_per_account: self
                .displacements_per_account
                .or(file.displacements_per_account),
            max_unauthenticated_per_source: self
                .max_unauthenticated_per_source
                .or(file.max_unauthenticated_per_source),
            limit_loopback: switch("limit_loopback", self.limit_loopback, file.limit_loopback),
            no_mailbox: switch("no_mailbox", self.no_mailbox, file.no_mailbox),
            mailbox_max_messages: self.mailbox_max_messages.or(file.mailbox_max_messages),
            mailbox_max_bytes: self.mailbox_max_bytes.or(file.mailbox_max_bytes),
            mailbox_ttl_ms: self.mailbox_ttl_ms.or(file.mailbox_ttl_ms),
            mailbox_sender_share_percent: self
                .mailbox_sender_share_percent
                .or(file.mailbox_sender_share_percent),
            journal_max_bytes: self.journal_max_bytes.or(file.journal_max_bytes),
            address_max_per_account: self
                .address_max_per_account
                .or(file.address_max_per_account),
            address_ttl_ms: self.address_ttl_ms.or(file.address_ttl_ms),
            presence_visibility: self.presence_visibility.or(file.presence_visibility),
            no_key_directory: switch(
                "no_key_directory",
                self.no_key_directory,
                file.no_key_directory,
            ),
            rate_burst: self.rate_burst.or(file.rate_burst),
            rate_per_sec: self.rate_per_sec.or(file.rate_per_sec),
            max_connections: self.max_connections.or(file.max_connections),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            log_level: self.log_level.or(file.log_level),
            log_format: self.log_format.or(file.log_format),
        }
    }

    /// The relay these settings describe; reads the files they name (the secret, TLS PEMs).
    pub(super) fn into_config(self) -> Result<(RelayConfig, Logging), UsageError> {
        let listen = self
            .listen
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080)));
        let tuned = self.cluster_name.is_some()
            || self.cluster_replicas.is_some()
            || self.cluster_presence_ttl_ms.is_some();
        if tuned && self.cluster.is_none() {
            return Err(UsageError::new(
                "--cluster-name, --cluster-replicas and --cluster-presence-ttl-ms need --cluster",
            ));
        }
        let storage = match (self.db, self.memory, self.cluster) {
            (Some(path), false, None) => Storage::Path(path),
            (None, true, None) => Storage::Memory,
            (None, false, Some(servers)) => {
                let mut cluster = ClusterStorage::new(servers);
                if let Some(name) = self.cluster_name {
                    cluster.name = name;
                }
                if let Some(replicas) = self.cluster_replicas {
                    cluster.replicas = replicas;
                }
                if let Some(ms) = self.cluster_presence_ttl_ms {
                    cluster.presence_ttl = Duration::from_millis(ms);
                }
                Storage::Cluster(cluster)
            }
            (None, false, None) => {
                return Err(UsageError::new(
                    "one of --db PATH, --memory or --cluster URLS is required",
                ))
            }
            _ => {
                return Err(UsageError::new(
                    "--db, --memory and --cluster exclude each other",
                ))
            }
        };

        let secret_file = self
            .jwt_secret_file
            .ok_or_else(|| UsageError::new("--jwt-secret-file FILE is required"))?;
        let secret = read_secret(&secret_file, self.jwt_secret_encoding.unwrap_or_default())?;

        let mut config = RelayConfig::new(listen, storage, secret);
        let auth = &mut config.auth;
        if let Some(secs) = self.max_token_lifetime_sec {
            auth.max_token_lifetime = Duration::from_secs(secs.get());
        }
        auth.audience = self.token_audience;
        auth.issuer = self.token_issuer;
        auth.revoked_tokens = self.revoked_tokens;
        let per_minute = |n: NonZeroU32| AttemptLimit {
            burst: n.get(),
            per_minute: n.get(),
        };
        if let Some(n) = self.auth_attempts_per_source {
            auth.attempts_per_source = per_minute(n);
        }
        if let Some(n) = self.auth_attempts_per_account {
            auth.attempts_per_account = per_minute(n);
        }
        if let Some(n) = self.displacements_per_account {
            auth.supersedes_per_account = per_minute(n);
        }
        if let Some(n) = self.max_unauthenticated_per_source {
            auth.max_unauthenticated_per_source = n.get();
        }
        auth.limit_loopback = self.limit_loopback;
        config.key_directory = !self.no_key_directory;
        config.presence_visibility = self.presence_visibility.unwrap_or_default();
        if self.no_mailbox {
            let mailbox_flags = [
                ("--mailbox-max-messages", self.mailbox_max_messages),
                ("--mailbox-max-bytes", self.mailbox_max_bytes),
                ("--mailbox-ttl-ms", self.mailbox_ttl_ms),
                ("--journal-max-bytes", self.journal_max_bytes),
            ];
            let share_flag = self
                .mailbox_sender_share_percent
                .map(|_| "--mailbox-sender-share-percent");
            let flag = mailbox_flags
                .iter()
                .find(|(_, v)| v.is_some())
                .map(|(flag, _)| *flag)
                .or(share_flag);
            if let Some(flag) = flag {
                return Err(UsageError::new(format!(
                    "--no-mailbox cannot be combined with {flag}"
                )));
            }
            config.mailbox = None;
        } else {
            let defaults = MailboxLimits::default();
            config.mailbox = Some(MailboxLimits {
                max_messages: self
                    .mailbox_max_messages
                    .map_or(defaults.max_messages, NonZeroU64::get),
                max_bytes: self
                    .mailbox_max_bytes
                    .map_or(defaults.max_bytes, NonZeroU64::get),
                ttl_ms: self.mailbox_ttl_ms.map_or(defaults.ttl_ms, NonZeroU64::get),
                sender_share_percent: self
                    .mailbox_sender_share_percent
                    .unwrap_or(defaults.sender_share_percent),
                max_journal_bytes: self
                    .journal_max_bytes
                    .map_or(defaults.max_journal_bytes, NonZeroU64::get),
            });
        }
        if let Some(max) = self.address_max_per_account {
            config.addresses.max_per_account = max.get();
        }
        if let Some(ttl) = self.address_ttl_ms {
            config.addresses.ttl_ms = ttl.get();
        }
        if let Some(burst) = self.rate_burst {
            config.rate_limit.burst = burst.get();
        }
        if let Some(per_sec) = self.rate_per_sec {
            config.rate_limit.per_sec = per_sec.get();
        }
        if let Some(max) = self.max_connections {
            config.max_connections = max.get() as usize;
        }
        config.tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsConfig {
                cert_pem: read_file("--tls-cert", &cert)?,
                key_pem: read_file("--tls-key", &key)?,
            }),
            (None, None) => None,
            (Some(_), None) => return Err(UsageError::new("--tls-cert needs --tls-key")),
            (None, Some(_)) => return Err(UsageError::new("--tls-key needs --tls-cert")),
        };
        config.metrics_listen = self.metrics_listen;
        config
            .validate()
            .map_err(|e| UsageError::new(e.to_string()))?;
        let logging = Logging {
            level: self.log_level,
            format: self.log_format.unwrap_or_default(),
        };
        Ok((config, logging))
    }
}

fn read_secret(path: &Path, encoding: SecretEncoding) -> Result<Vec<u8>, UsageError> {
    let text = read_file("--jwt-secret-file", path)?;
    let text = text.trim_end_matches(['\n', '\r']);
    let undecodable = |what: &str| {
        UsageError::new(format!(
            "the secret in {} is not {what} (--jwt-secret-encoding)",
            path.display()
        ))
    };
    let secret = match encoding {
        SecretEncoding::Raw => text.as_bytes().to_vec(),
        SecretEncoding::Hex => decode_hex(text.trim()).ok_or_else(|| undecodable("hex"))?,
        SecretEncoding::Base64 => {
            let text = text.trim().trim_end_matches('=');
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(text)
                .map_err(|_| undecodable("base64"))?
        }
    };
    if secret.len() < MIN_SECRET_BYTES {
        return Err(UsageError::new(format!(
            "the secret in {} is {} bytes; at least {MIN_SECRET_BYTES} are required",
            path.display(),
            secret.len()
        )));
    }
    Ok(secret)
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
