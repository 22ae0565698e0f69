//! One gateway connection: the attach, then message exchange while bound.
//!
//! Before binding each attach step has its deadline; once bound, the connection is closed when
//! it sends no line for the idle timeout (devices keep an idle link up with `Ping` lines,
//! `docs/protocol.md#gateway-framing`).

use std::net::SocketAddr;
use std::sync::Arc;

use courier_proto::lines::{LineBuffer, LineTooLong};
use courier_proto::{Address, Disposition, RelayFrame, UnreachableCause};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::attach::{check_declaration, identify_device_id, looks_like_http, Attach};
use super::outbox::{outbox, Outbound, OutboxTx};
use super::sources::SourceSlot;
use super::{Shared, Undelivered};
use crate::linger::close_after_reading_out;
use crate::rate::TokenBucket;
use crate::send::recipient_unreachable;
use crate::{now_ms, stopping};

/// Bytes read from the socket at once; lines are assembled from them (`LineBuffer`).
const READ_CHUNK: usize = 8 * 1024;

/// What the connection does after a line.
enum Step {
    Continue,
    /// Close, after reading the socket out (`linger.rs`) so the last line is read.
    Close,
}

struct Conn {
    shared: Arc<Shared>,
    id: u64,
    remote: SocketAddr,
    write: OwnedWriteHalf,
    queue: OutboxTx,
    state: Attach,
    /// When the connection is closed: unless the attach moves on, or once bound, unless a line
    /// comes in.
    deadline: Instant,
    /// Paces `SendMessage` (`docs/operating-the-relay.md#the-gateway`).
    sends: TokenBucket,
}

/// Serves one connection; `_slot` holds its place under its source's cap until it ends.
pub async fn serve(shared: Arc<Shared>, tcp: TcpStream, remote: SocketAddr, _slot: SourceSlot) {
    let id = shared.next_connection_id();
    let (mut read, write) = tcp.into_split();
    let (queue, mut inbox) = outbox(shared.max_queue_bytes, Arc::clone(&shared.queue_budget));
    let mut shutdown = shared.shutdown.clone();
    let mut conn = Conn {
        deadline: Instant::now() + shared.timings.identify_deadline,
        sends: TokenBucket::new(shared.send_rate, std::time::Instant::now()),
        shared,
        id,
        remote,
        write,
        queue,
        state: Attach::AwaitIdentify,
    };
    tracing::debug!(connection = id, %remote, "gateway connection");
    let mut lines = LineBuffer::default();
    let mut chunk = vec![0u8; READ_CHUNK];
    let linger = loop {
        tokio::select! {
            () = stopping(&mut shutdown) => break true,
            () = tokio::time::sleep_until(conn.deadline) => {
                if let Attach::Bound(address) = &conn.state {
                    tracing::info!(connection = id, %remote, %address, "no line within the idle timeout; closing");
                } else {
                    tracing::info!(connection = id, %remote, state = ?conn.state, "attach deadline passed; closing");
                }
                break true;
            }
            Some(out) = inbox.recv() => match out {
                Outbound::Line(line) => {
                    let written = conn.write_line(&line).await;
                    inbox.done(&line);
                    if !written {
                        break false;
                    }
                }
                Outbound::Superseded => {
                    tracing::info!(connection = id, %remote, "binding taken over by a newer connection");
                    let line = json!({"type": "SessionSuperseded", "reason": "new_session"});
                    conn.write_line(&line.to_string()).await;
                    break true;
                }
            },
            read = read.read(&mut chunk) => match read {
                Ok(0) | Err(_) => break false,
                Ok(n) => {
                    lines.push(&chunk[..n]);
                    match conn.handle_lines(&mut lines).await {
                        Step::Continue => {}
                        Step::Close => break true,
                    }
                }
            },
        }
    };
    if let Attach::Bound(address) = &conn.state {
        conn.shared.unbind(address, id);
    }
    if linger {
        if let Ok(mut tcp) = read.reunite(conn.write) {
            close_after_reading_out(&mut tcp, conn.shared.timings.close_linger).await;
        }
    }
    tracing::debug!(connection = id, %remote, "gateway connection closed");
}

impl Conn {
    /// Writes one line; false when the peer is gone or does not read in time.
    async fn write_line(&mut self, line: &str) -> bool {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        let timeout = self.shared.timings.write_timeout;
        matches!(
            tokio::time::timeout(timeout, self.write.write_all(&bytes)).await,
            Ok(Ok(()))
        )
    }

    /// Handles every complete line read so far, in order.
    async fn handle_lines(&mut self, lines: &mut LineBuffer) -> Step {
        loop {
            match lines.pop() {
                Ok(Some(line)) => {
                    if matches!(self.state, Attach::Bound(_)) {
                        self.deadline = Instant::now() + self.shared.idle_timeout;
                    }
                    if let Step::Close = self.handle(&line).await {
                        return Step::Close;
                    }
                }
                Ok(None) => return Step::Continue,
                Err(LineTooLong) => {
                    tracing::info!(connection = self.id, remote = %self.remote, "line over 1 MiB; closing");
                    return Step::Close;
                }
            }
        }
    }

