//! Errors the application sees. Each maps to a stable `ProtocolError.code` in JS.

use crate::config::ConfigError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the protocol is not started")]
    NotStarted,
    #[error("the protocol is already started")]
    AlreadyStarted,
    /// Disk full, locked, corrupt: the text carries SQLite's reason.
    #[error("storage: {0}")]
    Storage(String),
    /// A durability hook needs storage that outlives the process.
    #[error("inboundDurabilityHook needs storage.path: storage.memory cannot keep a message until the hook commits it")]
    UnsupportedDurabilityBackend,
    #[error("{0}")]
    Internal(String),
}

impl From<StoreError> for ClientError {
    fn from(e: StoreError) -> Self {
        Self::Storage(e.to_string())
    }
}

impl ClientError {
    /// The stable code (`ProtocolErrorCode` in `js/index.d.ts`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Config(_) => "ERR_CONFIG",
            Self::InvalidArgument(_) => "ERR_INVALID_ARGUMENT",
            Self::NotStarted => "ERR_NOT_STARTED",
            Self::AlreadyStarted => "ERR_ALREADY_STARTED",
            Self::Storage(_) => "ERR_STORAGE",
            Self::UnsupportedDurabilityBackend => "ERR_UNSUPPORTED_DURABILITY_BACKEND",
            Self::Internal(_) => "ERR_INTERNAL",
        }
    }
}
