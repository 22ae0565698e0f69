//! Application events (`docs/delivery.md#terminal-events`; each one's fields as `js/index.d.ts`
//! declares them). The runtime converts them to JS objects.

use courier_proto::{Message, Priority, UnreachableCause};

use crate::io::{FailReason, InboundKey, MemberState, Millis};

// Events are drained right after the call that produced them; boxing the large variant would
// cost an allocation per event for no memory that is ever held.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A carrier wrote the message (attempt = 1 for the first send).
    MessageSent {
        message_id: String,
        recipient: String,
        priority: Priority,
        transport: String,
        attempt: u32,
    },
    /// No carrier could take it now; it waits for one (`next_retry_at` = `None`: no timer, edge-driven).
    MessageDeferred {
        message_id: String,
        recipient: String,
        reason: String,
        retry_count: u32,
        next_retry_at: Option<Millis>,
    },
    /// The relay's mailbox holds it: custody, not delivery; never turns into a failure by timeout.
    MessageStored {
        message_id: String,
        recipient: String,
    },
    /// The relay reported the recipient unreachable: the message is parked (non-terminal, repeats
    /// per verdict). `reason_code` is the relay's cause; `reason` is a fixed local string, never
    /// the relay's text; `file_id` names the transfer of a media chunk.
    MessageUndeliverable {
        message_id: String,
        recipient: String,
        reason_code: UnreachableCause,
        reason: String,
        file_id: Option<String>,
    },
    /// ACK timeout or failed attempt; the next send is at `next_retry_at`. Non-terminal.
    MessageRetrying {
        message_id: String,
        recipient: String,
        retry_count: u32,
        next_retry_at: Millis,
    },
    /// Terminal: the recipient acknowledged it.
    MessageDelivered {
        message_id: String,
        recipient: String,
        latency_ms: u64,
        hop_count: u32,
        transport: String,
    },
    /// Terminal failure.
    MessageFailed {
        message_id: String,
        recipient: String,
        reason: FailReason,
        retry_count: u32,
    },
    /// A group message was accepted and went on its path: `"relay"` (one broadcast awaiting its
    /// report) or `"fanout"` (a copy per member).
    GroupMessageSent {
        group_id: String,
        message_id: String,
        path: &'static str,
        members: usize,
    },
    /// The relay's report on a broadcast, after its backstop: `missed_reissued` got copies.
    GroupMessageDeliveryReport {
        group_id: String,
        message_id: String,
        delivered: Vec<String>,
        pushed: Vec<String>,
        missed_reissued: Vec<String>,
    },
    /// One member's state of a group message changed (`getGroupMessageStatus`).
    GroupMemberStatus {
        group_id: String,
        message_id: String,
        member: String,
        state: MemberState,
    },
    /// A new inbound message for the application. `chat` is the dedup chat key.
    MessageReceived {
        message: Message,
        chat: String,
        sender: String,
        transport: String,
        /// It arrived sealed in an end-to-end session and `sender` is the session's credential.
        encrypted: bool,
    },
    /// A sealed message did not open on this attempt: advisory, per attempt, never terminal.
    MessageDecryptionFailed {
        message_id: String,
        sender: String,
        code: &'static str,
        reason: String,
    },
    /// The relay's `PresenceStatus` for a peer (`last_seen_ms` when the relay said).
    PresenceUpdated {
        peer_id: String,
        online: bool,
        last_seen_ms: Option<Millis>,
    },
    /// A peer came in range of an app carrier.
    NeighborDiscovered { peer_id: String, transport: String },
    /// A peer went out of range of an app carrier.
    NeighborLost { peer_id: String, transport: String },
    /// The relay's offline backlog has been processed (`count` frames since connect); with a
    /// durability hook, once the drain's last batch committed.
    InboundDrainCompleted { count: u64 },
    /// Something that deserves the app's attention on security or data-retention grounds.
    SecurityWarning {
        peer_id: String,
        reason_code: &'static str,
        reason: String,
    },
    /// Something worth a log line.
    Diagnostic {
        level: DiagnosticLevel,
        message: String,
    },
}

impl Event {
    /// The dedup key of a `message_received`; `None` for every other event.
    pub fn received_key(&self) -> Option<InboundKey> {
        match self {
            Self::MessageReceived {
                message,
                chat,
                sender,
                ..
            } => Some(InboundKey {
                chat: chat.clone(),
                sender: sender.clone(),
                message_id: message.id.clone(),
            }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagnosticLevel {
    Error,
    Warn,
    Info,
    Debug,
}
