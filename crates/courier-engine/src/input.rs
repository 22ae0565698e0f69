//! Everything the engine is told, as one type: [`Input`], taken by [`crate::Engine::handle`].
//! The runtime converts what happened (an app call, a carrier report, a frame, the clock) into
//! an `Input` and carries the engine's outputs out; it decides nothing itself
//! (`docs/architecture.md#the-engine-interface`).

use courier_proto::Message;

use crate::io::{
    Carrier, CarrierAnswer, GroupReport, GroupSendRecord, GroupSendRequest, InboundOrigin, Millis,
    OutboxRecord, PendingInbound, ProcessedKey, SendRequest,
};

/// One input. Every variant is handled by `Engine::handle(input, now)`; after it the runtime
/// drains the outputs in the step's order (`crate::step`).
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The application sends a message (already validated by the runtime).
    Send(SendRequest),
    /// At start, before any other input: what storage holds.
    Restore(Restore),
    /// A carrier became available. `Carrier::Local(name)` registers an app carrier; the relay
    /// or a gateway coming up is the reconnect flush and a reachability edge for everyone.
    CarrierUp(Carrier),
    /// A carrier is gone (an app carrier: unregistered, with all its neighbor links).
    CarrierDown(Carrier),
    /// The relay authenticated this device as this account.
    AccountName(String),
    /// The carrier wrote attempt `send_seq` of `id`: its ACK timer starts now.
    Written { id: String, send_seq: u64 },
    /// Attempt `send_seq` of `id` did not make it (carrier error, no answer in time, connection
    /// loss, an app carrier's rejected `send`).
    SendFailed {
        id: String,
        send_seq: u64,
        reason: String,
    },
    /// The relay's or a gateway's answer to attempt `send_seq` of `id`.
    Answer {
        id: String,
        send_seq: u64,
        answer: CarrierAnswer,
    },
    /// A message from a carrier: data, or a delivery ACK. A file chunk comes here only once the
    /// runtime holds its bytes durably (they commit with this step): the engine acknowledges it
    /// and records it processed, and neither the application nor the durability hook sees it.
    Inbound {
        message: Box<Message>,
        origin: InboundOrigin,
    },
    /// A relay connection on `carrier` advertised `mailbox_v1`: what arrives until
    /// `DrainComplete` is its offline backlog.
    DrainStarted(Carrier),
    /// The relay's `DrainComplete{count}` on `carrier`.
    DrainComplete { carrier: Carrier, count: u64 },
    /// The durability hook's verdict on batch `batch_id`: `Err` carries the app's reason.
    HookResult {
        batch_id: u64,
        result: Result<(), String>,
    },
    /// The relay's `PresenceStatus` for `peer` (an answer or a watch push).
    Presence {
        peer: String,
        online: bool,
        last_seen_ms: Option<Millis>,
    },
    /// `peer` came in range of the app carrier named `carrier`.
    NeighborDiscovered { peer: String, carrier: String },
    /// `peer` went out of range of the app carrier named `carrier`.
    NeighborLost { peer: String, carrier: String },
    /// A sealed message from a carrier did not open (`docs/delivery.md#sealed-messages`): it is
    /// reported, not acknowledged, and its relay frame is released, so the sender's retry —
    /// sealed again for the current session — is what recovers it.
    Undecryptable {
        message_id: String,
        sender: String,
        origin: InboundOrigin,
        code: &'static str,
        reason: String,
    },
    /// The runtime drops an inbound frame unprocessed — a replayed sealed copy whose key is
    /// spent, a repeat of something this device already opened: its relay frame is released,
    /// with a debug diagnostic saying why.
    Discard {
        origin: InboundOrigin,
        reason: String,
    },
    /// The runtime holds an end-to-end session with the device `recipient` names: what waits
    /// for it in the pre-session queue enters the outbox, and later sends to it go straight there.
    SessionReady { recipient: String },
    /// The application sends a group message, sealed for its roster (`docs/delivery.md#group-sends`).
    GroupSend(Box<GroupSendRequest>),
    /// The relay is ready to broadcast to `group_id` (registered and answered on this connection,
    /// group delivery advertised), or no longer is.
    GroupRelay { group_id: String, ready: bool },
    /// The relay's delivery report on a broadcast.
    GroupReport(GroupReport),
    /// The relay refused the broadcast `message_id` (its wire id): `GroupError` naming it.
    GroupRefused { message_id: String, reason: String },
    /// The runtime withdraws these file chunks (their transfer ended or restarts): each leaves
    /// the outbox or the pre-session queue with no event (`docs/delivery.md#file-transfers`).
    CancelChunks { ids: Vec<String> },
    /// Time passed. Spurious calls are harmless: nothing that is not due happens.
    Timeout,
}

/// What storage holds at start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Restore {
    /// The outbox rows.
    pub outbox: Vec<OutboxRecord>,
    /// Inbound dedup records still within retention.
    pub processed: Vec<ProcessedKey>,
    /// Verified control frames' dedup records still within the replay window (`MarkControl`).
    pub controls: Vec<ProcessedKey>,
    /// Inbound messages buffered for the durability hook and not committed.
    pub inbound: Vec<PendingInbound>,
    /// Group messages with something left to deliver (`docs/delivery.md#group-sends`).
    pub group_sends: Vec<GroupSendRecord>,
}

impl Input {
    /// `Input::Undecryptable` for the sealed copy `message` that did not open.
    pub fn undecryptable(
        message: &courier_proto::Message,
        origin: InboundOrigin,
        code: &'static str,
        reason: String,
    ) -> Self {
        Self::Undecryptable {
            message_id: message.id.clone(),
            sender: message.sender.clone(),
            origin,
            code,
            reason,
        }
    }
}
