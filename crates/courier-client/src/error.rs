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
    /// Groups are MLS groups: they need `encryption` on.
    #[error("groups need end-to-end encryption, which is disabled")]
    EncryptionRequired,
    /// `forwardMessage` of an id this device keeps no received message under.
    #[error("no received message {0} on this device")]
    MessageNotFound(String),
    #[error("no group {0} on this device")]
    GroupNotFound(String),
    #[error("this device does not administer group {0}: only its creator changes its members")]
    GroupNotAdmin(String),
    /// What was asked needs the relay, and none that can do it is connected.
    #[error("{0}")]
    NotConnected(String),
    /// The relay's directory holds no key package for these members: they have not connected
    /// since they last used their packages up, or never.
    #[error("no key package for {0} in the relay's directory: they must connect once first")]
    KeyPackageUnavailable(String),
    /// A file over `media.maxFileSize` (or over what a transfer can carry).
    #[error("{0}")]
    FileTooLarge(String),
    /// `media.maxOutgoingTransfers` unfinished transfers already.
    #[error("{0}")]
    MediaOutboxFull(String),
    /// The file to send cannot be read.
    #[error("{0}")]
    FileUnreadable(String),
    /// The stored identity cannot be trusted: its key file is a symlink, another user's, or
    /// open to others, or a sealed identity was replaced by one in the clear.
    #[error("{0}")]
    IdentityRefused(String),
    #[error("{0}")]
    Internal(String),
}

impl From<StoreError> for ClientError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::UnsafeKeyFile { .. } | StoreError::CleartextIdentity => {
                Self::IdentityRefused(e.to_string())
            }
            e => Self::Storage(e.to_string()),
        }
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
            Self::EncryptionRequired => "ERR_ENCRYPTION_REQUIRED",
            Self::MessageNotFound(_) => "ERR_MESSAGE_NOT_FOUND",
            Self::GroupNotFound(_) => "ERR_GROUP_NOT_FOUND",
            Self::GroupNotAdmin(_) => "ERR_GROUP_NOT_ADMIN",
            Self::NotConnected(_) => "ERR_NOT_CONNECTED",
            Self::KeyPackageUnavailable(_) => "ERR_KEY_PACKAGE_UNAVAILABLE",
            Self::FileTooLarge(_) => "ERR_FILE_TOO_LARGE",
            Self::MediaOutboxFull(_) => "ERR_MEDIA_OUTBOX_FULL",
            Self::FileUnreadable(_) => "ERR_FILE_UNREADABLE",
            Self::IdentityRefused(_) => "ERR_IDENTITY_REFUSED",
            Self::Internal(_) => "ERR_INTERNAL",
        }
    }
}
