//! Events for the application: the engine's, plus what only the runtime knows (carrier status,
//! relay frames it does not consume). Serialized as `js/index.d.ts` declares them: snake_case
//! `type`, camelCase fields, epoch-ms times.

use std::collections::BTreeMap;

use courier_engine::{DiagnosticLevel, Event, FailReason};
use courier_proto::message::{META_GROUP_COPY, META_GROUP_ID};
use courier_proto::{Message, RichParts};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    /// Boxed: a received message is large, and most events are small.
    Engine(Box<Event>),
    RelayStatusChanged {
        connected: bool,
        authenticated: bool,
    },
    RelaySessionSuperseded {
        reason: String,
    },
    /// The relay refused this connection's token (`reason`: its `AuthError` reason, or
    /// `rejected` for a bare close 4001), or the application's token provider gave none
    /// (`token_unavailable`, with `message`). The carrier tries again in `retry_in_ms`.
    AuthFailed {
        reason: String,
        message: Option<String>,
        retry_in_ms: u64,
    },
    /// The gateway carrier's connection (`connected`) and binding (`attached`: the gateway
    /// bound this device's own address, so the carrier is available).
    GatewayStatusChanged {
        connected: bool,
        attached: bool,
    },
    /// A relay frame the engine does not consume, verbatim.
    RelayServerMessage {
        json: String,
    },
    Diagnostic {
        level: DiagnosticLevel,
        message: String,
        target: &'static str,
    },
    /// This device's identity is loaded (or was just created): its address.
    IdentityReady {
        address: String,
    },
    /// `message_received` as the application sees it: the engine's event, and whether the
    /// sender is one of this device's contacts (`docs/delivery.md#connection-requests`).
    Received {
        event: Box<Event>,
        known_sender: bool,
    },
    /// A peer asks to connect (`implicit`: it did not ask, but sent a message while
    /// `encryption.unknownSenders` is `request`; the request's id is that message's).
    ConnectionRequestReceived {
        request_id: String,
        sender: String,
        note: Option<String>,
        implicit: bool,
    },
    /// The peer accepted this device's request `request_id`; they are contacts, and with
    /// sessions the session between them is set up.
    ConnectionAccepted {
        request_id: String,
        peer: String,
    },
    ConnectionRejected {
        request_id: String,
        peer: String,
    },
    /// The requester withdrew its request.
    ConnectionRequestCancelled {
        request_id: String,
        sender: String,
    },
    /// This device created a group, or joined one by its Welcome.
    GroupCreated {
        group_id: String,
        name: String,
        admin: String,
        members: Vec<String>,
    },
    GroupMemberAdded {
        group_id: String,
        member: String,
        added_by: String,
    },
    /// `member` left or was removed (this device included: it then reads nothing of the group).
    GroupMemberRemoved {
        group_id: String,
        member: String,
        removed_by: String,
    },
    /// The relay is ready (or no longer) to broadcast this device's messages to the group.
    GroupRelaySyncChanged {
        group_id: String,
        synced: bool,
    },
    /// A file transfer's event (`file_progress`, `file_received`, …).
    Media(Box<crate::driver::media::MediaEvent>),
    /// A terminal event (`message_delivered` / `message_failed`) committed before a crash cut
    /// off its dispatch, emitted again at the next start: its JSON as it was then, plus
    /// `"replayed": true`.
    Replayed {
        message_id: String,
        json: Value,
    },
}

impl From<Event> for ClientEvent {
    fn from(e: Event) -> Self {
        Self::Engine(Box::new(e))
    }
}

/// A received message's metadata as the app sees it, and its group: a group message's markers
/// are the runtime's (`docs/protocol.md#group-messages`), not the app's metadata.
pub fn app_metadata(
    mut metadata: BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Option<String>) {
    let group_id = metadata.remove(META_GROUP_ID);
    metadata.remove(META_GROUP_COPY);
    (metadata, group_id)
}

