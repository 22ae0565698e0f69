//! The engine's inputs and outputs as data. The runtime executes outputs and reports back, which
//! is how "the ACK timer starts on the wire" stays exact: a `Transmit` is only a request until
//! the runtime reports `Input::Written`.

use std::collections::BTreeMap;
use std::fmt;

use courier_proto::{ContentType, Message, Priority, RichParts, UnreachableCause};
use serde::{Deserialize, Serialize};

/// Epoch milliseconds. The engine never reads a clock; every input carries `now`.
pub type Millis = u64;

/// A carrier a frame can travel on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Carrier {
    /// The relay connection.
    Relay,
    /// A gateway daemon (`docs/protocol.md#gateway-protocol`). Like the relay it routes by the
    /// message's address and answers every send live or unreachable; unlike it, it keeps no mailbox
    /// and has no presence.
    Gateway,
    /// An app-supplied local carrier (BLE, Wi-Fi Direct, …), by its registered name.
    Local(String),
}

impl Carrier {
    pub fn name(&self) -> &str {
        match self {
            Self::Relay => "internet",
            Self::Gateway => "gateway",
            Self::Local(name) => name,
        }
    }

    /// The relay and a gateway route by the message's address; a local carrier reaches only the
    /// neighbor a frame is handed to.
    pub fn is_addressed(&self) -> bool {
        matches!(self, Self::Relay | Self::Gateway)
    }
}

impl fmt::Display for Carrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the application asked to send. Already validated by the runtime (content cap, reserved
/// prefixes, identifier rules, reserved metadata keys).
#[derive(Debug, Clone, PartialEq)]
pub struct SendRequest {
    /// The app's id, or one the runtime minted (a v4 UUID) when the app chose none.
    pub id: String,
    /// How a message with this id last settled, as storage remembers it: an id already
    /// delivered is a no-op, a failed one may be sent again (`docs/delivery.md#repeated-ids`).
    pub settled: Option<Settlement>,
    pub recipient: String,
    pub content: String,
    pub content_type: ContentType,
    pub priority: Priority,
    pub metadata: BTreeMap<String, String>,
    /// Base64 of binary content (`Uint8Array` from JS), carried in `Message.binary_content`.
    pub binary_content: Option<String>,
    /// A file chunk's header (`courier_proto::ChunkHeader`), carried in `Message.media_metadata`.
    /// Its bytes are the runtime's to add when it puts the chunk on a carrier.
    pub media: Option<serde_json::Value>,
    /// The reply link, quote, mentions, extras and forward origin
    /// (`docs/protocol.md#rich-messages`), checked. Boxed: most sends have none, and a send
    /// travels inside every input and command.
    pub rich: Box<RichParts>,
}

/// What the application asked to send to a group, sealed once for its roster
/// (`docs/delivery.md#group-sends`).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSendRequest {
    /// The app's id, or one the runtime minted.
    pub id: String,
    pub group_id: String,
    /// The roster the message was sealed for, this device excluded.
    pub members: Vec<String>,
    /// The sealed message every path carries: id = the wire id of `id`, recipient = the group,
    /// content = the group ciphertext, group markers in its metadata.
    pub message: Message,
    /// `group.relayBroadcastEnabled`: the relay broadcast may be used when the relay is ready.
    pub broadcast: bool,
}

/// Where one member of a group message stands (`getGroupMessageStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Not reached yet: a report or its copy's ACK is awaited.
    Pending,
    /// The relay's mailbox holds it for the member (the report's `pushed`, or custody of its copy).
    Stored,
    /// The relay wrote it to the member's live connection (the report's `delivered`), or the
    /// member acknowledged its copy.
    Delivered,
    /// Its copy failed (retries, lifetime, capacity).
    Failed,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Stored => "stored",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }
}

/// How a group message travels now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "path")]
pub enum GroupPath {
    /// Broadcast by the relay `sends` times (1..=3), its report due by `report_due`.
    Broadcast { sends: u8, report_due: Millis },
    /// Per-member copies, each an outbox entry; no report is awaited.
    FanOut,
}

/// The persisted form of a group message's tracker: restored at start while anything of it is
/// left to deliver, and what `getGroupMessageStatus` answers from afterwards.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSendRecord {
    pub id: String,
    pub group_id: String,
    pub message: Message,
    pub created_at: Millis,
    pub path: GroupPath,
    pub members: BTreeMap<String, MemberState>,
}

/// The relay's settled delivery report of a broadcast (`GroupMessageSent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReport {
    pub group_id: String,
    /// The broadcast's wire id.
    pub message_id: String,
    pub delivered: Vec<String>,
    pub pushed: Vec<String>,
    /// (member, reason): logged, never branched on.
    pub missed: Vec<(String, String)>,
}

/// What became of a file chunk (`Engine::poll_chunk`): the runtime's transfer follows its chunks
/// by these, not by message events, which the application never sees for a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkOutcome {
    /// The chunk's id, as the runtime submitted it.
    pub id: String,
    pub file_id: String,
    /// `Ok` when the recipient acknowledged it; else why it failed (a withdrawn chunk reports
    /// nothing).
    pub result: Result<(), FailReason>,
}

