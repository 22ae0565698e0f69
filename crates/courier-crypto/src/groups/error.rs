//! What a group operation refuses, with stable codes.

use courier_proto::{Address, IdentError};

use crate::sessions::SessionError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("the group id {id:?} {reason}")]
    InvalidGroupId { id: String, reason: IdentError },
    #[error("group {0} exists already")]
    Exists(String),
    #[error("this device holds no group {0}")]
    UnknownGroup(String),
    /// This device was removed from the group, or left it.
    #[error("this device is no longer a member of group {0}")]
    NotMember(String),
    #[error("{from} is not the admin of group {group_id}")]
    NotAdmin { group_id: String, from: Address },
    #[error("{0} is a member already, or named twice")]
    AlreadyMember(Address),
    #[error("{0} is not a member")]
    NoSuchMember(Address),
    #[error("no member to add or remove")]
    NoMembers,
    #[error("the admin cannot remove itself")]
    AdminStays,
    #[error("the {what} is not bound to {peer}: its credential names another identity or key")]
    NotBound { what: &'static str, peer: Address },
    /// Sealed in an epoch this device has no keys of: before it joined, or further back than it
    /// keeps.
    #[error("group {group_id}'s epoch {epoch} is past")]
    PastEpoch { group_id: String, epoch: u64 },
    #[error("group {0} holds as many commits and messages of later epochs as it may")]
    HoldFull(String),
    /// The key of the message is spent: this device opened it already, so this copy is a
    /// replay.
    #[error("a copy of a message from {from} in group {group_id} whose key is spent")]
    Spent { group_id: String, from: Address },
    #[error("{what} does not decode: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("the commit is refused: {0}")]
    Refused(&'static str),
    #[error("MLS refused it: {0}")]
    Mls(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The codes of [`GroupError`]; those it shares with sessions have the same words.
pub mod code {
    pub use crate::sessions::code::{MALFORMED, NOT_BOUND, REFUSED};
    pub const INVALID_GROUP_ID: &str = "INVALID_GROUP_ID";
    pub const GROUP_EXISTS: &str = "GROUP_EXISTS";
    pub const UNKNOWN_GROUP: &str = "UNKNOWN_GROUP";
    pub const NOT_A_MEMBER: &str = "NOT_A_MEMBER";
    pub const NOT_ADMIN: &str = "NOT_ADMIN";
    pub const ALREADY_MEMBER: &str = "ALREADY_MEMBER";
    pub const NO_SUCH_MEMBER: &str = "NO_SUCH_MEMBER";
    pub const NO_MEMBERS: &str = "NO_MEMBERS";
    pub const ADMIN_STAYS: &str = "ADMIN_STAYS";
    pub const PAST_EPOCH: &str = "PAST_EPOCH";
    pub const HOLD_FULL: &str = "HOLD_FULL";
    pub const SPENT: &str = "SPENT";
}

impl GroupError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidGroupId { .. } => code::INVALID_GROUP_ID,
            Self::Exists(_) => code::GROUP_EXISTS,
            Self::UnknownGroup(_) => code::UNKNOWN_GROUP,
            Self::NotMember(_) => code::NOT_A_MEMBER,
            Self::NotAdmin { .. } => code::NOT_ADMIN,
            Self::AlreadyMember(_) => code::ALREADY_MEMBER,
            Self::NoSuchMember(_) => code::NO_SUCH_MEMBER,
            Self::NoMembers => code::NO_MEMBERS,
            Self::AdminStays => code::ADMIN_STAYS,
            Self::NotBound { .. } => code::NOT_BOUND,
            Self::PastEpoch { .. } => code::PAST_EPOCH,
            Self::HoldFull(_) => code::HOLD_FULL,
            Self::Spent { .. } => code::SPENT,
            Self::Malformed { .. } => code::MALFORMED,
            Self::Refused(_) | Self::Mls(_) | Self::Store(_) => code::REFUSED,
        }
    }
}

/// What groups and sessions share (a key package's check, loading state) fails alike.
impl From<SessionError> for GroupError {
    fn from(error: SessionError) -> Self {
        match error {
            SessionError::NotBound { what, peer } => Self::NotBound { what, peer },
            SessionError::Malformed { what, detail } => Self::Malformed { what, detail },
            SessionError::Store(e) => Self::Store(e),
            e => Self::Mls(e.to_string()),
        }
    }
}

pub(super) fn mls(error: impl std::fmt::Display) -> GroupError {
    GroupError::Mls(error.to_string())
}

pub(super) fn malformed(
    what: &'static str,
) -> impl FnOnce(openmls::prelude::tls_codec::Error) -> GroupError {
    move |e| GroupError::Malformed {
        what,
        detail: e.to_string(),
    }
}
