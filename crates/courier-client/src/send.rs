//! What a send asks for, and the checks it passes before the engine sees it
//! (`docs/delivery.md#send-validation`): `sendMessage`, `sendGroupMessage` and `forwardMessage`
//! alike. A refused send changes nothing.

use std::collections::BTreeMap;

use courier_engine::SendRequest;
use courier_proto::limits::{is_reserved_content, MAX_CONTENT_BYTES};
use courier_proto::message::RESERVED_METADATA_KEYS;
use courier_proto::{
    validate_identifier, wire_id, Address, ContentType, ForwardInfo, Priority, Rich, RichParts,
};
use serde_json::{Map, Value};

use crate::driver;
use crate::error::ClientError;
use crate::event::app_metadata;
use crate::store::ReceivedMessage;

/// The quote a send carries is the wire's own type, its `message_id` still the app's id.
pub use courier_proto::Quote;

/// What the application passes to `sendMessage`, before validation.
#[derive(Debug, Clone, Default)]
pub struct SendInput {
    pub recipient: String,
    pub content: String,
    pub binary_content: Option<String>,
    pub binary_len: usize,
    pub id: Option<String>,
    pub priority: Option<String>,
    pub content_type: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub rich: RichInput,
}

/// `replyTo`, `quote`, `mentions` and `extras` as the application passed them
/// (`docs/protocol.md#rich-messages`). The ids are the app's: a message it received (its
/// `messageId`) or one it sent; the wire carries their wire ids.
#[derive(Debug, Clone, Default)]
pub struct RichInput {
    pub reply_to: Option<String>,
    pub quote: Option<Quote>,
    pub mentions: Vec<String>,
    pub extras: Option<Map<String, Value>>,
}

/// `forwardMessage(messageId, to, options)`, before validation.
#[derive(Debug, Clone)]
pub struct ForwardInput {
    /// The `messageId` this device saw the message under.
    pub message_id: String,
    /// An address (an account name in plaintext mode), or a group this device is in.
    pub to: String,
    pub id: Option<String>,
    pub priority: Option<String>,
}

/// Whether a send is held to the content cap: a direct message is; a group message is not,
/// since it is sealed at once and waits in no pre-session queue, and is bounded by the frame it
/// must fit instead (`docs/delivery.md#send-validation`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ContentCap {
    Applies,
    Exempt,
}

/// The checks of a send (`docs/delivery.md#send-validation`). `recipient` is the group's id for
/// a group message.
pub fn validate_send(input: SendInput, cap: ContentCap) -> Result<SendRequest, ClientError> {
    let invalid = |m: String| Err(ClientError::InvalidArgument(m));
    if let Err(e) = validate_identifier(&input.recipient) {
        return invalid(format!("recipient {e}"));
    }
    if let Some(id) = &input.id {
        if let Err(e) = validate_identifier(id) {
            return invalid(format!("options.id {e}"));
        }
    }
    let rich = rich_parts(input.rich)?;
    let rich_len = rich.rich.as_ref().map_or(0, Rich::encoded_len);
    let size = input.content.len() + input.binary_len + rich_len;
    if cap == ContentCap::Applies && size > MAX_CONTENT_BYTES {
        let what = match rich_len {
            0 => "content",
            _ => "content with its quote, mentions and extras",
        };
        return invalid(format!(
            "{what} is {size} bytes; the limit is {MAX_CONTENT_BYTES} (send larger content \
             with sendMedia)"
        ));
    }
    if is_reserved_content(&input.content) {
        return invalid("content starts with a prefix reserved for the engine".into());
    }
    let priority = match input.priority.as_deref() {
        None => Priority::Medium,
        Some(p) => match Priority::parse(p) {
            Some(p) => p,
            None => {
                return invalid(format!(
                    "options.priority must be 'low', 'medium', 'high' or 'critical', got {p:?}"
                ))
            }
        },
    };
    let content_type = match input.content_type.as_deref() {
        None => ContentType::Text,
        Some(t) => match ContentType::parse(t) {
            Some(ContentType::FileChunk) | None => {
                return invalid(format!(
                    "options.contentType {t:?} is not a message content type"
                ))
            }
            Some(t) => t,
        },
    };
    if let Some(key) = input
        .metadata
        .keys()
        .find(|k| RESERVED_METADATA_KEYS.contains(&k.as_str()))
    {
        return invalid(format!("options.metadata key {key:?} is reserved"));
    }
    Ok(SendRequest {
        id: input.id.unwrap_or_else(driver::mint_id),
        settled: None,
        recipient: input.recipient,
        content: input.content,
        content_type,
        priority,
        metadata: input.metadata,
        binary_content: input.binary_content,
        media: None,
        rich: Box::new(rich),
    })
}

