//! `Relay.start`, `issueToken` and the `courier-relay` command line, over `courier-relay`.

use std::path::PathBuf;

use courier_relay::{cli, MailboxLimits, RateLimit, RelayConfig, RelayHandle, Storage, TlsConfig};
use napi_derive::napi;

use crate::error::{coded, Code, Result, Settled};
use crate::running::Running;

#[napi(object)]
pub struct NativeRelayMailbox {
    pub max_messages: Option<i64>,
    pub max_bytes: Option<i64>,
    pub ttl_ms: Option<i64>,
}

#[napi(object)]
pub struct NativeRelayOptions {
    pub listen: String,
    pub storage_path: Option<String>,
    pub jwt_secret: String,
    /// `false` disables store-and-forward; absent or an object enables it.
    pub mailbox_enabled: bool,
    pub mailbox: Option<NativeRelayMailbox>,
    pub rate_burst: Option<u32>,
    pub rate_per_sec: Option<u32>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
}

/// `stats()` of a relay: `RelayStats` in `js/index.d.ts`. Counts cross as JS numbers, exact up
/// to 2^53.
#[napi(object)]
pub struct NativeRelayStats {
    /// Authenticated connections (at most one per account).
    pub connections: f64,
    /// Accounts that ever authenticated.
    pub accounts: f64,
    /// Stored frames not yet acknowledged or expired.
    pub stored_frames: f64,
    /// Presence watches held for connected clients.
    pub watches: f64,
}

#[napi]
pub struct NativeRelay {
    handle: Running<RelayHandle>,
    url: String,
    port: u16,
}

fn non_negative(name: &str, v: Option<i64>, default: u64) -> Result<u64> {
    match v {
        None => Ok(default),
        Some(v) if v >= 1 => Ok(v as u64),
        Some(_) => Err(coded(
            Code::CONFIG,
            format!("mailbox.{name} must be a positive integer"),
        )),
    }
}

fn relay_config(o: NativeRelayOptions) -> Result<RelayConfig> {
    let listen = o.listen.parse().map_err(|_| {
        coded(
            Code::CONFIG,
            format!(
                "listen must be an address like 127.0.0.1:0, got {:?}",
                o.listen
            ),
        )
    })?;
    let storage = match o.storage_path {
        Some(path) => Storage::Path(PathBuf::from(path)),
        None => Storage::Memory,
    };
    if o.jwt_secret.is_empty() {
        return Err(coded(Code::CONFIG, "jwtSecret must not be empty"));
    }
    let mut config = RelayConfig::new(listen, storage, o.jwt_secret.into_bytes());
    config.mailbox = if o.mailbox_enabled {
        let d = MailboxLimits::default();
        let m = o.mailbox.unwrap_or(NativeRelayMailbox {
            max_messages: None,
            max_bytes: None,
            ttl_ms: None,
        });
        Some(MailboxLimits {
            max_messages: non_negative("maxMessages", m.max_messages, d.max_messages)?,
            max_bytes: non_negative("maxBytes", m.max_bytes, d.max_bytes)?,
            ttl_ms: non_negative("ttlMs", m.ttl_ms, d.ttl_ms)?,
        })
    } else {
        None
    };
    let default_rate = RateLimit::default();
    config.rate_limit = RateLimit {
        burst: o.rate_burst.unwrap_or(default_rate.burst),
        per_sec: o.rate_per_sec.unwrap_or(default_rate.per_sec),
    };
    config.tls = match (o.tls_cert, o.tls_key) {
        (Some(cert_pem), Some(key_pem)) => Some(TlsConfig { cert_pem, key_pem }),
        (None, None) => None,
        _ => return Err(coded(Code::CONFIG, "tls needs both cert and key")),
    };
    Ok(config)
}

async fn start_relay(config: RelayConfig) -> Result<NativeRelay> {
    let handle = courier_relay::start(config)
        .await
        .map_err(|e| coded(Code::RELAY, e))?;
    Ok(NativeRelay {
        url: handle.url(),
        port: handle.port(),
        handle: Running::new(handle),
    })
}

#[napi]
impl NativeRelay {
    #[napi(ts_return_type = "Promise<NativeRelay>")]
    pub async fn start(options: NativeRelayOptions) -> Settled<NativeRelay> {
        match relay_config(options) {
            Ok(config) => start_relay(config).await,
            Err(e) => Err(e),
        }
        .into()
    }

    /// Starts a relay from `courier-relay` command-line arguments.
    #[napi(ts_return_type = "Promise<NativeRelay>")]
    pub async fn start_from_args(args: Vec<String>) -> Settled<NativeRelay> {
        let config = cli::parse(&args).map_err(|e| coded(Code::CONFIG, e));
        match config {
            Ok(cli::CliCommand::Run(config)) => start_relay(config).await,
            Ok(cli::CliCommand::Help) => Err(coded(Code::CONFIG, "--help has no relay to start")),
            Err(e) => Err(e),
        }
        .into()
    }

    #[napi(getter)]
    pub fn url(&self) -> String {
        self.url.clone()
    }

    #[napi(getter)]
    pub fn port(&self) -> u32 {
        u32::from(self.port)
    }

    #[napi]
    pub fn stats(&self) -> Result<NativeRelayStats> {
        let s = self
            .handle
            .with("the relay is stopped", RelayHandle::stats)?;
        Ok(NativeRelayStats {
            connections: s.connections as f64,
            accounts: s.accounts as f64,
            stored_frames: s.stored_frames as f64,
            watches: s.watches as f64,
        })
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub async fn stop(&self) -> Settled<()> {
        self.handle.stop(RelayHandle::stop).await
    }
}

#[napi]
pub fn relay_cli_help() -> String {
    cli::HELP.to_owned()
}

/// An HS256 JWT for `account`, valid for `expiresInSec` (default one day).
#[napi]
pub fn issue_token(secret: String, account: String, expires_in_sec: Option<u32>) -> Result<String> {
    courier_relay::issue_token(
        secret.as_bytes(),
        &account,
        u64::from(expires_in_sec.unwrap_or(86_400)),
    )
    .map_err(|e| coded(Code::INVALID_ARGUMENT, e))
}
