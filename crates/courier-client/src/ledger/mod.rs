//! The message ledger: what happened to each message, kept so its life can be explained after
//! the fact (`docs/delivery.md#a-messages-life`). Entries are derived from what a step already
//! produced — the engine's events and store ops, and the inputs the driver applied — and are
//! written in that step's commit, so the ledger never says more than storage holds and costs no
//! transaction of its own.

pub mod explain;
mod observe;
pub mod time;

#[cfg(test)]
mod tests;

use courier_engine::Millis;
use serde::{Deserialize, Serialize};

pub use observe::Observer;

/// Entries kept per message: the first, and the latest `PER_MESSAGE - 1` (a probe ladder that
/// runs for days would otherwise grow its message's history without bound).
pub const PER_MESSAGE: u64 = 64;

/// Messages the ledger keeps at most, besides the age it shares with the settled outcomes.
pub const MAX_MESSAGES: usize = 20_000;

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Outbound,
    Inbound,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Outbound => "outbound",
            Self::Inbound => "inbound",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "outbound" => Some(Self::Outbound),
            "inbound" => Some(Self::Inbound),
            _ => None,
        }
    }
}

/// One thing that happened to a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum Kind {
    /// `sendMessage` accepted it.
    Accepted,
    /// A carrier wrote it: attempt `attempt` of the ACK ladder. `probe`: the write was a timed
    /// probe of a parked message.
    Attempt {
        carrier: String,
        attempt: u32,
        probe: bool,
    },
    /// The relay's or a gateway's answer to the attempt: `live`, `stored` or `unreachable`.
    Answer {
        disposition: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        cause: Option<String>,
    },
    /// No carrier could take it now.
    Deferred {
        reason: String,
        retry_count: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        next_retry_at: Option<Millis>,
    },
    /// The relay said the recipient cannot be reached: parked until an edge or a probe.
    Parked {
        cause: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        next_probe_at: Option<Millis>,
    },
    /// The relay's mailbox holds it: custody, not delivery.
    Custody {
        #[serde(skip_serializing_if = "Option::is_none")]
        next_probe_at: Option<Millis>,
    },
    /// A parked message was sent again because its recipient became reachable.
    Redriven { trigger: String },
    /// Its ACK did not come in time: retry `ladder_step` (counted from 0) at `next_retry_at`.
    Retrying {
        ladder_step: u32,
        next_retry_at: Millis,
    },
    /// Terminal: acknowledged by `from` over `carrier`.
    Delivered {
        carrier: String,
        from: String,
        latency_ms: u64,
    },
    /// Terminal: failed.
    Failed { reason: String, retry_count: u32 },
    /// Inbound: written to the durability buffer before the hook sees it.
    Buffered { carrier: String },
    /// Inbound: offered to the durability hook in batch `batch`.
    HookOffered { batch: u64, origin: String },
    /// Inbound: the hook committed batch `batch`.
    HookCommitted { batch: u64 },
    /// Inbound: the hook refused batch `batch`; the message is offered again.
    HookRefused { batch: u64, reason: String },
    /// Inbound: handed to the application.
    Received { carrier: String, encrypted: bool },
    /// Inbound: a sealed copy did not open (advisory: the sender's retry recovers it).
    DecryptionFailed { code: String, reason: String },
    /// Inbound: dropped from the durability buffer after its retention, never committed.
    Expired,
}

impl Kind {
    /// The name the entry is stored and exported under.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Attempt { .. } => "attempt",
            Self::Answer { .. } => "answer",
            Self::Deferred { .. } => "deferred",
            Self::Parked { .. } => "parked",
            Self::Custody { .. } => "custody",
            Self::Redriven { .. } => "redriven",
            Self::Retrying { .. } => "retrying",
            Self::Delivered { .. } => "delivered",
            Self::Failed { .. } => "failed",
            Self::Buffered { .. } => "buffered",
            Self::HookOffered { .. } => "hook_offered",
            Self::HookCommitted { .. } => "hook_committed",
            Self::HookRefused { .. } => "hook_refused",
            Self::Received { .. } => "received",
            Self::DecryptionFailed { .. } => "decryption_failed",
            Self::Expired => "expired",
        }
    }

    /// How the message's life ended with this entry, if it did.
    pub fn outcome(&self) -> Option<&'static str> {
        match self {
            Self::Delivered { .. } => Some("delivered"),
            Self::Failed { .. } => Some("failed"),
            Self::Received { .. } => Some("received"),
            Self::Expired => Some("expired"),
            _ => None,
        }
    }
}

/// One ledger entry of message `message_id`, exchanged with `peer` (the recipient, or the
/// sender of an inbound message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub direction: Direction,
    pub message_id: String,
    pub peer: String,
    pub at: Millis,
    pub kind: Kind,
}

/// A message's ledger as read back: its entries in order (numbered by position), at most
/// `PER_MESSAGE` of them: the first and the latest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    pub direction: Direction,
    pub message_id: String,
    pub peer: String,
    pub outcome: Option<String>,
    pub entries: Vec<(u64, Millis, Kind)>,
    /// Entries the store holds: more than `entries.len()` when the middle is left out (the
    /// hourly prune then trims it from the file).
    pub kept: u64,
}

impl History {
    /// The ledger as JSON (`messageTimeline`): `{ id, direction, peer, outcome, dropped,
    /// entries: [{ seq, at, kind, ... }] }`.
    pub fn to_json(&self) -> serde_json::Value {
        let entries: Vec<serde_json::Value> = self
            .entries
            .iter()
            .map(|(seq, at, kind)| {
                let mut value = serde_json::to_value(kind).unwrap_or_default();
                if let Some(fields) = value.as_object_mut() {
                    fields.insert("seq".into(), (*seq).into());
                    fields.insert("at".into(), (*at).into());
                }
                value
            })
            .collect();
        serde_json::json!({
            "id": self.message_id,
            "direction": self.direction.as_str(),
            "peer": self.peer,
            "outcome": self.outcome,
            "dropped": self.kept.saturating_sub(self.entries.len() as u64),
            "entries": entries,
        })
    }
}
