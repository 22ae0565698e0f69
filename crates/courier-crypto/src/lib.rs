//! End-to-end sessions of offline-courier (`docs/architecture.md#end-to-end-sessions`): MLS
//! (RFC 9420, with `openmls`) between pairs of devices and in chat groups, credentials bound to
//! each device's Ed25519 identity key so that an MLS sender is an `off1` address, and state kept
//! as rows the runtime commits in the same transaction as what they protect.
//!
//! Nothing here reads a clock other than openmls's own (its key-package lifetime check, and the
//! time it stamps on a past epoch's keys, which are kept by count here), touches a file, or
//! decides delivery: the engine decides what is sealed and when; the runtime calls in.

mod groups;
mod sessions;
mod store;

pub use groups::{
    code as group_code, group_of, CommitOutcome, GroupCommit, GroupError, GroupJoined,
    GroupMessage, GroupOpened, GroupState, Released, MAX_HELD, MAX_HELD_BYTES,
};
pub use sessions::{code, Joined, SessionError, Sessions, CIPHERSUITE};
pub use store::{Change, RowKey, StoreError};

#[cfg(test)]
mod tests;
