//! One client connection: upgrade, authentication (`docs/protocol.md#authentication`, under the
//! limits of `docs/protocol.md#authentication-limits`), then the reader loop that handles frames
//! strictly in arrival order, keepalive (`docs/protocol.md#transport`), displacement
//! (`docs/protocol.md#session-displacement`), revocation and shutdown.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use courier_proto::limits::{
    close, CAP_ADDRESS_ROUTING, CAP_GROUP_DELIVERY, CAP_KEY_DIRECTORY, CAP_MAILBOX,
    CAP_PRESENCE_WATCH, MAX_FRAME_BYTES,
};
use courier_proto::{ClientFrame, DecodeError, MailboxInfo, RateLimitInfo, RelayFrame};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::attempts::Pending;
use crate::auth::{encode_challenge, AuthFailure, Verified};
use crate::dispatch::{Flow, Session};
use crate::linger::{read_out_websocket, Input};
use crate::mailbox::DeliveryQueue;
use crate::read_budget::{Budgeted, OverBudget};
use crate::router::{Peer, SupersedeAck};
use crate::writer::{self, Outbound, Sink};
use crate::{now_ms, stopping, Ctx};

/// Answers the reader may queue ahead of the writer before it waits.
const OUTBOUND_QUEUE: usize = 64;

/// The bytes of the largest `Authenticate` read (`docs/protocol.md#authentication-limits`): a
/// token and 64 capabilities of 128 bytes fit with room to spare.
const MAX_AUTHENTICATE_BYTES: usize = 16 * 1024;

/// A connection not yet authenticated: the one deadline it has from accept to `Authenticated`,
/// and its place under its source's cap.
struct Unauthenticated {
    deadline: Instant,
    /// Released on `Authenticated` or when the connection ends.
    _pending: Option<Pending>,
    remote: SocketAddr,
}

pub async fn serve(ctx: Arc<Ctx>, tcp: TcpStream, tls: Option<TlsAcceptor>, remote: SocketAddr) {
    let pending = match ctx.auth_limits.admit(remote.ip()) {
        Ok(pending) => pending,
        Err(()) => {
            tracing::debug!(%remote, "too many unauthenticated connections from this source; closed at accept");
            ctx.metrics.closed(CloseReason::TooManyUnauthenticated);
            return;
        }
    };
    let pre = Unauthenticated {
        deadline: Instant::now() + ctx.timings.auth_timeout,
        _pending: pending,
        remote,
    };
    match tls {
        // Boxed: a TLS session's state is most of this task's size (about 15 KiB), which a
        // plain connection must not carry, and a TLS one only once it got this far.
        Some(acceptor) => Box::pin(serve_tls(ctx, tcp, acceptor, pre)).await,
        None => run(ctx, tcp, pre).await,
    }
}

async fn serve_tls(ctx: Arc<Ctx>, tcp: TcpStream, acceptor: TlsAcceptor, pre: Unauthenticated) {
    let remote = pre.remote;
    match tokio::time::timeout_at(pre.deadline, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => run(ctx, stream, pre).await,
        Ok(Err(e)) => {
            tracing::debug!(%remote, error = %e, "TLS handshake failed");
            ctx.metrics.closed(CloseReason::HandshakeFailed);
        }
        Err(_) => {
            tracing::debug!(%remote, "TLS handshake timed out");
            ctx.metrics.closed(CloseReason::HandshakeTimeout);
        }
    }
}

/// Bytes a connection reads from its socket at once. tungstenite zero-fills this much of its
/// read buffer before every read, so it is resident for every connection, authenticated or
/// not: at its default of 128 KiB, 10 000 connections that never authenticate held over 1 GiB.
/// Frames are mostly small; a large one is read in more calls, not refused.
const READ_CHUNK: usize = 8 * 1024;

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_CHUNK)
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}