/// How an addressed carrier (the relay or a gateway) answered a `SendMessage` it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CarrierAnswer {
    /// `MessageSent{disposition:"live"}`: queued to the recipient's socket.
    Live,
    /// `MessageSent{disposition:"stored"}`: the relay's mailbox holds it (custody, not delivery).
    Stored,
    /// `DeliveryError{recipient_unreachable…}`: the verdict that the recipient cannot be
    /// reached, and why.
    Unreachable(UnreachableCause),
}

/// Where an inbound message came from, as the carrier (not the message) says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundOrigin {
    pub carrier: Carrier,
    /// The identity the relay stamped (`MessageReceived.sender`), or a local carrier's peer id.
    pub stamped_sender: String,
    /// `MessageReceived.sender_account` (ours, not the published contract), when the relay sent it.
    pub sender_account: Option<String>,
    /// The relay journal `seq`, to be acknowledged with a frame release once processed.
    pub seq: Option<u64>,
    /// The address whose MLS credential sealed the message, when it arrived sealed and the
    /// runtime opened it (`docs/delivery.md#sender-attribution`): the strongest attribution
    /// there is, on any carrier.
    pub sealed_by: Option<String>,
}

/// A frame for the runtime to put on a carrier.
#[derive(Debug, Clone, PartialEq)]
pub struct Transmit {
    pub carrier: Carrier,
    /// For `Carrier::Local(_)`: the neighbor the frame is handed to — the recipient itself on a
    /// direct link, or a neighbor that only carries it (a parked message offered on park or
    /// probe). `None` for the addressed carriers (`Relay`, `Gateway`), which route by the
    /// message.
    pub peer: Option<String>,
    pub kind: TransmitKind,
}

/// A change of the presence watchlist (`docs/delivery.md#presence-watchlist`): the runtime sends
/// `WatchPresence` / `UnwatchPresence` for it under `presence_watch_v1`, else polls
/// `CheckPresence` for the watched peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresenceChange {
    Watch(String),
    Unwatch(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum TransmitKind {
    /// An outbox entry's (re)send. Report with `Input::Written` / `Input::SendFailed`, quoting
    /// `send_seq`; reports for an older `send_seq` are stale and ignored.
    Outbox { message: Message, send_seq: u64 },
    /// A delivery ACK: the ACK Message back to the sender (fire and forget: a lost one makes the
    /// sender retry). See `docs/glossary.md#delivery-ack`.
    DeliveryAck { message: Message },
    /// A group message for the relay to broadcast (`SendGroupMessage`): no `Written` report is
    /// owed; the relay's delivery report or the report deadline moves it on.
    GroupBroadcast { group_id: String, message: Message },
    /// A frame release: relay journal frame `seq` may be dropped (the wire's `Ack`/`AckUpTo`),
    /// sent only after the message it carried was processed. Never a delivery ACK.
    ReleaseFrame { seq: u64 },
}

/// Where an outbox entry stands, as persisted and as `getMessageStatus` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryState {
    /// Waiting for a carrier or a retry time.
    Queued,
    /// Handed to a carrier, or written and awaiting the ACK.
    InFlight,
    /// The relay holds it (custody) or reported the recipient unreachable; paced by edges and probes.
    Parked,
    /// In the pre-session queue: its recipient has no end-to-end session yet.
    AwaitingSession,
}

/// The persisted form of one outbox entry: everything needed to resume its ladder after a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRecord {
    pub message: Message,
    pub state: EntryState,
    /// When `sendMessage` accepted it; anchors the absolute cap.
    pub created_at: Millis,
    /// Anchor of the sliding lifetime: the last send, or the restore that refreshed the window.
    pub window_start: Millis,
    /// ACK timeouts consumed (the `maxRetries` budget). Never reset by bookkeeping.
    pub ack_attempts: u32,
    /// Transport failures since the relay last accepted the frame (backoff of the deferred path;
    /// no limit).
    pub transport_retries: u32,
    /// The next timer of this entry (retry, probe), if any.
    pub next_at: Option<Millis>,
    pub first_sent_at: Option<Millis>,
    pub last_sent_at: Option<Millis>,
}

/// How a message settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    Delivered,
    Failed(FailReason),
}

/// The reasons of a terminal `message_failed` (`docs/delivery.md#exactly-one-terminal-event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    MaxRetriesExceeded,
    OutboxLifetimeExceeded,
    OutboxCapacityExceeded,
    PendingSessionLifetimeExceeded,
    PendingSessionCapacityExceeded,
    /// A signed control frame aged out of its receivers' freshness window before it could go
    /// (`docs/protocol.md#control-signatures`).
    ControlSignatureExpired,
    /// The relay's verdict on a connection request: it is never parked
    /// (`docs/delivery.md#connection-requests`).
    ConnectionRequestUndeliverable,
    /// A file chunk withdrawn by the runtime: its transfer ended (`Input::CancelChunks`).
    TransferAborted,
}

