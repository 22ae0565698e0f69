//! The end-to-end `Message` carried in `SendMessage.content` (`docs/protocol.md#message-json`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::ident::{validate_identifier, IdentError};
use crate::quote::quoted;

/// Reserved metadata keys (`docs/protocol.md#message-json`); applications may not set them.
pub const META_ACK_FOR: &str = "ack_for";
pub const META_ACK_HOP_COUNT: &str = "ack_hop_count";
pub const META_ACK_TRANSPORT: &str = "ack_transport";
/// On a group message (`docs/protocol.md#group-messages`): the group, and the logical id every
/// copy of it shares, in the clear so a receiver can tell a copy it already has before opening it.
pub const META_GROUP_ID: &str = "__group_id";
pub const META_GROUP_MESSAGE: &str = "__group_msg";
/// On a group message as a receiving runtime hands it on once opened: the id of the per-member
/// copy it came in, which is what the end-to-end ACK names. Absent for a relay broadcast copy.
pub const META_GROUP_COPY: &str = "__group_copy";
pub const RESERVED_METADATA_KEYS: &[&str] = &[
    META_ACK_FOR,
    META_ACK_HOP_COUNT,
    META_ACK_TRANSPORT,
    META_GROUP_ID,
    META_GROUP_MESSAGE,
    META_GROUP_COPY,
    "transport_preference",
    "original_content_type",
    "__ctrl_sig",
    "__ctrl_pk",
    "__ctrl_ts",
];

/// Delivery priority; on equal retry times the higher one is sent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Low,
    Medium,
    High,
    Critical,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Critical => "critical",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "low" => Some(Self::Low),
            "medium" => Some(Self::Medium),
            "high" => Some(Self::High),
            "critical" => Some(Self::Critical),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentType {
    Text,
    Image,
    Video,
    Audio,
    VoiceNote,
    VideoNote,
    File,
    FileChunk,
    Poll,
}

impl ContentType {
    /// Unknown names decode as `File` (`docs/protocol.md#message-json`).
    pub fn parse_lenient(s: &str) -> Self {
        match s {
            "text" => Self::Text,
            "image" => Self::Image,
            "video" => Self::Video,
            "audio" => Self::Audio,
            "voice_note" => Self::VoiceNote,
            "video_note" => Self::VideoNote,
            "file_chunk" => Self::FileChunk,
            "poll" => Self::Poll,
            _ => Self::File,
        }
    }

    /// Strict form for values an application passes in.
    pub fn parse(s: &str) -> Option<Self> {
        let parsed = Self::parse_lenient(s);
        (parsed != Self::File || s == "file").then_some(parsed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Image => "image",
            Self::Video => "video",
            Self::Audio => "audio",
            Self::VoiceNote => "voice_note",
            Self::VideoNote => "video_note",
            Self::File => "file",
            Self::FileChunk => "file_chunk",
            Self::Poll => "poll",
        }
    }
}

impl<'de> Deserialize<'de> for ContentType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Self::parse_lenient(&s))
    }
}

fn clamp_lamport<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(u64::deserialize(d)?.min(i64::MAX as u64))
}

fn default_true() -> bool {
    true
}

/// One end-to-end message. `reply_to_msg` is always emitted (`null` when none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub id: String,
    pub sender: String,
    pub recipient: String,
    pub app_id: String,
    pub priority: Priority,
    pub ttl: u8,
    pub hop_count: u8,
    pub timestamp: u64,
    #[serde(deserialize_with = "clamp_lamport")]
    pub lamport_clock: u64,
    pub content_type: ContentType,
    pub content: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default = "default_true")]
    pub requires_ack: bool,
    #[serde(default)]
    pub reply_to_msg: Option<String>,
    /// A quote, mentions and app extras (`docs/protocol.md#rich-messages`), as the wire has
    /// them: a receiver reads them with [`RichParts::read`](crate::rich::RichParts::read), which
    /// drops a malformed part rather than the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rich: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_content: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_metadata: Option<Value>,
    /// Where a forward first came from (`docs/protocol.md#rich-messages`), read like `rich`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_from: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_context: Option<Value>,
    /// `Some(false)` on a message its sender sent in the clear by choice (plaintext mode,
    /// `docs/protocol.md#message-json`). A receiver never believes `Some(true)`: whether a message
    /// was sealed is what it had to open, not what it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("not a valid message: {0}")]
    Json(String),
    #[error("field {field} {error}")]
    Identifier {
        field: &'static str,
        error: IdentError,
    },
}

