//! Where each fact lives in NATS (`docs/cluster.md#layout`). Account names and addresses are
//! free text, which subjects and keys cannot carry, so they appear there as the hex SHA-256 of
//! their bytes; the records themselves keep the names.

use sha2::{Digest, Sha256};

use super::ClusterError;

pub(super) struct Names {
    prefix: String,
}

impl Names {
    pub(super) fn new(prefix: &str) -> Result<Self, ClusterError> {
        let valid = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if valid {
            Ok(Self {
                prefix: prefix.to_owned(),
            })
        } else {
            Err(ClusterError::InvalidName(prefix.to_owned()))
        }
    }

    pub(super) fn stream(&self) -> String {
        format!("{}-journal", self.prefix)
    }

    pub(super) fn journal_subjects(&self) -> String {
        format!("{}.journal.*", self.prefix)
    }

    /// The subject of one account's journal.
    pub(super) fn journal(&self, account: &str) -> String {
        format!("{}.journal.{}", self.prefix, token(&[account]))
    }

    /// The subject of the notices of frames appended to one account's journal.
    pub(super) fn appended(&self, account: &str) -> String {
        format!("{}.appended.{}", self.prefix, token(&[account]))
    }

    /// The subject of the notices of group reports held for one account.
    pub(super) fn reports(&self, account: &str) -> String {
        format!("{}.reports.{}", self.prefix, token(&[account]))
    }

    /// The subject on which the node of one account's connection answers whether a frame of
    /// the account's journal was written to it.
    pub(super) fn written(&self, account: &str) -> String {
        format!("{}.written.{}", self.prefix, token(&[account]))
    }

    pub(super) fn bucket(&self, what: &str) -> String {
        format!("{}-{what}", self.prefix)
    }
}

/// A subject token or key for `parts`: each part length-prefixed, so no two lists of parts share
/// one.
pub(super) fn token(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