/// A received message's reply link, quote, mentions, extras and forward origin as the app sees
/// them (`replyTo`, `quote`, `mentions`, `extras`, `forwardInfo` in `js/index.d.ts`), on
/// `message_received` and on the durability hook's messages alike. The engine hands on only parts
/// that keep their rules (`docs/protocol.md#rich-messages`).
pub fn rich_fields(message: &Message) -> Map<String, Value> {
    let parts = RichParts::read(message).0;
    let rich = parts.rich.unwrap_or_default();
    let quote = rich.quote.map(|quote| {
        let mut v = json!({"text": quote.text});
        if let Some(sender) = quote.sender {
            v["sender"] = Value::String(sender);
        }
        if let Some(id) = quote.message_id {
            v["messageId"] = Value::String(id);
        }
        v
    });
    let forward_info = parts.forwarded_from.map(forward_info_json);
    Map::from_iter([
        ("replyTo".to_owned(), json!(parts.reply_to)),
        ("quote".to_owned(), json!(quote)),
        ("mentions".to_owned(), json!(rich.mentions)),
        ("extras".to_owned(), json!(rich.extras)),
        ("forwardInfo".to_owned(), json!(forward_info)),
    ])
}

pub fn level_name(level: DiagnosticLevel) -> &'static str {
    match level {
        DiagnosticLevel::Error => "error",
        DiagnosticLevel::Warn => "warn",
        DiagnosticLevel::Info => "info",
        DiagnosticLevel::Debug => "debug",
    }
}

impl ClientEvent {
    /// The message a terminal event settles: `message_delivered`, `message_failed`, or one of
    /// them replayed. `None` for every other event.
    pub fn terminal_message_id(&self) -> Option<&str> {
        match self {
            Self::Engine(e) => match &**e {
                Event::MessageDelivered { message_id, .. }
                | Event::MessageFailed { message_id, .. } => Some(message_id),
                _ => None,
            },
            Self::Replayed { message_id, .. } => Some(message_id),
            _ => None,
        }
    }

    /// The level of a diagnostic event, `None` for every other event.
    pub fn diagnostic_level(&self) -> Option<DiagnosticLevel> {
        match self {
            Self::Diagnostic { level, .. } => Some(*level),
            Self::Engine(e) => match &**e {
                Event::Diagnostic { level, .. } => Some(*level),
                _ => None,
            },
            _ => None,
        }
    }

    /// The engine's event this is, if it is one (a received message included).
    pub fn engine(&self) -> Option<&Event> {
        match self {
            Self::Engine(e) | Self::Received { event: e, .. } => Some(e),
            _ => None,
        }
    }

