//! The relay carrier: one WebSocket connection to `courier-relay` (`relay-protocol.md`), kept up
//! with reconnects, metered by the client token bucket. It reports every outcome to the driver
//! and decides nothing about delivery.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_engine::{Carrier, DiagnosticLevel, Input};
use courier_proto::limits::{
    close, CAP_MAILBOX, CAP_PRESENCE_WATCH, MAX_CAPABILITIES, MAX_CAPABILITY_BYTES, MAX_FRAME_BYTES,
};
use courier_proto::security::{RELAY_ADDRESS_BINDING_MISMATCH, RELAY_ADDRESS_DECLARATION_REFUSED};
use courier_proto::{
    declare_address_after_auth, validate_identifier, ClientFrame, DecodeError, IdentityKey,
    RelayFrame,
};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout};
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::carrier::answers::Answers;
use crate::carrier::backoff::Backoff;
use crate::carrier::inbound::{inbound_input, Stamp};
use crate::carrier::intake::Intake;
use crate::carrier::presence::PresenceWatch;
use crate::carrier::release::Releases;
use crate::carrier::{report, Submit};
use crate::driver::{Command, DriverTx};
use crate::event::ClientEvent;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
const PING_EVERY: Duration = Duration::from_secs(10);
const DEAD_AFTER: Duration = Duration::from_secs(30);
/// After close 4001 the same token is presented at most once per this period.
const AUTH_RETRY_MIN: Duration = Duration::from_secs(30);
/// Frames owed to the relay (end-to-end ACKs, releases) past which reading waits: an inbound
/// flood is then read no faster than the rate limit lets its ACKs out, instead of piling
/// them up here.
const MAX_OWED_FRAMES: usize = 256;

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// What the driver asks of the relay carrier.
#[derive(Debug)]
pub enum RelayOut {
    Submit(Submit),
    /// Release relay journal frame `seq`.
    ReleaseFrame {
        seq: u64,
    },
    /// The OS says the network is up (`true`: reconnect now) or down.
    Hint(bool),
    /// Inbound frames were processed but could not be stored (a failed commit), so they were not
    /// acked: start a new session, whose drain writes every unacked frame again.
    Redeliver,
    /// Start or stop hearing about a peer's presence (the engine's watchlist changed).
    Watch(String),
    Unwatch(String),
    /// Close the connection (1000) and end the task.
    Stop,
}

#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub url: String,
    pub token: String,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub auto_reconnect: bool,
    /// Proves this device's address to the relay on every connection (relay-protocol §4).
    pub identity: IdentityKey,
}

/// Why a connection ended, which decides what happens next.
enum Loss {
    /// Reconnect with backoff.
    Dropped(String),
    /// The relay refused the token: not again for 30 s.
    AuthRejected(String),
    /// Another session took over the account: no automatic reconnect.
    Superseded(String),
    /// The app said the network is down: wait for a hint or the backoff.
    Offline,
    /// Inbound frames could not be stored: reconnect for a redelivery, backing off while the
    /// storage keeps failing.
    Redeliver,
    /// The channel from the driver closed: the client is stopping.
    Stopped,
}

pub async fn run(
    settings: RelaySettings,
    mut rx: mpsc::UnboundedReceiver<RelayOut>,
    driver: DriverTx,
) {
    let mut attempt: u32 = 0;
    // Consecutive sessions ended for a redelivery: while storage keeps failing they back off.
    let mut redeliveries: u32 = 0;
    let mut superseded_reported = false;
    let mut presence = PresenceWatch::default();
    loop {
        let loss = match connect(&settings, &mut rx, &driver, &mut presence).await {
            Ok(Some(ws)) => {
                attempt = 0;
                Session::new(ws, &settings.identity, &driver, &mut presence)
                    .run(&mut rx)
                    .await
            }
            Ok(None) => Loss::Stopped,
            Err(loss) => loss,
        };
        if !matches!(loss, Loss::Redeliver) {
            redeliveries = 0;
        }
        let wait = match loss {
            Loss::Stopped => return,
            Loss::Redeliver => {
                let delay = Backoff::default().delay(redeliveries);
                redeliveries = redeliveries.saturating_add(1);
                diagnostic(
                    &driver,
                    DiagnosticLevel::Warn,
                    format!(
                        "reconnecting in {} ms so the relay redelivers inbound frames that could \
                         not be stored",
                        delay.as_millis()
                    ),
                );
                Some(delay)
            }
            Loss::Superseded(reason) => {
                if !superseded_reported {
                    superseded_reported = true;
                    driver.send(Command::Emit(ClientEvent::RelaySessionSuperseded {
                        reason,
                    }));
                }
                None
            }
            Loss::AuthRejected(reason) => {
                diagnostic(
                    &driver,
                    DiagnosticLevel::Error,
                    format!("relay refused the token: {reason}"),
                );
                Some(AUTH_RETRY_MIN)
            }
            Loss::Offline => None,
            Loss::Dropped(reason) => {
                diagnostic(
                    &driver,
                    DiagnosticLevel::Warn,
                    format!("relay connection lost: {reason}"),
                );
                if settings.auto_reconnect {
                    let delay = Backoff::default().delay(attempt);
                    attempt = attempt.saturating_add(1);
                    Some(delay)
                } else {
                    None
                }
            }
        };
        if !wait_for_reconnect(wait, &mut rx, &driver, &mut presence).await {
            return;
        }
        if superseded_reported {
            // An explicit reconnect from the app clears the latch.
            superseded_reported = false;
        }
    }
}

