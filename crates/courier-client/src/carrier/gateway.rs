//! The gateway carrier (`docs/protocol.md#gateway-client`): one TCP connection to a gateway daemon,
//! speaking newline-delimited JSON, kept up with reconnects.
//!
//! Every connection attaches from scratch: `Identify`, the gateway's `Challenge`, this device's
//! `DeclareAddress` (its proof over that challenge), and the gateway's answer. Only an
//! `AddressDeclared` naming this device's own address makes the carrier available to the engine:
//! until then nothing is submitted and nothing arriving is taken as inbound, because an unbound
//! session is never a recipient at the gateway. A refusal, or a binding to another address, is a
//! security warning and closes the connection; so does a challenge that is not 32 bytes, or a
//! challenge or answer that takes over 10 s. Once bound, sends and inbound messages take the
//! relay carrier's paths ([`Answers`], [`inbound_input`]). A gateway has no mailbox, journal or
//! presence: what the relay carrier does for those has no counterpart here. A gateway that
//! requires a token gets it in `Identify`; one that refuses it answers `AddressError` instead of
//! a `Challenge`. A bound link with nothing to say sends a `Ping` line every keepalive interval,
//! since the gateway closes a bound connection that stays silent.

use std::time::Duration;

use courier_engine::{Carrier, DiagnosticLevel, Input};
use courier_proto::lines::LineBuffer;
use courier_proto::security::{
    GATEWAY_ADDRESS_BINDING_MISMATCH, GATEWAY_ADDRESS_DECLARATION_REFUSED,
};
use courier_proto::{
    decode_challenge, gateway_declaration, Address, DecodeError, IdentityKey, RelayFrame,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, Instant};

use crate::carrier::answers::Answers;
use crate::carrier::backoff::Backoff;
use crate::carrier::inbound::{inbound_input, Stamp};
use crate::carrier::intake::Intake;
use crate::carrier::{report, Submit};
use crate::config::GatewayToken;
use crate::driver::{Command, DriverTx};
use crate::event::ClientEvent;

const TARGET: &str = "courier_client::gateway";
/// Bound on writing one line to a gateway that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

const REFUSED_REASON: &str =
    "the gateway refused this device's address declaration: nothing can be sent or received over it";
const MISMATCH_REASON: &str =
    "the gateway bound an address other than the one this device declared: the connection was closed";

