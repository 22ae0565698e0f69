//! The sealed form of an end-to-end message (`docs/protocol.md#sealed-messages`): what carriers
//! and the relay see of a message that travels in an MLS session.
//!
//! The whole message — content, metadata, media, reply links, and for a delivery ACK what it
//! acknowledges — is sealed as its JSON. Around the ciphertext goes an envelope with only what
//! routing needs: the id (the relay's dedup key), the sealing device's address as `sender`, the
//! recipient as the sender addressed it, the app id, priority, hop counters and `requires_ack`;
//! `content` is `__MLS_ENC__` and the base64 of the MLS message. A chat group's message has the
//! same envelope with `__MLS_GROUP__`; its Welcomes and commits travel as signed control frames
//! like a session's Welcome.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::{Address, ContentType, Message};

pub const MLS_ENC_PREFIX: &str = "__MLS_ENC__";
/// A message sealed in a chat group's MLS group.
pub const MLS_GROUP_PREFIX: &str = "__MLS_GROUP__";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealedError {
    #[error("the sealed payload is not base64")]
    Base64,
    #[error("the envelope's sender {0:?} is not an address")]
    SenderNotAnAddress(String),
    #[error("the sealed message does not decode: {0}")]
    Inner(String),
    #[error("the sealed message's {field} differs from its envelope's")]
    Mismatch { field: &'static str },
}

/// The envelope of `inner`, sealed by `sender` into `ciphertext` in a session.
pub fn envelope(inner: &Message, sender: &Address, ciphertext: &[u8]) -> Message {
    envelope_with(MLS_ENC_PREFIX, inner, sender, ciphertext)
}

/// The envelope of `inner`, sealed by `sender` into `ciphertext` in a chat group.
pub fn group_envelope(inner: &Message, sender: &Address, ciphertext: &[u8]) -> Message {
    envelope_with(MLS_GROUP_PREFIX, inner, sender, ciphertext)
}

fn envelope_with(prefix: &str, inner: &Message, sender: &Address, ciphertext: &[u8]) -> Message {
    Message {
        id: inner.id.clone(),
        sender: sender.to_string(),
        recipient: inner.recipient.clone(),
        app_id: inner.app_id.clone(),
        priority: inner.priority,
        ttl: inner.ttl,
        hop_count: inner.hop_count,
        timestamp: 0,
        lamport_clock: 0,
        content_type: ContentType::Text,
        content: prefixed(prefix, ciphertext),
        metadata: BTreeMap::new(),
        requires_ack: inner.requires_ack,
        reply_to_msg: None,
        rich: None,
        binary_content: None,
        media_metadata: None,
        forwarded_from: None,
        reply_context: None,
        encrypted: None,
    }
}

/// The signed control frames that set a session up (`docs/protocol.md#session-setup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionFrame {
    /// `__MLS_KEY_PKG__`: the sender's key package, for the recipient to start a session with.
    KeyPackage,
    /// `__MLS_WELCOME__`: the Welcome into a session the sender started.
    Welcome,
}

impl SessionFrame {
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::KeyPackage => "__MLS_KEY_PKG__",
            Self::Welcome => "__MLS_WELCOME__",
        }
    }

    /// The unsigned frame `id` of app `app_id` from `sender` to `recipient` carrying `bytes`,
    /// made at `at`. Nobody waits for an answer to it; the caller signs it as a control frame.
    pub fn message(
        self,
        id: String,
        app_id: &str,
        sender: &Address,
        recipient: &Address,
        bytes: &[u8],
        at: u64,
    ) -> Message {
        unanswered_control(self.prefix(), id, app_id, sender, recipient, bytes, at)
    }

    /// Which session frame `content` is, and the bytes it carries.
    pub fn parse(content: &str) -> Option<(Self, Result<Vec<u8>, SealedError>)> {
        parse_kind([Self::KeyPackage, Self::Welcome], Self::prefix, content)
    }
}

/// The signed control frames that change a chat group's MLS group; only its admin sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupFrame {
    /// `__GRP_WELCOME__`: the Welcome into the group, for the members a commit added.
    Welcome,
    /// `__GRP_COMMIT__`: a commit, for the members it leaves in the group and those it removed.
    Commit,
}