impl FailReason {
    pub const ALL: [FailReason; 8] = [
        Self::MaxRetriesExceeded,
        Self::OutboxLifetimeExceeded,
        Self::OutboxCapacityExceeded,
        Self::PendingSessionLifetimeExceeded,
        Self::PendingSessionCapacityExceeded,
        Self::ControlSignatureExpired,
        Self::ConnectionRequestUndeliverable,
        Self::TransferAborted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxRetriesExceeded => "Max retries exceeded",
            Self::OutboxLifetimeExceeded => "Outbox lifetime exceeded",
            Self::OutboxCapacityExceeded => "Outbox capacity exceeded",
            Self::PendingSessionLifetimeExceeded => "Pending session lifetime exceeded",
            Self::PendingSessionCapacityExceeded => "Pending session queue capacity exceeded",
            Self::ControlSignatureExpired => "Control signature expired",
            Self::ConnectionRequestUndeliverable => "Connection request undeliverable",
            Self::TransferAborted => "Media transfer aborted",
        }
    }

    /// The reason `as_str` spells `s`, as storage keeps it.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// A write for the runtime's store. The runtime commits all ops it drained in one transaction
/// before it dispatches the events and executes the transmits of the same step.
// Drained and committed after each call, never held: boxing `Put` would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum StoreOp {
    /// Insert or replace the entry's row.
    Put(OutboxRecord),
    /// Remove the entry's row and remember how it ended (for status and idempotent ids).
    Settle {
        id: String,
        recipient: String,
        settlement: Settlement,
        at: Millis,
    },
    /// Insert or replace a group message's tracker row (with its members' states).
    PutGroupSend(GroupSendRecord),
    /// One member's state of group message `id` changed.
    GroupMember {
        id: String,
        member: String,
        state: MemberState,
    },
    /// Nothing of group message `id` is left to deliver: its row is kept for status and no
    /// longer restored.
    GroupSendDone { id: String },
    /// Remember an inbound message as processed (dedup across restarts).
    MarkProcessed(ProcessedKey),
    /// Remember a verified control frame as processed: kept for
    /// `courier_proto::CONTROL_REPLAY_WINDOW_MS` and never evicted by count
    /// (`docs/delivery.md#control-frames`). Insert or ignore.
    MarkControl(ProcessedKey),
    /// Buffer a batch's messages before the durability hook sees them (insert or ignore).
    BufferInbound(Vec<PendingInbound>),
    /// The hook committed these: delete their buffered rows and mark each processed at `at`.
    CommitInbound { keys: Vec<InboundKey>, at: Millis },
    /// Buffered rows past retention, removed undelivered (each also reported as an event).
    ExpireInbound { keys: Vec<InboundKey> },
}

/// Identifies an inbound message `(chat, sender, messageId)`: for dedup and for the durability
/// hook's buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InboundKey {
    pub chat: String,
    pub sender: String,
    pub message_id: String,
}

/// How a message reached the durability hook (`origin` in `docs/delivery.md#batches`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOrigin {
    /// Live traffic: a batch of one.
    Live,
    /// The relay's offline backlog, batched until `DrainComplete`.
    Drain,
    /// Offered again from the buffered copy (after a refused batch, a redelivery or a restart).
    Redelivery,
}

impl BatchOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Drain => "drain",
            Self::Redelivery => "redelivery",
        }
    }
}

/// A buffered inbound message: written before the hook runs, cleared once the hook committed it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingInbound {
    pub key: InboundKey,
    pub message: Message,
    /// The carrier it arrived on and the identity that carrier vouched for (for the end-to-end ACK).
    pub carrier: Carrier,
    pub stamped_sender: String,
    pub received_at: Millis,
    /// It arrived sealed in an end-to-end session (`InboundOrigin::sealed_by`).
    pub encrypted: bool,
}

/// A batch for the application's durability hook. Exactly one is with the hook at a time.
#[derive(Debug, Clone, PartialEq)]
pub struct HookBatch {
    pub id: u64,
    pub messages: Vec<HookMessage>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HookMessage {
    pub key: InboundKey,
    pub message: Message,
    pub transport: String,
    pub origin: BatchOrigin,
}

/// An inbound message's dedup key and when it was processed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcessedKey {
    pub key: InboundKey,
    pub at: Millis,
}

/// Counts for `stats()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub outbox_regular: usize,
    pub outbox_media: usize,
    /// Entries handed to a carrier or awaiting their ACK (a probe in flight included).
    pub pending_acks: usize,
    /// Queued entries that are not parked.
    pub retry_queue: usize,
    /// Parked entries not in flight: unreachable and relay custody alike, probing or resting.
    pub parked: usize,
    /// Messages in the pre-session queue.
    pub pre_session: usize,
    /// Group messages with a report awaited or copies in the outbox.
    pub group_sends: usize,
    pub carriers_up: usize,
}