/// What the driver asks of the gateway carrier.
#[derive(Debug)]
pub enum GatewayOut {
    Submit(Submit),
    /// Close the connection and end the task.
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayClientTimings {
    /// The longest wait for the TCP connection, for `Challenge` after `Identify`, and for the
    /// answer after `DeclareAddress` (10 s each, `docs/protocol.md#gateway-client`).
    pub attach_deadline: Duration,
    /// Reconnect pacing (1 s doubling to 30 s, `docs/protocol.md#gateway-client`).
    pub backoff: Backoff,
    /// Longest a bound link goes without writing a line before it sends a `Ping` (30 s, well
    /// within the gateway's 90 s idle timeout, `docs/protocol.md#gateway-framing`).
    pub keepalive: Duration,
}

impl Default for GatewayClientTimings {
    fn default() -> Self {
        Self {
            attach_deadline: Duration::from_secs(10),
            backoff: Backoff::default(),
            keepalive: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// `host:port` of the gateway daemon.
    pub address: String,
    /// Proves this device's address on every attach.
    pub identity: IdentityKey,
    /// The gateway's attach token, sent in `Identify` when set.
    pub token: Option<GatewayToken>,
    pub timings: GatewayClientTimings,
}

/// A security warning an attach ended with: the peer it names and its code.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    peer_id: String,
    code: &'static str,
}

/// Why a connection ended, which decides what happens next.
enum Loss {
    /// Reconnect with backoff.
    Dropped(String),
    /// The attach was refused or bound another address: reported, then reconnect with backoff.
    Refused(Refusal),
    /// Another attach of this address took the session over; the backoff keeps growing so two
    /// holders of one identity do not take turns once a second.
    Superseded,
    /// The client is stopping.
    Stopped,
}

pub async fn run(
    settings: GatewaySettings,
    mut rx: mpsc::UnboundedReceiver<GatewayOut>,
    driver: DriverTx,
) {
    let mut attempt: u32 = 0;
    // A refusal is reported once until an attach succeeds, not on every reconnect.
    let mut reported: Option<Refusal> = None;
    let mut intake = Intake::default();
    loop {
        let loss = match connect(&settings, &mut rx, &driver).await {
            Ok(None) => return,
            Ok(Some(link)) => {
                reported = None;
                let loss = Session::new(link, &driver, &mut intake, settings.timings.keepalive)
                    .run(&mut rx)
                    .await;
                if matches!(loss, Loss::Dropped(_)) {
                    attempt = 0;
                }
                loss
            }
            Err(loss) => loss,
        };
        match loss {
            Loss::Stopped => return,
            Loss::Dropped(reason) => diagnostic(
                &driver,
                DiagnosticLevel::Warn,
                format!("gateway connection lost: {reason}"),
            ),
            Loss::Superseded => diagnostic(
                &driver,
                DiagnosticLevel::Warn,
                "gateway session taken over by another attach of this address".to_owned(),
            ),
            Loss::Refused(refusal) => {
                if reported.as_ref() != Some(&refusal) {
                    let reason = if refusal.code == GATEWAY_ADDRESS_BINDING_MISMATCH {
                        MISMATCH_REASON
                    } else {
                        REFUSED_REASON
                    };
                    report::security_warning(
                        &driver,
                        refusal.peer_id.clone(),
                        refusal.code,
                        reason,
                    );
                    reported = Some(refusal);
                }
            }
        }
        let delay = settings.timings.backoff.delay(attempt);
        attempt = attempt.saturating_add(1);
        if !wait_for_reconnect(delay, &mut rx, &driver).await {
            return;
        }
    }
}

fn diagnostic(driver: &DriverTx, level: DiagnosticLevel, message: String) {
    report::diagnostic(driver, TARGET, level, message);
}

fn status(driver: &DriverTx, connected: bool, attached: bool) {
    driver.send(Command::Emit(ClientEvent::GatewayStatusChanged {
        connected,
        attached,
    }));
}

/// While no session is bound the carrier is down for the engine: an outbox send handed over
/// before it learned so fails at once, an ACK is dropped (the sender's resend is re-ACKed).
/// Returns false on `Stop`.
fn refuse_while_down(cmd: Option<GatewayOut>, driver: &DriverTx) -> bool {
    match cmd {
        None | Some(GatewayOut::Stop) => false,
        Some(GatewayOut::Submit(Submit::Outbox { id, send_seq, .. })) => {
            driver.input(Input::SendFailed {
                id,
                send_seq,
                reason: "gateway not attached".into(),
            });
            true
        }
        Some(GatewayOut::Submit(Submit::Ack { .. })) => true,
    }
}

/// Waits out the pause between connections; false when the client is stopping.
async fn wait_for_reconnect(
    wait: Duration,
    rx: &mut mpsc::UnboundedReceiver<GatewayOut>,
    driver: &DriverTx,
) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        tokio::select! {
            cmd = rx.recv() => if !refuse_while_down(cmd, driver) {
                return false;
            },
            _ = sleep_until(deadline) => return true,
        }
    }
}

/// Connects and attaches. `Ok(None)` when the client stopped meanwhile.
async fn connect(
    settings: &GatewaySettings,
    rx: &mut mpsc::UnboundedReceiver<GatewayOut>,
    driver: &DriverTx,
) -> Result<Option<Link>, Loss> {
    let deadline = settings.timings.attach_deadline;
    let attempt = async {
        let tcp = timeout(deadline, TcpStream::connect(settings.address.as_str()))
            .await
            .map_err(|_| Loss::Dropped("connect timed out".into()))?
            .map_err(|e| Loss::Dropped(format!("connect failed: {e}")))?;
        // Lines are small and latency-bound: Nagle would hold an ACK back.
        let _ = tcp.set_nodelay(true);
        status(driver, true, false);
        let mut link = Link::new(tcp);
        match attach(&mut link, settings, deadline).await {
            Ok(()) => Ok(link),
            Err(loss) => {
                link.close().await;
                status(driver, false, false);
                Err(loss)
            }
        }
    };
    tokio::pin!(attempt);
    loop {
        tokio::select! {
            result = &mut attempt => return result.map(Some),
            cmd = rx.recv() => if !refuse_while_down(cmd, driver) {
                return Ok(None);
            },
        }
    }
}

