//! The log subscriber of the `courier-relay` command (the binary and `npx courier-relay`): events
//! of the `tracing` crate, written to stderr as text or as one JSON object per line, filtered by
//! `--log-level` or else `RUST_LOG` (`docs/operating-the-relay.md#logging`). A program that embeds
//! the relay as a library installs its own subscriber instead.

use tracing_subscriber::filter::{EnvFilter, LevelFilter};

/// `--log-level`: the least severe events written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl From<LogLevel> for LevelFilter {
    fn from(level: LogLevel) -> Self {
        match level {
            LogLevel::Error => LevelFilter::ERROR,
            LogLevel::Warn => LevelFilter::WARN,
            LogLevel::Info => LevelFilter::INFO,
            LogLevel::Debug => LevelFilter::DEBUG,
            LogLevel::Trace => LevelFilter::TRACE,
        }
    }
}

/// `--log-format`: how each event is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    // One human-readable line per event.
    #[default]
    Text,
    // One JSON object per line, the event's fields at its top level.
    Json,
}

/// Why the subscriber was not installed.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `RUST_LOG` holds something `EnvFilter` cannot read.
    #[error("RUST_LOG is not a valid filter: {0}")]
    InvalidRustLog(String),
    /// The process already has a global subscriber.
    #[error("a log subscriber is already installed in this process")]
    AlreadyInstalled,
}

/// What the command line chose for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Logging {
    /// `None`: `RUST_LOG` decides, and without it `info`.
    pub level: Option<LogLevel>,
    pub format: LogFormat,
}

impl Logging {
    fn filter(&self) -> Result<EnvFilter, LoggingError> {
        match self.level {
            Some(level) => Ok(EnvFilter::default().add_directive(LevelFilter::from(level).into())),
            None => EnvFilter::builder()
                .with_default_directive(LevelFilter::INFO.into())
                .from_env()
                .map_err(|e| LoggingError::InvalidRustLog(e.to_string())),
        }
    }

    /// Installs the process-wide subscriber writing to stderr; once per process.
    pub fn install(&self) -> Result<(), LoggingError> {
        let builder = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(self.filter()?);
        let installed = match self.format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .try_init(),
        };
        installed.map_err(|_| LoggingError::AlreadyInstalled)
    }
}