    pub fn to_json(&self) -> Value {
        match self {
            Self::Engine(e) => engine_event_json(e),
            Self::Received {
                event,
                known_sender,
            } => {
                let mut json = engine_event_json(event);
                json["knownSender"] = Value::Bool(*known_sender);
                json
            }
            Self::ConnectionRequestReceived {
                request_id,
                sender,
                note,
                implicit,
            } => json!({
                "type": "connection_request_received", "requestId": request_id, "sender": sender,
                "message": note, "implicit": implicit,
            }),
            Self::ConnectionAccepted { request_id, peer } => {
                json!({"type": "connection_accepted", "requestId": request_id, "peer": peer})
            }
            Self::ConnectionRejected { request_id, peer } => {
                json!({"type": "connection_rejected", "requestId": request_id, "peer": peer})
            }
            Self::ConnectionRequestCancelled { request_id, sender } => json!({
                "type": "connection_request_cancelled", "requestId": request_id, "sender": sender,
            }),
            Self::Replayed { json, .. } => {
                let mut json = json.clone();
                if let Some(fields) = json.as_object_mut() {
                    fields.insert("replayed".into(), Value::Bool(true));
                }
                json
            }
            Self::RelayStatusChanged {
                connected,
                authenticated,
            } => {
                json!({"type": "internet_status_changed", "connected": connected, "authenticated": authenticated})
            }
            Self::GatewayStatusChanged {
                connected,
                attached,
            } => {
                json!({"type": "gateway_status_changed", "connected": connected, "attached": attached})
            }
            Self::RelaySessionSuperseded { reason } => {
                json!({"type": "internet_session_superseded", "reason": reason})
            }
            Self::AuthFailed {
                reason,
                message,
                retry_in_ms,
            } => {
                json!({"type": "auth_failed", "reason": reason, "message": message, "retryInMs": retry_in_ms})
            }
            Self::RelayServerMessage { json } => {
                json!({"type": "internet_server_message", "json": json})
            }
            Self::GroupCreated {
                group_id,
                name,
                admin,
                members,
            } => json!({
                "type": "group_created", "groupId": group_id, "name": name, "admin": admin,
                "members": members,
            }),
            Self::GroupMemberAdded {
                group_id,
                member,
                added_by,
            } => json!({
                "type": "group_member_added", "groupId": group_id, "member": member,
                "addedBy": added_by,
            }),
            Self::GroupMemberRemoved {
                group_id,
                member,
                removed_by,
            } => json!({
                "type": "group_member_removed", "groupId": group_id, "member": member,
                "removedBy": removed_by,
            }),
            Self::Media(event) => event.to_json(),
            Self::GroupRelaySyncChanged { group_id, synced } => json!({
                "type": "group_relay_sync_changed", "groupId": group_id, "synced": synced,
            }),
            Self::IdentityReady { address } => {
                json!({"type": "identity_ready", "address": address})
            }
            Self::Diagnostic {
                level,
                message,
                target,
            } => {
                json!({"type": "diagnostic", "level": level_name(*level), "message": message, "target": target})
            }
        }
    }
}