/// The close code a read error calls for, if the peer is still there to hear it.
fn close_code_for(error: &WsError) -> Option<u16> {
    match error {
        WsError::Capacity(_) => Some(close::TOO_BIG),
        WsError::Io(e) if OverBudget::is(e) => Some(close::TOO_BIG),
        WsError::Utf8(_) => Some(close::INVALID_UTF8),
        _ => None,
    }
}

fn close_message(code: u16) -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: "".into(),
    }))
}

struct Authed {
    token: Verified,
    opted_in: bool,
}

async fn run<S>(ctx: Arc<Ctx>, stream: S, pre: Unauthenticated)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let remote = pre.remote;
    let accepted = tokio::time::timeout_at(
        pre.deadline,
        tokio_tungstenite::accept_async_with_config(Budgeted::new(stream), Some(ws_config())),
    )
    .await;
    let mut ws = match accepted {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            tracing::debug!(%remote, error = %e, "WebSocket upgrade failed");
            ctx.metrics.closed(CloseReason::HandshakeFailed);
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, "WebSocket upgrade timed out");
            ctx.metrics.closed(CloseReason::HandshakeTimeout);
            return;
        }
    };
    let authed = match authenticate(&ctx, &mut ws, pre.deadline, remote).await {
        Ok(authed) => {
            ws.get_mut().lift();
            drop(pre);
            authed
        }
        Err(reason) => {
            tracing::debug!(%remote, reason = reason.as_str(), "connection closed before authentication");
            ctx.metrics.closed(reason);
            return;
        }
    };
    // Boxed: the session's state is most of what is left of this task's size, and a
    // connection that never authenticates should not hold room for it.
    Box::pin(session(ctx, ws, authed, remote)).await;
}

/// An authenticated connection, from `Authenticated` to its end.
async fn session<S>(ctx: Arc<Ctx>, mut ws: WebSocketStream<S>, authed: Authed, remote: SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Authed { token, opted_in } = authed;
    let account = token.account.clone();
    // Drawn before anything changes state, so a failing generator displaces nobody.
    let ready = match ctx.timings.challenge() {
        None => {
            tracing::error!("the system random generator failed");
            None
        }
        Some(challenge) => match ctx.store.ensure_account(&account, now_ms()).await {
            Ok(()) => Some(challenge),
            Err(e) => {
                tracing::error!(%account, error = %e, "cannot persist the account");
                None
            }
        },
    };
    let Some(challenge) = ready else {
        let linger = ctx.timings.close_linger;
        close_and_read_out(&mut ws, close::INTERNAL, Input::Parsing, linger).await;
        ctx.metrics.closed(CloseReason::Internal);
        return;
    };
    let (queue, deliveries) = DeliveryQueue::new();
    let (peer, superseded) = Peer::new(ctx.next_connection_id(), account.clone(), queue);
    let peer = Arc::new(peer);
    // Registration precedes the drain bound, so no frame falls between drain and live (mailbox.rs).
    if let Some(old) = ctx.router.register(Arc::clone(&peer)) {
        if let Some(done) = old.supersede() {
            let _ = tokio::time::timeout(ctx.timings.supersede_wait, done).await;
        }
    }
    let _attachment = match ctx.store.attach(&peer).await {
        Ok(attachment) => attachment,
        Err(e) => {
            tracing::error!(%account, error = %e, "cannot record the connection in the cluster");
            if let Some(at) = leave(&ctx, &peer) {
                record_last_seen(&ctx, &peer, at).await;
            }
            let linger = ctx.timings.close_linger;
            close_and_read_out(&mut ws, close::INTERNAL, Input::Parsing, linger).await;
            ctx.metrics.closed(CloseReason::Internal);
            return;
        }
    };
    // What this relay implements (`docs/protocol.md#capabilities`).
    let mut capabilities = vec![CAP_ADDRESS_ROUTING.to_owned()];
    if ctx.mailbox.is_some() {
        capabilities.push(CAP_MAILBOX.to_owned());
    }
    capabilities.push(CAP_PRESENCE_WATCH.to_owned());
    if ctx.key_directory {
        capabilities.push(CAP_KEY_DIRECTORY.to_owned());
    }
    capabilities.push(CAP_GROUP_DELIVERY.to_owned());
    let authenticated = RelayFrame::Authenticated {
        user_id: account.clone(),
        username: account.clone(),
        capabilities,
        address_challenge: Some(encode_challenge(&challenge)),
        rate_limit: Some(RateLimitInfo {
            burst: ctx.rate_limit.burst,
            per_sec: ctx.rate_limit.per_sec,
        }),
        mailbox: ctx.mailbox.map(|m| MailboxInfo {
            max_messages: m.max_messages,
            max_bytes: m.max_bytes,
            ttl_ms: m.ttl_ms,
        }),
    };
    ctx.metrics.sent(&authenticated);
    if ws
        .send(Message::text(authenticated.encode()))
        .await
        .is_err()
    {
        if let Some(at) = leave(&ctx, &peer) {
            record_last_seen(&ctx, &peer, at).await;
        }
        ctx.metrics.closed(CloseReason::Gone);
        return;
    }
    tracing::debug!(%remote, %account, opted_in, "authenticated");

    let (sink, stream) = ws.split();
    let (out, out_rx) = mpsc::channel(OUTBOUND_QUEUE);
    let writer = tokio::spawn(writer::run(
        sink,
        out_rx,
        deliveries,
        Arc::clone(&peer),
        Arc::clone(&ctx),
        opted_in,
    ));
    let connection = Arc::clone(&peer);
    let session = Session::new(Arc::clone(&ctx), Arc::clone(&peer), challenge, out.clone());
    let reader = Reader {
        ctx: Arc::clone(&ctx),
        token,
        peer,
        stream,
        out,
        writer: WriterTask(writer),
    };
    let (reason, offline_at) = reader.run(session, superseded).await;
    if let Some(at) = offline_at {
        record_last_seen(&ctx, &connection, at).await;
    }
    tracing::debug!(%remote, %account, reason = reason.as_str(), "connection closed");
    ctx.metrics.closed(reason);
}

