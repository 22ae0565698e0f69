//! What a message says beside its content (`docs/protocol.md#rich-messages`): the message it
//! replies to (`reply_to_msg`), a quote, mentions and app extras (`rich`), and where a forwarded
//! message first came from (`forwarded_from`). They travel inside the Message JSON, so a sealed
//! message seals them too.
//!
//! A sender is refused a part that breaks its rule; a receiver drops that part alone and keeps
//! the message, since one peer's malformed extras are no reason to lose what it said.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ident::{validate_identifier, IdentError};
use crate::Message;

/// The largest `rich` (quote, mentions and extras) as serialized.
pub const MAX_RICH_BYTES: usize = 32 * 1024;
/// The most mentions one message names.
pub const MAX_MENTIONS: usize = 256;

/// `Message.rich`. Never empty on the wire: a message with none of it carries no `rich`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Rich {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quote: Option<Quote>,
    /// Identifiers (addresses, account names) the message mentions, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mentions: Vec<String>,
    /// The app's own data: any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extras: Option<Map<String, Value>>,
}

/// The excerpt a message quotes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quote {
    pub text: String,
    /// Who wrote the quoted text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// The wire id of the quoted message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

/// `Message.forwarded_from`: the message a forward copies, as it first was. A forward of a
/// forward keeps the first origin and counts one more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardInfo {
    /// The original message's wire id.
    pub message_id: String,
    /// Its sender.
    pub sender: String,
    /// Its sender's clock when it was sent.
    pub timestamp: u64,
    /// Where it was received: its sender for a direct message, the group for a group message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<String>,
    /// How many times it was forwarded to get here: 1 for a forward of the original.
    pub forward_count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RichError {
    #[error("mentions has {count} entries; the limit is {MAX_MENTIONS}")]
    TooManyMentions { count: usize },
    #[error("mentions[{index}] {error}")]
    Mention { index: usize, error: IdentError },
    #[error("mentions names {0:?} more than once")]
    DuplicateMention(String),
    #[error("quote.sender {0}")]
    QuoteSender(IdentError),
    #[error("quote.message_id {0}")]
    QuoteMessageId(IdentError),
    #[error(
        "quote, mentions and extras are {size} bytes serialized; the limit is {MAX_RICH_BYTES}"
    )]
    TooLarge { size: usize },
    #[error("reply_to_msg {0}")]
    ReplyTo(IdentError),
    #[error("forwarded_from.{field} {error}")]
    Forward {
        field: &'static str,
        error: IdentError,
    },
    #[error("forwarded_from.forward_count is 0")]
    ForwardCount,
    #[error("{part} is not what it should be: {reason}")]
    Shape { part: &'static str, reason: String },
}

impl Rich {
    /// The `rich` of a message being sent, checked; `None` when it would be empty.
    pub fn new(
        quote: Option<Quote>,
        mentions: Vec<String>,
        extras: Option<Map<String, Value>>,
    ) -> Result<Option<Self>, RichError> {
        let rich = Self {
            quote,
            mentions,
            extras: extras.filter(|extras| !extras.is_empty()),
        };
        if rich.is_empty() {
            return Ok(None);
        }
        rich.check()?;
        Ok(Some(rich))
    }

    pub fn is_empty(&self) -> bool {
        self.quote.is_none() && self.mentions.is_empty() && self.extras.is_none()
    }

    /// Its size as it travels.
    pub fn encoded_len(&self) -> usize {
        self.to_value().to_string().len()
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("rich parts always serialize")
    }

    fn check(&self) -> Result<(), RichError> {
        if self.mentions.len() > MAX_MENTIONS {
            return Err(RichError::TooManyMentions {
                count: self.mentions.len(),
            });
        }
        let mut seen = std::collections::HashSet::new();
        for (index, mention) in self.mentions.iter().enumerate() {
            validate_identifier(mention).map_err(|error| RichError::Mention { index, error })?;
            if !seen.insert(mention.as_str()) {
                return Err(RichError::DuplicateMention(mention.clone()));
            }
        }
        if let Some(quote) = &self.quote {
            if let Some(sender) = &quote.sender {
                validate_identifier(sender).map_err(RichError::QuoteSender)?;
            }
            if let Some(id) = &quote.message_id {
                validate_identifier(id).map_err(RichError::QuoteMessageId)?;
            }
        }
        let size = self.encoded_len();
        if size > MAX_RICH_BYTES {
            return Err(RichError::TooLarge { size });
        }
        Ok(())
    }
}

