//! Frames after authentication: decode, meter (§11), and one handler per frame type. Frame
//! types whose features this relay does not offer yet are answered `unknown_type`, matching
//! the capabilities it advertises; their handlers slot into `dispatch`.

use std::sync::Arc;
use std::time::Instant;

use courier_proto::limits::{close, MAX_IDENTIFIER_BYTES, MAX_MALFORMED_FRAMES};
use courier_proto::{ClientFrame, DecodeError, RelayFrame};
use tokio::sync::mpsc;

use crate::mailbox::Envelope;
use crate::rate::TokenBucket;
use crate::router::Peer;
use crate::send::{resolve_recipient, send_message, Recipient};
use crate::store::Release;
use crate::writer::Outbound;
use crate::Ctx;

/// What the reader does after a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Close(u16),
    WriterGone,
}

pub fn error_frame(code: &str, frame_type: &str, message_id: Option<String>) -> RelayFrame {
    RelayFrame::Error {
        code: code.to_owned(),
        frame_type: Some(frame_type.to_owned()),
        message_id,
        detail: None,
    }
}

/// Identifier fields are 1–256 UTF-8 bytes.
pub fn identifier_size_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_IDENTIFIER_BYTES
}

/// One authenticated connection's reading side.
pub struct Session {
    pub ctx: Arc<Ctx>,
    pub peer: Arc<Peer>,
    /// Stamped as `sender` on every frame relayed from this connection (§5).
    pub identity: String,
    bucket: TokenBucket,
    malformed: u32,
    drain_requested: bool,
    out: mpsc::Sender<Outbound>,
}

impl Session {
    pub fn new(
        ctx: Arc<Ctx>,
        peer: Arc<Peer>,
        bucket: TokenBucket,
        out: mpsc::Sender<Outbound>,
    ) -> Self {
        Self {
            identity: peer.account.clone(),
            ctx,
            peer,
            bucket,
            malformed: 0,
            drain_requested: false,
            out,
        }
    }

    pub fn account(&self) -> &str {
        &self.peer.account
    }