/// Waits out a pause between connections while answering the driver: sends fail at once (the
/// carrier is down), a `Hint(true)` cuts the wait short. `None` waits for a hint only.
/// Returns false when the client is stopping.
async fn wait_for_reconnect(
    wait: Option<Duration>,
    rx: &mut mpsc::UnboundedReceiver<RelayOut>,
    driver: &DriverTx,
    presence: &mut PresenceWatch,
) -> bool {
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    loop {
        let cmd = match deadline {
            Some(d) => tokio::select! {
                cmd = rx.recv() => cmd,
                _ = sleep_until(d) => return true,
            },
            None => rx.recv().await,
        };
        match cmd {
            None | Some(RelayOut::Stop) => return false,
            Some(RelayOut::Hint(true)) => return true,
            Some(cmd) => refuse_while_down(cmd, driver, presence),
        }
    }
}

/// While no connection is up, sends fail at once and watchlist changes are remembered.
fn refuse_while_down(cmd: RelayOut, driver: &DriverTx, presence: &mut PresenceWatch) {
    match cmd {
        RelayOut::Submit(Submit::Outbox { id, send_seq, .. }) => driver.input(Input::SendFailed {
            id,
            send_seq,
            reason: "relay not connected".into(),
        }),
        RelayOut::Watch(peer) => presence.watch(peer),
        RelayOut::Unwatch(peer) => presence.unwatch(&peer),
        RelayOut::Submit(Submit::Ack { .. })
        | RelayOut::ReleaseFrame { .. }
        | RelayOut::Hint(_)
        // The next session's drain writes every unacked frame anyway.
        | RelayOut::Redeliver
        | RelayOut::Stop => {}
    }
}

/// Connects and authenticates. `Ok(None)` when the client stopped meanwhile.
async fn connect(
    settings: &RelaySettings,
    rx: &mut mpsc::UnboundedReceiver<RelayOut>,
    driver: &DriverTx,
    presence: &mut PresenceWatch,
) -> Result<Option<(Ws, Authenticated)>, Loss> {
    let attempt = async {
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_FRAME_BYTES))
            .max_frame_size(Some(MAX_FRAME_BYTES));
        let connector = settings.tls.clone().map(Connector::Rustls);
        let (mut ws, _) = timeout(
            CONNECT_TIMEOUT,
            tokio_tungstenite::connect_async_tls_with_config(
                settings.url.as_str(),
                Some(config),
                // Frames are small and latency-bound: Nagle would hold an ACK for tens of ms.
                true,
                connector,
            ),
        )
        .await
        .map_err(|_| Loss::Dropped("connect timed out".into()))?
        .map_err(|e| Loss::Dropped(format!("connect failed: {e}")))?;
        let hello = ClientFrame::Authenticate {
            token: settings.token.clone(),
            client_capabilities: Some(vec![CAP_MAILBOX.to_owned()]),
        };
        ws.send(WsMessage::text(hello.encode()))
            .await
            .map_err(|e| Loss::Dropped(format!("write failed: {e}")))?;
        let auth = timeout(AUTH_TIMEOUT, await_authenticated(&mut ws))
            .await
            .map_err(|_| Loss::Dropped("no answer to Authenticate".into()))??;
        Ok((ws, auth))
    };
    tokio::pin!(attempt);
    loop {
        tokio::select! {
            result = &mut attempt => return result.map(Some),
            cmd = rx.recv() => match cmd {
                None | Some(RelayOut::Stop) => return Ok(None),
                Some(RelayOut::Hint(_)) => {}
                Some(cmd) => refuse_while_down(cmd, driver, presence),
            },
        }
    }
}

