//! The relay's settings: one field each, named alike as a flag (`--mailbox-ttl-ms`), an
//! environment variable (`COURIER_RELAY_MAILBOX_TTL_MS`) and a config-file key
//! (`mailbox-ttl-ms`), and how they make a [`RelayConfig`].

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};

use clap::builder::BoolishValueParser;

use super::{positive, read_file, socket_addr, UsageError};
use crate::logging::{LogFormat, LogLevel, Logging};
use crate::{MailboxLimits, RelayConfig, Storage, TlsConfig};

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

    /// File holding the HS256 token secret (trailing newline ignored)
    #[arg(long, env = "COURIER_RELAY_JWT_SECRET_FILE", value_name = "FILE")]
    jwt_secret_file: Option<PathBuf>,

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
            jwt_secret_file: self.jwt_secret_file.or(file.jwt_secret_file),
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
        let storage = match (self.db, self.memory) {
            (Some(_), true) => return Err(UsageError::new("--db and --memory exclude each other")),
            (Some(path), false) => Storage::Path(path),
            (None, true) => Storage::Memory,
            (None, false) => {
                return Err(UsageError::new("one of --db PATH or --memory is required"))
            }
        };
        let secret_file = self
            .jwt_secret_file
            .ok_or_else(|| UsageError::new("--jwt-secret-file FILE is required"))?;
        let secret = read_secret(&secret_file)?;

        let mut config = RelayConfig::new(listen, storage, secret);
        config.key_directory = !self.no_key_directory;
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

fn read_secret(path: &Path) -> Result<Vec<u8>, UsageError> {
    let secret = read_file("--jwt-secret-file", path)?;
    let secret = secret.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(UsageError::new(format!(
            "the secret in {} is empty",
            path.display()
        )));
    }
    Ok(secret.as_bytes().to_vec())
}
