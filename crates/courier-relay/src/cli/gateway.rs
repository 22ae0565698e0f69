//! The gateway daemon's settings (`courier-relay gateway`), named alike as flags, environment
//! variables (`COURIER_RELAY_GATEWAY_*`, the log ones shared with the relay) and config-file keys.

use std::net::SocketAddr;
use std::num::NonZeroU32;

use super::{positive, socket_addr};
use crate::gateway::DEFAULT_LISTEN;
use crate::logging::{LogFormat, LogLevel, Logging};
use crate::GatewayConfig;

/// The fields it shares with the relay's settings are written out again: serde cannot refuse
/// unknown keys of a struct that flattens another.
#[derive(Debug, Default, clap::Args, serde::Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct GatewaySettings {
    /// Address devices connect to [default: 127.0.0.1:4242]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_LISTEN", value_name = "ADDR", value_parser = socket_addr)]
    listen: Option<SocketAddr>,

    /// Connections served at once; more are refused at accept [default: 16384]
    #[arg(long, env = "COURIER_RELAY_GATEWAY_MAX_CONNECTIONS", value_name = "N", value_parser = positive::<NonZeroU32>, help_heading = "Limits")]
    max_connections: Option<NonZeroU32>,

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
    /// These settings (the command line and environment) over `file`'s.
    pub(super) fn over(self, file: Self) -> Self {
        Self {
            listen: self.listen.or(file.listen),
            max_connections: self.max_connections.or(file.max_connections),
            log_level: self.log_level.or(file.log_level),
            log_format: self.log_format.or(file.log_format),
        }
    }

    pub(super) fn into_config(self) -> (GatewayConfig, Logging) {
        let mut config = GatewayConfig::new(self.listen.unwrap_or(DEFAULT_LISTEN));
        if let Some(max) = self.max_connections {
            config.max_connections = max.get() as usize;
        }
        let logging = Logging {
            level: self.log_level,
            format: self.log_format.unwrap_or_default(),
        };
        (config, logging)
    }
}