/// With encryption a direct message goes to a device, and only an address names one.
pub fn check_direct_recipient(recipient: &str, encryption: bool) -> Result<(), ClientError> {
    if encryption && Address::parse(recipient).is_err() {
        return Err(ClientError::InvalidArgument(format!(
            "recipient {recipient:?} is not an off1 address: with encryption enabled messages go \
             to a device's address"
        )));
    }
    Ok(())
}

/// The app's rich options as the wire carries them: its ids mapped to wire ids, the rest checked.
fn rich_parts(input: RichInput) -> Result<RichParts, ClientError> {
    let app_id = |field: &str, id: String| match validate_identifier(&id) {
        Ok(()) => Ok(wire_id(&id)),
        Err(e) => Err(ClientError::InvalidArgument(format!("options.{field} {e}"))),
    };
    let reply_to = input.reply_to.map(|id| app_id("replyTo", id)).transpose()?;
    let quote = match input.quote {
        Some(quote) => Some(Quote {
            message_id: quote
                .message_id
                .map(|id| app_id("quote.messageId", id))
                .transpose()?,
            ..quote
        }),
        None => None,
    };
    let rich = Rich::new(quote, input.mentions, input.extras)
        .map_err(|e| ClientError::InvalidArgument(format!("options: {e}")))?;
    Ok(RichParts {
        reply_to,
        rich,
        forwarded_from: None,
    })
}

/// The send that forwards `received` (`docs/protocol.md#rich-messages`): its content, content
/// type, bytes, app metadata, quote, mentions and extras, to `forward.to`. It replies to nothing
/// there. The quote's id is a wire id already, which the send's mapping keeps: every wire id is
/// a UUID, and a UUID maps to itself.
pub fn forward_input(received: &ReceivedMessage, forward: ForwardInput) -> SendInput {
    let message = &received.message;
    let (metadata, _group) = app_metadata(message.metadata.clone());
    let rich = RichParts::read(message).0.rich.unwrap_or_default();
    let (binary_content, binary_len) = match &message.binary_content {
        Some(Value::String(b64)) => (Some(b64.clone()), base64_decoded_len(b64)),
        _ => (None, 0),
    };
    SendInput {
        recipient: forward.to,
        content: message.content.clone(),
        binary_content,
        binary_len,
        id: forward.id,
        priority: forward.priority,
        content_type: Some(message.content_type.as_str().to_owned()),
        metadata,
        rich: RichInput {
            reply_to: None,
            quote: rich.quote,
            mentions: rich.mentions,
            extras: rich.extras,
        },
    }
}

/// Where a forward of `received` says it first came from: the first origin of a message that
/// was itself forwarded, one forward further.
pub fn forward_origin(received: &ReceivedMessage) -> ForwardInfo {
    let message = &received.message;
    match RichParts::read(message).0.forwarded_from {
        Some(origin) => ForwardInfo {
            forward_count: origin.forward_count.saturating_add(1),
            ..origin
        },
        None => ForwardInfo {
            message_id: message.id.clone(),
            sender: received.sender.clone(),
            timestamp: message.timestamp,
            chat: Some(received.chat.clone()),
            forward_count: 1,
        },
    }
}