impl GroupFrame {
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::Welcome => "__GRP_WELCOME__",
            Self::Commit => "__GRP_COMMIT__",
        }
    }

    /// The `content` of the frame carrying `bytes`. It travels as a signed control frame
    /// through the outbox, one per member, with the whole delivery ladder.
    pub fn content(self, bytes: &[u8]) -> String {
        prefixed(self.prefix(), bytes)
    }

    /// Which group frame `content` is, and the bytes it carries.
    pub fn parse(content: &str) -> Option<(Self, Result<Vec<u8>, SealedError>)> {
        parse_kind([Self::Welcome, Self::Commit], Self::prefix, content)
    }
}

fn prefixed(prefix: &str, bytes: &[u8]) -> String {
    let mut content = String::with_capacity(prefix.len() + bytes.len().div_ceil(3) * 4);
    content.push_str(prefix);
    base64::engine::general_purpose::STANDARD.encode_string(bytes, &mut content);
    content
}

fn unanswered_control(
    prefix: &str,
    id: String,
    app_id: &str,
    sender: &Address,
    recipient: &Address,
    bytes: &[u8],
    at: u64,
) -> Message {
    let mut message = crate::control::control_frame(
        id,
        app_id,
        &sender.to_string(),
        &recipient.to_string(),
        prefixed(prefix, bytes),
        at,
    );
    message.requires_ack = false;
    message
}

fn parse_kind<K: Copy, const N: usize>(
    kinds: [K; N],
    prefix: fn(K) -> &'static str,
    content: &str,
) -> Option<(K, Result<Vec<u8>, SealedError>)> {
    kinds.into_iter().find_map(|kind| {
        let payload = content.strip_prefix(prefix(kind))?;
        Some((kind, decode(payload)))
    })
}

fn decode(payload: &str) -> Result<Vec<u8>, SealedError> {
    base64::engine::general_purpose::STANDARD
        .decode(payload)
        .map_err(|_| SealedError::Base64)
}

/// The MLS message inside `envelope` and the address that sealed it, when it is sealed in a
/// session at all.
pub fn sealed_payload(envelope: &Message) -> Option<Result<(Address, Vec<u8>), SealedError>> {
    payload_with(MLS_ENC_PREFIX, envelope)
}

/// The MLS message inside `envelope` and the address that sealed it, when it is sealed in a
/// chat group.
pub fn group_payload(envelope: &Message) -> Option<Result<(Address, Vec<u8>), SealedError>> {
    payload_with(MLS_GROUP_PREFIX, envelope)
}

fn payload_with(
    prefix: &str,
    envelope: &Message,
) -> Option<Result<(Address, Vec<u8>), SealedError>> {
    let payload = envelope.content.strip_prefix(prefix)?;
    Some((|| {
        let sender = Address::parse(&envelope.sender)
            .map_err(|_| SealedError::SenderNotAnAddress(envelope.sender.clone()))?;
        Ok((sender, decode(payload)?))
    })())
}