/// The connection stops being the account's: its watches end, and if it was the account's
/// connection the account goes offline (its watchers hear it); returns when it did. Called
/// before the socket closes, so a client that saw its connection end never finds the relay
/// still routing to it.
fn leave(ctx: &Ctx, peer: &Peer) -> Option<u64> {
    let now = now_ms();
    ctx.router.unregister(peer, now).then_some(now)
}

/// Persists when the account went offline as its last_seen.
async fn record_last_seen(ctx: &Ctx, peer: &Peer, at: u64) {
    let account = &peer.account;
    let recorded = tokio::time::timeout(
        ctx.timings.answer_deadline,
        ctx.store.record_last_seen(peer, at),
    )
    .await;
    match recorded {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(%account, error = %e, "last_seen not persisted"),
        Err(_) => tracing::warn!(%account, "persisting last_seen timed out"),
    }
}

enum AuthEvent {
    Message(Option<Result<Message, WsError>>),
    Timeout,
    Shutdown,
}

/// A first frame's `type`, read without building the rest of it.
#[derive(Deserialize)]
struct FrameType<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

/// `Authenticate`, decoded straight into its fields.
#[derive(Deserialize)]
struct AuthenticateFrame {
    token: String,
    #[serde(default)]
    client_capabilities: Option<Vec<String>>,
}