fn engine_event_json(e: &Event) -> Value {
    match e {
        Event::MessageSent {
            message_id,
            recipient,
            priority,
            transport,
            attempt,
        } => json!({
            "type": "message_sent", "messageId": message_id, "recipient": recipient,
            "priority": priority.as_str(), "transport": transport, "attempt": attempt,
        }),
        Event::MessageDeferred {
            message_id,
            recipient,
            reason,
            retry_count,
            next_retry_at,
        } => json!({
            "type": "message_deferred", "messageId": message_id, "recipient": recipient,
            "reason": reason, "retryCount": retry_count, "nextRetryAt": next_retry_at,
        }),
        Event::MessageStored {
            message_id,
            recipient,
        } => json!({
            "type": "message_stored", "messageId": message_id, "recipient": recipient,
        }),
        Event::MessageUndeliverable {
            message_id,
            recipient,
            reason_code,
            reason,
            file_id,
        } => {
            let mut v = json!({
                "type": "message_undeliverable", "messageId": message_id, "recipient": recipient,
                "reasonCode": reason_code.as_str(), "reason": reason,
            });
            if let Some(file_id) = file_id {
                v["fileId"] = Value::String(file_id.clone());
            }
            v
        }
        Event::MessageRetrying {
            message_id,
            recipient,
            retry_count,
            next_retry_at,
        } => json!({
            "type": "message_retrying", "messageId": message_id, "recipient": recipient,
            "retryCount": retry_count, "nextRetryAt": next_retry_at,
        }),
        Event::MessageDelivered {
            message_id,
            recipient,
            latency_ms,
            hop_count,
            transport,
        } => json!({
            "type": "message_delivered", "messageId": message_id, "recipient": recipient,
            "latencyMs": latency_ms, "hopCount": hop_count, "transport": transport,
        }),
        // A connection request's terminal verdict has its own event
        // (`docs/delivery.md#connection-requests`).
        Event::MessageFailed {
            message_id,
            recipient,
            reason: FailReason::ConnectionRequestUndeliverable,
            ..
        } => json!({
            "type": "connection_request_undeliverable", "requestId": message_id,
            "recipient": recipient,
        }),
        Event::MessageFailed {
            message_id,
            recipient,
            reason,
            retry_count,
        } => json!({
            "type": "message_failed", "messageId": message_id, "recipient": recipient,
            "reason": reason.as_str(), "retryCount": retry_count,
        }),
        Event::MessageReceived {
            message,
            chat,
            sender,
            transport,
            encrypted,
        } => {
            let (metadata, group_id) = app_metadata(message.metadata.clone());
            let mut v = json!({
                "type": "message_received", "messageId": message.id, "sender": sender,
                "recipient": message.recipient, "chat": chat, "content": message.content,
                "contentType": message.content_type.as_str(), "timestamp": message.timestamp,
                "transport": transport, "hopCount": message.hop_count, "metadata": metadata,
                "encrypted": encrypted,
            });
            if let Some(group_id) = group_id {
                v["groupId"] = Value::String(group_id.clone());
            }
            if let Some(Value::String(b64)) = &message.binary_content {
                v["binaryContent"] = Value::String(b64.clone());
            }
            if let Some(fields) = v.as_object_mut() {
                fields.extend(rich_fields(message));
            }
            v
        }
        Event::GroupMessageSent {
            group_id,
            message_id,
            path,
            members,
        } => json!({
            "type": "group_message_sent", "groupId": group_id, "messageId": message_id,
            "path": path, "members": members,
        }),
        Event::GroupMessageDeliveryReport {
            group_id,
            message_id,
            delivered,
            pushed,
            missed_reissued,
        } => json!({
            "type": "group_message_delivery_report", "groupId": group_id,
            "messageId": message_id, "delivered": delivered, "pushed": pushed,
            "missedReissued": missed_reissued,
        }),
        Event::GroupMemberStatus {
            group_id,
            message_id,
            member,
            state,
        } => json!({
            "type": "group_message_member_status", "groupId": group_id,
            "messageId": message_id, "member": member, "status": state.as_str(),
        }),
        Event::InboundDrainCompleted { count } => {
            json!({"type": "inbound_drain_completed", "count": count})
        }
        Event::PresenceUpdated {
            peer_id,
            online,
            last_seen_ms,
        } => {
            let mut v = json!({"type": "presence_updated", "peerId": peer_id, "online": online});
            if let Some(at) = last_seen_ms {
                v["lastSeenMs"] = json!(at);
            }
            v
        }
        Event::NeighborDiscovered { peer_id, transport } => {
            json!({"type": "neighbor_discovered", "peerId": peer_id, "transport": transport})
        }
        Event::NeighborLost { peer_id, transport } => {
            json!({"type": "neighbor_lost", "peerId": peer_id, "transport": transport})
        }
        Event::SecurityWarning {
            peer_id,
            reason_code,
            reason,
        } => json!({
            "type": "security_warning", "peerId": peer_id, "reasonCode": reason_code, "reason": reason,
        }),
        Event::MessageDecryptionFailed {
            message_id,
            sender,
            code,
            reason,
        } => json!({
            "type": "message_decryption_failed", "messageId": message_id, "sender": sender,
            "code": code, "reason": reason,
        }),
        Event::Diagnostic { level, message } => json!({
            "type": "diagnostic", "level": level_name(*level), "message": message, "target": "courier_engine",
        }),
    }
}

/// `forwardInfo` as the application sees it, on a message or a file.
pub fn forward_info_json(origin: courier_proto::rich::ForwardInfo) -> Value {
    let mut v = json!({
        "messageId": origin.message_id, "sender": origin.sender,
        "timestamp": origin.timestamp, "forwardCount": origin.forward_count,
    });
    if let Some(chat) = origin.chat {
        v["chat"] = Value::String(chat);
    }
    v
}
