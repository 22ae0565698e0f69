//! Relay wire frames (`docs/protocol.md#frame-reference`). One frame is one UTF-8 JSON object with
//! a PascalCase `type`; unknown fields are ignored and `null` reads as an absent optional field.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::key_package::{KeyPackage, KeyPackageBatch};
use crate::limits::MAX_FRAME_BYTES;
use crate::quote::quoted;
use crate::Address;

/// Frames a client sends to the relay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ClientFrame {
    Authenticate {
        token: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_capabilities: Option<Vec<String>>,
    },
    DeclareAddress {
        address: String,
        public_key: String,
        signature: String,
    },
    SendMessage {
        recipient: String,
        content: String,
        message_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to_msg: Option<String>,
    },
    Ack {
        seq: u64,
    },
    AckUpTo {
        seq: u64,
    },
    CheckPresence {
        username: String,
    },
    WatchPresence {
        users: Vec<String>,
    },
    UnwatchPresence {
        users: Vec<String>,
    },
    CreateGroup {
        group_id: String,
        name: String,
    },
    AddGroupMember {
        group_id: String,
        username: String,
    },
    RemoveGroupMember {
        group_id: String,
        username: String,
    },
    LeaveGroup {
        group_id: String,
    },
    SendGroupMessage {
        group_id: String,
        content: String,
        message_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to_msg: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forward_info: Option<Value>,
    },
    /// \[ext\] `key_directory_v1` (`docs/protocol.md#key-package-directory`): stores key packages
    /// for the connection's declared address; with neither field it only asks what is held.
    PublishKeyPackages {
        packages: KeyPackageBatch,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_resort: Option<KeyPackage>,
    },
    /// \[ext\] `key_directory_v1`: takes one key package of `address`.
    FetchKeyPackage {
        address: Address,
    },
}

impl ClientFrame {
    pub const TYPES: &'static [&'static str] = &[
        "Authenticate",
        "DeclareAddress",
        "SendMessage",
        "Ack",
        "AckUpTo",
        "CheckPresence",
        "WatchPresence",
        "UnwatchPresence",
        "CreateGroup",
        "AddGroupMember",
        "RemoveGroupMember",
        "LeaveGroup",
        "SendGroupMessage",
        "PublishKeyPackages",
        "FetchKeyPackage",
    ];

    /// Decodes a frame read by the relay.
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        decode_tagged(text, Self::TYPES)
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("client frames always serialize")
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Authenticate { .. } => "Authenticate",
            Self::DeclareAddress { .. } => "DeclareAddress",
            Self::SendMessage { .. } => "SendMessage",
            Self::Ack { .. } => "Ack",
            Self::AckUpTo { .. } => "AckUpTo",
            Self::CheckPresence { .. } => "CheckPresence",
            Self::WatchPresence { .. } => "WatchPresence",
            Self::UnwatchPresence { .. } => "UnwatchPresence",
            Self::CreateGroup { .. } => "CreateGroup",
            Self::AddGroupMember { .. } => "AddGroupMember",
            Self::RemoveGroupMember { .. } => "RemoveGroupMember",
            Self::LeaveGroup { .. } => "LeaveGroup",
            Self::SendGroupMessage { .. } => "SendGroupMessage",
            Self::PublishKeyPackages { .. } => "PublishKeyPackages",
            Self::FetchKeyPackage { .. } => "FetchKeyPackage",
        }
    }
}

/// `MessageSent.disposition` \[ext\]: where the relay put the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Disposition {
    /// The recipient is connected; the frame is queued to its socket.
    Live,
    /// The recipient is offline; the relay's mailbox holds the frame.
    Stored,
}

/// `MessageSent`'s two spellings of one fact. Ours is `disposition` \[ext\]; a relay written to the
/// published contract says custody as `stored: true` (with `pushed: true`) and has no
/// `disposition`. Our relay writes both for a stored frame, so either kind of client reads it;
/// a live one carries `disposition` only. Read: `disposition` when present, else `stored: true`
/// is custody; a frame whose two spellings disagree is invalid rather than guessed at.
mod custody {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Disposition;