/// A first text frame, decoded and counted: the `Authenticate` it is, or the failure it calls
/// for.
fn first_frame(ctx: &Ctx, text: &str) -> Result<AuthenticateFrame, AuthFailure> {
    let decoded = match serde_json::from_str::<FrameType>(text) {
        Err(_) => Err(DecodeError::Malformed),
        Ok(FrameType { kind }) if kind != "Authenticate" => Err(DecodeError::Invalid {
            frame_type: kind.chars().take(128).collect(),
            detail: String::new(),
        }),
        Ok(_) => match serde_json::from_str::<AuthenticateFrame>(text) {
            Ok(frame) => Ok(frame),
            Err(_) => Err(DecodeError::Invalid {
                frame_type: "Authenticate".to_owned(),
                detail: String::new(),
            }),
        },
    };
    // Counted as the frame types the session counts.
    let counted = decoded
        .as_ref()
        .map(|_| ClientFrame::Authenticate {
            token: String::new(),
            client_capabilities: None,
        })
        .map_err(Clone::clone);
    ctx.metrics.received(&counted, text.len());
    match decoded {
        Ok(frame) => Ok(frame),
        Err(DecodeError::Invalid { frame_type, .. }) if frame_type == "Authenticate" => {
            Err(AuthFailure::InvalidToken)
        }
        Err(_) => Err(AuthFailure::NotAuthenticated),
    }
}

/// A decoded `Authenticate` from `remote`: its token checked, then the limits and the deny list
/// applied.
fn admit(ctx: &Ctx, frame: AuthenticateFrame, remote: SocketAddr) -> Result<Authed, AuthFailure> {
    let now = std::time::Instant::now();
    ctx.auth_limits.attempt(remote.ip(), now)?;
    let token = ctx.verifier.verify(&frame.token)?;
    if ctx
        .revocations
        .borrow()
        .revokes(&token.account, token.issued_at)
    {
        return Err(AuthFailure::TokenRevoked);
    }
    // Online on any node: a login through another node displaces the connection as well.
    let displacing = ctx.router.status(&token.account).online;
    ctx.auth_limits.login(&token.account, displacing, now)?;
    let opted_in = frame
        .client_capabilities
        .unwrap_or_default()
        .iter()
        .any(|c| c == CAP_MAILBOX);
    Ok(Authed { token, opted_in })
}

/// Waits for the first frame, until `deadline`; it must be a valid Authenticate
/// (`docs/protocol.md#handshake`). Everything else ends the connection with the matching
/// AuthError and close 4001, and has no effect. Without an account, says why the connection
/// ended.
async fn authenticate<S>(
    ctx: &Ctx,
    ws: &mut WebSocketStream<Budgeted<S>>,
    deadline: Instant,
    remote: SocketAddr,
) -> Result<Authed, CloseReason>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let linger = ctx.timings.close_linger;
    let mut shutdown = ctx.shutdown.clone();
    loop {
        let event = tokio::select! {
            m = tokio::time::timeout_at(deadline, ws.next()) => m.map_or(AuthEvent::Timeout, AuthEvent::Message),
            () = stopping(&mut shutdown) => AuthEvent::Shutdown,
        };
        let failure = match event {
            AuthEvent::Timeout => AuthFailure::AuthTimeout,
            AuthEvent::Shutdown => {
                close_and_read_out(ws, close::GOING_AWAY, Input::Parsing, linger).await;
                return Err(CloseReason::Shutdown);
            }
            AuthEvent::Message(None) => return Err(CloseReason::Gone),
            AuthEvent::Message(Some(Err(e))) => {
                return Err(match close_code_for(&e) {
                    Some(code) => {
                        // What is left is read out as raw bytes into a small buffer, never
                        // parsed or kept: the budget no longer has anything to bound.
                        ws.get_mut().lift();
                        close_and_read_out(ws, code, Input::Failed, linger).await;
                        CloseReason::with(code)
                    }
                    None => CloseReason::Gone,
                });
            }
            AuthEvent::Message(Some(Ok(message))) => match message {
                Message::Text(text) if text.len() > MAX_AUTHENTICATE_BYTES => {
                    close_and_read_out(ws, close::TOO_BIG, Input::Parsing, linger).await;
                    return Err(CloseReason::FrameTooBig);
                }
                Message::Text(text) => {
                    match first_frame(ctx, &text).and_then(|frame| admit(ctx, frame, remote)) {
                        Ok(authed) => return Ok(authed),
                        Err(failure) => failure,
                    }
                }
                Message::Binary(_) => {
                    ctx.metrics.received_binary();
                    AuthFailure::NotAuthenticated
                }
                Message::Close(_) => {
                    answer_peer_close(ws, linger).await;
                    return Err(CloseReason::PeerClosed);
                }
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
            },
        };
        // The token itself is never logged: it is a credential.
        tracing::info!(%remote, reason = failure.reason(), "authentication refused");
        ctx.metrics.auth_failed(failure);
        let refusal = RelayFrame::AuthError {
            reason: failure.reason().to_owned(),
        };
        ctx.metrics.sent(&refusal);
        if ws.send(Message::text(refusal.encode())).await.is_ok() {
            close_and_read_out(ws, close::AUTH_FAILED, Input::Parsing, linger).await;
        }
        return Err(CloseReason::AuthFailed);
    }
}