/// The message `plaintext` holds, bound to its envelope: the same id and recipient, and — but
/// for a delivery ACK, whose `sender` is what the acknowledged message was addressed to — the
/// same sender. Hop counters are the envelope's: carriers count them on the outside.
pub fn open_envelope(envelope: &Message, plaintext: &[u8]) -> Result<Message, SealedError> {
    let text = std::str::from_utf8(plaintext).map_err(|e| SealedError::Inner(e.to_string()))?;
    let mut inner = Message::decode(text).map_err(|e| SealedError::Inner(e.to_string()))?;
    if inner.id != envelope.id {
        return Err(SealedError::Mismatch { field: "id" });
    }
    if inner.recipient != envelope.recipient {
        return Err(SealedError::Mismatch { field: "recipient" });
    }
    if inner.ack_for().is_none() && inner.sender != envelope.sender {
        return Err(SealedError::Mismatch { field: "sender" });
    }
    inner.ttl = envelope.ttl;
    inner.hop_count = envelope.hop_count;
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdentityKey, Priority};

    fn message(sender: &str) -> Message {
        Message {
            id: "0b7c8f0e-3f43-4c52-9d0e-2f1f5b8e9a01".into(),
            sender: sender.into(),
            recipient: "bob".into(),
            app_id: "chat".into(),
            priority: Priority::High,
            ttl: 9,
            hop_count: 1,
            timestamp: 1_700_000_000_000,
            lamport_clock: 7,
            content_type: ContentType::Image,
            content: "the secret".into(),
            metadata: BTreeMap::from([("k".into(), "private".into())]),
            requires_ack: true,
            reply_to_msg: Some("earlier".into()),
            rich: Some(serde_json::json!({"mentions": ["carol"], "extras": {"note": "hidden"}})),
            binary_content: None,
            media_metadata: None,
            forwarded_from: Some(serde_json::json!({
                "message_id": "m-0", "sender": "dave", "timestamp": 1, "forward_count": 1
            })),
            reply_context: None,
            encrypted: None,
        }
    }

    #[test]
    fn the_envelope_shows_only_routing_and_opens_to_the_whole_message() {
        let alice = IdentityKey::from_seed([1; 32]).address();
        let inner = message(&alice.to_string());
        let outer = envelope(&inner, &alice, b"ciphertext bytes");
        let wire = outer.encode();
        for secret in [
            "the secret",
            "private",
            "earlier",
            "image",
            "carol",
            "hidden",
            "dave",
        ] {
            assert!(!wire.contains(secret), "{secret} is visible");
        }
        let (sealed_by, bytes) = sealed_payload(&outer).unwrap().unwrap();
        assert_eq!(
            (sealed_by, bytes.as_slice()),
            (alice, &b"ciphertext bytes"[..])
        );
        let opened = open_envelope(&outer, inner.encode().as_bytes()).unwrap();
        assert_eq!(opened, inner);
        assert!(
            sealed_payload(&inner).is_none(),
            "plain content is not sealed"
        );
    }

    #[test]
    fn an_inner_message_that_disagrees_with_its_envelope_is_refused() {
        let alice = IdentityKey::from_seed([1; 32]).address();
        let inner = message(&alice.to_string());
        let outer = envelope(&inner, &alice, b"x");
        for (field, change) in [
            (
                "id",
                Box::new(|m: &mut Message| m.id = "other".into()) as Box<dyn Fn(&mut Message)>,
            ),
            (
                "recipient",
                Box::new(|m: &mut Message| m.recipient = "carol".into()),
            ),
            (
                "sender",
                Box::new(|m: &mut Message| m.sender = "mallory".into()),
            ),
        ] {
            let mut forged = inner.clone();
            change(&mut forged);
            assert_eq!(
                open_envelope(&outer, forged.encode().as_bytes()),
                Err(SealedError::Mismatch { field })
            );
        }
        // A delivery ACK names what the acknowledged message was addressed to.
        let ack = message("bob-account").ack(inner.id.clone(), 0, "internet");
        let ack = Message {
            id: inner.id.clone(),
            recipient: "bob".into(),
            ..ack
        };
        assert!(open_envelope(&outer, ack.encode().as_bytes()).is_ok());
    }

    #[test]
    fn a_bad_payload_or_sender_is_refused() {
        let mut outer = envelope(
            &message("x"),
            &IdentityKey::from_seed([1; 32]).address(),
            b"x",
        );
        outer.content = format!("{MLS_ENC_PREFIX}not base64!");
        assert_eq!(sealed_payload(&outer), Some(Err(SealedError::Base64)));
        outer.sender = "bob".into();
        assert_eq!(
            sealed_payload(&outer),
            Some(Err(SealedError::SenderNotAnAddress("bob".into())))
        );
    }

    #[test]
    fn group_frames_are_signature_gated_and_parse_back() {
        for kind in [GroupFrame::Welcome, GroupFrame::Commit] {
            let content = kind.content(b"mls bytes");
            assert!(crate::is_signature_gated(&content), "{kind:?}");
            assert_eq!(
                GroupFrame::parse(&content),
                Some((kind, Ok(b"mls bytes".to_vec())))
            );
            assert_eq!(SessionFrame::parse(&content), None);
        }
        assert_eq!(
            GroupFrame::parse("__GRP_COMMIT__not base64!"),
            Some((GroupFrame::Commit, Err(SealedError::Base64)))
        );
        assert_eq!(GroupFrame::parse("__MLS_WELCOME__AAAA"), None);
    }

    #[test]
    fn a_group_envelope_is_data_plane_and_only_a_group_payload() {
        let alice = IdentityKey::from_seed([1; 32]).address();
        let inner = message(&alice.to_string());
        let outer = group_envelope(&inner, &alice, b"group ciphertext");
        assert!(outer.content.starts_with(MLS_GROUP_PREFIX));
        assert!(!crate::is_signature_gated(&outer.content));
        assert!(!outer.encode().contains("the secret"));
        assert_eq!(
            group_payload(&outer),
            Some(Ok((alice, b"group ciphertext".to_vec())))
        );
        assert_eq!(sealed_payload(&outer), None, "not a session's");
        assert_eq!(
            group_payload(&envelope(&inner, &alice, b"x")),
            None,
            "a session's is not a group's"
        );
        assert_eq!(open_envelope(&outer, inner.encode().as_bytes()), Ok(inner));
    }
}