/// `Identify` → `Challenge` → `DeclareAddress` → `AddressDeclared` naming our own address.
async fn attach(
    link: &mut Link,
    settings: &GatewaySettings,
    deadline: Duration,
) -> Result<(), Loss> {
    let identity = &settings.identity;
    let own = identity.address().to_string();
    let mut identify = json!({"type": "Identify", "device_id": own, "protocol_version": 1});
    if let Some(token) = &settings.token {
        identify["token"] = json!(token.expose());
    }
    link.write_line(&identify.to_string()).await?;
    let refused = Loss::Refused(Refusal {
        peer_id: own.clone(),
        code: GATEWAY_ADDRESS_DECLARATION_REFUSED,
    });
    let challenge = timeout(deadline, async {
        loop {
            let line = link.next_line().await?;
            let Ok(frame) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            match frame.get("type").and_then(Value::as_str) {
                Some("Challenge") => {}
                // A gateway refuses a missing or wrong token before any challenge.
                Some("AddressError") => return Err(refused),
                _ => continue,
            }
            // Whatever protocol version the gateway answers, the device proceeds.
            return frame
                .get("challenge")
                .and_then(Value::as_str)
                .and_then(decode_challenge)
                .ok_or_else(|| Loss::Dropped("the Challenge is not 32 bytes of base64".into()));
        }
    })
    .await
    .map_err(|_| Loss::Dropped(format!("no Challenge within {} s", deadline.as_secs_f32())))??;

    let proof = gateway_declaration(identity, &challenge);
    let declare = json!({
        "type": "DeclareAddress",
        "address": proof.address,
        "public_key": proof.public_key,
        "signature": proof.signature,
    });
    link.write_line(&declare.to_string()).await?;
    let answer = timeout(deadline, async {
        loop {
            let line = link.next_line().await?;
            let Ok(text) = std::str::from_utf8(&line) else {
                continue;
            };
            match RelayFrame::decode(text) {
                Ok(
                    frame @ (RelayFrame::AddressDeclared { .. } | RelayFrame::AddressError { .. }),
                ) => return Ok(frame),
                _ => continue,
            }
        }
    })
    .await
    .map_err(|_| {
        Loss::Dropped(format!(
            "no answer to DeclareAddress within {} s",
            deadline.as_secs_f32()
        ))
    })??;
    match answer {
        RelayFrame::AddressDeclared { address } if address == own => Ok(()),
        // The bound address as the peer, when it is one: a gateway's free text never reaches an
        // event, and one that does not parse is an empty peer
        // (`docs/protocol.md#security-warnings`).
        RelayFrame::AddressDeclared { address } => Err(Loss::Refused(Refusal {
            peer_id: Address::parse(&address)
                .map(|a| a.to_string())
                .unwrap_or_default(),
            code: GATEWAY_ADDRESS_BINDING_MISMATCH,
        })),
        _ => Err(Loss::Refused(Refusal {
            peer_id: own,
            code: GATEWAY_ADDRESS_DECLARATION_REFUSED,
        })),
    }
}

/// The keepalive line (`docs/protocol.md#gateway-framing`): the gateway reads it as a sign of
/// life and answers nothing.
const PING: &str = r#"{"type":"Ping"}"#;

/// The connection: lines in, lines out.
struct Link {
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
    lines: LineBuffer,
    chunk: Vec<u8>,
    /// When the last line was written: the keepalive counts from it.
    last_write: Instant,
}

impl Link {
    fn new(tcp: TcpStream) -> Self {
        let (read, write) = tcp.into_split();
        Self {
            read,
            write,
            lines: LineBuffer::default(),
            chunk: vec![0; READ_CHUNK],
            last_write: Instant::now(),
        }
    }

    /// The next line. Cancel-safe: what was read stays in the buffer.
    async fn next_line(&mut self) -> Result<Vec<u8>, Loss> {
        loop {
            match self.lines.pop() {
                Ok(Some(line)) => return Ok(line),
                Ok(None) => {}
                Err(e) => return Err(Loss::Dropped(e.to_string())),
            }
            let n = self
                .read
                .read(&mut self.chunk)
                .await
                .map_err(|e| Loss::Dropped(format!("read failed: {e}")))?;
            if n == 0 {
                return Err(Loss::Dropped("closed by the gateway".into()));
            }
            self.lines.push(&self.chunk[..n]);
        }
    }

    async fn write_line(&mut self, line: &str) -> Result<(), Loss> {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        match timeout(WRITE_TIMEOUT, self.write.write_all(&bytes)).await {
            Ok(Ok(())) => {
                self.last_write = Instant::now();
                Ok(())
            }
            Ok(Err(e)) => Err(Loss::Dropped(format!("write failed: {e}"))),
            Err(_) => Err(Loss::Dropped("the gateway does not read".into())),
        }
    }

    async fn close(&mut self) {
        let _ = timeout(WRITE_TIMEOUT, self.write.shutdown()).await;
    }
}

