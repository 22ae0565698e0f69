//! `Relay.start`, `issueToken` and the `courier-relay` command line, over `courier-relay`.

use courier_relay::cli::{self, Command, Parsed};
use courier_relay::logging::LoggingError;
use courier_relay::{RelayConfig, RelayHandle};
use napi_derive::napi;

use crate::error::{coded, config_error, Code, Result, Settled};
use crate::options::relay_config;
use crate::running::Running;

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
    metrics_address: Option<String>,
}

async fn start_relay(config: RelayConfig) -> Result<NativeRelay> {
    let handle = courier_relay::start(config)
        .await
        .map_err(|e| coded(Code::RELAY, e))?;
    Ok(NativeRelay {
        url: handle.url(),
        port: handle.port(),
        metrics_address: handle.metrics_addr().map(|addr| addr.to_string()),
        handle: Running::new(handle),
    })
}

#[napi]
impl NativeRelay {
    /// `options`: `RelayOptions` as JSON text, validated here.
    #[napi(ts_return_type = "Promise<NativeRelay>")]
    pub async fn start(options: String) -> Settled<NativeRelay> {
        match relay_config(&options).map_err(config_error) {
            Ok(config) => start_relay(config).await,
            Err(e) => Err(e),
        }
        .into()
    }

    /// Starts a relay from `courier-relay` command-line arguments (and the environment and
    /// config file they read). The log options are not applied here: see `relayCliInit`.
    #[napi(ts_return_type = "Promise<NativeRelay>")]
    pub async fn start_from_args(args: Vec<String>) -> Settled<NativeRelay> {
        match cli::parse_relay(&args).map_err(|e| coded(Code::CONFIG, e)) {
            Ok(Parsed::Run(launch)) => start_relay(launch.config).await,
            Ok(Parsed::Print(_)) => Err(coded(
                Code::CONFIG,
                "--help and --version have no relay to start",
            )),
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

    /// `host:port` of `/healthz`, `/readyz` and `/metrics`, when the relay serves them.
    #[napi(getter)]
    pub fn metrics_address(&self) -> Option<String> {
        self.metrics_address.clone()
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
    cli::relay_help()
}

/// For `npx courier-relay` only, once, before it starts anything: reads the whole command line
/// (`gateway` and its options included) and returns what `--help` or `--version` print, or
/// else installs the log subscriber its options choose (stderr, level, format) and returns
/// null. A program that merely loads the package never calls this, so it keeps its own logging.
#[napi]
pub fn relay_cli_init(args: Vec<String>) -> Result<Option<String>> {
    let logging = match cli::parse_command(&args).map_err(|e| coded(Code::CONFIG, e))? {
        Command::Relay(Parsed::Print(text)) | Command::Gateway(Parsed::Print(text)) => {
            return Ok(Some(text))
        }
        Command::Relay(Parsed::Run(launch)) => launch.logging,
        Command::Gateway(Parsed::Run(launch)) => launch.logging,
    };
    logging.install().map_err(|e| match e {
        LoggingError::InvalidRustLog(_) => coded(Code::CONFIG, e),
        LoggingError::AlreadyInstalled => coded(Code::INTERNAL, e),
    })?;
    Ok(None)
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