    async fn handle(&mut self, bytes: &[u8]) -> Step {
        if self.state == Attach::AwaitIdentify && looks_like_http(bytes) {
            tracing::info!(connection = self.id, remote = %self.remote, "an HTTP request, not a device; closing");
            return Step::Close;
        }
        // A line that is no JSON object with a string `type` is not a frame: ignored, like an
        // unknown type (never a reason to close).
        let Ok(frame) = serde_json::from_slice::<Value>(bytes) else {
            tracing::debug!(connection = self.id, "ignoring a line that is not JSON");
            return Step::Continue;
        };
        let Some(kind) = frame.get("type").and_then(Value::as_str) else {
            tracing::debug!(
                connection = self.id,
                "ignoring a line without a string type"
            );
            return Step::Continue;
        };
        match (kind, &self.state) {
            ("Identify", Attach::AwaitIdentify) => self.identify(&frame).await,
            ("DeclareAddress", Attach::AwaitDeclare { .. }) => self.declare(&frame).await,
            ("DeclareAddress", Attach::Bound(_)) => {
                // A challenge is good for one binding; there is no second one on a connection.
                self.refuse("already_declared").await
            }
            ("SendMessage", Attach::Bound(sender)) => {
                let sender = *sender;
                self.send_message(sender, &frame).await
            }
            _ => {
                // Unknown types, and known ones out of turn (a second Identify, anything before
                // binding): not processed.
                tracing::debug!(connection = self.id, kind, state = ?self.state, "ignoring frame");
                Step::Continue
            }
        }
    }

    async fn identify(&mut self, frame: &Value) -> Step {
        let Some(device_id) = identify_device_id(frame) else {
            tracing::debug!(
                connection = self.id,
                "ignoring an Identify without device_id"
            );
            return Step::Continue;
        };
        if let Err(reason) = self.shared.access.admit(frame) {
            tracing::info!(connection = self.id, remote = %self.remote, reason, "attach token refused");
            return self.refuse(reason).await;
        }
        let Some(challenge) = crate::auth::new_challenge() else {
            tracing::error!("the system random source failed; closing the connection");
            return Step::Close;
        };
        // Whatever version the device offered, the gateway speaks 1.
        let line = json!({
            "type": "Challenge",
            "challenge": crate::auth::encode_challenge(&challenge),
            "protocol_version": 1,
        });
        if !self.write_line(&line.to_string()).await {
            return Step::Close;
        }
        self.state = Attach::AwaitDeclare {
            device_id,
            challenge,
        };
        self.deadline = Instant::now() + self.shared.timings.declare_deadline;
        Step::Continue
    }

    async fn declare(&mut self, frame: &Value) -> Step {
        let Attach::AwaitDeclare {
            device_id,
            challenge,
        } = &self.state
        else {
            return Step::Continue;
        };
        match check_declaration(device_id, challenge, frame) {
            Ok(address) => {
                self.shared.bind(address, self.id, self.queue.clone());
                self.state = Attach::Bound(address);
                self.deadline = Instant::now() + self.shared.idle_timeout;
                tracing::info!(connection = self.id, remote = %self.remote, %address, "device bound");
                let answer = RelayFrame::AddressDeclared {
                    address: address.to_string(),
                };
                if self.write_line(&answer.encode()).await {
                    Step::Continue
                } else {
                    Step::Close
                }
            }
            Err(reason) => {
                tracing::info!(connection = self.id, remote = %self.remote, reason, "declaration refused");
                self.refuse(reason).await
            }
        }
    }

    /// `AddressError`, then close: on a gateway a refusal is fatal.
    async fn refuse(&mut self, reason: &str) -> Step {
        let answer = RelayFrame::AddressError {
            reason: reason.to_owned(),
        };
        self.write_line(&answer.encode()).await;
        Step::Close
    }

    async fn send_message(&mut self, sender: Address, frame: &Value) -> Step {
        let field = |name: &str| frame.get(name).and_then(Value::as_str).map(str::to_owned);
        // Every SendMessage line costs a token, well-formed or not.
        if let Err(wait) = self.sends.try_take(1, std::time::Instant::now()) {
            let answer = RelayFrame::RateLimited {
                retry_after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                frame_type: "SendMessage".to_owned(),
                message_id: field("message_id"),
                seq: None,
            };
            return self.answer(&answer).await;
        }
        let reply_to_msg = match frame.get("reply_to_msg") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(()),
        };
        let (Some(recipient), Some(content), Some(message_id), Ok(reply_to_msg)) = (
            field("recipient"),
            field("content"),
            field("message_id"),
            reply_to_msg,
        ) else {
            let mut error = RelayFrame::error("invalid_frame", Some("SendMessage"));
            if let RelayFrame::Error { message_id, .. } = &mut error {
                *message_id = field("message_id");
            }
            return self.answer(&error).await;
        };
        let timestamp = now_ms();
        let answer = match Address::parse(&recipient) {
            Ok(address) => {
                let received = RelayFrame::MessageReceived {
                    seq: None,
                    sender: sender.to_string(),
                    sender_account: None,
                    content,
                    message_id: message_id.clone(),
                    timestamp,
                    reply_to_msg,
                };
                match self.shared.deliver(&address, self.id, received.encode()) {
                    Ok(()) => RelayFrame::MessageSent {
                        message_id,
                        recipient,
                        timestamp,
                        disposition: Some(Disposition::Live),
                    },
                    Err(Undelivered::Offline) => recipient_unreachable(
                        message_id,
                        recipient,
                        UnreachableCause::OfflineNoMailbox,
                    ),
                }
            }
            // Not a canonical address: it names no device (`docs/protocol.md#addresses`).
            Err(_) => {
                recipient_unreachable(message_id, recipient, UnreachableCause::UnknownRecipient)
            }
        };
        self.answer(&answer).await
    }

    async fn answer(&mut self, frame: &RelayFrame) -> Step {
        if self.write_line(&frame.encode()).await {
            Step::Continue
        } else {
            Step::Close
        }
    }
}