pub struct Authenticated {
    username: String,
    address_challenge: Option<String>,
    capabilities: Vec<String>,
    rate_limit: Option<courier_proto::RateLimitInfo>,
}

async fn await_authenticated(ws: &mut Ws) -> Result<Authenticated, Loss> {
    while let Some(msg) = ws.next().await {
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                if let Some(code) = close_code_for(&e) {
                    let _ = ws.send(close_message(code, "")).await;
                }
                return Err(Loss::Dropped(format!("read failed: {e}")));
            }
        };
        match msg {
            WsMessage::Text(text) => match RelayFrame::decode(text.as_str()) {
                Ok(RelayFrame::Authenticated {
                    username,
                    address_challenge,
                    capabilities,
                    rate_limit,
                    ..
                }) => {
                    return Ok(Authenticated {
                        username,
                        address_challenge,
                        capabilities: bounded_capabilities(capabilities),
                        rate_limit,
                    });
                }
                Ok(RelayFrame::AuthError { reason }) => return Err(Loss::AuthRejected(reason)),
                _ => {}
            },
            WsMessage::Close(frame) => return Err(close_loss(frame.as_ref())),
            _ => {}
        }
    }
    Err(Loss::Dropped("closed before Authenticated".into()))
}

/// At most 64 tokens of at most 128 bytes (§3); longer ones discarded, extra ones ignored.
fn bounded_capabilities(tokens: Vec<String>) -> Vec<String> {
    tokens
        .into_iter()
        .filter(|t| t.len() <= MAX_CAPABILITY_BYTES)
        .take(MAX_CAPABILITIES)
        .collect()
}

/// The close code a read error calls for (§1, §14.2): a message over 1 MiB, or invalid UTF-8.
/// Other errors leave nobody to tell.
fn close_code_for(error: &WsError) -> Option<u16> {
    match error {
        WsError::Capacity(_) => Some(close::TOO_BIG),
        WsError::Utf8(_) => Some(close::INVALID_UTF8),
        _ => None,
    }
}

fn close_message(code: u16, reason: &str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.into(),
    }))
}

fn close_loss(frame: Option<&CloseFrame>) -> Loss {
    match frame.map(|f| u16::from(f.code)) {
        Some(close::SUPERSEDED) => Loss::Superseded("close_4000".into()),
        Some(close::AUTH_FAILED) => Loss::AuthRejected("close_4001".into()),
        Some(code) => Loss::Dropped(format!("closed by relay ({code})")),
        None => Loss::Dropped("closed by relay".into()),
    }
}

fn diagnostic(driver: &DriverTx, level: DiagnosticLevel, message: String) {
    report::diagnostic(driver, "courier_client::relay", level, message);
}

struct Session<'a> {
    ws: Ws,
    driver: &'a DriverTx,
    presence: &'a mut PresenceWatch,
    bucket: super::bucket::TokenBucket,
    /// Funding order (§11): acks first, then sends.
    acks: VecDeque<String>,
    /// Journal frames received and released on this connection (the relay `Ack`s).
    releases: Releases,
    /// The `DeclareAddress` frame to write before anything else, and the address it declares.
    declaration: Option<String>,
    declared: Option<String>,
    sends: VecDeque<(String, u64, String, String)>,
    answers: Answers,
    last_heard: Instant,
    last_ping: Instant,
    /// The relay broke the transport rules (§1): the close code to end the connection with.
    violation: Option<u16>,
    intake: Intake,
}