    async fn answer(&self, frame: RelayFrame) -> Flow {
        match self.out.send(Outbound::Frame(frame)).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::WriterGone,
        }
    }

    /// Drain rule (b) of §8: any first frame other than DeclareAddress starts the drain.
    async fn request_drain(&mut self) -> Flow {
        if self.drain_requested {
            return Flow::Continue;
        }
        self.drain_requested = true;
        match self.out.send(Outbound::StartDrain).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::WriterGone,
        }
    }

    /// Takes a token, or answers RateLimited and reports the frame dropped.
    async fn meter(
        &mut self,
        frame_type: &str,
        message_id: Option<String>,
        seq: Option<u64>,
    ) -> Result<(), Flow> {
        match self.bucket.try_take(Instant::now()) {
            Ok(()) => Ok(()),
            Err(wait) => {
                let limited = RelayFrame::RateLimited {
                    retry_after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1),
                    frame_type: frame_type.to_owned(),
                    message_id,
                    seq,
                };
                Err(self.answer(limited).await)
            }
        }
    }

    pub async fn on_malformed(&mut self) -> Flow {
        if let flow @ (Flow::WriterGone | Flow::Close(_)) = self.request_drain().await {
            return flow;
        }
        self.malformed += 1;
        let flow = self.answer(RelayFrame::error("malformed", None)).await;
        if flow == Flow::Continue && self.malformed >= MAX_MALFORMED_FRAMES {
            return Flow::Close(close::TOO_MANY_MALFORMED);
        }
        flow
    }

    pub async fn on_text(&mut self, text: &str) -> Flow {
        let frame = match ClientFrame::decode(text) {
            Ok(frame) => frame,
            Err(DecodeError::Malformed) => return self.on_malformed().await,
            Err(DecodeError::UnknownType(frame_type)) => {
                return self.refuse(&frame_type, "unknown_type").await;
            }
            Err(DecodeError::Invalid { frame_type, detail }) => {
                tracing::debug!(%frame_type, %detail, "invalid frame");
                return self.refuse(&frame_type, "invalid_frame").await;
            }
        };
        let is_declaration = matches!(frame, ClientFrame::DeclareAddress { .. });
        if !is_declaration {
            if let flow @ (Flow::WriterGone | Flow::Close(_)) = self.request_drain().await {
                return flow;
            }
            let (message_id, seq) = match &frame {
                // Echoed only when it is a well-formed identifier, so an answer stays small.
                ClientFrame::SendMessage { message_id, .. }
                | ClientFrame::SendGroupMessage { message_id, .. } => (
                    identifier_size_ok(message_id).then(|| message_id.clone()),
                    None,
                ),
                ClientFrame::Ack { seq } | ClientFrame::AckUpTo { seq } => (None, Some(*seq)),
                _ => (None, None),
            };
            if let Err(flow) = self.meter(frame.type_name(), message_id, seq).await {
                return flow;
            }
        }
        self.dispatch(frame).await
    }

    /// Unknown or invalid frames: metered like any frame (DeclareAddress excepted), answered
    /// with an Error, never fatal.
    async fn refuse(&mut self, frame_type: &str, code: &str) -> Flow {
        if let flow @ (Flow::WriterGone | Flow::Close(_)) = self.request_drain().await {
            return flow;
        }
        if frame_type != "DeclareAddress" {
            if let Err(flow) = self.meter(frame_type, None, None).await {
                return flow;
            }
        }
        self.answer(error_frame(code, frame_type, None)).await
    }

    async fn dispatch(&mut self, frame: ClientFrame) -> Flow {
        match frame {
            ClientFrame::Authenticate { .. } => {
                self.answer(RelayFrame::error(
                    "already_authenticated",
                    Some("Authenticate"),
                ))
                .await
            }
            ClientFrame::SendMessage {
                recipient,
                content,
                message_id,
                reply_to_msg,
            } => {
                let answer = send_message(self, recipient, content, message_id, reply_to_msg).await;
                self.answer(answer).await
            }
            ClientFrame::Ack { seq } => self.ack(Release::One(seq)).await,
            ClientFrame::AckUpTo { seq } => self.ack(Release::UpTo(seq)).await,
            ClientFrame::CheckPresence { username } => self.check_presence(username).await,
            ClientFrame::DeclareAddress { .. } => {
                // `address_routing_v1` is not advertised: the frame is not served yet. Its
                // answer still counts as drain rule (a).
                let flow = self
                    .answer(error_frame("unknown_type", "DeclareAddress", None))
                    .await;
                if flow != Flow::Continue {
                    return flow;
                }
                self.request_drain().await
            }
            ClientFrame::WatchPresence { .. }
            | ClientFrame::UnwatchPresence { .. }
            | ClientFrame::CreateGroup { .. }
            | ClientFrame::AddGroupMember { .. }
            | ClientFrame::RemoveGroupMember { .. }
            | ClientFrame::LeaveGroup { .. }
            | ClientFrame::SendGroupMessage { .. } => {
                // Not advertised (`presence_watch_v1`, `group_delivery_v3`).
                self.answer(error_frame("unknown_type", frame.type_name(), None))
                    .await
            }
        }
    }

    /// Ack / AckUpTo (§7.1): only frames written on this connection are released; acks of
    /// anything else are ignored, and acks are never answered.
    async fn ack(&mut self, release: Release) -> Flow {
        if self.ctx.mailbox.is_none() {
            return Flow::Continue;
        }
        let written = self.peer.queue.highest_written();
        let release = match release {
            Release::One(seq) if seq >= 1 && seq <= written => Release::One(seq),
            Release::UpTo(seq) if seq.min(written) >= 1 => Release::UpTo(seq.min(written)),
            _ => return Flow::Continue,
        };
        let released = tokio::time::timeout(
            self.ctx.timings.answer_deadline,
            self.ctx.store.release(self.account(), release),
        )
        .await;
        match released {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(account = self.account(), error = %e, "ack not recorded"),
            Err(_) => tracing::warn!(account = self.account(), "ack timed out"),
        }
        Flow::Continue
    }

    /// CheckPresence (§10): `user_id` echoes the identifier as given.
    async fn check_presence(&mut self, username: String) -> Flow {
        if !identifier_size_ok(&username) {
            return self
                .answer(error_frame("invalid_frame", "CheckPresence", None))
                .await;
        }
        let (online, last_seen) = match resolve_recipient(&username) {
            Recipient::Account(account) => self.ctx.router.presence(account),
            Recipient::Unknown => (false, None),
        };
        let status = RelayFrame::PresenceStatus {
            user_id: username,
            online,
            last_seen: last_seen.map(serde_json::Value::from),
        };
        self.answer(status).await
    }

    /// The envelope this connection's SendMessage becomes: stamped now, with this identity.
    pub fn envelope(
        &self,
        message_id: String,
        content: String,
        reply_to_msg: Option<String>,
    ) -> Envelope {
        Envelope {
            seq: None,
            sender: self.identity.clone(),
            sender_account: self.peer.account.clone(),
            message_id,
            content,
            reply_to_msg,
            accepted_ms: crate::now_ms(),
        }
    }
}