/// Why a connection ended, as logs and `connections_closed_total` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// The client closed.
    PeerClosed,
    /// The socket ended without a close.
    Gone,
    KeepaliveTimeout,
    /// The same account connected again.
    Superseded,
    AuthFailed,
    /// The source had too many connections not yet authenticated: closed at accept.
    TooManyUnauthenticated,
    /// The operator revoked the token the connection authenticated with.
    Revoked,
    Shutdown,
    /// The TLS handshake or the WebSocket upgrade failed.
    HandshakeFailed,
    HandshakeTimeout,
    FrameTooBig,
    InvalidUtf8,
    TooManyMalformed,
    /// Writing to the socket failed.
    WriteFailed,
    Internal,
    /// A close code of the relay's not named above.
    ClosedByRelay,
}

impl CloseReason {
    /// The relay closed with `code`.
    fn with(code: u16) -> Self {
        match code {
            close::GOING_AWAY => Self::Shutdown,
            close::INVALID_UTF8 => Self::InvalidUtf8,
            close::TOO_BIG => Self::FrameTooBig,
            close::INTERNAL => Self::Internal,
            close::SUPERSEDED => Self::Superseded,
            close::AUTH_FAILED => Self::AuthFailed,
            close::TOO_MANY_MALFORMED => Self::TooManyMalformed,
            close::KEEPALIVE_TIMEOUT => Self::KeepaliveTimeout,
            _ => Self::ClosedByRelay,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::PeerClosed => "peer_closed",
            Self::Gone => "gone",
            Self::KeepaliveTimeout => "keepalive_timeout",
            Self::Superseded => "superseded",
            Self::AuthFailed => "auth_failed",
            Self::TooManyUnauthenticated => "too_many_unauthenticated",
            Self::Revoked => "token_revoked",
            Self::Shutdown => "shutdown",
            Self::HandshakeFailed => "handshake_failed",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::FrameTooBig => "frame_too_big",
            Self::InvalidUtf8 => "invalid_utf8",
            Self::TooManyMalformed => "too_many_malformed",
            Self::WriteFailed => "write_failed",
            Self::Internal => "internal",
            Self::ClosedByRelay => "closed_by_relay",
        }
    }
}

/// Closes with `code` and reads the socket out (`linger.rs`), so the code reaches a peer that
/// is still writing.
async fn close_and_read_out<S>(
    ws: &mut WebSocketStream<S>,
    code: u16,
    input: Input,
    linger: Duration,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if ws.send(close_message(code)).await.is_ok() {
        read_out_websocket(ws, input, linger).await;
    }
}

/// The peer closed first: reading on writes the reply tungstenite queued and ends the stream.
async fn answer_peer_close<St>(stream: &mut St, linger: Duration)
where
    St: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    let _ = tokio::time::timeout(linger, async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
}

