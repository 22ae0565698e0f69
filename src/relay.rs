//! `Relay.start`, `issueToken` and the `courier-relay` command line, over `courier-relay`.

use courier_relay::{cli, RelayConfig, RelayHandle};
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
    /// `options`: `RelayOptions` as JSON text, validated here.
    #[napi(ts_return_type = "Promise<NativeRelay>")]
    pub async fn start(options: String) -> Settled<NativeRelay> {
        match relay_config(&options).map_err(config_error) {
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
