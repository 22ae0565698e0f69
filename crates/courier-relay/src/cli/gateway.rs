//! The gateway daemon's settings (`courier-relay gateway`), named alike as flags, environment
//! variables (`COURIER_RELAY_GATEWAY_*`, the log ones shared with the relay) and config-file keys.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;

use super::{positive, read_file, socket_addr, UsageError};
use crate::gateway::{GatewayAccess, GatewayToken, DEFAULT_LISTEN};
use crate::logging::{LogFormat, LogLevel, Logging};
use crate::GatewayConfig;

/// The fields it shares with the relay's settings are written out again: serde cannot refuse
/// unknown keys of a struct that flattens another.
#[derive(Debug, Default, clap::Args, serde::Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct GatewaySettings {
    /// Address devices connect to; beyond loopback only with a token or
    /// --allow-public-without-token [default: 127.0.0.1:4242]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_LISTEN", value_name = "ADDR", value_parser = socket_addr)]
    listen: Option<SocketAddr>,

    /// File holding the token every device must present to attach (surrounding whitespace
    /// ignored, at least 16 bytes) [default: none]
    #[arg(
        long,
        env = "COURIER_RELAY_GATEWAY_REQUIRE_TOKEN_FILE",
        value_name = "FILE",
        help_heading = "Access"
    )]
    require_token_file: Option<PathBuf>,

    /// Listen beyond loopback with no token: anyone who can reach the port may attach
    #[arg(long, env = "COURIER_RELAY_GATEWAY_ALLOW_PUBLIC_WITHOUT_TOKEN", value_parser = BoolishValueParser::new(), help_heading = "Access")]
    allow_public_without_token: bool,

    /// Connections served at once; more are refused at accept [default: 16384]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_MAX_CONNECTIONS", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    max_connections: Option<NonZeroU32>,

    /// Connections from one IPv4 address or IPv6 /64 served at once; more are refused at
    /// accept [default: 64]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_MAX_CONNECTIONS_PER_SOURCE", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    max_connections_per_source: Option<NonZeroU32>,

    /// Bytes queued for one attached device; a send beyond it is answered unreachable, at
    /// least 1048576 [default: 8388608]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_MAX_QUEUE_BYTES", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Limits")]
    max_queue_bytes: Option<NonZeroU64>,

    /// Bytes queued for every attached device together; a send beyond it is answered
    /// unreachable, at least 1048576 [default: 536870912]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_MAX_TOTAL_QUEUE_BYTES", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Limits")]
    max_total_queue_bytes: Option<NonZeroU64>,

    /// Seconds an attached device may send no line before it is closed [default: 90]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_IDLE_TIMEOUT_SECS", value_name = "N", value_parser = positive::<NonZeroU64>, help_heading = "Limits")]
    idle_timeout_secs: Option<NonZeroU64>,

    /// SendMessage token bucket capacity per device [default: 200]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_RATE_BURST", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    rate_burst: Option<NonZeroU32>,

    /// SendMessage token bucket refill per second [default: 100]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_RATE_PER_SEC", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    rate_per_sec: Option<NonZeroU32>,

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

impl GatewaySettings {
    /// These settings (the command line and environment) over `file`'s. `given` tells whether
    /// a switch was set here, as `false` is also its unset value.
    pub(super) fn over(self, file: Self, given: impl Fn(&str) -> bool) -> Self {
        Self {
            listen: self.listen.or(file.listen),
            require_token_file: self.require_token_file.or(file.require_token_file),
            allow_public_without_token: if given("allow_public_without_token") {
                self.allow_public_without_token
            } else {
                file.allow_public_without_token
            },
            max_connections: self.max_connections.or(file.max_connections),
            max_connections_per_source: self
                .max_connections_per_source
                .or(file.max_connections_per_source),
            max_queue_bytes: self.max_queue_bytes.or(file.max_queue_bytes),
            max_total_queue_bytes: self.max_total_queue_bytes.or(file.max_total_queue_bytes),
            idle_timeout_secs: self.idle_timeout_secs.or(file.idle_timeout_secs),
            rate_burst: self.rate_burst.or(file.rate_burst),
            rate_per_sec: self.rate_per_sec.or(file.rate_per_sec),
            log_level: self.log_level.or(file.log_level),
            log_format: self.log_format.or(file.log_format),
        }
    }

    /// Reads the token file, and refuses what the gateway would refuse to start with.
    pub(super) fn into_config(self) -> Result<(GatewayConfig, Logging), UsageError> {
        let mut config = GatewayConfig::new(self.listen.unwrap_or(DEFAULT_LISTEN));
        config.access = match (self.require_token_file, self.allow_public_without_token) {
            (Some(_), true) => {
                return Err(UsageError::new(
                    "--require-token-file and --allow-public-without-token exclude each other",
                ))
            }
            (Some(path), false) => {
                let token = read_file("--require-token-file", &path)?;
                GatewayAccess::Token(GatewayToken::new(&token).map_err(|e| {
                    UsageError::new(format!(
                        "--require-token-file {}: the token {e}",
                        path.display()
                    ))
                })?)
            }
            (None, true) => GatewayAccess::Public,
            (None, false) => GatewayAccess::Loopback,
        };
        if let Some(max) = self.max_connections {
            config.max_connections = max.get() as usize;
        }
        if let Some(max) = self.max_connections_per_source {
            config.max_connections_per_source = max.get() as usize;
        }
        if let Some(max) = self.max_queue_bytes {
            config.max_queue_bytes = usize::try_from(max.get()).unwrap_or(usize::MAX);
        }
        if let Some(max) = self.max_total_queue_bytes {
            config.max_total_queue_bytes = usize::try_from(max.get()).unwrap_or(usize::MAX);
        }
        if let Some(secs) = self.idle_timeout_secs {
            config.idle_timeout = Duration::from_secs(secs.get());
        }
        if let Some(burst) = self.rate_burst {
            config.send_rate.burst = burst.get();
        }
        if let Some(per_sec) = self.rate_per_sec {
            config.send_rate.per_sec = per_sec.get();
        }
        config.check().map_err(UsageError::new)?;
        let logging = Logging {
            level: self.log_level,
            format: self.log_format.unwrap_or_default(),
        };
        Ok((config, logging))
    }
}