    #[derive(Serialize)]
    struct Written {
        #[serde(skip_serializing_if = "Option::is_none")]
        disposition: Option<Disposition>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pushed: Option<bool>,
        #[serde(skip_serializing_if = "Option::is_none")]
        stored: Option<bool>,
    }

    /// `pushed` is not read: it adds nothing to `stored` for a sender.
    #[derive(Deserialize)]
    struct Read {
        #[serde(default)]
        disposition: Option<Disposition>,
        #[serde(default)]
        stored: Option<bool>,
    }

    pub fn serialize<S: Serializer>(
        disposition: &Option<Disposition>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let custody = (*disposition == Some(Disposition::Stored)).then_some(true);
        Written {
            disposition: *disposition,
            pushed: custody,
            stored: custody,
        }
        .serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Disposition>, D::Error> {
        let Read {
            disposition,
            stored,
        } = Read::deserialize(deserializer)?;
        match (disposition, stored) {
            (Some(Disposition::Live), Some(true)) | (Some(Disposition::Stored), Some(false)) => {
                Err(D::Error::custom("`disposition` and `stored` disagree"))
            }
            (Some(disposition), _) => Ok(Some(disposition)),
            (None, Some(true)) => Ok(Some(Disposition::Stored)),
            (None, Some(false) | None) => Ok(None),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitInfo {
    pub burst: u32,
    pub per_sec: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxInfo {
    pub max_messages: u64,
    pub max_bytes: u64,
    pub ttl_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissedMember {
    pub username: String,
    pub reason: String,
}

/// Frames the relay sends to a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum RelayFrame {
    Authenticated {
        user_id: String,
        username: String,
        #[serde(default)]
        capabilities: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        address_challenge: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rate_limit: Option<RateLimitInfo>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mailbox: Option<MailboxInfo>,
    },
    AuthError {
        reason: String,
    },
    AddressDeclared {
        address: String,
    },
    AddressError {
        reason: String,
    },
    MessageSent {
        message_id: String,
        recipient: String,
        timestamp: u64,
        /// On the wire as our `disposition` and, for custody, the published `pushed: true,
        /// stored: true` too; read from either (`custody`). `None`: the relay said neither.
        #[serde(flatten, with = "custody")]
        disposition: Option<Disposition>,
    },
    DeliveryError {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
        recipient: String,
        reason: String,
    },
    MessageReceived {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        sender: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_account: Option<String>,
        content: String,
        message_id: String,
        timestamp: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to_msg: Option<String>,
    },
    DrainComplete {
        count: u64,
    },
    #[serde(alias = "PresenceStatusWithLastSeen")]
    PresenceStatus {
        user_id: String,
        online: bool,
        /// Epoch ms; published relays may send an ISO-8601 string instead.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_seen: Option<Value>,
    },
    RateLimited {
        retry_after_ms: u64,
        frame_type: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
    },
    SessionSuperseded {
        reason: String,
    },
    GroupCreated {
        group_id: String,
        name: String,
    },
    GroupMemberAdded {
        group_id: String,
        user_id: String,
        added_by: String,
    },
    GroupMemberRemoved {
        group_id: String,
        user_id: String,
        removed_by: String,
    },
    GroupError {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
    },
    GroupMessageReceived {
        group_id: String,
        sender: String,
        content: String,
        message_id: String,
        timestamp: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to_msg: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forward_info: Option<Value>,
    },
    GroupMessageSent {
        group_id: String,
        message_id: String,
        #[serde(default)]
        delivered: Vec<String>,
        #[serde(default)]
        pushed: Vec<String>,
        #[serde(default)]
        missed: Vec<MissedMember>,
        timestamp: u64,
    },
    Error {
        code: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame_type: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// \[ext\] `key_directory_v1` (`docs/protocol.md#key-package-directory`): the answer to
    /// `PublishKeyPackages`, counting what the relay now holds for the address.
    KeyPackagesPublished {
        available: u32,
        last_resort: bool,
    },
    /// \[ext\] `key_directory_v1`: the package `FetchKeyPackage` took; a one-time one is never
    /// handed out again, a last-resort one is.
    KeyPackage {
        address: Address,
        package: KeyPackage,
        last_resort: bool,
    },
    /// \[ext\] `key_directory_v1`: the relay holds no package of `address`.
    KeyPackageUnavailable {
        address: Address,
    },
}

impl RelayFrame {
    pub const TYPES: &'static [&'static str] = &[
        "Authenticated",
        "AuthError",
        "AddressDeclared",
        "AddressError",
        "MessageSent",
        "DeliveryError",
        "MessageReceived",
        "DrainComplete",
        "PresenceStatus",
        "PresenceStatusWithLastSeen",
        "RateLimited",
        "SessionSuperseded",
        "GroupCreated",
        "GroupMemberAdded",
        "GroupMemberRemoved",
        "GroupError",
        "GroupMessageReceived",
        "GroupMessageSent",
        "Error",
        "KeyPackagesPublished",
        "KeyPackage",
        "KeyPackageUnavailable",
    ];

    /// Decodes a frame read by a client.
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        decode_tagged(text, Self::TYPES)
    }

    /// The `type` the frame is written with.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Authenticated { .. } => "Authenticated",
            Self::AuthError { .. } => "AuthError",
            Self::AddressDeclared { .. } => "AddressDeclared",
            Self::AddressError { .. } => "AddressError",
            Self::MessageSent { .. } => "MessageSent",
            Self::DeliveryError { .. } => "DeliveryError",
            Self::MessageReceived { .. } => "MessageReceived",
            Self::DrainComplete { .. } => "DrainComplete",
            Self::PresenceStatus { .. } => "PresenceStatus",
            Self::RateLimited { .. } => "RateLimited",
            Self::SessionSuperseded { .. } => "SessionSuperseded",
            Self::GroupCreated { .. } => "GroupCreated",
            Self::GroupMemberAdded { .. } => "GroupMemberAdded",
            Self::GroupMemberRemoved { .. } => "GroupMemberRemoved",
            Self::GroupError { .. } => "GroupError",
            Self::GroupMessageReceived { .. } => "GroupMessageReceived",
            Self::GroupMessageSent { .. } => "GroupMessageSent",
            Self::Error { .. } => "Error",
            Self::KeyPackagesPublished { .. } => "KeyPackagesPublished",
            Self::KeyPackage { .. } => "KeyPackage",
            Self::KeyPackageUnavailable { .. } => "KeyPackageUnavailable",
        }
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("relay frames always serialize")
    }

    /// An `Error` frame with only a code and the offending frame type.
    pub fn error(code: &str, frame_type: Option<&str>) -> Self {
        Self::Error {
            code: code.to_owned(),
            frame_type: frame_type.map(str::to_owned),
            message_id: None,
            detail: None,
        }
    }
}

/// Why a text message is not a usable frame; the three cases get different answers
/// (`docs/protocol.md#transport`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not a JSON object, or no string `type`.
    #[error("malformed frame")]
    Malformed,
    /// A `type` this side does not know; carries the type for the answer.
    #[error("unknown frame type {0:?}")]
    UnknownType(String),
    /// A known type with a missing, ill-typed or oversized field.
    #[error("invalid {frame_type} frame: {detail}")]
    Invalid { frame_type: String, detail: String },
}

fn decode_tagged<T: serde::de::DeserializeOwned>(
    text: &str,
    known: &[&str],
) -> Result<T, DecodeError> {
    if text.len() > MAX_FRAME_BYTES {
        return Err(DecodeError::Malformed);
    }
    let value: Value = serde_json::from_str(text).map_err(|_| DecodeError::Malformed)?;
    let Some(object) = value.as_object() else {
        return Err(DecodeError::Malformed);
    };
    let Some(frame_type) = object.get("type").and_then(Value::as_str) else {
        return Err(DecodeError::Malformed);
    };
    if !known.contains(&frame_type) {
        return Err(DecodeError::UnknownType(quoted(frame_type)));
    }
    let frame_type = frame_type.to_owned();
    serde_json::from_value(value).map_err(|e| DecodeError::Invalid {
        frame_type,
        // serde quotes the offending value, which may be most of a 1 MiB frame.
        detail: quoted(&e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_KEY_PACKAGES_PER_FRAME, MAX_KEY_PACKAGE_BYTES};

    #[test]
    fn a_relay_frame_names_the_type_it_is_written_with() {
        let frames = [
            RelayFrame::error("malformed", None),
            RelayFrame::DrainComplete { count: 1 },
            RelayFrame::PresenceStatus {
                user_id: "bob".into(),
                online: true,
                last_seen: None,
            },
            RelayFrame::SessionSuperseded {
                reason: "new_session".into(),
            },
        ];
        for frame in frames {
            let written: Value = serde_json::from_str(&frame.encode()).unwrap();
            assert_eq!(written["type"], frame.type_name());
            assert!(RelayFrame::TYPES.contains(&frame.type_name()));
        }
    }

    #[test]
    fn decode_distinguishes_malformed_unknown_and_invalid() {
        assert_eq!(ClientFrame::decode("[1]"), Err(DecodeError::Malformed));
        assert_eq!(
            ClientFrame::decode("{\"x\":1}"),
            Err(DecodeError::Malformed)
        );
        assert_eq!(
            ClientFrame::decode("{\"type\":5}"),
            Err(DecodeError::Malformed)
        );
        assert_eq!(
            ClientFrame::decode("{\"type\":\"Nope\"}"),
            Err(DecodeError::UnknownType("Nope".into()))
        );
        assert!(matches!(
            ClientFrame::decode("{\"type\":\"Ack\",\"seq\":\"x\"}"),
            Err(DecodeError::Invalid { .. })
        ));
    }

    #[test]
    fn what_a_decode_error_quotes_of_the_input_is_bounded() {
        let huge = "x".repeat(100_000);
        let text = serde_json::json!({"type": "Ack", "seq": huge}).to_string();
        match ClientFrame::decode(&text) {
            Err(DecodeError::Invalid { frame_type, detail }) => {
                assert_eq!(frame_type, "Ack");
                assert!(detail.starts_with("invalid type: string"), "{detail}");
                assert!(detail.len() <= 128, "{} bytes", detail.len());
            }
            other => panic!("{other:?}"),
        }
        let text = serde_json::json!({"type": huge}).to_string();
        assert_eq!(
            RelayFrame::decode(&text),
            Err(DecodeError::UnknownType("x".repeat(128)))
        );
    }

    #[test]
    fn null_reads_as_absent_and_unknown_fields_are_ignored() {
        let f = ClientFrame::decode(
            r#"{"type":"SendMessage","recipient":"bob","content":"{}","message_id":"m1","reply_to_msg":null,"extra":true}"#,
        )
        .unwrap();
        assert_eq!(
            f,
            ClientFrame::SendMessage {
                recipient: "bob".into(),
                content: "{}".into(),
                message_id: "m1".into(),
                reply_to_msg: None
            }
        );
    }

    const K1: &str = "off1qysluvwl5922yctzd0u9gpr06gn3k7ldfvgtwgvn";

    fn package(byte: u8, len: usize) -> KeyPackage {
        KeyPackage::new(vec![byte; len]).unwrap()
    }

    fn publish(packages: &[Value], last_resort: Option<&str>) -> Result<ClientFrame, DecodeError> {
        let mut frame = serde_json::json!({"type": "PublishKeyPackages", "packages": packages});
        if let Some(last_resort) = last_resort {
            frame["last_resort"] = last_resort.into();
        }
        ClientFrame::decode(&frame.to_string())
    }

    fn invalid(frame_type: &str, decoded: Result<impl std::fmt::Debug, DecodeError>) {
        match decoded {
            Err(DecodeError::Invalid { frame_type: t, .. }) => assert_eq!(t, frame_type),
            other => panic!("expected an invalid {frame_type}, got {other:?}"),
        }
    }

    #[test]
    fn key_directory_frames_round_trip_with_their_wire_spelling() {
        let address = Address::parse(K1).unwrap();
        let frames = [
            (
                ClientFrame::PublishKeyPackages {
                    packages: KeyPackageBatch::new(vec![package(1, 2), package(2, 1)]).unwrap(),
                    last_resort: Some(package(3, 3)),
                },
                serde_json::json!({"type": "PublishKeyPackages", "packages": ["AQE=", "Ag=="],
                    "last_resort": "AwMD"}),
            ),
            (
                ClientFrame::PublishKeyPackages {
                    packages: KeyPackageBatch::default(),
                    last_resort: None,
                },
                serde_json::json!({"type": "PublishKeyPackages", "packages": []}),
            ),
            (
                ClientFrame::FetchKeyPackage { address },
                serde_json::json!({"type": "FetchKeyPackage", "address": K1}),
            ),
        ];
        for (frame, json) in frames {
            assert_eq!(
                serde_json::from_str::<Value>(&frame.encode()).unwrap(),
                json
            );
            assert_eq!(ClientFrame::decode(&json.to_string()), Ok(frame));
        }
        let answers = [
            (
                RelayFrame::KeyPackagesPublished {
                    available: 7,
                    last_resort: true,
                },
                serde_json::json!({"type": "KeyPackagesPublished", "available": 7,
                    "last_resort": true}),
            ),
            (
                RelayFrame::KeyPackage {
                    address,
                    package: package(0xff, 1),
                    last_resort: false,
                },
                serde_json::json!({"type": "KeyPackage", "address": K1, "package": "/w==",
                    "last_resort": false}),
            ),
            (
                RelayFrame::KeyPackageUnavailable { address },
                serde_json::json!({"type": "KeyPackageUnavailable", "address": K1}),
            ),
        ];
        for (frame, json) in answers {
            assert_eq!(wire(&frame), json);
            assert_eq!(RelayFrame::decode(&json.to_string()), Ok(frame));
        }
        // `null` reads as no last-resort package.
        assert_eq!(
            ClientFrame::decode(
                r#"{"type":"PublishKeyPackages","packages":[],"last_resort":null}"#
            ),
            Ok(ClientFrame::PublishKeyPackages {
                packages: KeyPackageBatch::default(),
                last_resort: None
            })
        );
    }

    #[test]
    fn key_packages_out_of_bounds_make_the_frame_invalid() {
        let largest = crate::encoding::b64_encode(&[7; MAX_KEY_PACKAGE_BYTES]);
        let over = crate::encoding::b64_encode(&[7; MAX_KEY_PACKAGE_BYTES + 1]);
        let hundred = vec![Value::from("AQ=="); MAX_KEY_PACKAGES_PER_FRAME];
        match publish(&hundred, Some(&largest)).unwrap() {
            ClientFrame::PublishKeyPackages {
                packages,
                last_resort: Some(last_resort),
            } => {
                assert_eq!(packages.as_slice().len(), MAX_KEY_PACKAGES_PER_FRAME);
                assert_eq!(last_resort.as_bytes().len(), MAX_KEY_PACKAGE_BYTES);
            }
            other => panic!("{other:?}"),
        }
        let mut hundred_and_one = hundred.clone();
        hundred_and_one.push("AQ==".into());
        invalid("PublishKeyPackages", publish(&hundred_and_one, None));
        invalid("PublishKeyPackages", publish(&[over.clone().into()], None));
        invalid("PublishKeyPackages", publish(&[], Some(&over)));
        for bad in ["", "AQ", "AR==", "AQ==\n", "-_8=", "%%%%"] {
            invalid("PublishKeyPackages", publish(&[bad.into()], None));
            invalid("PublishKeyPackages", publish(&[], Some(bad)));
        }
        invalid("PublishKeyPackages", publish(&[Value::from(1)], None));
        invalid(
            "PublishKeyPackages",
            ClientFrame::decode(r#"{"type":"PublishKeyPackages","last_resort":"AQ=="}"#),
        );
        for bad in [
            "OFF1QYSLUVWL5922YCTZD0U9GPR06GN3K7LDFVGTWGVN",
            "off1x",
            "alice",
            "",
        ] {
            let text = serde_json::json!({"type": "FetchKeyPackage", "address": bad}).to_string();
            invalid("FetchKeyPackage", ClientFrame::decode(&text));
        }
        let text = serde_json::json!({"type": "KeyPackage", "address": K1, "package": over,
            "last_resort": false})
        .to_string();
        invalid("KeyPackage", RelayFrame::decode(&text));
    }

    #[test]
    fn presence_alias_and_round_trip() {
        let f = RelayFrame::decode(r#"{"type":"PresenceStatusWithLastSeen","user_id":"a","online":false,"last_seen":"2026-01-01T00:00:00Z"}"#).unwrap();
        assert!(matches!(
            f,
            RelayFrame::PresenceStatus { online: false, .. }
        ));
    }

    fn message_sent(disposition: Option<Disposition>) -> RelayFrame {
        RelayFrame::MessageSent {
            message_id: "m".into(),
            recipient: "bob".into(),
            timestamp: 5,
            disposition,
        }
    }

    fn wire(frame: &RelayFrame) -> Value {
        serde_json::from_str(&frame.encode()).unwrap()
    }

    #[test]
    fn custody_is_written_in_both_spellings_and_a_live_answer_in_ours_only() {
        let stored = message_sent(Some(Disposition::Stored));
        assert_eq!(
            wire(&stored),
            serde_json::json!({"type": "MessageSent", "message_id": "m", "recipient": "bob",
                "timestamp": 5, "disposition": "stored", "pushed": true, "stored": true})
        );
        let live = message_sent(Some(Disposition::Live));
        assert_eq!(
            wire(&live),
            serde_json::json!({"type": "MessageSent", "message_id": "m", "recipient": "bob",
                "timestamp": 5, "disposition": "live"})
        );
        for frame in [stored, live, message_sent(None)] {
            assert_eq!(RelayFrame::decode(&frame.encode()).unwrap(), frame);
        }
    }

    #[test]
    fn custody_is_read_from_either_spelling() {
        let decode = |fields: &str| {
            RelayFrame::decode(&format!(
                r#"{{"type":"MessageSent","message_id":"m","recipient":"bob","timestamp":5{fields}}}"#
            ))
        };
        let ours = decode(r#","disposition":"stored""#);
        let published = decode(r#","pushed":true,"stored":true"#);
        assert_eq!(ours, Ok(message_sent(Some(Disposition::Stored))));
        assert_eq!(published, Ok(message_sent(Some(Disposition::Stored))));
        assert_eq!(
            decode(r#","stored":true"#),
            Ok(message_sent(Some(Disposition::Stored)))
        );
        // The published contract's answer without custody, and one that says nothing.
        assert_eq!(
            decode(r#","pushed":true,"stored":false"#),
            Ok(message_sent(None))
        );
        assert_eq!(decode(r#","stored":null"#), Ok(message_sent(None)));
        assert_eq!(decode(""), Ok(message_sent(None)));
        assert_eq!(
            decode(r#","disposition":"live","pushed":false,"stored":false"#),
            Ok(message_sent(Some(Disposition::Live)))
        );
        for contradiction in [
            r#","disposition":"live","stored":true"#,
            r#","disposition":"stored","stored":false"#,
        ] {
            assert!(
                matches!(decode(contradiction), Err(DecodeError::Invalid { .. })),
                "{contradiction}"
            );
        }
        assert!(matches!(
            decode(r#","stored":"yes""#),
            Err(DecodeError::Invalid { .. })
        ));
    }
}