impl Message {
    /// Parses and validates a message received from a peer.
    pub fn decode(text: &str) -> Result<Self, MessageError> {
        // serde quotes the offending value, which the peer wrote.
        let m: Self =
            serde_json::from_str(text).map_err(|e| MessageError::Json(quoted(&e.to_string())))?;
        m.validate()?;
        Ok(m)
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("messages always serialize")
    }

    fn validate(&self) -> Result<(), MessageError> {
        for (field, value) in [
            ("id", &self.id),
            ("sender", &self.sender),
            ("recipient", &self.recipient),
            ("app_id", &self.app_id),
        ] {
            validate_identifier(value)
                .map_err(|error| MessageError::Identifier { field, error })?;
        }
        Ok(())
    }

    /// The id this message acknowledges, when it is a delivery ACK
    /// (`docs/protocol.md#delivery-ack`).
    pub fn ack_for(&self) -> Option<&str> {
        self.metadata.get(META_ACK_FOR).map(String::as_str)
    }

    /// The delivery ACK for this message, sent by its recipient (`docs/protocol.md#delivery-ack`).
    /// `id` is the ACK's own id; `now_ms` its timestamp.
    pub fn ack(&self, id: String, now_ms: u64, transport: &str) -> Message {
        let mut metadata = BTreeMap::new();
        metadata.insert(META_ACK_FOR.to_owned(), self.id.clone());
        metadata.insert(META_ACK_HOP_COUNT.to_owned(), self.hop_count.to_string());
        metadata.insert(META_ACK_TRANSPORT.to_owned(), transport.to_owned());
        Message {
            id,
            sender: self.recipient.clone(),
            recipient: self.sender.clone(),
            app_id: self.app_id.clone(),
            priority: Priority::Low,
            ttl: self.ttl,
            hop_count: 0,
            timestamp: now_ms,
            lamport_clock: 0,
            content_type: ContentType::Text,
            content: String::new(),
            metadata,
            requires_ack: false,
            reply_to_msg: None,
            rich: None,
            binary_content: None,
            media_metadata: None,
            forwarded_from: None,
            reply_context: None,
            encrypted: None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_peer_cannot_smuggle_a_megabyte_or_a_forged_line_into_a_decode_error() {
        let mut value = serde_json::to_value(sample()).unwrap();
        // serde quotes an unknown variant's text in its error.
        value["priority"] = format!("x\nERROR forged\u{1b}[2J{}", "y".repeat(1 << 20)).into();
        let err = Message::decode(&value.to_string()).unwrap_err();
        let MessageError::Json(detail) = &err else {
            panic!("{err:?}")
        };
        assert!(
            detail.len() <= crate::quote::MAX_QUOTED_BYTES,
            "{} bytes",
            detail.len()
        );
        assert!(!detail.chars().any(char::is_control), "{detail:?}");
    }

    pub(crate) fn sample() -> Message {
        Message {
            id: "m1".into(),
            sender: "alice".into(),
            recipient: "bob".into(),
            app_id: "chat".into(),
            priority: Priority::High,
            ttl: 8,
            hop_count: 1,
            timestamp: 10,
            lamport_clock: 3,
            content_type: ContentType::Text,
            content: "hi".into(),
            metadata: BTreeMap::new(),
            requires_ack: true,
            reply_to_msg: None,
            rich: None,
            binary_content: None,
            media_metadata: None,
            forwarded_from: None,
            reply_context: None,
            encrypted: None,
        }
    }

    #[test]
    fn round_trip_always_emits_reply_to_msg() {
        let m = sample();
        let text = m.encode();
        assert!(text.contains("\"reply_to_msg\":null"));
        assert_eq!(Message::decode(&text).unwrap(), m);
    }

    #[test]
    fn lenient_content_type_strict_priority_and_clamped_lamport() {
        let text = sample()
            .encode()
            .replace("\"text\"", "\"hologram\"")
            .replace(
                "\"lamport_clock\":3",
                "\"lamport_clock\":18446744073709551615",
            );
        let m = Message::decode(&text).unwrap();
        assert_eq!(m.content_type, ContentType::File);
        assert_eq!(m.lamport_clock, i64::MAX as u64);
        assert!(Message::decode(&sample().encode().replace("\"high\"", "\"urgent\"")).is_err());
        assert!(Message::decode(
            &sample()
                .encode()
                .replace("\"sender\":\"alice\"", "\"sender\":\"\"")
        )
        .is_err());
    }

    #[test]
    fn ack_swaps_parties_and_names_the_message() {
        let ack = sample().ack("a1".into(), 99, "internet");
        assert_eq!(ack.sender, "bob");
        assert_eq!(ack.recipient, "alice");
        assert_eq!(ack.ack_for(), Some("m1"));
        assert!(!ack.requires_ack);
        assert_eq!(ack.metadata[META_ACK_HOP_COUNT], "1");
    }
}