/// A bound connection: the carrier is up for the engine.
struct Session<'a> {
    link: Link,
    driver: &'a DriverTx,
    answers: Answers,
    /// What has been read and handed over, so a flood is read no faster than the driver and
    /// the application take it; the carrier's, so a reconnect does not reopen it.
    intake: &'a mut Intake,
    keepalive: Duration,
}

impl<'a> Session<'a> {
    fn new(link: Link, driver: &'a DriverTx, intake: &'a mut Intake, keepalive: Duration) -> Self {
        Self {
            link,
            driver,
            answers: Answers::new("gateway"),
            intake,
            keepalive,
        }
    }

    async fn run(mut self, rx: &mut mpsc::UnboundedReceiver<GatewayOut>) -> Loss {
        diagnostic(
            self.driver,
            DiagnosticLevel::Info,
            "gateway attached".to_owned(),
        );
        self.driver.input(Input::CarrierUp(Carrier::Gateway));
        // After the engine heard of it: a listener of the event reads the gateway as up.
        status(self.driver, true, true);
        let loss = loop {
            let overdue = self.answers.next_deadline();
            let ping_at = self.link.last_write + self.keepalive;
            let step = tokio::select! {
                cmd = rx.recv() => self.on_command(cmd).await,
                line = self.link.next_line(), if self.intake.open() => match line {
                    Ok(line) => {
                        self.intake.took(line.len(), self.driver);
                        self.on_line(&line)
                    }
                    Err(loss) => Err(loss),
                },
                () = self.intake.caught_up(self.driver), if self.intake.waiting() => Ok(()),
                _ = sleep_until(overdue.map_or_else(Instant::now, Instant::from_std)), if overdue.is_some() => {
                    self.answers.expire(self.driver, std::time::Instant::now());
                    Ok(())
                }
                () = sleep_until(ping_at) => self.link.write_line(PING).await,
            };
            if let Err(loss) = step {
                break loss;
            }
        };
        self.link.close().await;
        self.driver.input(Input::CarrierDown(Carrier::Gateway));
        self.answers.connection_lost(self.driver);
        status(self.driver, false, false);
        loss
    }

    async fn on_command(&mut self, cmd: Option<GatewayOut>) -> Result<(), Loss> {
        match cmd {
            None | Some(GatewayOut::Stop) => Err(Loss::Stopped),
            Some(GatewayOut::Submit(Submit::Outbox {
                id,
                send_seq,
                recipient,
                frame,
            })) => {
                self.link.write_line(&frame).await?;
                self.driver.input(Input::Written {
                    id: id.clone(),
                    send_seq,
                });
                self.answers.written(id, send_seq, recipient);
                Ok(())
            }
            Some(GatewayOut::Submit(Submit::Ack { frame })) => self.link.write_line(&frame).await,
        }
    }

    /// Unknown types and lines that are no frame are ignored, never a reason to close
    /// (`docs/protocol.md#gateway-framing`).
    fn on_line(&mut self, line: &[u8]) -> Result<(), Loss> {
        let Ok(text) = std::str::from_utf8(line) else {
            return Ok(());
        };
        let frame = match RelayFrame::decode(text) {
            Ok(frame) => frame,
            Err(DecodeError::Malformed | DecodeError::UnknownType(_)) => return Ok(()),
            Err(e) => {
                diagnostic(
                    self.driver,
                    DiagnosticLevel::Warn,
                    format!("dropped gateway frame: {e}"),
                );
                return Ok(());
            }
        };
        let Some(frame) = self.answers.take_answer(self.driver, frame) else {
            return Ok(());
        };
        match frame {
            RelayFrame::Error {
                message_id: Some(id),
                ..
            } => {
                let reason = "gateway refused the message".to_owned();
                self.answers.fail(self.driver, &id, reason);
            }
            // Over the gateway's send rate: a failed send, retried like any other.
            RelayFrame::RateLimited {
                message_id: Some(id),
                ..
            } => {
                let reason = "rate limited by the gateway".to_owned();
                self.answers.fail(self.driver, &id, reason);
            }
            // The gateway vouches for the sender's address only; it has no journal to release.
            RelayFrame::MessageReceived {
                sender, content, ..
            } => {
                let stamp = Stamp {
                    carrier: Carrier::Gateway,
                    sender,
                    sender_account: None,
                    seq: None,
                };
                match inbound_input(stamp, &content) {
                    Ok(input) => self.driver.input(input),
                    Err(reason) => diagnostic(self.driver, DiagnosticLevel::Warn, reason),
                }
            }
            RelayFrame::SessionSuperseded { .. } => return Err(Loss::Superseded),
            _ => {}
        }
        Ok(())
    }
}