/// Resolves once the deny list revokes `token`; pending for good if it never does, or if the
/// relay stops updating it.
async fn revoked(revocations: &mut crate::revocation::Revocations, token: &Verified) {
    if revocations
        .wait_for(|list| list.revokes(&token.account, token.issued_at))
        .await
        .is_err()
    {
        std::future::pending::<()>().await;
    }
}

enum End<S> {
    /// Close with this code, then read the socket out.
    Close(u16, Input),
    /// The deny list now revokes the connection's token: `AuthError{token_revoked}`, then 4001.
    Revoked,
    Superseded(Option<SupersedeAck>),
    /// No Pong or other message for `dead_after`: best-effort 4008, no waiting
    /// (`docs/protocol.md#transport`).
    Dead,
    /// The peer sent Close.
    PeerClosed,
    /// The peer went away or the socket failed.
    Gone,
    /// The writer stopped: on a socket error, or after it wrote a Close itself (then with the
    /// sink, to read the socket out; the writer closes only for reasons of its own, never on
    /// the peer's input).
    WriterStopped(Option<Sink<S>>),
}

impl<S> End<S> {
    fn reason(&self) -> CloseReason {
        match self {
            End::Close(code, _) => CloseReason::with(*code),
            End::Revoked => CloseReason::Revoked,
            End::Superseded(_) => CloseReason::Superseded,
            End::Dead => CloseReason::KeepaliveTimeout,
            End::PeerClosed => CloseReason::PeerClosed,
            End::Gone => CloseReason::Gone,
            // The writer closes of its own accord only when the journal cannot be read.
            End::WriterStopped(Some(_)) => CloseReason::Internal,
            End::WriterStopped(None) => CloseReason::WriteFailed,
        }
    }
}

/// The writer task, aborted when its connection task ends or is dropped (e.g. aborted at
/// shutdown), so no writer outlives its connection.
struct WriterTask<S>(tokio::task::JoinHandle<Option<Sink<S>>>);