/// Bytes that base64 text `b64` stands for, as the content cap counts binary content.
fn base64_decoded_len(b64: &str) -> usize {
    let padding = b64.bytes().rev().take_while(|&b| b == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(padding)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn input(rich: RichInput) -> SendInput {
        SendInput {
            recipient: "bob".into(),
            content: "hello".into(),
            rich,
            ..SendInput::default()
        }
    }

    fn refused(input: SendInput) -> String {
        match validate_send(input, ContentCap::Applies) {
            Err(ClientError::InvalidArgument(m)) => m,
            other => panic!("expected ERR_INVALID_ARGUMENT, got {other:?}"),
        }
    }

    fn extras(value: Value) -> Option<Map<String, Value>> {
        value.as_object().cloned()
    }

    #[test]
    fn app_ids_go_on_the_wire_as_wire_ids() {
        let received = "6f1c2c39-6f5e-4f0a-9d4c-2b9e8f1e7a10";
        let req = validate_send(
            input(RichInput {
                reply_to: Some(received.into()),
                quote: Some(Quote {
                    text: "earlier".into(),
                    sender: Some("alice".into()),
                    message_id: Some("my-own-id".into()),
                }),
                mentions: vec!["carol".into()],
                extras: extras(json!({"thread": 7})),
            }),
            ContentCap::Applies,
        )
        .unwrap();
        assert_eq!(req.rich.reply_to.as_deref(), Some(received));
        let rich = req.rich.rich.unwrap();
        assert_eq!(rich.quote.unwrap().message_id, Some(wire_id("my-own-id")));
        assert_eq!(rich.mentions, ["carol"]);
        assert_eq!(req.rich.forwarded_from, None);
    }

    #[test]
    fn rich_options_are_checked() {
        let message = refused(input(RichInput {
            reply_to: Some(String::new()),
            ..RichInput::default()
        }));
        assert_eq!(message, "options.replyTo is empty");
        let message = refused(input(RichInput {
            mentions: vec!["bob".into(), "bob".into()],
            ..RichInput::default()
        }));
        assert_eq!(message, "options: mentions names \"bob\" more than once");
        let message = refused(input(RichInput {
            quote: Some(Quote {
                text: "x".into(),
                sender: None,
                message_id: Some("a/b".into()),
            }),
            ..RichInput::default()
        }));
        assert_eq!(message, "options.quote.messageId contains '/', '\\' or ':'");
        let message = refused(input(RichInput {
            extras: extras(json!({"k": "x".repeat(40_000)})),
            ..RichInput::default()
        }));
        assert_eq!(
            message,
            "options: quote, mentions and extras are 40019 bytes serialized; the limit is 32768"
        );
    }

    #[test]
    fn the_content_cap_counts_the_rich_parts() {
        let extras_len = 30_000;
        let mut send = input(RichInput {
            extras: extras(json!({"k": "x".repeat(extras_len)})),
            ..RichInput::default()
        });
        // `{"extras":{"k":"…"}}` is 19 bytes around the text.
        send.content = "c".repeat(MAX_CONTENT_BYTES - extras_len - 19);
        assert!(validate_send(send.clone(), ContentCap::Applies).is_ok());
        send.content.push('c');
        assert!(refused(send.clone()).contains("the limit is 262144"));
        assert!(validate_send(send, ContentCap::Exempt).is_ok());
    }

    fn received(forwarded_from: Option<Value>) -> ReceivedMessage {
        let mut message = courier_proto::Message::decode(
            r#"{"id":"m1","sender":"alice","recipient":"bob","app_id":"chat","priority":"high",
               "ttl":10,"hop_count":0,"timestamp":42,"lamport_clock":1,"content_type":"image",
               "content":"","binary_content":"AQID","metadata":{"name":"a.png","__group_id":"g1"},
               "reply_to_msg":"m0","rich":{"mentions":["carol"],"extras":{"k":1}}}"#,
        )
        .unwrap();
        message.forwarded_from = forwarded_from;
        ReceivedMessage {
            chat: "g1".into(),
            sender: "alice".into(),
            message,
        }
    }

    #[test]
    fn a_forward_copies_the_message_but_its_reply_link_and_names_its_origin() {
        let original = received(None);
        let forward = ForwardInput {
            message_id: "m1".into(),
            to: "dave".into(),
            id: None,
            priority: None,
        };
        let req = validate_send(forward_input(&original, forward), ContentCap::Applies).unwrap();
        assert_eq!(req.recipient, "dave");
        assert_eq!(req.content_type, ContentType::Image);
        assert_eq!(req.binary_content.as_deref(), Some("AQID"));
        assert_eq!(
            req.metadata,
            BTreeMap::from([("name".to_owned(), "a.png".to_owned())]),
            "the group marker is the runtime's, not the app's"
        );
        assert_eq!(req.rich.reply_to, None);
        let rich = req.rich.rich.clone().unwrap();
        assert_eq!(rich.mentions, ["carol"]);
        assert_eq!(rich.extras, extras(json!({"k": 1})));
        assert_eq!(
            forward_origin(&original),
            ForwardInfo {
                message_id: "m1".into(),
                sender: "alice".into(),
                timestamp: 42,
                chat: Some("g1".into()),
                forward_count: 1,
            }
        );
        let origin =
            json!({"message_id": "m0", "sender": "erin", "timestamp": 7, "forward_count": 2});
        assert_eq!(
            forward_origin(&received(Some(origin))),
            ForwardInfo {
                message_id: "m0".into(),
                sender: "erin".into(),
                timestamp: 7,
                chat: None,
                forward_count: 3,
            },
            "a forward of a forward keeps the first origin"
        );
    }

    #[test]
    fn base64_lengths() {
        for bytes in 0..10usize {
            use base64::Engine as _;
            let b64 = base64::engine::general_purpose::STANDARD.encode(vec![7u8; bytes]);
            assert_eq!(base64_decoded_len(&b64), bytes, "{b64}");
        }
    }
}
