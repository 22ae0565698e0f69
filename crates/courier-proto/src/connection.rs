//! Connection requests (`docs/protocol.md#connection-requests`): the signed control frames by
//! which a device asks another to talk, and the answers. Each is `content` = a prefix and a JSON
//! body; the frame is signed as a control frame by its sender.
//!
//! A request carries the requester's key package when it has end-to-end sessions, so that
//! accepting starts the session at once: the acceptance carries the Welcome back.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// Longest note a request may carry, in bytes: a line of introduction, not a message.
pub const MAX_REQUEST_NOTE_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionFrame {
    /// `__CONN_REQ__`: the sender asks to connect.
    Request {
        note: Option<String>,
        key_package: Option<Vec<u8>>,
    },
    /// `__CONN_ACC__`: the request `request_id` is accepted; `welcome` into the session the
    /// acceptor started from the request's key package.
    Accept {
        request_id: String,
        welcome: Option<Vec<u8>>,
    },
    /// `__CONN_REJ__`: the request `request_id` is declined.
    Reject { request_id: String },
    /// `__CONN_CAN__`: the requester withdraws its request `request_id`.
    Cancel { request_id: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionFrameError {
    #[error("the body is not the frame's JSON: {0}")]
    Json(String),
    #[error("a byte field is not base64")]
    Base64,
    #[error("the note is {0} bytes; the limit is {MAX_REQUEST_NOTE_BYTES}")]
    NoteTooLong(usize),
}

#[derive(Serialize, Deserialize)]
struct RequestBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_package: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct AnswerBody {
    request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    welcome: Option<String>,
}

const REQUEST: &str = "__CONN_REQ__";
const ACCEPT: &str = "__CONN_ACC__";
const REJECT: &str = "__CONN_REJ__";
const CANCEL: &str = "__CONN_CAN__";

/// Whether `content` is a connection request (the kind the outbox never parks).
pub fn is_connection_request(content: &str) -> bool {
    content.starts_with(REQUEST)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: Option<String>) -> Result<Option<Vec<u8>>, ConnectionFrameError> {
    text.map(|t| {
        base64::engine::general_purpose::STANDARD
            .decode(t)
            .map_err(|_| ConnectionFrameError::Base64)
    })
    .transpose()
}

fn json<T: for<'de> Deserialize<'de>>(body: &str) -> Result<T, ConnectionFrameError> {
    serde_json::from_str(body).map_err(|e| ConnectionFrameError::Json(e.to_string()))
}

impl ConnectionFrame {
    /// The frame as `Message.content`.
    pub fn content(&self) -> String {
        let (prefix, body) = match self {
            Self::Request { note, key_package } => (
                REQUEST,
                serde_json::to_string(&RequestBody {
                    message: note.clone(),
                    key_package: key_package.as_deref().map(b64),
                }),
            ),
            Self::Accept {
                request_id,
                welcome,
            } => (
                ACCEPT,
                serde_json::to_string(&AnswerBody {
                    request_id: request_id.clone(),
                    welcome: welcome.as_deref().map(b64),
                }),
            ),
            Self::Reject { request_id } | Self::Cancel { request_id } => (
                if matches!(self, Self::Reject { .. }) {
                    REJECT
                } else {
                    CANCEL
                },
                serde_json::to_string(&AnswerBody {
                    request_id: request_id.clone(),
                    welcome: None,
                }),
            ),
        };
        format!("{prefix}{}", body.expect("plain structs always serialize"))
    }

    /// Which connection frame `content` is; `None` when it is none.
    pub fn parse(content: &str) -> Option<Result<Self, ConnectionFrameError>> {
        if let Some(body) = content.strip_prefix(REQUEST) {
            return Some(json::<RequestBody>(body).and_then(|b| {
                let bytes = b.message.as_ref().map_or(0, String::len);
                if bytes > MAX_REQUEST_NOTE_BYTES {
                    return Err(ConnectionFrameError::NoteTooLong(bytes));
                }
                Ok(Self::Request {
                    note: b.message,
                    key_package: unb64(b.key_package)?,
                })
            }));
        }
        let (prefix, body) = [ACCEPT, REJECT, CANCEL]
            .into_iter()
            .find_map(|p| Some((p, content.strip_prefix(p)?)))?;
        Some(json::<AnswerBody>(body).and_then(|b| {
            Ok(match prefix {
                ACCEPT => Self::Accept {
                    request_id: b.request_id,
                    welcome: unb64(b.welcome)?,
                },
                REJECT => Self::Reject {
                    request_id: b.request_id,
                },
                _ => Self::Cancel {
                    request_id: b.request_id,
                },
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_frame_round_trips() {
        for frame in [
            ConnectionFrame::Request {
                note: Some("hi, it's Alice".into()),
                key_package: Some(vec![1, 2, 3]),
            },
            ConnectionFrame::Request {
                note: None,
                key_package: None,
            },
            ConnectionFrame::Accept {
                request_id: "r1".into(),
                welcome: Some(vec![9; 40]),
            },
            ConnectionFrame::Accept {
                request_id: "r1".into(),
                welcome: None,
            },
            ConnectionFrame::Reject {
                request_id: "r2".into(),
            },
            ConnectionFrame::Cancel {
                request_id: "r3".into(),
            },
        ] {
            let content = frame.content();
            assert!(crate::is_signature_gated(&content), "{content}");
            assert_eq!(ConnectionFrame::parse(&content), Some(Ok(frame)));
        }
        assert_eq!(
            ConnectionFrame::Request {
                note: None,
                key_package: None
            }
            .content(),
            "__CONN_REQ__{}",
            "the identity vectors' content"
        );
    }

    #[test]
    fn bad_bodies_are_errors_and_other_content_is_none() {
        assert_eq!(ConnectionFrame::parse("hello"), None);
        assert_eq!(ConnectionFrame::parse("__MLS_WELCOME__AAAA"), None);
        assert!(matches!(
            ConnectionFrame::parse("__CONN_ACC__{}"),
            Some(Err(ConnectionFrameError::Json(_)))
        ));
        assert!(matches!(
            ConnectionFrame::parse("__CONN_REQ__not json"),
            Some(Err(ConnectionFrameError::Json(_)))
        ));
        assert_eq!(
            ConnectionFrame::parse(r#"__CONN_REQ__{"key_package":"%%"}"#),
            Some(Err(ConnectionFrameError::Base64))
        );
        let long = format!(
            r#"__CONN_REQ__{{"message":"{}"}}"#,
            "x".repeat(MAX_REQUEST_NOTE_BYTES + 1)
        );
        assert_eq!(
            ConnectionFrame::parse(&long),
            Some(Err(ConnectionFrameError::NoteTooLong(
                MAX_REQUEST_NOTE_BYTES + 1
            )))
        );
        assert!(is_connection_request("__CONN_REQ__{}"));
        assert!(!is_connection_request("__CONN_ACC__{}"));
    }
}