impl<S> WriterTask<S> {
    /// The writer's end, if it comes within `wait`: its sink when it wrote a Close.
    async fn stopped(&mut self, wait: Duration) -> Option<Sink<S>> {
        match tokio::time::timeout(wait, &mut self.0).await {
            Ok(Ok(sink)) => sink,
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

impl<S> Drop for WriterTask<S> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Reader<S> {
    ctx: Arc<Ctx>,
    /// What the connection authenticated with, re-checked whenever the deny list changes.
    token: Verified,
    peer: Arc<Peer>,
    stream: futures_util::stream::SplitStream<WebSocketStream<S>>,
    out: mpsc::Sender<Outbound>,
    writer: WriterTask<S>,
}

impl<S> Reader<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Reads until the connection ends; returns why it ended, and when the account went
    /// offline with it.
    async fn run(
        mut self,
        mut session: Session,
        mut superseded: oneshot::Receiver<SupersedeAck>,
    ) -> (CloseReason, Option<u64>) {
        let timings = self.ctx.timings;
        let mut shutdown = self.ctx.shutdown.clone();
        let mut revocations = self.ctx.revocations.clone();
        let token = self.token.clone();
        let mut last_heard = Instant::now();
        let end = loop {
            let event = tokio::select! {
                biased;
                () = stopping(&mut shutdown) => Err(End::Close(close::GOING_AWAY, Input::Parsing)),
                ack = &mut superseded => Err(End::Superseded(ack.ok())),
                () = revoked(&mut revocations, &token) => Err(End::Revoked),
                sink = &mut self.writer.0 => Err(End::WriterStopped(sink.ok().flatten())),
                () = tokio::time::sleep_until(last_heard + timings.dead_after) => Err(End::Dead),
                message = self.stream.next() => Ok(message),
            };
            let message = match event {
                Err(end) => break end,
                Ok(None) => break End::Gone,
                Ok(Some(Err(e))) => match close_code_for(&e) {
                    Some(code) => break End::Close(code, Input::Failed),
                    None => break End::Gone,
                },
                Ok(Some(Ok(message))) => message,
            };
            last_heard = Instant::now();
            let handling = async {
                match message {
                    Message::Text(text) => Some(session.on_text(&text).await),
                    Message::Binary(_) => Some(session.on_binary().await),
                    Message::Close(_) => None,
                    Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => Some(Flow::Continue),
                }
            };
            // A peer that sends but never reads stalls the writer, and with it the answer
            // being queued here: the keepalive rule (`docs/protocol.md#transport`) must still end
            // the connection, and shutdown and displacement must still be heard.
            let handled = tokio::select! {
                biased;
                handled = handling => handled,
                () = stopping(&mut shutdown) => break End::Close(close::GOING_AWAY, Input::Parsing),
                ack = &mut superseded => break End::Superseded(ack.ok()),
                () = revoked(&mut revocations, &token) => break End::Revoked,
                () = tokio::time::sleep_until(last_heard + timings.dead_after) => break End::Dead,
            };
            let Some(flow) = handled else {
                break End::PeerClosed;
            };
            match flow {
                Flow::Continue => {}
                Flow::Close(code) => break End::Close(code, Input::Parsing),
                Flow::WriterGone => {
                    break End::WriterStopped(self.writer.stopped(timings.close_linger).await)
                }
            }
        };
        // The session holds a sender too; the writer must see the channel close.
        drop(session);
        let reason = end.reason();
        (reason, self.finish(end).await)
    }

    async fn finish(mut self, end: End<S>) -> Option<u64> {
        let linger = self.ctx.timings.close_linger;
        let offline = leave(&self.ctx, &self.peer);
        let closed = match end {
            End::Close(code, input) => {
                // Bounded: a writer stuck on a peer that does not read never takes the Close.
                let queued = tokio::time::timeout(linger, self.out.send(Outbound::Close(code)));
                match queued.await {
                    Ok(Ok(())) => self.writer.stopped(linger).await.map(|sink| (sink, input)),
                    Ok(Err(_)) | Err(_) => None,
                }
            }
            End::Revoked => {
                let refusal = RelayFrame::AuthError {
                    reason: AuthFailure::TokenRevoked.reason().to_owned(),
                };
                let _ = self.out.send(Outbound::Frame(refusal)).await;
                let _ = self.out.send(Outbound::Close(close::AUTH_FAILED)).await;
                self.writer
                    .stopped(linger)
                    .await
                    .map(|sink| (sink, Input::Parsing))
            }
            End::Superseded(ack) => {
                let superseded = RelayFrame::SessionSuperseded {
                    reason: "new_session".to_owned(),
                };
                let _ = self.out.send(Outbound::Frame(superseded)).await;
                let _ = self.out.send(Outbound::Close(close::SUPERSEDED)).await;
                // The new connection is answered only once the old one has closed.
                let sink = self.writer.stopped(self.ctx.timings.supersede_wait).await;
                if let Some(ack) = ack {
                    let _ = ack.send(());
                }
                sink.map(|sink| (sink, Input::Parsing))
            }
            End::Dead => {
                let _ = self.out.try_send(Outbound::Close(close::KEEPALIVE_TIMEOUT));
                None
            }
            End::PeerClosed => {
                // tungstenite queued the reply; reading on writes it and ends the stream.
                answer_peer_close(&mut self.stream, linger).await;
                None
            }
            End::Gone => None,
            End::WriterStopped(sink) => sink.map(|sink| (sink, Input::Parsing)),
        };
        drop(self.out);
        match closed {
            Some((sink, input)) => {
                if let Ok(mut ws) = self.stream.reunite(sink) {
                    read_out_websocket(&mut ws, input, linger).await;
                }
            }
            // A writer stuck on a socket that no longer drains is aborted when `self` drops.
            None if !self.writer.0.is_finished() => {
                let _ = tokio::time::timeout(linger, &mut self.writer.0).await;
            }
            None => {}
        }
        offline
    }
}