impl ForwardInfo {
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("forward info always serializes")
    }

    fn check(&self) -> Result<(), RichError> {
        let fields = [
            ("message_id", Some(&self.message_id)),
            ("sender", Some(&self.sender)),
            ("chat", self.chat.as_ref()),
        ];
        for (field, value) in fields {
            if let Some(value) = value {
                validate_identifier(value).map_err(|error| RichError::Forward { field, error })?;
            }
        }
        if self.forward_count == 0 {
            return Err(RichError::ForwardCount);
        }
        Ok(())
    }
}

/// The reply link, `rich` and forward origin of one message, as one value: what a send asks
/// for and what a receiver reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RichParts {
    /// The wire id of the message this one replies to.
    pub reply_to: Option<String>,
    pub rich: Option<Rich>,
    pub forwarded_from: Option<ForwardInfo>,
}

impl RichParts {
    /// Sets `message`'s wire fields to these parts.
    pub fn write_to(self, message: &mut Message) {
        message.reply_to_msg = self.reply_to;
        message.rich = self.rich.map(|rich| rich.to_value());
        message.forwarded_from = self.forwarded_from.map(|info| info.to_value());
    }

    /// The parts of a received message. A part that breaks its rule is left out, and what was
    /// wrong with it returned beside the rest.
    pub fn read(message: &Message) -> (Self, Vec<RichError>) {
        let mut problems = Vec::new();
        let reply_to = keep(
            match &message.reply_to_msg {
                Some(id) => validate_identifier(id)
                    .map(|()| Some(id.clone()))
                    .map_err(RichError::ReplyTo),
                None => Ok(None),
            },
            &mut problems,
        );
        let rich = keep(
            parse::<Rich>("rich", &message.rich).and_then(|rich| match rich {
                Some(rich) if !rich.is_empty() => rich.check().map(|()| Some(rich)),
                _ => Ok(None),
            }),
            &mut problems,
        );
        let forwarded_from = keep(
            parse::<ForwardInfo>("forwarded_from", &message.forwarded_from)
                .and_then(|info| info.map(|info| info.check().map(|()| info)).transpose()),
            &mut problems,
        );
        let parts = Self {
            reply_to,
            rich,
            forwarded_from,
        };
        (parts, problems)
    }
}

/// `part`, or `None` with what was wrong with it added to `problems`.
fn keep<T>(part: Result<Option<T>, RichError>, problems: &mut Vec<RichError>) -> Option<T> {
    part.unwrap_or_else(|e| {
        problems.push(e);
        None
    })
}