impl<'a> Session<'a> {
    fn new(
        (ws, auth): (Ws, Authenticated),
        identity: &IdentityKey,
        driver: &'a DriverTx,
        presence: &'a mut PresenceWatch,
    ) -> Self {
        let now = Instant::now();
        presence.connected(
            auth.capabilities.iter().any(|c| c == CAP_PRESENCE_WATCH),
            now,
        );
        let mut session = Self {
            ws,
            driver,
            presence,
            bucket: super::bucket::TokenBucket::from_advertised(auth.rate_limit, now),
            acks: VecDeque::new(),
            releases: Releases::default(),
            sends: VecDeque::new(),
            answers: Answers::new("relay"),
            last_heard: now,
            last_ping: now,
            declaration: None,
            declared: None,
            violation: None,
            intake: Intake::default(),
        };
        // Order is load-bearing (§4.3): the declaration is the very next frame, before any
        // queued frame is flushed, or those frames keep the account name for good.
        match declare_address_after_auth(
            identity,
            &auth.capabilities,
            Some(auth.username.as_str()),
            auth.address_challenge.as_deref(),
        ) {
            Ok(frame) => {
                session.declaration = Some(frame.encode());
                session.declared = Some(identity.address().to_string());
            }
            Err(e) => diagnostic(
                driver,
                DiagnosticLevel::Info,
                format!("address declaration skipped: {}", e.reason()),
            ),
        }
        if auth.capabilities.iter().any(|c| c == CAP_MAILBOX) {
            // The relay starts the backlog drain once it answered our declaration, or at our
            // first other frame, or only after a 2 s grace. Without a declaration, an
            // `AckUpTo{0}` (which releases nothing: seqs start at 1) is that first frame, so the
            // backlog and live traffic flow at once.
            if session.declaration.is_none() {
                session.releases.announce();
            }
            // Until DrainComplete, what arrives is the backlog (batched for a durability hook).
            driver.input(Input::DrainStarted(Carrier::Relay));
        }
        diagnostic(
            driver,
            DiagnosticLevel::Info,
            format!("relay connected; capabilities {:?}", auth.capabilities),
        );
        driver.input(Input::AccountName(auth.username.clone()));
        driver.input(Input::CarrierUp(Carrier::Relay));
        // After the engine heard of it: a listener of the event reads the relay as up.
        driver.send(Command::Emit(ClientEvent::RelayStatusChanged {
            connected: true,
            authenticated: true,
        }));
        session
    }

    async fn run(mut self, rx: &mut mpsc::UnboundedReceiver<RelayOut>) -> Loss {
        // Writes come first: the declaration (or the drain's first frame) is due the moment the
        // session starts, before anything has woken the loop.
        let loss = loop {
            if let Err(loss) = self.flush_and_check().await {
                break loss;
            }
            let wake = self.next_wake();
            let reading = self.may_read();
            let step = tokio::select! {
                cmd = rx.recv() => self.on_command(cmd),
                msg = self.ws.next(), if reading => self.on_socket(msg),
                () = self.intake.caught_up(self.driver), if self.intake.waiting() => Ok(()),
                _ = sleep_until(wake.into()) => Ok(()),
            };
            if let Err(loss) = step {
                break loss;
            }
        };
        self.teardown(&loss).await;
        loss
    }

    /// Reading waits while the driver is behind on this connection's frames, or while too
    /// many frames are owed to the relay: what a flood leaves is bounded (`intake.rs`).
    fn may_read(&self) -> bool {
        self.intake.open() && self.acks.len() + self.releases.backlog() < MAX_OWED_FRAMES
    }

    fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let mut wake = (self.last_ping + PING_EVERY).min(self.last_heard + DEAD_AFTER);
        if let Some(first) = self.answers.next_deadline() {
            wake = wake.min(first);
        }
        if self.has_frames() {
            wake = wake.min(self.bucket.next_token_at(now));
        }
        if let Some(at) = self.presence.next_wake() {
            wake = wake.min(at.max(self.bucket.next_token_at(now)));
        }
        wake
    }

    fn on_command(&mut self, cmd: Option<RelayOut>) -> Result<(), Loss> {
        match cmd {
            None | Some(RelayOut::Stop) => Err(Loss::Stopped),
            Some(RelayOut::Submit(Submit::Outbox {
                id,
                send_seq,
                recipient,
                frame,
            })) => {
                self.sends.push_back((id, send_seq, recipient, frame));
                Ok(())
            }
            Some(RelayOut::Submit(Submit::Ack { frame })) => {
                self.acks.push_back(frame);
                Ok(())
            }
            Some(RelayOut::ReleaseFrame { seq }) => {
                self.releases.release(seq);
                Ok(())
            }
            Some(RelayOut::Watch(peer)) => {
                self.presence.watch(peer);
                Ok(())
            }
            Some(RelayOut::Unwatch(peer)) => {
                self.presence.unwatch(&peer);
                Ok(())
            }
            Some(RelayOut::Hint(false)) => Err(Loss::Offline),
            Some(RelayOut::Hint(true)) => Ok(()),
            Some(RelayOut::Redeliver) => Err(Loss::Redeliver),
        }
    }

    fn on_socket(
        &mut self,
        msg: Option<Result<WsMessage, tokio_tungstenite::tungstenite::Error>>,
    ) -> Result<(), Loss> {
        let msg = match msg {
            None => return Err(Loss::Dropped("connection closed".into())),
            Some(Err(e)) => {
                self.violation = close_code_for(&e);
                return Err(Loss::Dropped(format!("read failed: {e}")));
            }
            Some(Ok(msg)) => msg,
        };
        self.last_heard = Instant::now();
        match msg {
            WsMessage::Text(text) => {
                self.intake.took(text.len(), self.driver);
                self.on_frame(text.as_str())
            }
            WsMessage::Close(frame) => Err(close_loss(frame.as_ref())),
            // Pings are answered by tungstenite on the next write or flush.
            _ => Ok(()),
        }
    }

    fn on_frame(&mut self, text: &str) -> Result<(), Loss> {
        let frame = match RelayFrame::decode(text) {
            Ok(frame) => frame,
            Err(DecodeError::UnknownType(_)) => {
                self.forward(text);
                return Ok(());
            }
            Err(e) => {
                diagnostic(
                    self.driver,
                    DiagnosticLevel::Warn,
                    format!("dropped relay frame: {e}"),
                );
                return Ok(());
            }
        };
        let Some(frame) = self.answers.take_answer(self.driver, frame) else {
            return Ok(());
        };
        match frame {
            RelayFrame::MessageReceived {
                seq,
                sender,
                sender_account,
                content,
                ..
            } => {
                self.on_inbound(seq, sender, sender_account, &content);
            }
            RelayFrame::DrainComplete { count } => self.driver.input(Input::DrainComplete {
                carrier: Carrier::Relay,
                count,
            }),
            RelayFrame::RateLimited {
                retry_after_ms,
                message_id,
                seq,
                ..
            } => {
                self.bucket
                    .back_off(Duration::from_millis(retry_after_ms.max(1)), Instant::now());
                if let Some(id) = &message_id {
                    let reason = "rate limited by the relay".to_owned();
                    self.answers.fail(self.driver, id, reason);
                }
                // A dropped `Ack`/`AckUpTo` names its seq: released again, it goes out again
                // (as an `AckUpTo` when it still covers only processed frames).
                if let Some(seq) = seq {
                    self.releases.release(seq);
                }
                self.forward(text);
            }
            RelayFrame::SessionSuperseded { reason } => return Err(Loss::Superseded(reason)),
            RelayFrame::AddressDeclared { ref address } => {
                // Checked and reported, never acted on (§4.3).
                if self.declared.as_deref().is_some_and(|own| own != address) {
                    self.security_warning(
                        address.clone(),
                        RELAY_ADDRESS_BINDING_MISMATCH,
                        "the relay bound an address other than the one this device declared",
                    );
                }
                self.forward(text);
            }
            RelayFrame::AddressError { .. } => {
                let own = self.declared.clone().unwrap_or_default();
                self.security_warning(
                    own,
                    RELAY_ADDRESS_DECLARATION_REFUSED,
                    "the relay refused this device's address declaration: new end-to-end sessions cannot be set up over it",
                );
                self.forward(text);
            }
            RelayFrame::PresenceStatus {
                user_id,
                online,
                last_seen,
            } => {
                // It names a peer in an event: an identifier (§5), or dropped unquoted.
                if let Err(e) = validate_identifier(&user_id) {
                    diagnostic(
                        self.driver,
                        DiagnosticLevel::Warn,
                        format!("dropped relay frame: PresenceStatus user_id {e}"),
                    );
                    return Ok(());
                }
                self.driver.input(Input::Presence {
                    peer: user_id,
                    online,
                    // Published relays may send an ISO-8601 string; only epoch ms is kept.
                    last_seen_ms: last_seen.and_then(|v| v.as_u64()),
                });
            }
            RelayFrame::Error {
                code,
                message_id: Some(id),
                ..
            } if code == "internal" => {
                let reason = "relay storage failure".to_owned();
                self.answers.fail(self.driver, &id, reason);
                self.forward(text);
            }
            _ => self.forward(text),
        }
        Ok(())
    }

    fn on_inbound(
        &mut self,
        seq: Option<u64>,
        sender: String,
        sender_account: Option<String>,
        content: &str,
    ) {
        if let Some(seq) = seq {
            self.releases.received(seq);
        }
        let stamp = Stamp {
            carrier: Carrier::Relay,
            sender,
            sender_account,
            seq,
        };
        match inbound_input(stamp, content) {
            Ok(input) => self.driver.input(input),
            Err(reason) => {
                diagnostic(self.driver, DiagnosticLevel::Warn, reason);
                self.release(seq);
            }
        }
    }

    /// A dropped frame is still released at the relay (§7.2 step 5).
    fn release(&mut self, seq: Option<u64>) {
        if let Some(seq) = seq {
            self.releases.release(seq);
        }
    }

    fn security_warning(&self, peer_id: String, reason_code: &'static str, reason: &'static str) {
        report::security_warning(self.driver, peer_id, reason_code, reason);
    }

    fn forward(&self, text: &str) {
        self.driver
            .send(Command::Emit(ClientEvent::RelayServerMessage {
                json: text.to_owned(),
            }));
    }

    fn has_frames(&self) -> bool {
        self.releases.has_frame() || !self.acks.is_empty() || !self.sends.is_empty()
    }

    /// Writes what the bucket can fund, then enforces the write-ack and keepalive deadlines.
    async fn flush_and_check(&mut self) -> Result<(), Loss> {
        let now = Instant::now();
        // Unmetered (§11), and first.
        if let Some(frame) = self.declaration.take() {
            self.write(frame).await?;
        }
        while self.has_frames() {
            if !self.bucket.try_take(Instant::now()) {
                break;
            }
            if let Some(frame) = self.releases.next_frame() {
                self.write(frame.encode()).await?;
            } else if let Some(frame) = self.acks.pop_front() {
                self.write(frame).await?;
            } else if let Some((id, send_seq, recipient, frame)) = self.sends.pop_front() {
                self.write(frame).await?;
                self.driver.input(Input::Written {
                    id: id.clone(),
                    send_seq,
                });
                self.answers.written(id, send_seq, recipient);
            }
        }
        // Presence comes last in the funding order (§11); a poll the bucket cannot fund waits
        // for the next tick.
        if self.presence.has_frame(now) {
            for frame in self.presence.take_frames(now) {
                if !self.bucket.try_take(Instant::now()) {
                    break;
                }
                self.write(frame.encode()).await?;
            }
        }
        self.answers.expire(self.driver, now);
        if now >= self.last_heard + DEAD_AFTER {
            let _ = self
                .ws
                .send(close_message(close::KEEPALIVE_TIMEOUT, "keepalive"))
                .await;
            return Err(Loss::Dropped("keepalive timeout".into()));
        }
        if now >= self.last_ping + PING_EVERY {
            self.last_ping = now;
            self.ws
                .send(WsMessage::Ping(Default::default()))
                .await
                .map_err(|e| Loss::Dropped(format!("write failed: {e}")))?;
        }
        Ok(())
    }

    async fn write(&mut self, frame: String) -> Result<(), Loss> {
        self.ws
            .send(WsMessage::text(frame))
            .await
            .map_err(|e| Loss::Dropped(format!("write failed: {e}")))
    }

    /// Every send not yet answered is a transmission failure; the engine re-queues it.
    async fn teardown(&mut self, loss: &Loss) {
        let close = match loss {
            Loss::Stopped | Loss::Offline => Some(close::NORMAL),
            _ => self.violation,
        };
        if let Some(code) = close {
            let _ = self.ws.send(close_message(code, "")).await;
        }
        self.presence.disconnected();
        self.driver.input(Input::CarrierDown(Carrier::Relay));
        self.answers.connection_lost(self.driver);
        for (id, send_seq, _, _) in self.sends.drain(..) {
            self.driver.input(Input::SendFailed {
                id,
                send_seq,
                reason: "relay connection lost".into(),
            });
        }
        self.driver
            .send(Command::Emit(ClientEvent::RelayStatusChanged {
                connected: false,
                authenticated: false,
            }));
    }
}