fn parse<T: DeserializeOwned>(
    part: &'static str,
    value: &Option<Value>,
) -> Result<Option<T>, RichError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(value) => T::deserialize(value)
            .map(Some)
            .map_err(|e| RichError::Shape {
                part,
                reason: e.to_string(),
            }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::message::tests::sample;

    fn extras(value: Value) -> Option<Map<String, Value>> {
        match value {
            Value::Object(map) => Some(map),
            _ => panic!("extras are an object"),
        }
    }

    fn quote() -> Quote {
        Quote {
            text: "earlier words".into(),
            sender: Some("alice".into()),
            message_id: Some("m0".into()),
        }
    }

    #[test]
    fn empty_parts_are_absent_on_the_wire() {
        assert_eq!(Rich::new(None, Vec::new(), None), Ok(None));
        assert_eq!(Rich::new(None, Vec::new(), extras(json!({}))), Ok(None));
        let mut message = sample();
        RichParts::default().write_to(&mut message);
        let text = message.encode();
        assert!(!text.contains("\"rich\""), "{text}");
        assert!(!text.contains("\"forwarded_from\""), "{text}");
        assert!(text.contains("\"reply_to_msg\":null"), "{text}");
        let (parts, problems) = RichParts::read(&Message::decode(&text).unwrap());
        assert_eq!((parts, problems), (RichParts::default(), Vec::new()));
    }

    #[test]
    fn every_part_round_trips_in_its_wire_layout() {
        let rich = Rich::new(
            Some(quote()),
            vec!["bob".into(), "carol".into()],
            extras(json!({"poll": {"options": [1, 2]}, "pinned": true})),
        )
        .unwrap();
        let forwarded_from = ForwardInfo {
            message_id: "m-1".into(),
            sender: "dave".into(),
            timestamp: 42,
            chat: Some("group-1".into()),
            forward_count: 2,
        };
        let parts = RichParts {
            reply_to: Some("m0".into()),
            rich,
            forwarded_from: Some(forwarded_from),
        };
        let mut message = sample();
        parts.clone().write_to(&mut message);
        let wire: Value = serde_json::from_str(&message.encode()).unwrap();
        assert_eq!(wire["reply_to_msg"], json!("m0"));
        assert_eq!(
            wire["rich"],
            json!({
                "quote": {"text": "earlier words", "sender": "alice", "message_id": "m0"},
                "mentions": ["bob", "carol"],
                "extras": {"pinned": true, "poll": {"options": [1, 2]}},
            })
        );
        assert_eq!(
            wire["forwarded_from"],
            json!({"message_id": "m-1", "sender": "dave", "timestamp": 42, "chat": "group-1", "forward_count": 2})
        );
        let decoded = Message::decode(&message.encode()).unwrap();
        assert_eq!(RichParts::read(&decoded), (parts, Vec::new()));
    }

    #[test]
    fn a_quote_alone_omits_the_other_parts() {
        let rich = Rich::new(
            Some(Quote {
                text: "hi".into(),
                sender: None,
                message_id: None,
            }),
            Vec::new(),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(rich.to_value(), json!({"quote": {"text": "hi"}}));
    }

    #[test]
    fn a_send_is_refused_what_breaks_a_rule() {
        let too_many: Vec<String> = (0..=MAX_MENTIONS).map(|i| format!("p{i}")).collect();
        assert_eq!(
            Rich::new(None, too_many, None),
            Err(RichError::TooManyMentions { count: 257 })
        );
        assert_eq!(
            Rich::new(None, vec!["bob".into(), "bob".into()], None),
            Err(RichError::DuplicateMention("bob".into()))
        );
        assert_eq!(
            Rich::new(None, vec!["bob".into(), String::new()], None),
            Err(RichError::Mention {
                index: 1,
                error: IdentError::Empty
            })
        );
        let bad_sender = Quote {
            sender: Some("a/b".into()),
            ..quote()
        };
        assert_eq!(
            Rich::new(Some(bad_sender), Vec::new(), None),
            Err(RichError::QuoteSender(IdentError::ForbiddenCharacter))
        );
    }

    #[test]
    fn the_cap_counts_the_serialized_parts() {
        // `{"extras":{"k":"…"}}` is 19 bytes around the text.
        let at_cap = |text_len: usize| extras(json!({"k": "x".repeat(text_len)}));
        let fits = Rich::new(None, Vec::new(), at_cap(MAX_RICH_BYTES - 19))
            .unwrap()
            .unwrap();
        assert_eq!(fits.encoded_len(), MAX_RICH_BYTES);
        assert_eq!(
            Rich::new(None, Vec::new(), at_cap(MAX_RICH_BYTES - 18)),
            Err(RichError::TooLarge {
                size: MAX_RICH_BYTES + 1
            })
        );
        // A quote counts toward the same cap.
        let long_quote = Quote {
            text: "q".repeat(MAX_RICH_BYTES),
            sender: None,
            message_id: None,
        };
        assert!(matches!(
            Rich::new(Some(long_quote), Vec::new(), None),
            Err(RichError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_receiver_drops_only_the_malformed_part() {
        let mut message = sample();
        message.reply_to_msg = Some("m0".into());
        message.rich = Some(json!({"mentions": "everyone"}));
        message.forwarded_from = Some(
            json!({"message_id": "m-1", "sender": "dave", "timestamp": 1, "forward_count": 1}),
        );
        let (parts, problems) = RichParts::read(&message);
        assert_eq!(parts.reply_to.as_deref(), Some("m0"));
        assert_eq!(parts.rich, None);
        assert_eq!(parts.forwarded_from.unwrap().forward_count, 1);
        assert!(
            matches!(&problems[..], [RichError::Shape { part: "rich", .. }]),
            "{problems:?}"
        );

        let mut message = sample();
        message.reply_to_msg = Some(String::new());
        message.rich = Some(json!({"quote": {"text": "ok"}, "mentions": ["bob", "bob"]}));
        message.forwarded_from = Some(
            json!({"message_id": "m-1", "sender": "dave", "timestamp": 1, "forward_count": 0}),
        );
        let (parts, problems) = RichParts::read(&message);
        assert_eq!(parts, RichParts::default());
        assert_eq!(
            problems,
            vec![
                RichError::ReplyTo(IdentError::Empty),
                RichError::DuplicateMention("bob".into()),
                RichError::ForwardCount,
            ]
        );

        // Oversized extras from a peer are dropped like any other broken rule.
        let mut message = sample();
        message.rich = Some(json!({"extras": {"k": "x".repeat(MAX_RICH_BYTES)}}));
        let (parts, problems) = RichParts::read(&message);
        assert_eq!(parts.rich, None);
        assert!(matches!(&problems[..], [RichError::TooLarge { .. }]));
    }

    #[test]
    fn a_message_with_a_malformed_part_still_decodes() {
        let mut wire: Value = serde_json::from_str(&sample().encode()).unwrap();
        wire["rich"] = json!([1, 2, 3]);
        wire["forwarded_from"] = json!("somewhere");
        let message = Message::decode(&wire.to_string()).expect("the message itself is fine");
        let (parts, problems) = RichParts::read(&message);
        assert_eq!(parts, RichParts::default());
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
